"""Batching: how a translate call groups its sentences. Token-budget batches sorted by length, the shares of its
workers (xattn.workers), and the padded id tensor of a batch."""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | None = None) -> Tensor:
    """N id lists -> (N, max length) int64, right-padded with pad_id."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)


OUTPUT_POSITIONS = 1 << 24
"""The most rows x output positions a batch of a search may hold, in tokens (int64; a position's attention tracked
along the search counts half a token per float32 value): its token buffers, and its attention's, are made for the
longest output its sentences may have. Default lengths (1.5 x source + 10) stay below it under the default token
budget; a max_len_b of 100,000 on 4,000 one-word lines asked for 3.2 GB at once, and ended in a traceback or the
OOM killer."""


def token_batches(lengths: Sequence[int], max_tokens: int, beam_size: int = 1,
                  outputs: Callable[[int], int] | None = None) -> list[list[int]]:
    """Indices grouped by length so that beam_size * batch * longest source <= max_tokens, and, with `outputs` (a
    source length -> what its search may hold per row, in OUTPUT_POSITIONS' tokens, growing with it), beam_size *
    batch * the longest's outputs <= OUTPUT_POSITIONS.

    Sorting by length keeps padding low; a sentence over a budget on its own gets its own batch.
    """
    batches: list[list[int]] = []
    for i in by_length(lengths):
        rows = beam_size * (len(batches[-1]) + 1) if batches else 0
        if batches and rows * lengths[i] <= max_tokens and (outputs is None or rows * outputs(lengths[i])
                                                              <= OUTPUT_POSITIONS):
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
