"""Guided alignment (xattn/guidance.py): the `alignment` section, training that teaches a head word links, the
choice it stores for the verbs that read links, and a model trained on its own links."""
import json
import random
from pathlib import Path

import pytest
import yaml

import xattn
from xattn.analysis.aer import score
from xattn.analysis.alignment import AlignSettings, align_pairs
from xattn.analysis.choice import settings_for, stored
from xattn.analysis.maps import HeadChoice
from xattn.checks import ConfigError
from xattn.cli.main import main
from xattn.config import ModelConfig, load_config
from xattn.links import parse_links
from xattn.training import Trainer, train

LINKS = "data.train_links=links.txt"  # guidance needs links (the file is only read when a corpus is prepared)
WORDS = {"haus": "house", "katze": "cat", "hund": "dog", "baum": "tree", "auto": "car", "schnell": "fast",
         "rot": "red", "blau": "blue", "gross": "big", "klein": "small", "alt": "old", "neu": "new"}


def reversed_pairs(n: int, seed: int) -> tuple[list[str], list[str], list[str]]:
    """(German, English, links): 2 to 6 words, the English in reverse order, so word i links to n - 1 - i."""
    rng = random.Random(seed)
    de, en, links = [], [], []
    for _ in range(n):
        words = [rng.choice(list(WORDS)) for _ in range(rng.randint(2, 6))]
        de.append(" ".join(words))
        en.append(" ".join(WORDS[w] for w in reversed(words)))
        links.append(" ".join(f"{i}-{len(words) - 1 - i}" for i in range(len(words))))
    return de, en, links


def write(folder: Path, name: str, lines: list[str]) -> str:
    (folder / name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return str(folder / name)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reversed")
    for split, n, seed in (("train", 2000, 1), ("valid", 50, 2), ("test", 100, 3)):
        for ext, lines in zip(("de", "en", "links"), reversed_pairs(n, seed)):
            write(folder, f"{split}.{ext}", lines)
    return folder


def overrides(corpus: Path, steps: int, weight: float, *extra: str) -> list[str]:
    """A 2-layer decoder learning the reversed corpus in seconds; guidance on layer 1, head 0."""
    return ["model.d_model=32", "model.n_heads=2", "model.n_encoder_layers=1", "model.n_decoder_layers=2",
            "model.d_ff=64", "model.dropout=0", "model.share_embeddings=true", "model.tie_output=true",
            "data.dataset=null", f"data.train_src={corpus}/train.de", f"data.train_tgt={corpus}/train.en",
            f"data.train_links={corpus}/train.links", f"data.valid_src={corpus}/valid.de",
            f"data.valid_tgt={corpus}/valid.en", "data.vocab_size=40", "train.max_tokens=800",
            f"train.max_steps={steps}", f"train.eval_every={steps}", "train.warmup=30", "train.lr=0.005",
            "train.amp=none", "train.threads=1", "train.eval_bleu_sentences=10", "train.log_every=1",
            f"alignment.weight={weight}", "alignment.layer=1", *extra]


@pytest.fixture(scope="module")
def models(corpus, tmp_path_factory) -> dict[str, Path]:
    """The same model trained 200 steps with guidance (weight 2) and without (seeded alike)."""
    root = tmp_path_factory.mktemp("guided")
    for name, weight in (("guided", 2.0), ("unguided", 0.0)):
        train(load_config(None, overrides(corpus, 200, weight)), root / name, quiet=True)
    return {"guided": root / "guided", "unguided": root / "unguided"}


def test_the_alignment_section_is_typed_and_checked():
    cfg = load_config(None, ["alignment.weight=0.05", "alignment.heads=0,2", "alignment.layer=1", LINKS])
    assert (cfg.alignment.weight, cfg.alignment.layer, cfg.alignment.heads) == (0.05, 1, [0, 2])
    assert load_config(None, ["alignment.heads=mean"]).alignment.heads == "mean"
    assert load_config(None, ["alignment.heads=[1]"]).alignment.heads == [1]
    assert "alignment" not in load_config(None).to_dict() and cfg.to_dict()["alignment"]["heads"] == [0, 2]
    for bad, key in ((["alignment.wieght=1"], "did you mean 'weight'"), (["alignment.weight=-1"], "alignment.weight"),
                     (["alignment.heads=0,0"], "alignment.heads"), (["alignment.heads=x"], "alignment.heads")):
        with pytest.raises(xattn.XattnError, match=key):
            load_config(None, bad)


def test_the_layer_and_heads_are_checked_against_the_model_naming_the_key():
    model = ModelConfig(n_decoder_layers=3, n_heads=4, heads={"cross": [4, 0, 2]})
    on = load_config(None, ["alignment.weight=1", LINKS]).alignment
    assert on.resolve(ModelConfig(n_decoder_layers=3)) == (1, (0,))  # the second-to-last layer, head 0
    for changes, key, problem in (
            (["alignment.layer=3"], "alignment.layer", "3 is not a decoder layer of this model (0 to 2)"),
            (["alignment.layer=1"], "alignment.layer", "layer 1 has no cross-attention heads left (pruned)"),
            (["alignment.layer=2", "alignment.heads=1,2"], "alignment.heads", "layer 2 has no head 2")):
        with pytest.raises(ConfigError) as e:
            load_config(None, ["alignment.weight=1", LINKS, *changes]).alignment.resolve(model)
        assert e.value.key == key and problem in e.value.problem
    assert load_config(None, ["alignment.layer=2", "alignment.heads=mean"]).alignment.resolve(model) == (2, None)


def gold_and_pairs(corpus: Path):
    de, en, links = (corpus / "test.de", corpus / "test.en", corpus / "test.links")
    gold = [(sure, possible) for sure, possible in (parse_links(line) for line in links.read_text().splitlines())]
    return de.read_text().splitlines(), en.read_text().splitlines(), gold


def test_guidance_teaches_the_chosen_head_links_that_training_alone_does_not(models, corpus):
    de, en, gold = gold_and_pairs(corpus)
    guided = xattn.load(models["guided"])
    record = stored(models["guided"], guided.model.cfg)
    assert (record.layer, record.heads, record.method, record.guided) == (1, [0], "naive", 2.0)
    aer = score(align_pairs(guided, de, en, settings_for(models["guided"], guided.model.cfg)), gold).aer
    unguided = xattn.load(models["unguided"])
    assert stored(models["unguided"], unguided.model.cfg) is None
    best = min(score(align_pairs(unguided, de, en, AlignSettings(HeadChoice(layer, heads), method)), gold).aer
               for layer in (0, 1) for heads in ((0,), (1,), None) for method in ("naive", "shift"))
    assert aer < 0.2 and best > 0.3, (aer, best)
    records = [json.loads(line) for line in (models["guided"] / "log.jsonl").read_text().splitlines()]
    losses = [r["alignment_loss"] for r in records if "alignment_loss" in r]
    assert len(losses) == 200 and sum(losses[-20:]) < sum(losses[:20]) / 3


def test_align_and_translate_read_the_stored_choice_by_default(models, corpus, tmp_path, capsys):
    model, pairs = str(models["guided"]), tmp_path / "pairs.txt"
    de, en, _ = gold_and_pairs(corpus)
    write(tmp_path, "pairs.txt", [f"{s} ||| {t}" for s, t in zip(de[:20], en[:20])])
    outputs = {}
    for name, flags in (("stored", []), ("explicit", ["--layer", "1", "--heads", "0", "--method", "naive"]),
                        ("other", ["--layer", "0", "--heads", "1", "--method", "shift"])):
        assert main(["align", model, "--pairs", str(pairs), *flags]) == 0
        outputs[name] = capsys.readouterr().out
    assert outputs["stored"] == outputs["explicit"] != outputs["other"]
    write(tmp_path, "in.de", de[:20])
    for name, flags in (("stored", []), ("explicit", ["--layer", "1", "--heads", "0", "--method", "naive"]),
                        ("other", ["--layer", "0", "--heads", "1", "--method", "shift"])):
        assert main(["translate", model, "-i", str(tmp_path / "in.de"), "--alignment", "--beam", "2", *flags]) == 0
        outputs[name] = capsys.readouterr().out
    assert outputs["stored"] == outputs["explicit"] != outputs["other"]


def test_a_guided_run_resumes_exactly(corpus, tmp_path):
    full, parts = tmp_path / "full", tmp_path / "parts"
    train(load_config(None, overrides(corpus, 6, 1.0)), full, quiet=True)
    train(load_config(None, overrides(corpus, 3, 1.0)), parts, quiet=True)
    train(load_config(None, overrides(corpus, 6, 1.0)), parts, quiet=True)
    logged = [[json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()] for run in (full, parts)]
    a, b = ([(r["step"], r["loss"], r["alignment_loss"]) for r in records if "loss" in r] for records in logged)
    assert [r[0] for r in a] == [r[0] for r in b] == list(range(1, 7))
    assert [x for r in a for x in r[1:]] == pytest.approx([x for r in b for x in r[1:]], rel=1e-6)
    with pytest.raises(xattn.XattnError, match=r"alignment.weight: 1.0 -> 2.0"):
        Trainer(load_config(None, overrides(corpus, 8, 2.0)), parts, quiet=True)


def test_guidance_needs_links(corpus, tmp_path):
    from xattn.data.prepare import prepare

    without = [o for o in overrides(corpus, 2, 1.0) if not o.startswith("data.train_links")]
    with pytest.raises(ConfigError, match=r"^alignment.weight: 1 needs the links of the training pairs"):
        load_config(None, without)
    prepare(load_config(None, without[:-2]).data, tmp_path / "prepared", workers=1)  # no links, no alignment
    with pytest.raises(xattn.XattnError, match=r"^alignment.weight: 1, but the training corpus .* has no alignment links"):
        train(load_config(None, [*without, f"data.prepared={tmp_path / 'prepared'}"]), tmp_path / "run", quiet=True)


def test_a_fine_tuned_child_learns_links_too(corpus, tmp_path):
    separate = ["data.joint_vocab=false", "model.share_embeddings=false", "model.tie_output=false"]
    parent = tmp_path / "parent"
    train(load_config(None, overrides(corpus, 2, 0.0, *separate)), parent, quiet=True)
    child_files = tmp_path / "nl"
    child_files.mkdir()
    dutch = {"haus": "huis", "katze": "kat", "hund": "hond", "baum": "boom", "auto": "auto", "schnell": "snel",
             "rot": "rood", "blau": "blauw", "gross": "groot", "klein": "klein", "alt": "oud", "neu": "nieuw"}
    for split in ("train", "valid"):
        lines = (corpus / f"{split}.de").read_text().splitlines()
        write(child_files, f"{split}.de", [" ".join(dutch[w] for w in line.split()) for line in lines])
        for ext in ("en", "links"):
            (child_files / f"{split}.{ext}").write_bytes((corpus / f"{split}.{ext}").read_bytes())
    config = tmp_path / "child.yaml"
    config.write_text(yaml.safe_dump({"data": {"src_lang": "nl"}}))
    args = ["finetune", "--parent", str(parent), "--strategy", "src+xattn", str(config), "--out", str(tmp_path / "child"),
            "--quiet", *[o for o in overrides(child_files, 3, 1.0) if not o.startswith("model.")], *separate[:1]]
    assert main(args) == 0
    records = [json.loads(line) for line in (tmp_path / "child" / "log.jsonl").read_text().splitlines()]
    assert all(r["alignment_loss"] > 0 for r in records if "loss" in r)
    child = xattn.load(tmp_path / "child")
    assert stored(tmp_path / "child", child.model.cfg).guided == 1.0


@pytest.mark.parametrize("beam", ["1", "3"])
def test_links_read_during_the_search_are_those_of_a_teacher_forced_pass(models, corpus, tmp_path, capsys, beam):
    model, (de, _, _) = str(models["guided"]), gold_and_pairs(corpus)
    source = write(tmp_path, "in.de", de[:30])
    assert main(["translate", model, "-i", source, "--alignment", "--beam", beam]) == 0
    texts, links = zip(*(line.split(" ||| ") for line in capsys.readouterr().out.splitlines()))
    assert main(["align", model, "--src", source, "--tgt", write(tmp_path, "out.en", list(texts))]) == 0
    assert list(links) == capsys.readouterr().out.splitlines()
    assert sum(len(line.split()) for line in links) > 60  # the translations are not empty
