"""Transfer strategies (Gheini et al. 2021): which parameters each one trains, and the parameter accounting."""
import pytest
import torch

import xattn
from tests.conftest import tiny_config
from xattn.errors import XattnError
from xattn.transfer import STRATEGIES, format_parameter_table, parameter_table, strategy, trainable_names


@pytest.fixture
def separate():
    torch.manual_seed(0)
    return xattn.Transformer(tiny_config(share_embeddings=False, tie_output=True))


def test_every_strategy_of_the_paper_is_named():
    assert list(STRATEGIES) == ["scratch", "src", "src+body", "src+xattn", "src+randxattn",
                                "tgt", "tgt+body", "tgt+xattn", "tgt+randxattn"]
    with pytest.raises(XattnError, match=r"--strategy: unknown strategy .src\+enc.; one of scratch, src, src\+body"):
        strategy("src+enc")


@pytest.mark.parametrize("name, side, groups", [
    ("src", "src", {"src"}),
    ("src+xattn", "src", {"src", "xattn"}),
    ("src+randxattn", "src", {"src", "xattn"}),
    ("src+body", "src", {"src", "enc", "dec", "xattn"}),
    ("tgt+xattn", "tgt", {"tgt", "xattn"}),
    ("tgt+body", "tgt", {"tgt", "enc", "dec", "xattn"}),
    ("scratch", "tgt", {"src", "tgt", "enc", "dec", "xattn"}),
])
def test_trainable_parameters_of_each_strategy(separate, name, side, groups):
    names = trainable_names(separate, strategy(name), side)
    by_group = separate.parameter_groups()
    assert names == {n for g in groups for n in by_group[g]}
    assert all(n.startswith("decoder.layers.") for n in by_group["xattn"])
    assert ("decoder.layers.0.cross_attn.q_proj.weight" in names) == ("xattn" in groups)
    assert ("decoder.layers.0.self_attn.q_proj.weight" in names) == ("dec" in groups)


def test_parameter_table_counts_every_parameter_once(separate):
    names = trainable_names(separate, strategy("src+xattn"), "src")
    rows = {r["group"]: r for r in parameter_table(separate, names)}
    total = sum(p.numel() for p in separate.parameters())  # tied output counted once
    assert rows["all"]["total"] == total
    expected = sum(p.numel() for n, p in separate.named_parameters() if n in names)
    assert rows["all"]["trained"] == expected and rows["all"]["share"] == pytest.approx(expected / total)
    assert rows["xattn"]["share"] == 1.0 and rows["enc"]["trained"] == 0 and rows["src"]["share"] == 1.0
    lines = format_parameter_table(list(rows.values()))
    assert lines[0].split() == ["group", "trained", "of", "share"] and lines[-1].startswith("all")


TINY = ["model.d_model=16", "model.n_heads=2", "model.n_encoder_layers=1", "model.n_decoder_layers=1",
        "model.d_ff=32", "model.share_embeddings=false", "model.tie_output=true", "data.joint_vocab=false",
        "data.dataset=numbers", "data.numbers_size=300", "data.vocab_size=120", "train.max_tokens=400",
        "train.amp=none", "train.eval_every=3", "train.eval_bleu_sentences=8", "train.threads=1", "train.log_every=1"]


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A de->en numbers model with separate vocabularies, trained for 3 steps."""
    from xattn.config import load_config, resolve_config
    from xattn.training import train

    out = tmp_path_factory.mktemp("parent") / "de-en"
    train(load_config(resolve_config("numbers-de-en"), TINY + ["train.max_steps=3"]), out, quiet=True)
    return out


def finetune(parent, out, strategy_name, *extra):
    from xattn.cli.main import main

    return main(["finetune", "--parent", str(parent), "--strategy", strategy_name, "numbers-de-en", *TINY,
                 "data.src_lang=fr", *extra, "--out", str(out), "--quiet"])


@pytest.mark.parametrize("name", ["src+xattn", "src+body", "src", "src+randxattn", "scratch"])
def test_a_child_trains_only_its_strategy_and_keeps_the_rest_of_the_parent(parent, tmp_path, name):
    from xattn.checkpoint import load_model_dir

    assert finetune(parent, tmp_path / "child", name, "train.max_steps=3") == 0
    mother, child = load_model_dir(parent).model, load_model_dir(tmp_path / "child").model
    trained = trainable_names(child, strategy(name), "src")
    before, after = mother.state_dict(), child.state_dict()
    names = dict(child.named_parameters())  # a tied alias (generator.weight) is not listed twice
    for key, value in after.items():
        if key.startswith("src_") or key in trained or name == "scratch":
            continue  # the new vocabulary has another shape; trained parameters change
        assert torch.equal(before[key], value), key  # frozen, and taken from the parent bit for bit
    changed = {k for k in names if not k.startswith("src_") and not torch.equal(before[k], after[k])}
    assert changed <= trained and (changed or name == "src")
    assert (parent / "spm.tgt.model").read_bytes() == (tmp_path / "child" / "spm.tgt.model").read_bytes()
    assert (parent / "spm.src.model").read_bytes() != (tmp_path / "child" / "spm.src.model").read_bytes()
    if name == "src+randxattn":  # cross-attention starts random, not from the parent
        assert not torch.equal(before["decoder.layers.0.cross_attn.q_proj.weight"],
                               after["decoder.layers.0.cross_attn.q_proj.weight"])


def test_a_fine_tuning_run_resumes_and_checks_its_recipe(parent, tmp_path, capsys):
    out = tmp_path / "child"
    assert finetune(parent, out, "src+xattn", "train.max_steps=2") == 0
    assert finetune(parent, out, "src+body", "train.max_steps=4") == 2
    assert "transfer.strategy: 'src+xattn' -> 'src+body'" in capsys.readouterr().err
    assert finetune(parent, out, "src+xattn", "train.max_steps=4") == 0
    steps = [r["step"] for r in map(__import__("json").loads, (out / "log.jsonl").read_text().splitlines())
             if "loss" in r]
    assert steps == [1, 2, 3, 4]


@pytest.mark.parametrize("strategy_name, extra, message", [
    ("tgt+xattn", [], "--strategy tgt+xattn changes the tgt side, but the child changes the src language"),
    ("src+xattn", ["data.src_lang=de"], "transfer changes the language of exactly one side"),
    ("src+xattn", ["data.src_lang=cs", "data.tgt_lang=fr"], "transfer changes the language of exactly one side"),
    ("src+enc", [], "argument --strategy: invalid choice"),
])
def test_bad_recipes_are_one_line(parent, tmp_path, capsys, strategy_name, extra, message):
    try:
        code = finetune(parent, tmp_path / "child", strategy_name, *extra)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "child").exists()


def test_a_shared_vocabulary_parent_is_refused(numbers_model, tmp_path, capsys):
    assert finetune(numbers_model, tmp_path / "child", "src+xattn") == 2
    assert "shares one vocabulary between source and target" in capsys.readouterr().err
