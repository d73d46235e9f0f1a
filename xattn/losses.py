"""Training losses, below both training (training.py) and analysis (head importance, analysis/importance.py)."""
from __future__ import annotations

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
