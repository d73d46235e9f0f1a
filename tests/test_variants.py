"""Attention variants chosen in the config: the registry, per-place and per-layer heads, and hard-coded
Gaussian attention (You, Sun & Iyyer 2020)."""
import re

import pytest
import torch

import xattn
from tests.conftest import tiny_config
from xattn.attention import AttentionContext
from xattn.config import load_config
from xattn.variants import VARIANTS, GaussianAttention


def test_config_names_a_variant_per_place_and_layer_in_one_canonical_form():
    cfg = load_config(None, ["model.attention={cross: gaussian, enc_self: [gaussian, learned, learned]}",
                             "model.heads={cross: [4, 4, 1], dec_self: 4}"]).model
    assert cfg.attention == {"cross": "gaussian", "enc_self": ["gaussian", "learned", "learned"]}
    assert cfg.heads == {"cross": [4, 4, 1]}  # dec_self: 4 is n_heads, the default
    assert [cfg.variant("enc_self", i) for i in range(3)] == ["gaussian", "learned", "learned"]
    assert [cfg.heads_of("cross", i) for i in range(3)] == [4, 4, 1] and cfg.heads_of("enc_self", 2) == 4
    assert "attention" not in xattn.ModelConfig().as_dict() and "length_ratio" not in xattn.ModelConfig().as_dict()
    assert set(VARIANTS) == {"learned", "gaussian"}


@pytest.mark.parametrize("override, message", [
    ("model.attention={crosss: gaussian}", "model.attention: 'crosss' is not a place; one of enc_self, dec_self, cross"),
    ("model.attention={cross: hard}", "model.attention: cross: 'hard' is not one of learned, gaussian"),
    ("model.attention=gaussian", "model.attention: expected a mapping such as {cross: gaussian}"),
    ("model.heads={cross: [8, 8]}", "model.heads: cross has 3 layers, but 2 values are given"),
    ("model.heads=[8, 8]", "model.heads: expected a mapping such as {cross: [8, 4, 1]}"),
    ("model.heads={cross: 1000}", "model.heads: cross: 1000 heads, more than model.n_heads"),
    ("model.heads={cross: 1, cross: 2}", "model.heads: not valid YAML ('cross' is given twice)"),
    ("model.attention={cross: [gaussian", "model.attention: not valid YAML"),
    ("model.heads={cross: -1}", "model.heads: cross: expected a number of heads >= 0, got -1"),
    ("model.score=cosine", "model.score: 'cosine' is not one of dot, scaled_dot, general, additive"),
    ("model.length_ratio=0", "model.length_ratio: must be > 0"),
])
def test_bad_variants_are_one_line_errors(override, message):
    with pytest.raises(xattn.XattnError) as e:
        load_config(None, [override])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("place", ["enc_self", "dec_self", "cross"])
def test_gaussian_rows_sum_to_one_and_respect_the_masks(place):
    torch.manual_seed(0)
    attn = GaussianAttention(16, 4, place, 4, ratio=1.5)
    memory, query = torch.randn(2, 6, 16), torch.randn(2, 6 if place != "cross" else 4, 16)
    T = query.shape[1]
    if place == "dec_self":
        mask = torch.ones(T, 6, dtype=torch.bool).tril().unsqueeze(0)  # (1, T, S) look-ahead
    else:
        mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3]).unsqueeze(1)  # (B, 1, S) padding
    out = attn(query, attn.project_kv(memory), mask=mask, ctx=AttentionContext(need_weights=True))
    w = out.weights  # (B, H, T, S)
    assert w.shape == (2, 4, T, 6) and out.out.shape == (2, T, 16)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, T))
    allowed = mask.unsqueeze(1).expand_as(w)
    assert (w[~allowed] == 0).all()
    # each head peaks at its centre: r * i + offset, offsets alternating as in the authors' code
    offsets = GaussianAttention.OFFSETS[place]
    ratio = 1.5 if place == "cross" else 1.0
    for h in range(4):
        for i in range(T):
            centre = ratio * i + offsets[h % 2]
            allowed_keys = allowed[0, h, i].nonzero().flatten().float()
            expected = allowed_keys[(allowed_keys - centre).abs().argmin()]
            assert w[0, h, i].argmax().item() == expected.item()
    if place == "dec_self":  # the centre is never a future token
        assert all(o <= 0 for o in offsets)


def test_gaussian_weights_ignore_the_input_and_values_stay_learned():
    attn = GaussianAttention(16, 2, "enc_self", 8)
    assert {n for n, _ in attn.named_parameters()} == {"v_proj.weight", "v_proj.bias", "out_proj.weight",
                                                        "out_proj.bias"}
    ctx, mask = AttentionContext(need_weights=True), torch.ones(1, 1, 5, dtype=torch.bool)
    a = attn(torch.randn(1, 5, 16), attn.project_kv(torch.randn(1, 5, 16)), mask=mask, ctx=ctx).weights
    b = attn(torch.randn(1, 5, 16), attn.project_kv(torch.randn(1, 5, 16)), mask=mask, ctx=ctx).weights
    assert torch.equal(a, b)


def test_a_pruned_layer_and_a_head_mask():
    torch.manual_seed(0)
    model = xattn.Transformer(tiny_config(heads={"cross": [0, 1]})).eval()
    src, tgt = torch.tensor([[5, 6, 2]]), torch.tensor([[1, 7, 8]])
    out = model(src, tgt, need_weights=True)
    assert out.cross_attn[0].shape == (1, 0, 3, 3) and out.cross_attn[1].shape == (1, 1, 3, 3)
    assert model.decoder.layers[0].cross_attn.q_proj.weight.shape == (0, 16)
    torch.testing.assert_close(model(src, tgt, head_mask={"cross": [None, torch.ones(1)]}).logits, out.logits)
    for wrong, message in (({"crosss": [None, None]}, "'crosss' is not a place"),
                           ({"cross": [None]}, "cross: expected a list of 2 layers"),
                           ({"cross": [None, torch.ones(2)]}, "cross layer 1: expected 1 factors (one per head), got 2")):
        with pytest.raises(ValueError, match=re.escape(message)):
            model(src, tgt, head_mask=wrong)


TINY = ["model.d_model=16", "model.n_heads=2", "model.n_encoder_layers=1", "model.n_decoder_layers=2",
        "model.d_ff=32", "data.dataset=numbers", "data.numbers_size=300", "data.vocab_size=120",
        "train.max_tokens=400", "train.amp=none", "train.eval_every=3", "train.eval_bleu_sentences=8",
        "train.threads=1", "train.max_steps=3"]


@pytest.mark.parametrize("attention, heads", [
    ("{enc_self: gaussian, dec_self: gaussian, cross: gaussian}", "{}"),
    ("{enc_self: gaussian, dec_self: gaussian}", "{cross: [0, 1]}"),  # You et al.'s one learned cross-attention head
])
def test_a_hard_coded_model_trains_saves_reloads_and_translates_from_the_cli(tmp_path, capsys, attention, heads):
    import yaml

    from xattn.cli.main import main

    out = tmp_path / "m"
    assert main(["train", "numbers-de-en", *TINY, f"model.attention={attention}", f"model.heads={heads}",
                 "--out", str(out), "--quiet"]) == 0
    model_cfg = yaml.safe_load((out / "config.yaml").read_text())["model"]
    assert model_cfg["attention"] == yaml.safe_load(attention)
    if "cross: gaussian" in attention:  # measured on the training data: source over target tokens
        assert 0.3 < model_cfg["length_ratio"] < 3
    else:
        assert "length_ratio" not in model_cfg and model_cfg["heads"] == {"cross": [0, 1]}
    (tmp_path / "in.txt").write_text("drei\nsieben hundert\n")
    for flags in ([], ["--beam", "1"], ["--sample", "--seed", "1"], ["--beam", "3", "--coverage-penalty", "0.2"]):
        assert main(["translate", str(out), "-i", str(tmp_path / "in.txt"), *flags]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["attention", str(out), "drei", "--output", str(tmp_path / "a.svg"), "--layer", "1"]) == 0
    assert main(["attention", str(out), "drei", "--output", str(tmp_path / "a.png"), "--grid"]) == 0
    assert main(["attention", str(out), "drei", "--output", str(tmp_path / "a.html")]) == 0
    (tmp_path / "pairs.txt").write_text("drei ||| three\n")
    assert main(["align", str(out), "--pairs", str(tmp_path / "pairs.txt")]) == 0
    assert main(["export", str(out), str(tmp_path / "hf")]) == 2
    assert "cannot be exported to Marian" in capsys.readouterr().err


def test_the_registry_names_every_choice_that_is_built():
    from xattn import layers, model, registry, variants

    assert tuple(variants.SCORES) == registry.SCORES and tuple(variants.VARIANTS) == registry.VARIANTS
    assert tuple(layers.ACTIVATIONS) == registry.ACTIVATIONS and tuple(model.NORMS) == registry.NORMS
    assert tuple(model.POSITIONS) == registry.POSITIONS
