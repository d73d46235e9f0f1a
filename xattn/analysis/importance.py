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

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch

from xattn.analysis.maps import check_positions
from xattn.data import TokenBatchSampler, tokenize_pairs
from xattn.checks import NON_NEGATIVE, Check, finite, one_of, read_record, sha256_hex, validate
from xattn.errors import ParameterError, XattnError
from xattn.lines import read_lines
from xattn.losses import label_smoothed_loss
from xattn.model import Transformer
from xattn.registry import IMPORTANCE_FILE, IMPORTANCE_METHODS, PLACES, place_problem  # noqa: F401 (IMPORTANCE_FILE re-exported)

def batches(translator, sources: Sequence[str], targets: Sequence[str], max_tokens: int = 4096):
    """Padded teacher-forcing batches (xattn.data.Batch) of the pairs, on the translator's device. A pair too long for
    the model's learned positions is an ItemError naming it (`sources[i]`, `targets[i]`), not the model's error of
    a batch, which named no pair."""
    corpus = tokenize_pairs(list(zip(sources, targets)), translator.tokenizers)
    for name, lengths in (("sources", corpus.src_lengths()), ("targets", corpus.tgt_lengths())):
        check_positions(translator.model.cfg, name, lengths)
    sampler = TokenBatchSampler(corpus.src_lengths(), corpus.tgt_lengths(), max_tokens, shuffle=False)
    return [corpus.collate(indices).to(translator.device) for indices in sampler.batches()]


def head_importance(model: Transformer, data, method: str = "gradient") -> list[dict]:
    """Rows {place, layer, head, score} for every head of `model` over `data` (Batches), in model order."""
    if method not in IMPORTANCE_METHODS:
        raise ParameterError("method", one_of(*IMPORTANCE_METHODS)(method))
    scores = gradient_scores(model, data) if method == "gradient" else confidence_scores(model, data)
    return [{"place": place, "layer": i, "head": h, "score": float(s)}
            for place in PLACES for i, layer in enumerate(scores[place]) for h, s in enumerate(layer.tolist())]


def gradient_scores(model: Transformer, data, normalise: bool = True) -> dict[str, list[torch.Tensor]]:
    """Per place, per layer: (H_l,) expected absolute gradients of the loss w.r.t. the head mask."""
    cfg = model.cfg
    device = next(model.parameters()).device
    mask = {place: [torch.ones(cfg.heads_of(place, i), device=device, requires_grad=True)
                    for i in range(cfg.layers_of(place))] for place in PLACES}
    total = {place: [torch.zeros_like(m) for m in layers] for place, layers in mask.items()}
    was_training = model.training
    model.eval()
    try:
        for batch in data:
            logits = model(batch.src, batch.tgt_in, head_mask=mask).logits
            nll = label_smoothed_loss(logits, batch.tgt_out, cfg.pad_id, 0.0)[0] / max(batch.n_tgt_tokens, 1)
            grads = torch.autograd.grad(nll, [m for layers in mask.values() for m in layers], allow_unused=True)
            flat = [t for layers in total.values() for t in layers]
            for t, g in zip(flat, grads):
                if g is not None:
                    t += g.abs()
    finally:
        model.train(was_training)
    if normalise:  # Michel et al.: each layer's scores over their L2 norm
        total = {p: [t / (t.norm() + 1e-20) for t in layers] for p, layers in total.items()}
    return total


@torch.inference_mode()
def confidence_scores(model: Transformer, data) -> dict[str, list[torch.Tensor]]:
    """Per place, per layer: (H_l,) mean largest attention weight over the real (unpadded) query positions."""
    cfg = model.cfg
    sums = {place: [torch.zeros(cfg.heads_of(place, i)) for i in range(cfg.layers_of(place))] for place in PLACES}
    counts = dict.fromkeys(PLACES, 0)
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


COLUMNS = ["layer", "place", "head", "score"]


@dataclass(frozen=True)
class Row:
    """One line of an importance table."""
    layer: int
    place: str
    head: int
    score: float

    CHECKS: ClassVar[dict[str, Check]] = dict(layer=NON_NEGATIVE, place=place_problem, head=NON_NEGATIVE,
                                              score=finite)

    def __post_init__(self) -> None:
        validate(self, "")


@dataclass(frozen=True)
class About:
    """The `# key: value` lines above a table's header: how it was measured, on which weights."""
    weights: str                        # checkpoint.weights_id of the model's weights
    method: str

    CHECKS: ClassVar[dict[str, Check]] = dict(weights=sha256_hex, method=one_of(*IMPORTANCE_METHODS))

    def __post_init__(self) -> None:
        validate(self, "")


def format_table(rows: list[dict], about: About) -> list[str]:
    """The table `xattn heads importance` prints and saves: `# key: value` lines (About), then tab-separated
    columns with a header."""
    return [f"# {key}: {value}" for key, value in dataclasses.asdict(about).items()] + ["\t".join(COLUMNS)] + \
        [f"{r['layer']}\t{r['place']}\t{r['head']}\t{r['score']:.6g}" for r in rows]


def read_table(path, weights: str | None = None) -> list[dict]:
    """The rows of a table `format_table` wrote. A malformed line, a head given twice, or (with `weights`, the
    weights_id of the model it is for) a table measured on other weights is a one-line XattnError naming the
    file, and the line where there is one."""
    lines = read_lines(path)
    info, n = {}, 0
    while n < len(lines) and lines[n].startswith("#"):
        key, sep, value = lines[n][1:].partition(":")
        if not sep or key.strip() in info:
            raise XattnError(f"{path}: line {n + 1}: expected `# key: value`, each key once, got {lines[n]!r}")
        info[key.strip()] = value.strip()
        n += 1
    if n == len(lines) or lines[n].split("\t") != COLUMNS:
        raise XattnError(f"{path}: line {n + 1}: expected the header {', '.join(COLUMNS)} (tab-separated)")
    if "weights" not in info:
        raise XattnError(f"{path}: does not name the weights it was measured on (a `# weights:` line above the "
                         "header); run `xattn heads importance` again")
    about = read_record(About, info, f"{path}: the lines `# key: value` above the header")
    rows, first = [], {}
    for k, line in enumerate(lines[n + 1:], start=n + 2):
        parts = line.split("\t")
        if len(parts) != len(COLUMNS):
            raise XattnError(f"{path}: line {k}: expected {len(COLUMNS)} tab-separated values "
                             f"({', '.join(COLUMNS)}), got {line!r}")
        row = read_record(Row, dict(zip(COLUMNS, parts)), f"{path}: line {k}")
        head = (row.place, row.layer, row.head)
        if head in first:
            raise XattnError(f"{path}: line {k}: {row.place} layer {row.layer} head {row.head} is given twice "
                             f"(first on line {first[head]})")
        first[head] = k
        rows.append(dataclasses.asdict(row))
    if weights is not None and about.weights != weights:
        raise XattnError(f"{path}: measured on other weights than this model's; run `xattn heads importance` on "
                         "this model again")
    return rows
