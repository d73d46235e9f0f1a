"""Batching: how a translate call groups its sentences. Token-budget batches sorted by length, the shares of its
workers (xattn.workers), and the padded id tensor of a batch."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | None = None) -> Tensor:
    """N id lists -> (N, max length) int64, right-padded with pad_id."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)


def token_batches(lengths: Sequence[int], max_tokens: int, beam_size: int = 1) -> list[list[int]]:
    """Indices grouped by length so that beam_size * batch * longest source <= max_tokens.

    Sorting by length keeps padding low; a sentence over the budget on its own gets its own batch.
    """
    batches: list[list[int]] = []
    for i in by_length(lengths):
        if batches and beam_size * (len(batches[-1]) + 1) * lengths[i] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def shares(lengths: Sequence[int], workers: int) -> list[list[int]]:
    """The indices of `lengths`, dealt in turn by length to `workers` parts (none empty): every part holds the same
    mix of short and long sentences, so the parts take about as long. Each part keeps the order of its lengths."""
    order = by_length(lengths)
    return [order[w::workers] for w in range(min(workers, len(order)))]


def by_length(lengths: Sequence[int]) -> list[int]:
    """The indices of `lengths`, shortest first (ties in input order)."""
    return sorted(range(len(lengths)), key=lambda i: lengths[i])
