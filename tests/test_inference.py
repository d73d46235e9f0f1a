import copy
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import xattn
from tests.conftest import tiny_config, tiny_model_dir
from tests.test_decoding import eos_model, random_src
from tests.test_translator import TEXTS, WordTokenizer, texts_and_scores
from xattn.inference import SELF_PROJECTIONS, Int8Linear, PackedLinear, Speedups, pack_linear_layers, prepare, rewrite
from xattn.attention import MultiHeadAttention, ScaledDotScore
from xattn.cache import LayerCache
from xattn.layers import DecoderLayer, EncoderLayer, FeedForward, PostNorm
from xattn.translator import Translator

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
GREEDY_AND_BEAM = [xattn.DecodeConfig(beam_size=1), xattn.DecodeConfig(beam_size=3, n_best=2)]

_sub = lambda prefix, mods: [f"{prefix}.{m}.{p}" for m in mods for p in ("weight", "bias")]  # noqa: E731
_ATTN = ["q_proj", "k_proj", "v_proj", "out_proj"]
PINNED = (["src_embed.weight", "tgt_embed.weight"]
          + _sub("encoder.layers.0.self_attn", _ATTN) + _sub("encoder.layers.0", ["self_attn_norm", "ffn.fc1", "ffn.fc2", "ffn_norm"])
          + _sub("decoder.layers.0.self_attn", _ATTN) + _sub("decoder.layers.0", ["self_attn_norm"])
          + _sub("decoder.layers.0.cross_attn", _ATTN) + _sub("decoder.layers.0", ["cross_attn_norm", "ffn.fc1", "ffn.fc2", "ffn_norm"])
          + ["generator.weight", "generator.bias"])
"""The state_dict names of a 1+1-layer model, in order (46)."""
ALIASES = {"tgt_embed.weight": "src_embed.weight", "generator.weight": "src_embed.weight"}
"""Names that shared embeddings and a tied output share with the first; the file stores the first."""


def word_translator(model: xattn.Transformer, speedups: Speedups | None = Speedups()) -> Translator:
    tok = WordTokenizer()
    return Translator(model, SimpleNamespace(src=tok, tgt=tok, joint=True), device="cpu", speedups=speedups)


def linear_types(model: torch.nn.Module) -> set[type]:
    return {type(m) for m in model.modules() if type(m).__name__.endswith("Linear")}


def packed_types(model: torch.nn.Module) -> set[type]:
    """linear_types, less the q, k and v layers that a self-attention with one product for them no longer uses
    (left plain: they share the model's weights); those must be all that is left plain."""
    plain = {name for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    unused = {f"{name}.{part}" for name, m in model.named_modules() if getattr(m, "qkv", None) is not None
              for part in SELF_PROJECTIONS}
    assert unused and unused <= plain
    return {type(m) for name, m in model.named_modules() if type(m).__name__.endswith("Linear") and name not in unused}


@pytest.fixture
def tied_dir(tmp_path):
    pytest.importorskip("sentencepiece")
    tiny_model_dir(tmp_path, share_embeddings=True, tie_output=True)
    return tmp_path


@needs_onednn
def test_loaded_model_is_the_plain_model_with_public_names(tied_dir):
    tr = xattn.load(tied_dir, device="cpu")
    model, fresh = tr.model, xattn.Transformer(tr.model.cfg)
    assert type(model) is xattn.Transformer and linear_types(model) == {torch.nn.Linear}
    assert packed_types(tr.inference.current()) == {PackedLinear}
    assert list(model.state_dict()) == list(fresh.state_dict()) == PINNED
    assert model.parameter_groups() == fresh.parameter_groups()
    saved = load_file(str(tied_dir / "model.safetensors"))
    assert set(saved) == set(PINNED) - set(ALIASES)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[ALIASES.get(name, name)]), name
    assert model.generator.weight is model.tgt_embed.weight is model.src_embed.weight
    assert all(p.requires_grad for p in model.parameters())
    src, tgt = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 8, 9]])
    model.train()(src, tgt).logits.log_softmax(-1).mean().backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()] == []


def test_loaded_model_saves_the_same_files(tied_dir, tmp_path_factory):
    from xattn.checkpoint import save_model_dir

    tr = xattn.load(tied_dir, device="cpu")
    tr.translate(["word3 word5"])
    again = tmp_path_factory.mktemp("again")
    for tokenizer in tied_dir.glob("spm*"):  # the weights' fingerprint names the tokenizer files beside them
        shutil.copy(tokenizer, again)
    save_model_dir(again, tr.model, tr.config)
    assert (again / "config.yaml").read_bytes() == (tied_dir / "config.yaml").read_bytes()
    before, after = (safe_open(str(d / "model.safetensors"), "pt") for d in (tied_dir, again))
    assert before.metadata() == after.metadata() and list(before.keys()) == list(after.keys())
    for name in before.keys():  # the header's metadata order varies between writes, so compare parsed
        assert torch.equal(before.get_tensor(name), after.get_tensor(name)), name


def test_int8_decodes_on_a_quantized_copy(tied_dir):
    tr = xattn.Translator.from_dir(tied_dir, device="cpu", quantize="int8")
    assert linear_types(tr.model) == {torch.nn.Linear} and list(tr.model.state_dict()) == PINNED
    assert linear_types(tr.inference.current()) == {torch.ao.nn.quantized.dynamic.Linear}
    texts = ["word3 word5", "word7", "word1 word2 word9"]
    assert [r.src_tokens[-1] for r in tr.translate(texts, xattn.DecodeConfig(beam_size=2))] == ["</s>"] * 3


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_int8_feed_forward_fuses_a_relu_into_its_first_layer(activation):
    """A ReLU runs inside the quantized first layer, with the same output as quantizing the two apart."""
    from torch.ao.nn.intrinsic.quantized.dynamic import LinearReLU as QuantizedLinearReLU
    torch.manual_seed(0)
    ffn = FeedForward(16, 64, activation).eval()
    apart = torch.ao.quantization.quantize_dynamic(copy.deepcopy(ffn), {torch.nn.Linear}, dtype=torch.qint8)
    fused = rewrite(copy.deepcopy(ffn), Speedups(quantize="int8"))
    assert isinstance(fused.fc1, QuantizedLinearReLU) is (activation == "relu")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        assert torch.equal(fused(x), apart(x))


def test_speedup_errors():
    with pytest.raises(xattn.XattnError, match="quantize: int8 or None, got 'int4'"):
        Speedups(quantize="int4")
    with pytest.raises(xattn.XattnError, match="^device: int8 quantization runs on the CPU only, not on cuda"):
        Speedups(quantize="int8").need_copy(torch.device("cuda"))


@needs_onednn
@pytest.mark.parametrize("cfg", GREEDY_AND_BEAM, ids=["greedy", "beam"])
def test_packed_copy_gives_the_same_translations(cfg):
    packed, plain = word_translator(eos_model()), word_translator(eos_model(), speedups=None)
    assert packed_types(packed.inference.current()) == {PackedLinear} and linear_types(packed.model) == {torch.nn.Linear}
    expected = texts_and_scores(plain.translate(TEXTS, cfg), expected=True)
    assert texts_and_scores(packed.translate(TEXTS, cfg)) == expected
    attention = dict(return_attention=True, attention_from="rescore")
    a, b = packed.translate(TEXTS, cfg, **attention), plain.translate(TEXTS, cfg, **attention)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.cross_attention, y.cross_attention, atol=1e-5)


def test_in_memory_translator_decodes_on_the_model_itself():
    model = eos_model()
    tr = word_translator(model, speedups=None)
    assert tr.model is model and tr.inference.current() is model


@needs_onednn
def test_pack_linear_layers_replaces_every_linear_layer():
    model = eos_model()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        reference = model.decoder.layers[0].ffn(x)
        pack_linear_layers(model)
        assert packed_types(model) == {PackedLinear}
        torch.testing.assert_close(model.decoder.layers[0].ffn(x), reference, atol=1e-5, rtol=1e-5)


@needs_onednn
@pytest.mark.parametrize("activation", ["relu", "gelu", "swish"])
def test_packed_feed_forward_fuses_its_activation(activation):
    torch.manual_seed(0)
    ffn = FeedForward(16, 64, activation).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        reference, one_row = ffn(x), ffn(x[:1, :1])
        pack_linear_layers(ffn)
        assert isinstance(ffn.fc1, PackedLinear) and ffn.fc1.activation == activation
        torch.testing.assert_close(ffn(x), reference, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ffn(x[:1, :1]), one_row, atol=1e-5, rtol=1e-5)  # one row: the unpacked weight


def attention_layers() -> tuple[DecoderLayer, EncoderLayer]:
    """A decoder and an encoder layer of the benchmark model's sizes (seeded), in eval mode."""
    torch.manual_seed(0)
    attention = lambda: MultiHeadAttention(256, 4, ScaledDotScore(64))  # noqa: E731
    return (DecoderLayer(attention(), attention(), FeedForward(256, 1024), PostNorm, 256, 0.0).eval(),
            EncoderLayer(attention(), FeedForward(256, 1024), PostNorm, 256, 0.0).eval())


def self_attention_outputs(decoder: DecoderLayer, encoder: EncoderLayer, rows: int):
    """A function giving, for fixed random inputs of `rows` rows, the decoder layer's self-attention of one step
    without and with a cache, and the encoder layer's output over padded sources."""
    x, before, source = torch.randn(rows, 1, 256), torch.randn(rows, 4, 3, 64), torch.randn(rows, 7, 256)
    mask = (torch.arange(7) < torch.randint(1, 8, (rows, 1))).unsqueeze(1)  # (rows, 1, 7)

    def outputs():
        cache = LayerCache(before, before)
        cache.append(before, before)
        return (decoder.self_attn.attend_self(x).out, decoder.self_attn.attend_self(x, cache=cache).out,
                encoder(source, mask=mask)[0])
    return outputs


@needs_onednn
@pytest.mark.parametrize("rows", [1, 5, 32, 300])
def test_packed_self_attention_projects_queries_keys_and_values_in_one_product(rows):
    """One (256 -> 768) product for a self-attention's q, k and v, bit for bit what three packed layers give, in a
    decoder step (with a cache and without) and an encoder pass (padded sources); cross-attention keeps its own
    projections, and training or pruning never uses the product."""
    decoder, encoder = attention_layers()
    with torch.no_grad():
        pack_linear_layers(decoder)
        pack_linear_layers(encoder)
        assert isinstance(decoder.self_attn.qkv, PackedLinear) and decoder.cross_attn.qkv is None
        outputs = self_attention_outputs(decoder, encoder, rows)
        fused = outputs()
        for attn in (decoder.self_attn, encoder.self_attn):  # the same weights packed, a product each
            for name in SELF_PROJECTIONS:
                setattr(attn, name, PackedLinear(getattr(attn, name)))
            attn.qkv = None
        for a, b in zip(fused, outputs()):
            assert torch.equal(a, b)
    plain, source = MultiHeadAttention(256, 4, ScaledDotScore(64)), torch.randn(rows, 7, 256)
    plain.qkv = torch.nn.Linear(256, 5)  # a wrong product: in training, or once pruned, never used
    plain.train().attend_self(source)
    plain.eval().prune_heads([0, 1])
    assert plain.qkv is None and plain.attend_self(source).out.shape == source.shape


@pytest.mark.parametrize("rows", [1, 5, 32, 300])
def test_int8_self_attention_projects_queries_keys_and_values_in_one_product(rows):
    """In the int8 copy, one int8 layer for a self-attention's q, k and v, each row keeping its own layer's scale:
    bit for bit what the three int8 layers give, in a decoder step (with a cache and without) and an encoder pass,
    although the three weights' ranges differ; cross-attention keeps its own projections."""
    decoder, encoder = attention_layers()
    with torch.no_grad():
        for attn in (decoder.self_attn, encoder.self_attn):
            attn.k_proj.weight.mul_(3.0)
            attn.v_proj.weight.mul_(0.2)
        rewrite(decoder, Speedups(quantize="int8"))
        rewrite(encoder, Speedups(quantize="int8"))
    assert type(decoder.self_attn.qkv) is Int8Linear and decoder.cross_attn.qkv is None
    scales = decoder.self_attn.qkv.weight().q_per_channel_scales()
    assert len({float(scales[0]), float(scales[256]), float(scales[512])}) == 3
    outputs = self_attention_outputs(decoder, encoder, rows)
    with torch.no_grad():
        fused = outputs()
        decoder.self_attn.qkv = encoder.self_attn.qkv = None
        for a, b in zip(fused, outputs()):
            assert torch.equal(a, b)


def test_int8_keeps_the_layers_of_a_pruned_away_attention_float():
    """A dynamic int8 layer with no inputs returns uninitialised memory, not its bias: in the int8 copy, a
    self-attention pruned to no heads keeps its layers float, and the same batch encodes alike every time, near the
    float model."""
    torch.manual_seed(0)
    model = xattn.Transformer(tiny_config(src_vocab_size=30, tgt_vocab_size=30, heads={"enc_self": [2, 0]})).eval()
    fast = prepare(model, Speedups(quantize="int8"))
    pruned, kept = fast.encoder.layers[1].self_attn, fast.encoder.layers[0].self_attn
    assert type(pruned.out_proj) is torch.nn.Linear and type(kept.out_proj) is Int8Linear
    src = random_src(1, batch=4, vocab=30, max_len=6)
    with torch.no_grad():
        states = [fast.encode(src).states for _ in range(5)]
        assert all(torch.equal(states[0], s) for s in states)
        torch.testing.assert_close(states[0], model.encode(src).states, atol=0.1, rtol=0)


def test_compiled_decoder_step_gives_the_same_translations():
    """`compile=True` (xattn translate --compile) keeps plain linear layers for the compiler to lower."""
    compiled, plain = word_translator(eos_model(), Speedups(compile=True)), word_translator(eos_model(), None)
    assert linear_types(compiled.inference.current()) == {torch.nn.Linear}
    cfg = xattn.DecodeConfig(beam_size=1)
    expected = texts_and_scores(plain.translate(TEXTS, cfg), expected=True)
    assert texts_and_scores(compiled.translate(TEXTS, cfg)) == expected


# ------------------------------------------------------------------------------------------- staleness

def _halve_in_place(model):
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)


def _load_other_weights(model):
    model.load_state_dict(eos_model(seed=1).state_dict())


def _assign_new_parameter(model):
    model.generator.weight = torch.nn.Parameter(eos_model(seed=1).generator.weight.detach().clone())


def _assign_new_data(model):
    model.decoder.layers[0].ffn.fc2.weight.data = torch.randn_like(model.decoder.layers[0].ffn.fc2.weight)


def _optimizer_step(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model(torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 8, 9]])).logits[..., 2].sum().backward()
    optimizer.step()


@pytest.mark.parametrize("change", [_halve_in_place, _load_other_weights, _assign_new_parameter, _assign_new_data,
                                    _optimizer_step], ids=lambda f: f.__name__.strip("_"))
def test_decoding_follows_changed_weights(change):
    tr = word_translator(eos_model())
    cfg = xattn.DecodeConfig(beam_size=2)
    before = texts_and_scores(tr.translate(TEXTS, cfg), expected=True)  # a change beyond noise below
    torch.manual_seed(1)
    change(tr.model)
    after = texts_and_scores(tr.translate(TEXTS, cfg))
    assert after == texts_and_scores(word_translator(copy.deepcopy(tr.model)).translate(TEXTS, cfg), expected=True)
    assert after != before


def test_unchanged_weights_keep_the_decoding_copy():
    tr = word_translator(eos_model())
    fast = tr.inference.current()
    tr.translate(TEXTS, xattn.DecodeConfig(beam_size=2), return_attention=True)
    tr.model.train().eval()
    assert tr.inference.current() is fast
