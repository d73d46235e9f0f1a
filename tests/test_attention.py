import math

import pytest
import torch
from torch import nn

import xattn.attention as attention_module
from xattn.attention import (AdditiveScore, AttentionContext, DotScore, GeneralScore, MultiHeadAttention,
                             ScaledDotScore, attend, causal_mask, padding_mask)
from xattn.variants import build_score

D, H = 16, 4


def _copy_from_torch(ref: nn.MultiheadAttention) -> MultiHeadAttention:
    mha = MultiHeadAttention(D, H, ScaledDotScore(D // H))
    wq, wk, wv = ref.in_proj_weight.chunk(3)
    bq, bk, bv = ref.in_proj_bias.chunk(3)
    with torch.no_grad():
        for lin, w, b in ((mha.q_proj, wq, bq), (mha.k_proj, wk, bk), (mha.v_proj, wv, bv),
                          (mha.out_proj, ref.out_proj.weight, ref.out_proj.bias)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
    return mha.eval()


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_equals_torch_multihead_attention(cross, need_weights):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    mha = _copy_from_torch(ref)
    query = torch.randn(3, 5, D)
    memory = torch.randn(3, 7, D) if cross else query
    keep = torch.ones(3, memory.shape[1], dtype=torch.bool)
    keep[1, -2:] = False
    keep[2, -3:] = False
    attn_mask = None if cross else ~causal_mask(5, 5)  # torch: True = blocked
    want, want_w = ref(query, memory, memory, key_padding_mask=~keep, attn_mask=attn_mask,
                       average_attn_weights=False)
    mask = keep.unsqueeze(1) if cross else keep.unsqueeze(1) & causal_mask(5, 5).unsqueeze(0)
    got = mha(query, mha.project_kv(memory), mask=mask, ctx=AttentionContext(need_weights))
    torch.testing.assert_close(got.out, want, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(got.weights, want_w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("score", ["dot", "scaled_dot"])
def test_fast_path_agrees_with_explicit_path(score):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, H, 6, 8), torch.randn(2, H, 9, 8), torch.randn(2, H, 9, 8)
    mask = torch.rand(2, 1, 6, 9) > 0.3
    mask[..., 0] = True
    fn = build_score(score, H, 8)
    fast, none = attend(q, k, v, mask, fn)
    slow, weights = attend(q, k, v, mask, fn, need_weights=True)
    assert none is None and weights is not None
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_score_functions_by_hand():
    torch.manual_seed(2)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    general, additive = GeneralScore(2, 4), AdditiveScore(2, 4)
    with torch.no_grad():
        general.weight.copy_(torch.randn(2, 4, 4))
    by_hand = {name: torch.zeros(1, 2, 3, 5) for name in ("dot", "scaled", "general", "additive")}
    for h in range(2):
        for t in range(3):
            for s in range(5):
                qv, kv = q[0, h, t], k[0, h, s]
                by_hand["dot"][0, h, t, s] = qv @ kv
                by_hand["scaled"][0, h, t, s] = qv @ kv / math.sqrt(4)
                by_hand["general"][0, h, t, s] = qv @ general.weight[h] @ kv
                by_hand["additive"][0, h, t, s] = additive.v[h] @ torch.tanh(qv @ additive.query[h] + kv @ additive.key[h])
    with torch.no_grad():
        torch.testing.assert_close(DotScore()(q, k), by_hand["dot"])
        torch.testing.assert_close(ScaledDotScore(4)(q, k), by_hand["scaled"])
        torch.testing.assert_close(general(q, k), by_hand["general"])
        torch.testing.assert_close(additive(q, k), by_hand["additive"])


def test_weights_are_a_softmax_over_allowed_keys():
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([True, True, False]).view(1, 1, 1, 3)
    out, w = attend(q, k, v, mask, DotScore(), need_weights=True)
    scores = q[0, 0] @ k[0, 0, :2].T
    torch.testing.assert_close(w[0, 0, :, :2], scores.softmax(-1))
    assert torch.all(w[..., 2] == 0)
    torch.testing.assert_close(out[0, 0], w[0, 0] @ v[0, 0])


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "general", "additive"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_rows_give_zeros_not_nan(score, need_weights):
    q = torch.randn(2, H, 3, 4, requires_grad=True)
    k, v = torch.randn(2, H, 5, 4), torch.randn(2, H, 5, 4)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1] = False
    out, w = attend(q, k, v, mask, build_score(score, H, 4), need_weights=need_weights)
    assert torch.all(out[1] == 0) and not out.isnan().any()
    if need_weights:
        assert torch.all(w[1] == 0) and torch.allclose(w[0].sum(-1), torch.ones(H, 3))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def _decode_shaped(rows: int, queries: int, S: int, time_major: bool):
    """q (rows, H, queries, 4) and k, v laid out as the decoder caches hold them: time-major (S, rows, H, 4)
    as self-attention's buffer, or head-major (rows, H, S, 4) as cross-attention's."""
    q = torch.randn(rows, queries, H, 4).transpose(1, 2)
    if time_major:
        k, v = (torch.randn(S, rows, H, 4).permute(1, 2, 0, 3) for _ in range(2))
    else:
        k, v = torch.randn(rows, H, S, 4), torch.randn(rows, H, S, 4)
    return q, k, v


@pytest.mark.parametrize("time_major", [False, True])
@pytest.mark.parametrize("queries", [1, 5])
def test_decode_steps_take_the_explicit_path_with_the_fused_kernels_result(time_major, queries, monkeypatch):
    torch.manual_seed(0)
    q, k, v = _decode_shaped(40, queries, 7, time_major)
    mask = torch.ones(40, 1, 1, 7, dtype=torch.bool)
    mask[::3, ..., -2:] = False
    mask[5] = False  # a row with no key: zeros, as the fused kernel gives
    with torch.inference_mode():
        fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5)
        calls = []
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1))
        out, _ = attend(q, k, v, mask, ScaledDotScore(4))
    assert not calls
    torch.testing.assert_close(out, fused)
    assert torch.all(out[5] == 0)


@pytest.mark.parametrize("case, fused", [
    ("many rows, one query each", False),
    ("a beam of 8 folded", False),
    ("one row", True),
    ("31 query rows", True),
    ("9 queries a row: an encoder pass", True),
    ("keys that are no stack of matrices", True),
    ("values that are no stack of matrices", True),
    ("training (float32)", True),
    ("training (bf16)", False),
])
def test_which_attention_path_decoding_shapes_take(case, fused):
    shapes = {"a beam of 8 folded": (4, 8, False), "one row": (1, 1, True), "31 query rows": (31, 1, True),
              "9 queries a row: an encoder pass": (40, 9, False)}
    rows, queries, time_major = shapes.get(case, (40, 1, True))
    q, k, v = _decode_shaped(rows, queries, 7, time_major)
    not_a_stack = torch.randn(40, 7, H, 4).transpose(1, 2)  # (B, S, H, Dh) seen as (B, H, S, Dh): a copy to fold
    if case == "keys that are no stack of matrices":
        k = not_a_stack
    elif case == "values that are no stack of matrices":
        v = not_a_stack
    elif case.startswith("training"):
        q = q.to(torch.bfloat16 if "bf16" in case else torch.float32).requires_grad_(True)
    assert attention_module._fused_is_slower(q, k, v) is not fused


def test_masks():
    ids = torch.tensor([[5, 6, 0], [7, 0, 0]])
    assert padding_mask(ids, 0).tolist() == [[True, True, False], [True, False, False]]
    assert causal_mask(3, 3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert causal_mask(1, 4).tolist() == [[True, True, True, True]]
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
