"""How much each attention head matters, per place and layer, over a set of sentence pairs.

- `gradient` (Michel, Levy & Neubig 2019): I_h = E |dL/d xi_h|, the expected absolute gradient of the loss
  (token NLL, teacher forced) with respect to head h's mask variable xi_h (all 1: the model unchanged).
  As in the authors' code, the expectation is over batches (the absolute gradient of each batch's loss,
  summed over batches), then the scores of each layer are divided by their L2 norm.
- `confidence` (Voita et al. 2019): the mean, over the query positions of every pair, of the head's
  largest attention weight.
Layers and heads are numbered from 0, as everywhere in xattn.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from xattn.model import Transformer
from xattn.variants import PLACES

METHODS = ("gradient", "confidence")
IMPORTANCE_FILE = "head_importance.tsv"
"""Where `xattn heads importance` saves its table in the model directory, and `xattn prune` looks for it."""


def batches(translator, sources: Sequence[str], targets: Sequence[str], max_tokens: int = 4096):
    """Padded teacher-forcing batches (xattn.data.Batch) of the pairs, on the translator's device."""
    from xattn.data import TokenBatchSampler, tokenize_pairs

    corpus = tokenize_pairs(list(zip(sources, targets)), translator.tokenizers)
    sampler = TokenBatchSampler(corpus.src_lengths(), corpus.tgt_lengths(), max_tokens, shuffle=False)
    return [corpus.collate(indices).to(translator.device) for indices in sampler.batches()]


def head_importance(model: Transformer, data, method: str = "gradient") -> list[dict]:
    """Rows {place, layer, head, score} for every head of `model` over `data` (Batches), in model order."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    scores = gradient_scores(model, data) if method == "gradient" else confidence_scores(model, data)
    return [{"place": place, "layer": i, "head": h, "score": float(s)}
            for place in PLACES for i, layer in enumerate(scores[place]) for h, s in enumerate(layer.tolist())]


def gradient_scores(model: Transformer, data, normalise: bool = True) -> dict[str, list[torch.Tensor]]:
    """Per place, per layer: (H_l,) expected absolute gradients of the loss w.r.t. the head mask."""
    from xattn.training import label_smoothed_loss

    cfg = model.cfg
    device = next(model.parameters()).device
    mask = {place: [torch.ones(cfg.heads_of(place, i), device=device, requires_grad=True)
                    for i in range(cfg.layers_of(place))] for place in PLACES}
    total = {place: [torch.zeros_like(m) for m in layers] for place, layers in mask.items()}
    was_training, saved = model.training, model.head_mask
    model.eval()
    model.head_mask = mask
    try:
        for batch in data:
            logits = model(batch.src, batch.tgt_in).logits
            nll = label_smoothed_loss(logits, batch.tgt_out, cfg.pad_id, 0.0)[0] / max(batch.n_tgt_tokens, 1)
            grads = torch.autograd.grad(nll, [m for layers in mask.values() for m in layers], allow_unused=True)
            flat = [t for layers in total.values() for t in layers]
            for t, g in zip(flat, grads):
                if g is not None:
                    t += g.abs()
    finally:
        model.head_mask = saved
        model.train(was_training)
    if normalise:  # Michel et al.: each layer's scores over their L2 norm
        total = {p: [t / (t.norm() + 1e-20) for t in layers] for p, layers in total.items()}
    return total


@torch.inference_mode()
def confidence_scores(model: Transformer, data) -> dict[str, list[torch.Tensor]]:
    """Per place, per layer: (H_l,) mean largest attention weight over the real (unpadded) query positions."""
    cfg = model.cfg
    sums = {place: [torch.zeros(cfg.heads_of(place, i)) for i in range(cfg.layers_of(place))] for place in PLACES}
    counts = {"enc_self": 0, "dec_self": 0, "cross": 0}
    was_training = model.training
    model.eval()
    try:
        for batch in data:
            enc = model.encode(batch.src, need_weights=True)
            dec = model.decode(batch.tgt_in, enc, need_weights=True)
            src_rows, tgt_rows = enc.mask, batch.tgt_in.ne(cfg.pad_id)  # (B, S), (B, T)
            for place, weights, rows in (("enc_self", enc.self_attn, src_rows), ("dec_self", dec.self_attn, tgt_rows),
                                         ("cross", dec.cross_attn, tgt_rows)):
                for i, w in enumerate(weights):  # (B, H, T, S)
                    top = w.float().amax(dim=-1) * rows.unsqueeze(1)  # (B, H, T)
                    sums[place][i] += top.sum(dim=(0, 2)).cpu()
                counts[place] += int(rows.sum())
    finally:
        model.train(was_training)
    return {place: [s / max(counts[place], 1) for s in layers] for place, layers in sums.items()}


def format_table(rows: list[dict]) -> list[str]:
    """The table `xattn heads importance` prints and saves (tab-separated, with a header)."""
    return ["layer\tplace\thead\tscore"] + [f"{r['layer']}\t{r['place']}\t{r['head']}\t{r['score']:.6g}" for r in rows]


def read_table(path) -> list[dict]:
    """A table `format_table` wrote; a malformed line is a one-line XattnError naming the file and line."""
    from xattn.errors import XattnError
    from xattn.io import read_lines

    lines = read_lines(path)
    if not lines or lines[0].split("\t") != ["layer", "place", "head", "score"]:
        raise XattnError(f"{path}: line 1: expected the header layer, place, head, score (tab-separated)")
    rows = []
    for n, line in enumerate(lines[1:], start=2):
        parts = line.split("\t")
        try:
            layer, place, head, score = int(parts[0]), parts[1], int(parts[2]), float(parts[3])
        except (IndexError, ValueError):
            raise XattnError(f"{path}: line {n}: expected layer, place, head and score, got {line!r}") from None
        if not math.isfinite(score):
            raise XattnError(f"{path}: line {n}: the score {parts[3]!r} is not a finite number")
        if place not in PLACES:
            raise XattnError(f"{path}: line {n}: {place!r} is not a place; one of {', '.join(PLACES)}")
        rows.append({"place": place, "layer": layer, "head": head, "score": score})
    return rows
