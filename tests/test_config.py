import dataclasses

import pytest

from xattn.checks import ConfigError, UnknownKey
from xattn.config import DecodeConfig, load_config

from xattn.presets import PRESET_DIR, presets, resolve_config
from xattn.errors import XattnError


def test_presets_ship_in_the_package_and_load():
    assert presets() == ["multi30k-de-en", "multi30k-de-en-8heads", "multi30k-en-de", "multi30k-en-fr", "multi30k-fr-en",
                         "numbers-de-en"]
    assert PRESET_DIR.parent.name == "xattn"
    for name in presets():
        cfg = load_config(resolve_config(name))
        assert name.split("-", 1)[1].startswith(f"{cfg.data.src_lang}-{cfg.data.tgt_lang}")  # dataset-src-tgt[-variant]


def test_a_preset_is_found_by_name_with_or_without_yaml():
    assert resolve_config("numbers-de-en") == PRESET_DIR / "numbers-de-en.yaml"
    assert resolve_config("numbers-de-en.yaml") == PRESET_DIR / "numbers-de-en.yaml"


def test_an_existing_file_wins_over_a_preset_of_the_same_name(tmp_path, monkeypatch):
    own = tmp_path / "numbers-de-en.yaml"
    own.write_text("train:\n  max_steps: 7\n")
    assert resolve_config(own) == own
    monkeypatch.chdir(tmp_path)
    assert load_config(resolve_config("numbers-de-en.yaml")).train.max_steps == 7


@pytest.mark.parametrize("arg", ["no-such-preset", "configs/numbers-de-en.yaml", "/nonexistent.yaml"])
def test_neither_file_nor_preset_is_one_line_listing_the_presets(arg):
    with pytest.raises(XattnError) as e:
        resolve_config(arg)
    message = str(e.value)
    assert message.startswith(f"{arg}: config file not found") and "\n" not in message
    assert all(name in message for name in presets())


def test_french_presets_have_one_vocabulary_per_language():
    """multi30k-fr-en is the transfer parent: a new language replaces one side's vocabulary."""
    for name in ("multi30k-fr-en", "multi30k-en-fr"):
        cfg = load_config(resolve_config(name))
        assert not cfg.data.joint_vocab and not cfg.model.share_embeddings and cfg.model.tie_output


def test_a_retired_key_in_a_model_directory_is_dropped_and_refused_as_an_override(tmp_path):
    """Model directories written before decode.stopping recorded decode.early_stopping: true (the old default)."""
    path = tmp_path / "config.yaml"
    path.write_text("decode:\n  beam_size: 4\n  early_stopping: true\n")
    cfg = load_config(path)
    assert cfg.decode.beam_size == 4 and cfg.decode.stopping == "exact"
    with pytest.raises(XattnError, match=r"decode.early_stopping is no longer a setting; use decode.stopping"):
        load_config(path, ["decode.early_stopping=false"])


def test_keys_added_later_are_written_only_when_set_so_older_versions_read_the_file(tmp_path):
    from xattn.config import DecodeConfig, RunConfig, load_config, save_config

    save_config(RunConfig(), tmp_path / "plain.yaml")
    assert "shortlist" not in (tmp_path / "plain.yaml").read_text()  # a default the older versions do not know
    cfg = RunConfig(decode=DecodeConfig(shortlist=True))
    save_config(cfg, tmp_path / "set.yaml")
    assert load_config(tmp_path / "set.yaml").decode.shortlist is True
    assert load_config(tmp_path / "plain.yaml") == RunConfig()


def test_an_overridden_list_entry_that_is_wrong_is_not_blamed_on_the_file(tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text("train:\n  lr: 0.001\n")
    with pytest.raises(XattnError) as e:
        load_config(path, ["data.corpora=[{tsv: x.tsv, upsample: 0}]"])
    assert str(e.value).startswith("data.corpora[0].upsample:") and "base.yaml" not in str(e.value)
    path.write_text("data:\n  corpora: [{tsv: x.tsv, upsample: 0}]\n")
    with pytest.raises(XattnError, match=r"base.yaml: data.corpora\[0\].upsample:"):
        load_config(path)


def test_which_settings_a_search_ignores_is_the_configs_and_only_used_sets_them_back():
    from xattn.config import DecodeConfig

    greedy, beam = DecodeConfig(beam_size=1, n_best=1), DecodeConfig(beam_size=4, n_best=2)
    sampling = DecodeConfig(sampling=True, num_samples=3)
    assert greedy.ignored == DecodeConfig.SAMPLING_ONLY | {"coverage_penalty", "stopping"}
    assert beam.ignored == DecodeConfig.SAMPLING_ONLY and sampling.ignored == DecodeConfig.BEAM_ONLY
    assert (greedy.returned, beam.returned, sampling.returned) == (1, 2, 3)
    asked = dict(coverage_penalty=0.2, stopping="early", temperature=0.5)
    base = DecodeConfig(max_len_b=20)
    first = DecodeConfig(beam_size=1, n_best=1, max_len_b=7, **asked).only_used(base)  # a greedy search beside a wider beam
    assert (first.coverage_penalty, first.stopping, first.temperature, first.max_len_b) == (0.0, "exact", 1.0, 7)
    kept = DecodeConfig(beam_size=4, max_len_b=7, **asked).only_used(base)
    assert (kept.coverage_penalty, kept.stopping, kept.temperature) == (0.2, "early", 1.0)
    with pytest.raises(XattnError, match="decode.stopping: applies to beam search"):
        greedy.refuse_unused(["max_len_b", "stopping"])


def test_a_users_choices_of_search_settings_follow_the_beam_and_leave_bad_values_to_the_checks():
    """n_best follows a smaller beam down unless given; a beam_size that is not a number was a TypeError in the
    comparison, before the config's own check could name it."""
    cfg = DecodeConfig(beam_size=5, n_best=3)
    assert cfg.with_choices({"beam_size": 2}) == {"beam_size": 2, "n_best": 2}
    assert cfg.with_choices({"beam_size": 2, "n_best": 1}) == {"beam_size": 2, "n_best": 1}
    assert cfg.with_choices({"beam_size": 4}) == {"beam_size": 4}
    changes = cfg.with_choices({"beam_size": "x"})
    with pytest.raises(ConfigError, match="decode.beam_size: expected int, got 'x'"):
        dataclasses.replace(cfg, **changes)


def test_config_errors_cross_to_other_processes():
    """A refusal that rank 0 shares with the other ranks under torchrun is pickled; these could not be unpickled
    (their __init__ takes other arguments than Exception's)."""
    import pickle

    for error in (ConfigError("train.lr", "expected a number, got 'fast'"),
                  UnknownKey("train.lrr", "unknown config key train.lrr (did you mean 'lr'?)")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and copy.key == error.key
