"""Head masks, head importance (Michel et al. 2019; Voita et al. 2019) and physical pruning."""
import numpy as np
import pytest
import torch

import xattn
from tests.conftest import tiny_config
from xattn.analysis.importance import confidence_scores, gradient_scores, head_importance
from xattn.analysis.pruning import mask_of_removal, prune_model, read_head_mask, removal_of_mask
from xattn.data import collate

SRC = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
TGT = torch.tensor([[1, 11, 12, 13], [1, 14, 15, 0]])
REMOVAL = {"enc_self": [[1, 3], []], "dec_self": [[], [0, 1, 2, 3]], "cross": [[2], [0, 3]]}


def _model(**overrides):
    torch.manual_seed(0)
    return xattn.Transformer(tiny_config(n_heads=4, **overrides)).eval()


CONFIGS = [dict(), dict(score="general"), dict(score="additive"), dict(norm="pre"),
           dict(attention={"enc_self": "gaussian", "dec_self": "gaussian", "cross": ["gaussian", "learned"]})]


@pytest.mark.parametrize("overrides", CONFIGS, ids=str)
def test_a_mask_of_ones_changes_nothing(overrides):
    model = _model(**overrides)
    with torch.no_grad():
        plain = model(SRC, TGT, need_weights=True)
        ones = {place: [torch.ones(4), torch.ones(4)] for place in ("enc_self", "dec_self", "cross")}
        masked = model(SRC, TGT, need_weights=True, head_mask=ones)
    torch.testing.assert_close(masked.logits, plain.logits, rtol=0, atol=0)
    torch.testing.assert_close(masked.cross_attn[1], plain.cross_attn[1], rtol=0, atol=0)


@pytest.mark.parametrize("overrides", CONFIGS, ids=str)
def test_zeroing_heads_equals_removing_them(overrides):
    model = _model(**overrides)
    pruned = prune_model(model, REMOVAL)
    assert pruned.cfg.heads == {"enc_self": [2, 4], "dec_self": [4, 0], "cross": [3, 2]}
    assert [n for n, _ in pruned.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert pruned.decoder.layers[1].cross_attn.q_proj.weight.shape[0] == 2 * model.cfg.head_dim
    mask = mask_of_removal(model.cfg, REMOVAL)
    with torch.no_grad():
        masked, small = model(SRC, TGT, head_mask=mask), pruned(SRC, TGT, need_weights=True)
    torch.testing.assert_close(small.logits, masked.logits, atol=1e-5, rtol=1e-5)
    assert small.cross_attn[1].shape[1] == 2
    from xattn.decoding import search

    with torch.no_grad():  # beam search, cached: the same translations
        a, b = (search(m, SRC, xattn.DecodeConfig(beam_size=3), head_mask=k) for m, k in ((model, mask), (pruned, None)))
    assert [[h.tokens for h in n_best] for n_best in a] == [[h.tokens for h in n_best] for n_best in b]


@pytest.mark.parametrize("removal", [REMOVAL, {"cross": [[], [0, 1, 2, 3]]}], ids=["some heads", "the last layer"])
def test_a_mask_and_the_model_pruned_by_it_score_the_coverage_alike(removal):
    """The coverage penalty averaged every head of the last layer, those a mask switched off too (the probe: 99 of 100
    translations differed from the pruned model's with --coverage-penalty 1, none without it)."""
    from xattn.decoding import search

    model = _model()
    with torch.no_grad():  # heads that look at different words (a random model's spread their weight evenly)
        for layer in model.decoder.layers:
            layer.cross_attn.q_proj.weight.mul_(30)
    pruned, mask = prune_model(model, removal), mask_of_removal(model.cfg, removal)
    cfg = xattn.DecodeConfig(beam_size=3, n_best=3, coverage_penalty=2.0)
    with torch.no_grad():
        a, b = (search(m, SRC, cfg, head_mask=k) for m, k in ((model, mask), (pruned, None)))
    assert [[h.tokens for h in n] for n in a] == [[h.tokens for h in n] for n in b]
    np.testing.assert_allclose([[h.score for h in n] for n in a], [[h.score for h in n] for n in b], atol=1e-4)
    half = {"cross": [None, torch.tensor([1.0, 1.0, 0.5, 0.0])]}  # a factor between weighs its head by it
    from xattn.decoding.beam import coverage_reading
    layer, weights = coverage_reading(model.cfg, half)
    assert layer == 1 and weights.tolist() == pytest.approx([0.4, 0.4, 0.2, 0.0])
    # the model takes any finite factor (a gradient check's): a negative one weighs nothing, never a sum of 0
    assert coverage_reading(model.cfg, {"cross": [None, torch.tensor([1.0, -1.0, 0.0, 0.0])]})[1].tolist() == [1, 0, 0, 0]


@pytest.mark.parametrize("cross", [[3, 2], [0, 3], [4, 0]])
def test_search_tracks_the_attention_of_a_pruned_model_and_reads_coverage_where_there_are_heads(cross):
    from xattn.decoding.beam import coverage_reading
    from xattn.decoding import search

    model = prune_model(_model(), {"cross": [list(range(4 - n)) for n in cross]})
    assert model.cfg.heads_per_layer("cross") == cross
    with torch.no_grad():
        for cfg in (xattn.DecodeConfig(beam_size=3), xattn.DecodeConfig(beam_size=1)):
            hyp = search(model, SRC, cfg, need_attention=True)[0][0]
            assert hyp.cross_attention.shape[:2] == (2, max(cross))  # (L, H, T, S), NaN for the heads a layer lacks
            assert [int((~hyp.cross_attention[layer].isnan().all(-1).all(-1)).sum()) for layer in range(2)] == cross
        covered = search(model, SRC, xattn.DecodeConfig(beam_size=3, coverage_penalty=0.5))
    assert coverage_reading(model.cfg) == (1 if cross[1] else 0, None)
    assert all(np.isfinite(n_best[0].score) for n_best in covered)
    with pytest.raises(xattn.XattnError, match="coverage_penalty: every cross-attention head of this model was pruned"):
        coverage_reading(prune_model(_model(), {"cross": [[0, 1, 2, 3], [0, 1, 2, 3]]}).cfg)
    with pytest.raises(xattn.XattnError, match="pruned, or is masked to 0"):
        coverage_reading(model.cfg, {"cross": [torch.zeros(n) for n in cross]})


def test_a_pruned_model_saves_reloads_and_prunes_again(tmp_path):
    from tests.conftest import tiny_model_dir
    from xattn.analysis.pruning import prune_dir
    from xattn.checkpoint import load_model_dir

    model, _ = tiny_model_dir(tmp_path / "m")
    H = model.cfg.n_heads
    removal = {"cross": [[0]], "enc_self": [list(range(H))]}
    pruned = prune_dir(tmp_path / "m", removal, tmp_path / "p")
    loaded = load_model_dir(tmp_path / "p")
    assert loaded.config.model.heads == {"cross": H - 1, "enc_self": 0}
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(SRC[:, :3], TGT).logits, pruned(SRC[:, :3], TGT).logits)
    again = prune_model(loaded.model, {"cross": [[0]]})
    assert again.cfg.heads == {"cross": H - 2, "enc_self": 0}
    out = xattn.load(tmp_path / "p").translate(["word1 word2"], xattn.DecodeConfig(beam_size=2))
    assert len(out) == 1


def test_importance_gradient_agrees_with_finite_differences():
    torch.manual_seed(0)
    model = xattn.Transformer(tiny_config(n_heads=4)).double().eval()
    batch = collate([[5, 6, 7], [9, 10]], [[11, 12, 13], [14, 15]], [0, 1])
    scores = gradient_scores(model, [batch], normalise=False)

    def loss(place, layer, head, delta):
        mask = {p: [torch.ones(4, dtype=torch.float64) for _ in range(2)] for p in ("enc_self", "dec_self", "cross")}
        mask[place][layer][head] += delta
        with torch.no_grad():
            logits = model(batch.src, batch.tgt_in, head_mask=mask).logits
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0,
                                                reduction="sum")  # in float64, for the finite difference
        return float(nll) / batch.n_tgt_tokens

    eps = 1e-5
    for place, layer, head in (("enc_self", 0, 1), ("dec_self", 1, 2), ("cross", 0, 0), ("cross", 1, 2)):
        numeric = (loss(place, layer, head, eps) - loss(place, layer, head, -eps)) / (2 * eps)
        assert scores[place][layer][head].item() == pytest.approx(abs(numeric), rel=1e-4, abs=1e-8)
    normalised = gradient_scores(model, [batch])
    for place in normalised:
        for layer in normalised[place]:
            assert float(layer.norm()) == pytest.approx(1.0)


def test_confidence_is_the_mean_largest_weight():
    model = _model()
    batch = collate([[5, 6, 7, 8], [9, 10]], [[11, 12, 13], [14]], [0, 1])
    scores = confidence_scores(model, [batch])
    with torch.no_grad():
        out = model(batch.src, batch.tgt_in, need_weights=True)
    real = batch.tgt_in.ne(0)
    top = out.cross_attn[1].amax(-1)  # (B, H, T)
    expected = torch.stack([top[:, h][real].mean() for h in range(4)])
    torch.testing.assert_close(scores["cross"][1], expected)
    rows = head_importance(model, [batch], "confidence")
    assert len(rows) == 3 * 2 * 4 and all(0 < r["score"] <= 1 for r in rows)


@pytest.mark.parametrize("text, message", [
    ("cros: [[1, 1, 1, 1], null]", "unknown key cros (did you mean 'cross'?)"),
    ("cross: [[1, 1, 1, 1]]", "cross: expected a list of 2 layers"),
    ("cross: [[1, 1, 1], null]", "cross layer 0: expected 4 factors"),
    ("cross: [[1, 1, 2, 1], null]", "cross[0][2]: must be in [0, 1], got 2"),  # layer 0, head 2 (it named neither)
    ("cross: [[1, true, 1, 1], null]", "cross[0][1]: expected float, got True"),
    ("cross: [null, [1, 1, abc, 1]]", "cross[1][2]: expected float, got 'abc'"),
    ("cross: [[1, .nan, 1, 1], null]", "cross[0][1]: must be a finite number in [0, 1], got nan"),
    ("cross: {0: [1, 1, 1, 1]}", "cross: expected a list of a list of float"),
    ("[1, 2]", "expected a mapping with the keys enc_self, dec_self, cross"),
    ("", "expected a mapping with the keys enc_self, dec_self, cross"),
    ("cross: [[1, 0, 1, 1], null]\ncross: [null, null]\n", "line 2: invalid YAML ('cross' is given twice)"),
    (None, "is a directory, not a file"),
])
def test_bad_mask_files_are_one_line(tmp_path, text, message):
    path = tmp_path / "mask.yaml"
    path.write_text(text) if text is not None else path.mkdir()
    with pytest.raises(xattn.XattnError) as e:
        read_head_mask(path, tiny_config(n_heads=4))
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_pruning_mask_holds_zeros_and_ones_only(tmp_path):
    path = tmp_path / "mask.yaml"
    path.write_text("cross: [[1, 0, 1, 1], null]\n")
    cfg = tiny_config(n_heads=4)
    assert removal_of_mask(read_head_mask(path, cfg), str(path)) == {"cross": [[1], []]}
    path.write_text("cross: [[1, 0.5, 1, 1], null]\n")
    with pytest.raises(xattn.XattnError, match="pruning needs factors of 0"):
        removal_of_mask(read_head_mask(path, cfg), str(path))


# ------------------------------------------------------------------------------------------- CLI

@pytest.fixture(scope="module")
def four_heads(tmp_path_factory):
    """A numbers model with 4 heads per attention and 2 decoder layers, trained for 3 steps."""
    from tests.conftest import NUMBERS_TINY
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.training import train

    out = tmp_path_factory.mktemp("heads") / "model"
    train(load_config(resolve_config("numbers-de-en"), NUMBERS_TINY + ["model.n_heads=4", "model.n_decoder_layers=2",
                                                                        "train.max_steps=3"]), out, quiet=True)
    return out


def cli(capsys, *argv):
    from xattn.cli.main import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_importance_then_prune_then_translate_like_the_masked_model(four_heads, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(four_heads, model)
    code, out, _ = cli(capsys, "heads", "importance", model, "--sentences", "20")
    lines = out.splitlines()
    from xattn.checkpoint import weights_id

    assert code == 0 and lines[:3] == [f"# weights: {weights_id(model)}", "# method: gradient", "layer\tplace\thead\tscore"]
    assert len(lines) == 3 + 4 * (1 + 2 + 2)
    assert (model / "head_importance.tsv").read_text().splitlines() == lines
    code, out, _ = cli(capsys, "heads", "importance", model, "--method", "confidence", "-o", tmp_path / "c.tsv")
    assert code == 0 and (tmp_path / "c.tsv").is_file()
    code, _, err = cli(capsys, "prune", model, "--fraction", "0.5", "--places", "cross", "--out", tmp_path / "p")
    assert code == 0 and "removed 4 heads" in err
    import yaml

    heads = yaml.safe_load((tmp_path / "p" / "config.yaml").read_text())["model"]["heads"]
    assert set(heads) == {"cross"} and sum(heads["cross"] if isinstance(heads["cross"], list) else [heads["cross"]] * 2) == 4
    # the removed heads as a mask file: translating under it equals translating with the pruned model
    from xattn.analysis.importance import read_table
    from xattn.analysis.pruning import least_important

    cfg = xattn.load(model).model.cfg
    removal = least_important(cfg, read_table(model / "head_importance.tsv"), ["cross"], 0.5, "t")
    rows = [[0 if h in removal["cross"][i] else 1 for h in range(4)] for i in range(2)]
    (tmp_path / "mask.yaml").write_text(yaml.safe_dump({"cross": rows}))
    (tmp_path / "in.txt").write_text("drei\nsieben hundert zwei\nneun\n")
    code, masked, _ = cli(capsys, "translate", model, "-i", tmp_path / "in.txt", "--head-mask", tmp_path / "mask.yaml")
    code2, small, _ = cli(capsys, "translate", tmp_path / "p", "-i", tmp_path / "in.txt")
    assert code == code2 == 0 and masked == small
    code, _, _ = cli(capsys, "prune", model, "--heads", tmp_path / "mask.yaml", "--out", tmp_path / "p2")
    assert code == 0
    from xattn.checkpoint import read_weights

    by_fraction, by_mask = (read_weights(tmp_path / d / "model.safetensors") for d in ("p", "p2"))
    assert by_fraction[1] == by_mask[1]  # the same fingerprint: config, tokenizers and tensors
    code, out, _ = cli(capsys, "evaluate", model, "--split", "val", "--head-mask", tmp_path / "mask.yaml", "--json")
    assert code == 0


@pytest.mark.parametrize("args, message", [
    (["--fraction", "1.5", "--out", "{tmp}/x"], "--fraction: must be in [0, 1]"),
    (["--fraction", "0.5", "--places", "crosss", "--out", "{tmp}/x"], "--places: 'crosss' is not a place"),
    (["--fraction", "0.5", "--importance", "{tmp}/none.tsv", "--out", "{tmp}/x"], "no importance table"),
    (["--fraction", "0.5", "--importance", "{tmp}/bad.tsv", "--out", "{tmp}/x"], "bad.tsv: line 4: head: expected int"),
    (["--fraction", "0.5", "--importance", "{tmp}/twice.tsv", "--out", "{tmp}/x"],
     "twice.tsv: line 5: cross layer 0 head 1 is given twice (first on line 4)"),
    (["--fraction", "0.5", "--importance", "{tmp}/other.tsv", "--out", "{tmp}/x"],
     "other.tsv: measured on other weights than this model's"),
    (["--fraction", "0.5", "--importance", "{tmp}/unnamed.tsv", "--out", "{tmp}/x"],
     "unnamed.tsv: does not name the weights it was measured on"),
    (["--fraction", "0.5", "--importance", "{tmp}/nan.tsv", "--out", "{tmp}/x"],
     "nan.tsv: line 4: score: must be a finite number, got nan"),
    (["--fraction", "0.5", "--importance", "{tmp}/short.tsv", "--out", "{tmp}/x"],
     "short.tsv: line 4: expected 4 tab-separated values"),
    (["--fraction", "0.5", "--heads", "{tmp}/m.yaml", "--out", "{tmp}/x"], "not allowed with argument"),
    (["--fraction", "0.5", "--places", " ,", "--out", "{tmp}/x"], "--places: names no place"),
    (["--heads", "{tmp}/m.yaml", "--places", "cross", "--out", "{tmp}/x"], "--places: only with --fraction"),
    (["--heads", "{tmp}/m.yaml", "--importance", "{tmp}/bad.tsv", "--out", "{tmp}/x"], "--importance: only with"),
])
def test_prune_errors_are_one_line(four_heads, tmp_path, capsys, args, message):
    from xattn.checkpoint import weights_id

    top = f"# weights: {weights_id(four_heads)}\n# method: gradient\nlayer\tplace\thead\tscore\n"
    tables = {"bad": "0\tcross\tzero\t0.5\n", "twice": "0\tcross\t1\t0.5\n0\tcross\t1\t0.7\n",
              "nan": "0\tcross\t1\tnan\n", "short": "0\tcross\t1\n"}
    for name, rows in tables.items():
        (tmp_path / f"{name}.tsv").write_text(top + rows)
    (tmp_path / "other.tsv").write_text(top.replace(weights_id(four_heads), "0" * 64) + "0\tcross\t1\t0.5\n")
    (tmp_path / "unnamed.tsv").write_text("layer\tplace\thead\tscore\n0\tcross\t1\t0.5\n")
    code, _, err = cli(capsys, "prune", four_heads, *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


PRUNED = {"none": [0, 0], "first": [0, 3], "last": [4, 0]}
"""Cross-attention heads per decoder layer (of 4), as `xattn prune` leaves them: none at all, none in the first
layer and 3 in the second (heads renumbered 0 to 2), none in the last."""
SENTENCE = "word1 word2 word3"


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    from tests.conftest import tiny_model_dir

    root = tmp_path_factory.mktemp("pruned")
    for name, heads in PRUNED.items():
        tiny_model_dir(root / name, n_heads=4, n_decoder_layers=2, heads={"cross": heads})
    (root / "src.txt").write_text(SENTENCE + "\n")
    (root / "tgt.txt").write_text("word4 word5 word6\n")
    (root / "gold.txt").write_text("0-0 1-1 2-2\n")
    return root


FILES = ["--src", "{r}/src.txt"]
PAIRS = [*FILES, "--tgt", "{r}/tgt.txt"]
VIEWS = {  # every view and tool that reads the cross-attention's heads
    "png": ["attention", "{m}", SENTENCE, "-o", "{o}/a.png"],
    "svg, words": ["attention", "{m}", SENTENCE, "--words", "-o", "{o}/a.svg"],
    "pdf, grid": ["attention", "{m}", SENTENCE, "--grid", "-o", "{o}/a.pdf"],
    "html": ["attention", "{m}", SENTENCE, "-o", "{o}/a.html"],
    "html, no links": ["attention", "{m}", SENTENCE, "--no-links", "-o", "{o}/a.html"],
    "reference": ["attention", "{m}", SENTENCE, "--reference", "word4 word5", "-o", "{o}/a.png"],
    "align": ["align", "{m}", *PAIRS],
    "heads align": ["heads", "align", "{m}", *PAIRS, "--gold", "{r}/gold.txt", "--no-store"],
    "diagnose": ["diagnose", "{m}", *FILES],
    "translate --alignment": ["translate", "{m}", "-i", "{r}/src.txt", "--alignment", "--beam", "3"],
    "coverage penalty": ["translate", "{m}", "-i", "{r}/src.txt", "--beam", "3", "--coverage-penalty", "0.5"],
}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("model", PRUNED)
def test_every_view_works_on_pruned_layers_or_says_why_in_one_line(pruned, tmp_path, capsys, model, view):
    argv = [a.format(m=pruned / model, r=pruned, o=tmp_path) for a in VIEWS[view]]
    code, out, err = cli(capsys, *argv)
    if model != "none":
        assert code == 0, err
        assert all(p.stat().st_size > 0 for p in tmp_path.iterdir())
        return
    why = ("--coverage-penalty: every cross-attention head of this model was pruned" if view == "coverage penalty" else
           "this model has no cross-attention heads left (all pruned): there is no attention to read")
    assert code == 2 and why in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


def test_other_attention_of_a_model_without_cross_heads_is_drawn(pruned, tmp_path, capsys):
    for kind in ("decoder-self", "encoder-self"):
        code, _, err = cli(capsys, "attention", pruned / "none", SENTENCE, "--kind", kind, "--grid", "-o", tmp_path / "a.png")
        assert code == 0, err


@pytest.mark.parametrize("model, argv, message", [
    ("last", ["attention", "{m}", SENTENCE, "--layer", "1", "-o", "{o}/a.png"],
     "--layer: layer 1 has no cross-attention heads left (pruned); layers with heads: 0"),
    ("first", ["align", "{m}", *PAIRS, "--layer", "1", "--heads", "3"],
     "--heads: layer 1 has no head 3 (its cross-attention heads: 0 to 2)"),
    ("first", ["diagnose", "{m}", *FILES, "--layer", "0"],
     "--layer: layer 0 has no cross-attention heads left (pruned); layers with heads: 1"),
    ("first", ["translate", "{m}", "-i", "{r}/src.txt", "--alignment", "--heads", "3"], "--heads: layer 1 has no head 3"),
    ("last", ["attention", "{m}", SENTENCE, "--heads", "4", "-o", "{o}/a.html"],  # without --layer: layer 0
     "--heads: layer 0 has no head 4 (its cross-attention heads: 0 to 3)"),
])
def test_a_layer_or_head_named_that_was_pruned_is_one_line(pruned, tmp_path, capsys, model, argv, message):
    """Named by the flag that gave it (they went unnamed), never by one not given (the default view named a --layer
    never given when the last layer had no heads)."""
    code, _, err = cli(capsys, *[a.format(m=pruned / model, r=pruned, o=tmp_path) for a in argv])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert all(flag in argv for flag in ("--layer", "--heads") if flag in err)  # nor a flag not given


def test_heads_align_ranks_each_layers_own_heads(pruned, capsys):
    code, out, err = cli(capsys, "heads", "align", pruned / "first", *[a.format(r=pruned) for a in PAIRS],
                         "--gold", pruned / "gold.txt", "--no-store")
    assert code == 0, err
    rows = [line.split(None, 5)[3:] for line in out.splitlines()[1:]]
    assert sorted((method, layer, heads) for method, layer, heads in rows) == sorted(
        (method, "1", heads) for method in ("shift", "naive") for heads in ("mean", "[0]", "[1]", "[2]"))


@pytest.mark.parametrize("removed, stored, left", [
    ([0], (1,), (0,)),        # the chosen head is renumbered
    ([1], (1,), None),        # the chosen head is gone: the choice is dropped
    ([0], None, None),        # the mean of the layer's heads loses one: its AER no longer holds, dropped
    ([], None, "mean"),       # nothing removed in the layer: kept as it is
])
def test_pruning_renumbers_or_drops_the_stored_head_choice(tmp_path, removed, stored, left):
    from tests.conftest import tiny_model_dir
    from xattn.analysis import choice
    from xattn.analysis.alignment import AlignSettings
    from xattn.analysis.maps import HeadChoice
    from xattn.analysis.pruning import prune_dir

    tiny_model_dir(tmp_path / "m")  # 1 decoder layer, 2 heads
    choice.save(tmp_path / "m", AlignSettings(HeadChoice(0, stored), "shift"), {"aer": 0.3})
    pruned = prune_dir(tmp_path / "m", {"cross": [removed]}, tmp_path / "p")
    record = choice.stored(tmp_path / "p", pruned.cfg)
    if left is None:
        assert record is None
    else:
        assert record.heads == (list(left) if left != "mean" else "mean") and record.method == "shift"
        assert record.aer is None  # measured on the unpruned weights: pruning any head changes what it scored


def test_pruning_keeps_frozen_parameters_frozen():
    model = _model()
    for p in model.parameters():
        p.requires_grad_(False)
    pruned = prune_model(model, REMOVAL)
    assert not any(p.requires_grad for p in pruned.parameters())


def test_a_table_and_a_stored_choice_name_the_weights_they_measured(four_heads, numbers_model, tmp_path, capsys,
                                                                     monkeypatch):
    """Weights that change while heads importance or heads align runs (a training still writing there) do not
    get the results measured on the weights loaded."""
    import shutil

    import xattn.analysis.heads as heads_module
    import xattn.analysis.importance as importance_module
    from xattn.checkpoint import weights_id

    model = tmp_path / "model"
    shutil.copytree(four_heads, model)
    before = weights_id(model)

    def replaced(compute):
        def run(*args, **kwargs):
            out = compute(*args, **kwargs)
            shutil.copyfile(numbers_model / "model.safetensors", model / "model.safetensors")  # other weights now
            return out
        return run
    monkeypatch.setattr(importance_module, "head_importance", replaced(importance_module.head_importance))
    code, out, _ = cli(capsys, "heads", "importance", model, "--sentences", "8")
    assert code == 0 and out.splitlines()[0] == f"# weights: {before}" != f"# weights: {weights_id(model)}"
    shutil.copytree(four_heads, model, dirs_exist_ok=True)
    pairs, gold = tmp_path / "pairs.txt", tmp_path / "gold.txt"
    pairs.write_text("drei vier ||| three four\nsieben ||| seven\n")
    gold.write_text("0-0 1-1\n0-0\n")
    monkeypatch.setattr(heads_module, "rank_alignment_heads", replaced(heads_module.rank_alignment_heads))
    code, _, err = cli(capsys, "heads", "align", model, "--pairs", pairs, "--gold", gold)
    assert code == 0, err
    assert f"weights: {before}" in (model / "analysis.yaml").read_text()


def test_a_pruned_model_keeps_its_shortlist_and_drops_a_coverage_penalty_it_cannot_read(numbers_model, tmp_path):
    """prune wrote the model's decode settings without its shortlist.safetensors (every translation then refused:
    `decode.shortlist: this model has no shortlist`), and kept a coverage penalty with no cross-attention head
    left (every beam search refused)."""
    import shutil

    import numpy as np
    import yaml

    from xattn.analysis.pruning import prune_dir
    from xattn.shortlist import FILE, Shortlist
    from xattn.tokenizer import tokenizer_hashes

    model = tmp_path / "model"
    shutil.copytree(numbers_model, model)
    cfg = xattn.load(model).model.cfg
    table = np.tile(np.arange(3, 3 + 8, dtype=np.int32), (cfg.src_vocab_size, 1))
    Shortlist(np.array([2, 1, 0]), table).save(model, {"tokenizers": tokenizer_hashes(model)})
    raw = yaml.safe_load((model / "config.yaml").read_text())
    raw["decode"].update(shortlist=True, beam_size=2, coverage_penalty=0.2)
    (model / "config.yaml").write_text(yaml.safe_dump(raw))
    before = xattn.load(model).translate(["drei vier"])[0].text
    cross = cfg.heads_per_layer("cross")
    prune_dir(model, {"cross": [[0]] + [[] for _ in cross[1:]]}, tmp_path / "some")
    assert (tmp_path / "some" / FILE).read_bytes() == (model / FILE).read_bytes()
    assert xattn.load(tmp_path / "some").decode_config.shortlist
    prune_dir(model, {"cross": [list(range(n)) for n in cross]}, tmp_path / "none")
    pruned = xattn.load(tmp_path / "none")
    assert pruned.decode_config.coverage_penalty == 0 and pruned.decode_config.shortlist
    assert before and pruned.translate(["drei vier"])[0].text is not None
