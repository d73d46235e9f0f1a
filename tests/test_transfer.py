"""Transfer strategies (Gheini et al. 2021): which parameters each one trains, and the parameter accounting."""
import pytest
import torch

import xattn
from tests.conftest import tiny_config
from xattn.errors import XattnError
from xattn.strategies import STRATEGIES, strategy
from xattn.transfer import compose, format_parameter_table, parameter_table, trainable_names


@pytest.fixture
def separate():
    torch.manual_seed(0)
    return xattn.Transformer(tiny_config(share_embeddings=False, tie_output=True))


def test_every_strategy_of_the_paper_is_named():
    assert list(STRATEGIES) == ["scratch", "src", "src+body", "src+xattn", "src+randxattn",
                                "tgt", "tgt+body", "tgt+xattn", "tgt+randxattn"]
    with pytest.raises(XattnError, match=r"^strategy: unknown strategy .src\+enc.; one of scratch, src, src\+body"):
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


SHAPE = ["model.d_model=16", "model.n_heads=2", "model.n_encoder_layers=1", "model.n_decoder_layers=1",
         "model.d_ff=32", "model.share_embeddings=false", "model.tie_output=true"]
"""The parent's; a child takes its shape from the parent."""
TINY = ["data.joint_vocab=false", "data.dataset=numbers", "data.numbers_size=300", "data.vocab_size=120",
        "train.max_tokens=400", "train.amp=none", "train.eval_every=3", "train.eval_bleu_sentences=8",
        "train.threads=1", "train.log_every=1"]


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A de->en numbers model with separate vocabularies, trained for 3 steps."""
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.training import train

    out = tmp_path_factory.mktemp("parent") / "de-en"
    train(load_config(resolve_config("numbers-de-en"), SHAPE + TINY + ["train.max_steps=3"]), out, quiet=True)
    return out


def finetune(parent, out, strategy_name, *extra):
    from xattn.cli.main import main

    return main(["finetune", "--parent", str(parent), "--strategy", strategy_name, "numbers-de-en", *TINY,
                 "data.src_lang=fr", *extra, "--out", str(out), "--quiet"])


@pytest.mark.parametrize("name", ["src+xattn", "src+body", "src", "src+randxattn", "scratch"])
def test_a_child_trains_only_its_strategy_and_keeps_the_rest_of_the_parent(parent, tmp_path, name):
    from xattn.checkpoint import load_model_dir

    # every step evaluated and the last three averaged: averaging must leave frozen parameters as they are
    assert finetune(parent, tmp_path / "child", name, "train.max_steps=3", "train.eval_every=1",
                    "train.average_last=3") == 0
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
    assert finetune(parent, out, "src+xattn", "train.max_steps=4", "--full") == 2  # stored as a delta so far
    assert "transfer.full: None -> True" in capsys.readouterr().err
    assert finetune(parent, out, "src+xattn", "train.max_steps=4") == 0
    steps = [r["step"] for r in map(__import__("json").loads, (out / "log.jsonl").read_text().splitlines())
             if "loss" in r]
    assert steps == [1, 2, 3, 4]


@pytest.mark.parametrize("strategy_name, extra, message", [
    ("tgt+xattn", [], "--strategy: tgt+xattn changes the tgt side, but the child changes the src language"),
    ("src+xattn", ["data.src_lang=de"], "transfer changes the language of exactly one side"),
    ("src+xattn", ["data.src_lang=cs", "data.tgt_lang=fr"], "transfer changes the language of exactly one side"),
    ("src+enc", [], "argument --strategy: invalid choice"),
    ("src+xattn", ["model.d_model=32"], "override 'model.d_model=32': a child has its parent's model section"),
    ("src+xattn", ["data.joint_vocab=true"], "vocabularies are always separate"),
    ("src+xattn", ["parent.delta=false"], "parent section is written from its parent model"),
    ("scratch", ["--full"], "--full: a scratch child always stores its whole weights"),
    ("src+xattn", ["--data-dir", "/somewhere/multi30k"], "--data-dir: only Multi30k is read from a folder"),
])
def test_bad_recipes_are_one_line(parent, tmp_path, capsys, strategy_name, extra, message):
    try:
        code = finetune(parent, tmp_path / "child", strategy_name, *extra)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "child").exists()


def test_a_child_never_trains_into_its_parent(parent, capsys):
    before = {f.name: f.read_bytes() for f in parent.iterdir() if f.is_file()}
    assert finetune(parent, parent, "src+xattn") == 2
    assert "is the parent; a child trains into a directory of its own" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in parent.iterdir() if f.is_file()} == before


def test_a_shared_vocabulary_parent_is_refused(numbers_model, tmp_path, capsys):
    assert finetune(numbers_model, tmp_path / "child", "src+xattn") == 2
    assert "shares one vocabulary between source and target" in capsys.readouterr().err


# ------------------------------------------------------------------------------ delta checkpoints

def config_of(model_dir):
    import yaml

    return yaml.safe_load((model_dir / "config.yaml").read_text())


@pytest.fixture(scope="module")
def children(parent, tmp_path_factory):
    """fr->en src+xattn as a delta and stored whole (the same run twice), and de->cs tgt+xattn as a delta."""
    root = tmp_path_factory.mktemp("children")
    assert finetune(parent, root / "fr-en", "src+xattn", "train.max_steps=3") == 0
    assert finetune(parent, root / "fr-en-full", "src+xattn", "train.max_steps=3", "--full") == 0
    from xattn.cli.main import main

    assert main(["finetune", "--parent", str(parent), "--strategy", "tgt+xattn", "numbers-de-en", *TINY,
                 "data.tgt_lang=cs", "train.max_steps=3", "--out", str(root / "de-cs"), "--quiet"]) == 0
    return root


def test_a_child_stores_what_it_trained_and_loads_as_the_whole_model(parent, children):
    from safetensors import safe_open

    from xattn.checkpoint import load_model_dir, tensors_digest, weights_of

    delta, full = children / "fr-en", children / "fr-en-full"
    child = load_model_dir(delta).model
    with safe_open(str(delta / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert stored == set(trainable_names(child, strategy("src+xattn"), "src"))
    link = config_of(delta)["parent"]
    assert link == {"path": "../../" + "/".join(parent.parts[-2:]), "delta": True,
                    "tensors": tensors_digest(weights_of(load_model_dir(parent).model))}
    assert config_of(full)["parent"] == link | {"path": "../../" + "/".join(parent.parts[-2:]), "delta": False}
    whole = load_model_dir(full).model
    assert weights_of(child).keys() == weights_of(whole).keys()
    assert all(torch.equal(a, weights_of(whole)[k]) for k, a in weights_of(child).items())  # the same run twice
    assert (delta / "model.safetensors").stat().st_size < 0.7 * (full / "model.safetensors").stat().st_size
    assert "parent" not in config_of(parent)
    translated = xattn.load(delta).translate(["un deux trois"], xattn.DecodeConfig(beam_size=2))
    assert translated == xattn.load(full).translate(["un deux trois"], xattn.DecodeConfig(beam_size=2))


def test_every_verb_that_reads_a_model_reads_a_delta(children, tmp_path, capsys):
    from xattn.cli.main import main

    scores = []
    for model in ("fr-en", "fr-en-full"):
        assert main(["evaluate", str(children / model), "--split", "val", "--beam", "1", "--json"]) == 0
        scores.append(capsys.readouterr().out)
    assert scores[0] == scores[1]
    assert main(["export", str(children / "fr-en"), str(tmp_path / "ct2"), "--format", "ct2"]) == 0
    assert main(["attention", str(children / "fr-en"), "un deux", "--output", str(tmp_path / "a.svg")]) == 0
    # an export holds whole weights: imported, it is a model of its own, which names no parent
    assert main(["export", str(children / "fr-en"), str(tmp_path / "hf")]) == 0
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
    assert "parent" not in config_of(tmp_path / "back")
    cfg = xattn.DecodeConfig(beam_size=2)
    assert xattn.load(tmp_path / "back").translate(["un deux trois"], cfg) == \
        xattn.load(children / "fr-en").translate(["un deux trois"], cfg)


def test_finetune_prints_the_trained_share_per_group(parent, tmp_path, capsys):
    from xattn.cli.main import main

    assert main(["finetune", "--parent", str(parent), "--strategy", "src+xattn", "numbers-de-en", *TINY,
                 "data.src_lang=fr", "train.max_steps=1", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr()
    lines = (out.out + out.err).splitlines()
    table = lines[lines.index("src+xattn: parameters trained, per group") + 1:][:7]
    assert [line.split()[0] for line in table] == ["group", "src", "tgt", "enc", "dec", "xattn", "all"]
    assert table[3].split()[1] == "0" and table[5].split()[-1] == "100.0%"


def test_scratch_names_no_parent_and_stores_everything(parent, tmp_path):
    assert finetune(parent, tmp_path / "scratch", "scratch", "train.max_steps=1") == 0
    assert "parent" not in config_of(tmp_path / "scratch")
    xattn.load(tmp_path / "scratch")


def test_a_missing_or_different_parent_is_one_line(parent, children, tmp_path, capsys):
    import shutil

    from xattn.cli.main import main
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.training import train

    moved = tmp_path / "a" / "b" / "moved"
    shutil.copytree(children / "fr-en", moved, ignore=shutil.ignore_patterns("train_state"))
    (tmp_path / "in.txt").write_text("un deux\n")
    assert main(["translate", str(moved), "-i", str(tmp_path / "in.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stores only what it changed from its parent" in err and "is missing" in err
    other = tmp_path / "other"
    train(load_config(resolve_config("numbers-de-en"), SHAPE + TINY + ["train.max_steps=3", "train.seed=2"]), other,
          quiet=True)
    text = (moved / "config.yaml").read_text().replace(config_of(moved)["parent"]["path"], str(other))
    (moved / "config.yaml").write_text(text)
    assert main(["translate", str(moved), "-i", str(tmp_path / "in.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"its parent {other} holds other weights" in err
    text = text.replace(str(other), str(parent))  # an absolute path to the right parent works
    (moved / "config.yaml").write_text(text)
    assert main(["translate", str(moved), "-i", str(tmp_path / "in.txt")]) == 0


def test_train_refuses_a_config_that_names_a_parent(tmp_path, capsys):
    from xattn.cli.main import main

    assert main(["train", "numbers-de-en", *SHAPE, *TINY, f"parent.path={tmp_path}", "parent.tensors=" + "0" * 64,
                 "--out", str(tmp_path / "m"), "--quiet"]) == 2
    assert "only a fine-tuned child names a parent" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- compose

def test_compose_puts_the_parents_embeddings_back_into_a_child(parent, children, tmp_path, capsys):
    from xattn.checkpoint import load_model_dir, weights_of
    from xattn.cli.main import main

    out = tmp_path / "forget"
    assert main(["compose", str(children / "fr-en"), "--src-embeddings", str(parent), "--out", str(out)]) == 0
    assert "de->en, stores what differs from the parent" in capsys.readouterr().out
    made, mother, child = (weights_of(load_model_dir(d).model) for d in (out, parent, children / "fr-en"))
    groups = load_model_dir(out).model.parameter_groups()
    for group, origin in (("src", mother), ("enc", mother), ("xattn", child), ("dec", child), ("tgt", child)):
        assert all(torch.equal(made[n], origin[n]) for n in groups[group]), group
    assert (out / "spm.src.model").read_bytes() == (parent / "spm.src.model").read_bytes()
    assert config_of(out)["data"]["src_lang"] == "de" and config_of(out)["parent"]["delta"] is True


def test_compose_takes_parts_of_a_grandchild_and_its_parent(parent, children, tmp_path, capsys):
    from xattn.checkpoint import load_model_dir, weights_of
    from xattn.cli.main import main

    grandchild = tmp_path / "cs-en"  # a child of the fr->en child
    assert main(["finetune", "--parent", str(children / "fr-en"), "--strategy", "src+xattn", "numbers-de-en", *TINY,
                 "data.src_lang=cs", "train.max_steps=2", "--out", str(grandchild), "--quiet"]) == 0
    out = tmp_path / "back"
    assert main(["compose", str(grandchild), "--src-embeddings", str(children / "fr-en"), "--out", str(out)]) == 0
    assert "fr->en, stores what differs from the parent" in capsys.readouterr().out
    assert (out / config_of(out)["parent"]["path"]).resolve() == (children / "fr-en").resolve()  # the nearest
    made, mother, child = (weights_of(load_model_dir(d).model) for d in (out, children / "fr-en", grandchild))
    groups = load_model_dir(out).model.parameter_groups()
    assert all(torch.equal(made[n], mother[n]) for n in groups["src"])
    assert all(torch.equal(made[n], child[n]) for n in groups["xattn"])
    xattn.load(out).translate(["un deux"], xattn.DecodeConfig(beam_size=1))


def test_compose_joins_an_encoder_side_and_a_decoder_side(parent, children, tmp_path):
    from xattn.checkpoint import load_model_dir, weights_of

    out = tmp_path / "fr-cs"
    compose(out, encoder=children / "fr-en", decoder=children / "de-cs")
    made, src_child, tgt_child = (weights_of(load_model_dir(d).model) for d in (out, children / "fr-en",
                                                                               children / "de-cs"))
    groups = load_model_dir(out).model.parameter_groups()
    for group, origin in (("src", src_child), ("enc", src_child), ("xattn", tgt_child), ("tgt", tgt_child)):
        assert all(torch.equal(made[n], origin[n]) for n in groups[group]), group
    cfg = config_of(out)
    assert (cfg["data"]["src_lang"], cfg["data"]["tgt_lang"]) == ("fr", "cs")
    assert (out / "spm.tgt.model").read_bytes() == (children / "de-cs" / "spm.tgt.model").read_bytes()
    xattn.load(out).translate(["un deux"], xattn.DecodeConfig(beam_size=2))
    full = tmp_path / "fr-cs-full"
    compose(full, full=True, encoder=children / "fr-en", decoder=children / "de-cs")
    assert config_of(full)["parent"]["delta"] is False
    assert all(torch.equal(a, weights_of(load_model_dir(full).model)[k]) for k, a in made.items())


@pytest.mark.parametrize("args, message", [
    (["--src-embeddings", "{fr-en}"], "no part gives the tgt, enc, dec, xattn parameters"),
    (["{fr-en}", "--decoder", "{fr-en}"], "every part comes from"),
    (["{fr-en}", "--src-embeddings", "{other}"], "only parts of children of one parent fit together"),
    (["{fr-en}", "--src-embeddings", "{shared}"], "shares one vocabulary between source and target"),
    (["{fr-en}", "--src-embeddings", "{missing}"], "not a model directory"),
    (["{de-cs}", "--encoder", "{fr-en}", "--decoder", "{fr-en}"], "the base model gives no part"),
])
def test_compose_refuses_parts_that_do_not_fit(parent, children, numbers_model, tmp_path, capsys, args, message):
    from xattn.cli.main import main
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.training import train

    other = tmp_path / "other"
    if "{other}" in args:
        train(load_config(resolve_config("numbers-de-en"), SHAPE + TINY + ["train.max_steps=1", "train.seed=2"]), other,
              quiet=True)
    paths = {"{fr-en}": children / "fr-en", "{de-cs}": children / "de-cs", "{other}": other, "{shared}": numbers_model, "{missing}": tmp_path / "no"}
    assert main(["compose", *[str(paths.get(a, a)) for a in args], "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_a_child_found_through_a_symlink_finds_its_parent(children, tmp_path):
    link = tmp_path / "elsewhere" / "child"
    link.parent.mkdir()
    link.symlink_to(children / "fr-en")
    xattn.load(link).translate(["un deux"], xattn.DecodeConfig(beam_size=1))


def test_hard_coded_heads_keep_their_centres_through_finetune_and_compose(tmp_path):
    from xattn.analysis.pruning import prune_dir
    from xattn.checkpoint import load_model_dir
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.training import train

    hard = SHAPE + ["model.n_heads=4", "model.attention={enc_self: gaussian, dec_self: gaussian, cross: gaussian}"]
    train(load_config(resolve_config("numbers-de-en"), hard + TINY + ["train.max_steps=1"]), tmp_path / "p0",
          quiet=True)
    prune_dir(tmp_path / "p0", {"cross": [[0]]}, tmp_path / "parent")  # centres (+1, -1, +1): not the defaults
    from xattn.cli.main import main

    assert main(["finetune", "--parent", str(tmp_path / "parent"), "--strategy", "src+xattn", "numbers-de-en", *TINY,
                 "data.src_lang=fr", "train.max_steps=1", "--out", str(tmp_path / "child"), "--quiet"]) == 0
    centres = lambda d: load_model_dir(d).model.decoder.layers[0].cross_attn.offsets.flatten().tolist()  # noqa: E731
    assert centres(tmp_path / "parent") == centres(tmp_path / "child") == [1.0, -1.0, 1.0]
    from xattn.corpus import prepare_corpus
    from xattn.recipes import length_ratio

    child = load_model_dir(tmp_path / "child").config  # its cross-attention centres by its own tokens' ratio
    own = length_ratio(child.model, prepare_corpus(child.data, tmp_path / "child", new_tokenizers=False))
    assert child.model.length_ratio == own != load_model_dir(tmp_path / "parent").config.model.length_ratio
    compose(tmp_path / "back", base=tmp_path / "child", src_embeddings=tmp_path / "parent")
    assert centres(tmp_path / "back") == [1.0, -1.0, 1.0]


@pytest.mark.parametrize("extra, message", [
    ("model:\n  d_model: 64\n", "model: a child has its parent's model section (its shape); drop it from the file"),
    ("parent:\n  delta: false\n", "parent: a child's parent section is written from its parent model"),
    ("data:\n  joint_vocab: true\n", "data.joint_vocab: a child's source and target vocabularies are always separate"),
])
def test_a_child_config_file_may_not_ask_what_a_child_cannot_have(parent, tmp_path, capsys, extra, message):
    """Refused as overrides, these keys in the child's own file were silently replaced by the parent's. A preset's
    model section (every other test here trains a child from one) is its template, not a wish."""
    from xattn.cli.main import main
    from xattn.presets import resolve_config

    child = tmp_path / "child.yaml"
    child.write_text(extra)
    code = main(["finetune", "--parent", str(parent), "--strategy", "src+xattn", str(child), *TINY,
                 "data.dataset=numbers", "data.src_lang=fr", "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and f"{child}: {message}" in err and len(err.strip().splitlines()) == 1
    assert "model:" in resolve_config("numbers-de-en").read_text()


def test_a_joint_vocab_override_is_read_as_the_config_reads_it():
    """`data.joint_vocab=[` gave YAML's traceback, and `data.joint_vocab=0` (false, as the config reads it) was
    refused as asking for a joint vocabulary."""
    from xattn.transfer import check_overrides
    check_overrides(["data.joint_vocab=0", "data.joint_vocab=false", "data.joint_vocab=no"])
    with pytest.raises(XattnError, match="data.joint_vocab: expected true or false, got '\\['"):
        check_overrides(["data.joint_vocab=["])
    with pytest.raises(XattnError, match="always separate"):
        check_overrides(["data.joint_vocab=1"])


def test_a_composed_model_names_its_languages_not_one_sides_files():
    """compose kept the decoder side's data section with the languages swapped: its training files (which
    `xattn shortlist` then read with the other side's tokenizer), and a dataset without the new source language
    (refused as `data.src_lang: 'es' is not one of ...`, a key nobody set)."""
    from xattn.config import DataConfig
    from xattn.transfer import composed_data

    enc = DataConfig(dataset=None, src_lang="de", tgt_lang="en", train_src="de.txt", train_tgt="en.txt")
    dec = DataConfig(dataset=None, src_lang="fr", tgt_lang="cs", train_src="fr.txt", train_tgt="cs.txt",
                     valid_src="v.fr", valid_tgt="v.cs")
    data = composed_data(enc, dec)
    assert (data.dataset, data.src_lang, data.tgt_lang) == (None, "de", "cs")
    assert (data.train_src, data.train_tgt, data.valid_src, data.valid_tgt) == (None, None, None, None)
    es = DataConfig(dataset=None, src_lang="es", tgt_lang="en", train_src="es.txt", train_tgt="en.txt")
    m30k = DataConfig(dataset="multi30k", src_lang="fr", tgt_lang="en", train_subset=100)
    assert (composed_data(es, m30k).dataset, composed_data(es, m30k).src_lang) == (None, "es")
    shared = composed_data(DataConfig(src_lang="cs", tgt_lang="en"), m30k)
    assert (shared.dataset, shared.src_lang, shared.train_subset) == ("multi30k", "cs", None)


def test_a_parent_whose_kept_tokenizer_has_an_id_table_is_refused_naming_it(parent, tmp_path, capsys):
    """An imported model's tokenizer may number its pieces by a table (spm.tgt.vocab.json); the child's corpus took
    the .model alone, so the frozen embeddings were read by other ids (or the run failed on a key it never set)."""
    import json
    import shutil

    import sentencepiece as spm

    from xattn.checkpoint import load_model_dir, save_model_dir

    imported = tmp_path / "imported"
    shutil.copytree(parent, imported)
    loaded = load_model_dir(imported)
    processor = spm.SentencePieceProcessor(model_file=str(imported / "spm.tgt.model"))
    table = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    (imported / "spm.tgt.vocab.json").write_text(json.dumps(table))
    save_model_dir(imported, loaded.model, loaded.config)  # (fingerprinted with the table)
    load_model_dir(imported)
    assert finetune(imported, tmp_path / "child", "src+xattn", "train.max_steps=1") == 2
    err = capsys.readouterr().err
    assert "its tgt tokenizer numbers its pieces by a table of its own (spm.tgt.vocab.json" in err
    assert len(err.strip().splitlines()) == 1


def test_compose_stores_whole_weights_when_the_shared_parent_no_longer_loads(parent, tmp_path):
    """Parts stored whole load without their parent; compose read the parent for a delta, and a parent that no
    longer loaded (its weights gone) made it refuse parts that all load."""
    import shutil

    from xattn.checkpoint import WEIGHTS
    from xattn.cli.main import main

    root = tmp_path / "parent"
    shutil.copytree(parent, root)
    assert finetune(root, tmp_path / "fr-en", "src+xattn", "train.max_steps=1", "--full") == 0
    assert main(["finetune", "--parent", str(root), "--strategy", "tgt+xattn", "numbers-de-en", *TINY,
                 "data.tgt_lang=cs", "train.max_steps=1", "--full", "--out", str(tmp_path / "de-cs"), "--quiet"]) == 0
    (root / WEIGHTS).unlink()
    compose(tmp_path / "fr-cs", encoder=tmp_path / "fr-en", decoder=tmp_path / "de-cs")
    assert config_of(tmp_path / "fr-cs")["parent"]["delta"] is False
    xattn.load(tmp_path / "fr-cs").translate(["un deux"], xattn.DecodeConfig(beam_size=1))
