"""The analysis verbs end to end on a tiny trained model: align, translate --alignment, heads align, diagnose."""
import json
import shutil

import pytest
import yaml

from xattn.analysis.alignment import parse_links
from xattn.cli.main import main

SRC = ["drei hundert vier", "eins", "zwei tausend sieben hundert elf", ""]
TGT = ["three hundred four", "one", "two thousand seven hundred eleven", ""]


@pytest.fixture(scope="module")
def work(tmp_path_factory, numbers_model):
    root = tmp_path_factory.mktemp("analysis")
    shutil.copytree(numbers_model, root / "model")
    shutil.copytree(numbers_model, root / "reverse")  # the same weights, labelled as the other direction
    cfg = yaml.safe_load((root / "reverse" / "config.yaml").read_text())
    cfg["data"]["src_lang"], cfg["data"]["tgt_lang"] = cfg["data"]["tgt_lang"], cfg["data"]["src_lang"]
    (root / "reverse" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (root / "src.txt").write_text("".join(f"{s}\n" for s in SRC))
    (root / "tgt.txt").write_text("".join(f"{t}\n" for t in TGT))
    (root / "pairs.txt").write_text("".join(f"{s} ||| {t}\n" for s, t in zip(SRC, TGT)))
    (root / "pairs-reversed.txt").write_text("".join(f"{t} ||| {s}\n" for s, t in zip(SRC, TGT)))
    # gold: the diagonal, written with 1-based indices
    (root / "gold.txt").write_text("".join(" ".join(f"{k + 1}-{k + 1}" for k in range(len(s.split()))) + "\n"
                                           for s in SRC))
    return root


def run(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def links(out: str) -> list[set]:
    return [parse_links(line)[0] for line in out.splitlines()]


def test_align_src_tgt_pairs_and_reverse(work, capsys):
    code, out, _ = run(capsys, "align", work / "model", "--src", work / "src.txt", "--tgt", work / "tgt.txt")
    assert code == 0
    result = links(out)
    assert len(result) == len(SRC) and result[3] == set()
    for (s, t), pair_links in zip(zip(SRC, TGT), result):
        assert pair_links and all(i < len(s.split()) and j < len(t.split()) for i, j in pair_links) or not s
        assert {j for _, j in pair_links} == set(range(len(t.split())))  # argmax: one link per target word
    assert run(capsys, "align", work / "model", "--pairs", work / "pairs.txt")[1] == out
    # the first side is the model's target: the same model reading, links still index the first side first
    code, reversed_out, _ = run(capsys, "align", work / "model", "--pairs", work / "pairs-reversed.txt", "--reverse")
    assert [{(j, i) for i, j in x} for x in links(reversed_out)] == result


def test_align_methods_heads_threshold_and_symmetrisation(work, capsys):
    base = ["align", work / "model", "--pairs", work / "pairs.txt"]
    naive = links(run(capsys, *base, "--method", "naive")[1])
    head = links(run(capsys, *base, "--layer", "0", "--heads", "1")[1])
    low = links(run(capsys, *base, "--threshold", "0.01")[1])
    assert all(len(x) >= len(y) for x, y in zip(low, naive))  # a low threshold keeps more links
    assert len(naive) == len(head) == len(SRC)
    sym = {m: links(run(capsys, *base, "--backward", work / "reverse", "--sym", m)[1])
           for m in ("intersect", "grow-diag-final", "union")}
    forward = links(run(capsys, *base)[1])
    for k in range(len(SRC)):
        assert sym["intersect"][k] <= forward[k] <= sym["union"][k]
        assert sym["intersect"][k] <= sym["grow-diag-final"][k] <= sym["union"][k]
    assert sym["intersect"] != sym["union"], "the backward model's links took no part"  # (they had been dropped)


def test_translate_alignment_every_strategy(work, capsys):
    for flags in ([], ["--beam", "2", "--n-best", "2"], ["--sample", "--num-samples", "2", "--seed", "3"]):
        code, out, _ = run(capsys, "translate", work / "model", "-i", work / "src.txt", "--alignment", *flags)
        assert code == 0
        for line in out.splitlines():
            parts = line.split(" ||| ")
            index = int(parts[0]) if len(parts) == 4 else None
            text, pharaoh = parts[-3 if index is not None else 0], parts[-1]
            source = SRC[index] if index is not None else None
            for i, j in parse_links(pharaoh)[0]:
                assert j < len(text.split())
                assert source is None or i < len(source.split())
        lines = out.splitlines()
        if flags:  # two per sentence (the empty sentence: one empty translation under beam search)
            assert [int(x.split(" ||| ")[0]) for x in lines if not x.startswith("3 ")] == [0, 0, 1, 1, 2, 2]
        else:
            assert len(lines) == len(SRC)


def test_translate_freezes_the_loaded_model_for_the_garbage_collector_and_thaws_it_after(work, capsys, monkeypatch):
    """translate takes what it loaded out of the cyclic collector's walks while it translates (a full collection
    would otherwise walk the model every few batches), and gives it back when the command ends."""
    import gc

    from xattn.translator import Translator

    frozen_while_translating = []
    translate = Translator.translate

    def spy(self, *args, **kwargs):
        frozen_while_translating.append(gc.get_freeze_count())
        return translate(self, *args, **kwargs)
    monkeypatch.setattr("xattn.translator.Translator.translate", spy)
    code, _, _ = run(capsys, "translate", work / "model", "-i", work / "src.txt", "--alignment")
    assert code == 0 and frozen_while_translating and min(frozen_while_translating) > 10_000  # objects
    assert gc.get_freeze_count() == 0


def test_heads_align_stores_the_choice_that_align_uses(work, capsys, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(work / "model", model)
    code, out, _ = run(capsys, "heads", "align", model, "--pairs", work / "pairs.txt", "--gold", work / "gold.txt",
                       "--gold-one-indexed", "--table", tmp_path / "rank.jsonl")
    assert code == 0 and "stored" in out
    ranking = [json.loads(line) for line in (tmp_path / "rank.jsonl").read_text().splitlines()]
    assert len(ranking) == 2 * (1 + 2)  # two methods x (the layer mean + 2 heads)
    assert ranking == sorted(ranking, key=lambda r: r["aer"])
    record = yaml.safe_load((model / "analysis.yaml").read_text())["alignment"]
    assert (record["method"], record["layer"], record["heads"]) == (ranking[0]["method"], 0, ranking[0]["heads"])
    # align reads the stored choice: the same links as naming it on the command line
    heads = "mean" if record["heads"] == "mean" else ",".join(map(str, record["heads"]))
    stored = run(capsys, "align", model, "--pairs", work / "pairs.txt")[1]
    named = run(capsys, "align", model, "--pairs", work / "pairs.txt", "--method", record["method"],
                "--layer", "0", "--heads", heads)[1]
    assert stored == named
    # new weights: the stored choice no longer applies, with a warning
    (model / "model.safetensors").write_bytes((work / "model" / "model.safetensors").read_bytes())
    text = (model / "analysis.yaml").read_text().replace(record["weights"], "f" * 64)
    (model / "analysis.yaml").write_text(text)
    code, _, err = run(capsys, "align", model, "--pairs", work / "pairs.txt")
    assert code == 0 and "measured on other weights; ignored" in err


def test_diagnose_json_lines(work, capsys):
    code, out, err = run(capsys, "diagnose", work / "model", "--src", work / "src.txt", "--ref", work / "tgt.txt")
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 4]
    assert all(len(r["coverage"]) == len(s.split()) and "chrf" in r for r, s in zip(records, SRC))
    summary = json.loads(err.strip().splitlines()[-1])["summary"]
    assert summary["sentences"] == 4
    code, out, _ = run(capsys, "diagnose", work / "model", "--src", work / "src.txt", "--hyp", work / "tgt.txt")
    assert code == 0 and [json.loads(x)["translation"] for x in out.splitlines()] == TGT
    (work / "empty.txt").write_text("")  # an empty report, exit 0, read as nothing flagged; evaluate refuses one
    code, out, err = run(capsys, "diagnose", work / "model", "--src", work / "empty.txt")
    assert (code, out, err) == (2, "", f"xattn diagnose: error: {work / 'empty.txt'}: no lines to diagnose\n")


MAGIC = {".png": b"\x89PNG", ".svg": b"<?xml", ".pdf": b"%PDF"}


@pytest.mark.parametrize("kind", ["cross", "decoder-self", "encoder-self"])
def test_attention_files(work, capsys, kind):
    for ext, magic in MAGIC.items():
        out = work / f"{kind}{ext}"
        for extra in ([], ["--words"], ["--grid"], ["--reference", "three hundred four"]):
            assert run(capsys, "attention", work / "model", "drei hundert vier", "-o", out, "--kind", kind, *extra)[0] == 0
            assert out.read_bytes().startswith(magic)
    page = work / f"{kind}.html"
    assert run(capsys, "attention", work / "model", "drei hundert vier", "-o", page, "--kind", kind, "--words",
               "--beam", "2")[0] == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "drei" in text
    heading = text.split('<h1 id="xa-title">')[1].split("</h1>")[0]  # the pickers choose the layer and head
    assert heading.split("\n")[1].startswith("drei hundert vier \u2192 ") and "layer" not in heading


def test_links_are_outlined_unless_the_source_has_one_word(work, capsys):
    import re

    def outlined(sentence: str, *flags) -> int:
        page = work / "links.html"
        assert run(capsys, "attention", work / "model", sentence, "-o", page, *flags)[0] == 0
        data = re.search(r'<script type="application/json" id="xa-data">(.*?)</script>', page.read_text(), re.S)[1]
        return len(json.loads(data)["views"][0]["links"])

    assert outlined("drei hundert vier") > 0
    assert outlined("drei hundert vier", "--no-links") == 0
    assert outlined("siebenhundertdrei") == 0  # every target word would be linked to it: nothing to say
    assert outlined("siebenhundertdrei", "--words") == 0


@pytest.mark.parametrize("argv, message", [
    (["attention", "{m}", "eins", "-o", "{w}/x.txt"], "the extension must be one of .png, .svg, .pdf, .html"),
    (["attention", "{m}", "eins", "-o", "{w}/x.html", "--grid"], "--grid applies to .png"),
    (["attention", "{m}", "eins", "-o", "{w}/x.png", "--grid", "--layer", "0"], "leave out --layer"),
    (["attention", "{m}", " ", "-o", "{w}/x.png"], "the sentence is empty"),
    (["attention", "{m}", "eins", "--reference", " ", "-o", "{w}/x.png"], "--reference is empty (it has no words)"),
    (["aer", "--gold", "{w}/empty.txt", "--hyp", "{w}/empty.txt"], "empty.txt: no lines to score"),
    (["attention", "{m}", "eins", "-o", "{w}/x.png", "--layer", "2"], "layer 2 is not a layer"),
    (["attention", "{m}", "eins", "-o", "{w}/x.png", "--heads", ""], "--heads: expected 'mean' or head numbers"),
    (["align", "{m}", "--pairs", "{w}/pairs.txt", "--heads", ""], "--heads: expected 'mean' or head numbers"),
    (["translate", "{m}", "-i", "{w}/src.txt", "--layer", "0", "--eos", "keep"], "--layer, --eos: apply to --alignment only"),
    (["heads", "align", "{m}", "--pairs", "{w}/pairs.txt", "--gold", "{w}/empty-gold.txt"], "no sure links"),
    (["heads", "align", "{m}", "--pairs", "{w}/pairs.txt", "--gold", "{w}/short.txt", "--first", "1"],
     "line counts differ"),
    (["heads", "align", "{m}", "--pairs", "{w}/pairs.txt", "--gold", "{w}/gold.txt", "--max-tokens", "0"],
     "--max-tokens: must be >= 1"),
    (["attention", "{m}", "eins", "-o", "{w}/x.png", "--beam", "0"], "--beam"),
    (["align", "{m}", "--src", "{w}/src.txt", "--tgt", "{w}/short.txt"], "line counts differ"),
    (["align", "{m}", "--pairs", "{w}/bad-pairs.txt"], "bad-pairs.txt: line 2: expected 'source ||| target'"),
    (["align", "{m}", "--src", "{w}/src.txt"], "give the sentence pairs"),
    (["align", "{m}", "--src", "{w}/src.txt", "--tgt", "{w}/tgt.txt", "--reverse"], "--reverse applies to --pairs"),
    (["align", "{m}", "--pairs", "{w}/pairs.txt", "--layer", "3"], "--layer: layer 3 is not a layer of this model (0 to 0)"),
    (["align", "{m}", "--pairs", "{w}/pairs.txt", "--heads", "0,x"], "--heads: expected 'mean' or head numbers"),
    (["align", "{m}", "--pairs", "{w}/pairs.txt", "--heads", "5"], "--heads: layer 0 has no head 5 (its cross-attention heads: 0 to 1)"),
    (["align", "{m}", "--pairs", "{w}/pairs.txt", "--threshold", "0"], "--threshold: must be in (0, 1]"),
    (["align", "{m}", "--pairs", "{w}/pairs.txt", "--backward", "{m}"], "--backward and --sym go together"),
    (["align", "{m}", "--pairs", "{w}/pairs.txt", "--backward", "{m}", "--sym", "union"],
     "translates de->en, but the reverse of"),
    (["align", "{w}/src.txt", "--pairs", "{w}/pairs.txt"], "not a model directory"),
    (["align", "{w}", "--pairs", "{w}/pairs.txt"], "not a model directory"),
    (["align", "{m}", "--pairs", "{w}/pairs.txt", "--max-tokens", "0"], "--max-tokens: must be >= 1"),
    (["translate", "{m}", "-i", "{w}/src.txt", "--alignment", "--layer", "1"], "--layer: layer 1 is not a layer"),
    (["attention", "{m}", "eins", "-o", "{w}/x.html", "--heads", "7"], "--heads: layer 0 has no head 7"),  # (no flag)
    (["diagnose", "{m}", "--src", "{w}/src.txt", "--layer", "4"], "--layer: layer 4 is not a layer"),
    (["heads", "align", "{m}", "--pairs", "{w}/pairs.txt", "--gold", "{w}/bad-gold.txt"], "bad-gold.txt: line 1"),
    (["heads", "align", "{m}", "--pairs", "{w}/pairs.txt", "--gold", "{w}/gold.txt"], "beyond"),
    (["heads", "align", "{m}", "--pairs", "{w}/pairs.txt", "--gold", "{w}/short.txt"], "line counts differ"),
    (["heads"], "the following arguments are required: SUBCOMMAND"),
    (["diagnose", "{m}", "--src", "{w}/src.txt", "--ref", "{w}/short.txt"], "line counts differ"),
    (["diagnose", "{m}", "--src", "{w}/src.txt", "--under", "-1"], "--under: must be >= 0"),
    (["diagnose", "{m}", "--src", "{w}/src.txt", "--detached", "inf"], "--detached: must be a finite number in [0, 1), got inf"),
    (["diagnose", "{m}", "--src", "{w}/src.txt", "--over", "nan"], "--over: must be a finite number >= 0, got nan"),
])
def test_errors_are_one_line(work, capsys, argv, message):
    (work / "short.txt").write_text("one\n")
    (work / "bad-pairs.txt").write_text("a ||| b\nno separator\n")
    (work / "bad-gold.txt").write_text("1-x\n\n\n\n")
    (work / "empty-gold.txt").write_text("\n\n\n\n")
    (work / "empty.txt").write_text("")
    argv = [a.format(m=work / "model", w=work) for a in argv]
    before = {p: p.read_bytes() for p in work.rglob("*") if p.is_file()}
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert {p: p.read_bytes() for p in work.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("content, message", [
    (b"- a list\n", "expected sections such as `alignment:`"),
    (b"alignment: {layer: 7, heads: mean, method: shift}\n", "alignment: layer 7 is not a layer of this model"),
    (b"alignment: {layer: 0, heads: [0], method: sideways}\n", "alignment.method: 'sideways' is not one of"),
    (b"alignment: {layer: 0, heads: [], method: naive}\n", "alignment.heads: expected 'mean' or distinct head numbers"),
    (b"alignment: {layer: 1.5, heads: mean, method: naive}\n", "alignment.layer: expected int, got 1.5"),
    (b"alignment: {layer: 0, heads: [0, 0], method: naive}\n", "alignment.heads: expected 'mean' or distinct"),
    (b"alignment: {layer: 0, heads: [9], method: naive}\n", "alignment: layer 0 has no head 9"),
    (b"alignment: {layer: 0, heads: mean, method: naive, threshold: .inf}\n", "alignment.threshold: must be a finite number in"),
    (b"alignment: {layer: 0, heads: mean, method: naive, layers: 2}\n", "unknown key alignment.layers"),
    (b"alignment: {layer: 0, heads: mean}\n", "alignment.method: missing"),
    (b"alignment: {layer: 0, layer: 1, heads: mean, method: naive}\n", "line 1: invalid YAML ('layer' is given twice)"),
    (b"alignment: [0, mean]\n", "alignment: expected a mapping with the keys layer, heads"),
    (b"alignment: {[layer]: 0, heads: mean}\n", "line 1: invalid YAML (a list or mapping cannot be a key)"),
    (b"{alignment: 1}: {layer: 0}\n", "line 1: invalid YAML (a list or mapping cannot be a key)"),
    (b"\xff\xfe\n", "not UTF-8"),
])
def test_a_damaged_analysis_file_is_one_line(work, capsys, tmp_path, content, message):
    model = tmp_path / "model"
    shutil.copytree(work / "model", model)
    (model / "analysis.yaml").write_bytes(content)
    code, _, err = run(capsys, "align", model, "--pairs", work / "pairs.txt")
    assert code == 2 and "analysis.yaml" in err and message in err and len(err.strip().splitlines()) == 1


def test_stored_rules_are_used_and_other_sections_kept(work, capsys, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(work / "model", model)
    (model / "analysis.yaml").write_text("pruning: {note: kept}\n")  # a section of another tool
    assert run(capsys, "align", model, "--pairs", work / "pairs.txt")[0] == 0  # no alignment record: defaults
    run(capsys, "heads", "align", model, "--pairs", work / "pairs.txt", "--gold", work / "gold.txt",
        "--gold-one-indexed", "--eos", "keep", "--punct", "match")
    data = yaml.safe_load((model / "analysis.yaml").read_text())
    assert data["pruning"] == {"note": "kept"} and data["alignment"]["eos"] == "keep"
    record = data["alignment"]
    heads = "mean" if record["heads"] == "mean" else ",".join(map(str, record["heads"]))
    stored = run(capsys, "align", model, "--pairs", work / "pairs.txt")[1]
    named = run(capsys, "align", model, "--pairs", work / "pairs.txt", "--method", record["method"], "--layer", "0",
                "--heads", heads, "--eos", "keep", "--punct", "match")[1]
    assert stored == named


def test_the_view_opens_on_the_layer_its_links_come_from(tmp_path, capsys):
    """The HTML view (and a figure) opened on the last layer while the links drawn on it came from the alignment
    layer (the second-to-last by default): red outlines on cells of a map they were not read from."""
    import re

    from tests.conftest import tiny_model_dir

    tiny_model_dir(tmp_path / "model", n_decoder_layers=3)

    def initial(*flags) -> tuple[int, int | None]:
        page = tmp_path / "x.html"
        assert run(capsys, "attention", tmp_path / "model", "word1 word2 word3", "-o", page, *flags)[0] == 0
        data = json.loads(re.search(r'<script type="application/json" id="xa-data">(.*?)</script>',
                                    page.read_text(), re.S)[1])
        return data["initial"]["layer"], data["views"][0]["linksLayer"]

    assert initial() == (1, 1)  # the links' layer (the second-to-last: the alignment default)
    assert initial("--no-links") == (2, None)  # no links: the last layer, as before
    assert initial("--layer", "0") == (0, 1)  # asked for: that layer, the links' still named


def test_a_misspelt_alignment_section_is_refused_and_other_tools_sections_are_kept(tmp_path):
    """A section that reads as a misspelt `alignment` where there is none was silently unread; other tools'
    sections, and ones beside an `alignment` section, are kept."""
    from xattn.analysis import choice
    from xattn.errors import XattnError

    record = {"layer": 0, "heads": "mean", "method": "naive"}
    for sections in ({"alignment": record, "alignment_old": record}, {"alignment": record, "alignments": record},
                     {"assignment": {"who": "me"}}, {"pruning": {"note": "kept"}}):
        (tmp_path / "analysis.yaml").write_text(yaml.safe_dump(sections))
        assert choice.read(tmp_path) == sections
    for misspelt in ("alignmnet", "Alignment", "alignments"):
        (tmp_path / "analysis.yaml").write_text(yaml.safe_dump({misspelt: record}))
        with pytest.raises(XattnError, match=f"unknown section '{misspelt}' \\(did you mean 'alignment'\\?\\)"):
            choice.read(tmp_path)
