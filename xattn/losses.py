"""Training losses, below both training (training.py) and analysis (head importance, analysis/importance.py):
label-smoothed cross-entropy, and the guided-alignment loss that teaches chosen cross-attention heads word links.

Shapes: B batch, T target positions, S source positions, H heads, V vocabulary, K links.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, T, V), target (B, T) -> (smoothed loss, NLL), both summed over non-pad tokens.

    The smoothed loss is (1 - eps) * NLL + eps * mean over the vocabulary of -log p, as in
    `F.cross_entropy(label_smoothing=eps)`; one log-softmax serves both figures.
    """
    lprobs = logits.float().log_softmax(dim=-1).flatten(0, 1)  # (B*T, V)
    target = target.flatten()
    keep = target.ne(pad_id).float()  # (B*T,)
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1) * keep
    smooth = -lprobs.mean(dim=-1) * keep
    return ((1.0 - smoothing) * nll + smoothing * smooth).sum(), nll.sum().detach()


def supervised_attention(cross: torch.Tensor, heads: Sequence[int] | None) -> torch.Tensor:
    """One layer's cross-attention (B, H, T, S) -> (B, T, S): the mean of `heads` (None: all of them)."""
    return (cross if heads is None else cross[:, list(heads)]).float().mean(dim=1)


def guided_alignment_loss(attention: torch.Tensor, links: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The guided-alignment loss (Garg et al. 2019) of attention (B, T, S) against links (K, 3) int64, each a
    distinct (batch row b, target position t, source position s): decoder position t, which predicts target
    piece t, should look at source piece s.

    A position t with links has the target distribution p = its links normalised over the source (1/n on each
    of its n linked pieces). Its loss is KL(p || a) = sum_s p_s (log p_s - log a_s): the cross-entropy
    -sum_s p_s log a_s of fairseq, Marian ("ce") and OpenNMT-py less the entropy of p, which the model cannot
    change; so the gradient is theirs, and a row's loss is 0 exactly when its attention equals p (its minimum,
    as a row of attention sums to at most 1 over the linked pieces). Positions without links, and rows
    without any, contribute nothing. Returns (the loss summed over positions with links, their number).
    """
    if links.numel() == 0:
        return attention.new_zeros(()), 0
    B, T, S = attention.shape
    b, t, s = links.unbind(dim=1)
    row = b * T + t  # (K,) one id per target position
    counts = torch.bincount(row, minlength=B * T)  # (B*T,) links of each position
    p = 1.0 / counts[row].float()  # (K,)
    a = attention[b, t, s].float().clamp_min(torch.finfo(torch.float32).tiny)  # (K,)
    return (p * (p.log() - a.log())).sum(), int(counts.count_nonzero())


@dataclass(frozen=True)
class GuidedAlignment:
    """The guided-alignment term of a training step: `weight` times guided_alignment_loss of the mean of
    `heads` (None: all) of decoder layer `layer`'s cross-attention (xattn.guidance.AlignmentConfig)."""
    layer: int
    heads: tuple[int, ...] | None
    weight: float

    @property
    def cross_layers(self) -> tuple[int, ...]:
        """The layers whose cross-attention weights the decoder must return (Transformer.decode)."""
        return (self.layer,)

    def __call__(self, cross_attn: Sequence[torch.Tensor | None], links: torch.Tensor) -> tuple[torch.Tensor, float, int]:
        """cross_attn: per decoder layer (B, H, T, S) or None; links (K, 3) as in guided_alignment_loss ->
        (weight * loss, the loss, target positions with links)."""
        loss, rows = guided_alignment_loss(supervised_attention(cross_attn[self.layer], self.heads), links)
        return self.weight * loss, float(loss.detach()), rows
