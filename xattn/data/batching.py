"""Token ids in batches: padded Batches, a tokenized corpus in memory, the token-budget sampler.

Shapes: B batch, S source length (tokens + eos), T target length (tokens + 1).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from xattn.corpora import copies
from xattn.data.text import Pair
from xattn.errors import XattnError
from xattn.tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerPair


@dataclass
class Batch:
    """One padded training batch; padding is `pad_id` on the right.

    src (B, S) int64: tokens + eos.  tgt_in (B, T) int64: bos + tokens.  tgt_out (B, T) int64: tokens + eos.
    n_tgt_tokens: non-pad positions in tgt_out.  indices: corpus index of each row.
    links (K, 3) int64: alignment links (row b, target position t, source position s): the decoder position t
    that predicts tgt_out[b, t] should look at src[b, s] (xattn.losses.guided_alignment_loss); None when the
    corpus has none.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_tgt_tokens: int
    indices: list[int]
    links: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.indices)

    def to(self, device: torch.device | str) -> Batch:
        return replace(self, src=self.src.to(device), tgt_in=self.tgt_in.to(device), tgt_out=self.tgt_out.to(device),
                       links=self.links.to(device) if self.links is not None else None)


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> torch.Tensor:
    """N id lists -> (N, max len) int64, right-padded with `pad_id`."""
    out = torch.full((len(seqs), max((len(s) for s in seqs), default=0)), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out


def collate(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    indices: Sequence[int],
    pad_id: int = PAD_ID,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    links: Sequence[Sequence[int]] | None = None,
) -> Batch:
    """Token ids without bos/eos -> a Batch (src gets eos; tgt_in gets bos, tgt_out gets eos). `links[b]`: row
    b's piece links, flat (source piece, target piece, ...); piece t of the target is tgt_out[b, t]."""
    tgt_out = pad_sequences([[*t, eos_id] for t in tgt_ids], pad_id)
    return Batch(
        src=pad_sequences([[*s, eos_id] for s in src_ids], pad_id),
        tgt_in=pad_sequences([[bos_id, *t] for t in tgt_ids], pad_id),
        tgt_out=tgt_out,
        n_tgt_tokens=int((tgt_out != pad_id).sum()),
        indices=list(indices),
        links=batch_links(links) if links is not None else None,
    )


def batch_links(links: Sequence[Sequence[int]]) -> torch.Tensor:
    """Each row's flat piece links (s0, t0, s1, t1, ...) -> (K, 3) int64 (row, target position, source position)."""
    pairs = [np.asarray(flat, dtype=np.int64).reshape(-1, 2) for flat in links]  # (K_b, 2) (s, t)
    rows = np.repeat(np.arange(len(pairs), dtype=np.int64), [len(p) for p in pairs])
    st = np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)
    return torch.from_numpy(np.stack([rows, st[:, 1], st[:, 0]], axis=1))


@dataclass
class TokenizedCorpus:
    """Token ids of a parallel corpus, without bos/eos."""

    src: list[list[int]]
    tgt: list[list[int]]

    def __len__(self) -> int:
        return len(self.src)

    def src_lengths(self) -> list[int]:
        """Length of each source row in a Batch (tokens + eos)."""
        return [len(s) + 1 for s in self.src]

    def tgt_lengths(self) -> list[int]:
        """Length of each target row in a Batch (tokens + bos or eos)."""
        return [len(t) + 1 for t in self.tgt]

    def collate(self, indices: Sequence[int]) -> Batch:
        return collate([self.src[i] for i in indices], [self.tgt[i] for i in indices], indices)


def tokenize_pairs(pairs: Sequence[Pair], tokenizers: TokenizerPair, max_len: int | None = None) -> TokenizedCorpus:
    """Encode both sides; with `max_len`, keep at most that many tokens per side (before bos/eos)."""
    src = tokenizers.src.encode_batch([s for s, _ in pairs])
    tgt = tokenizers.tgt.encode_batch([t for _, t in pairs])
    if max_len is not None:
        src, tgt = [s[:max_len] for s in src], [t[:max_len] for t in tgt]
    return TokenizedCorpus(src, tgt)


class Batches(Sequence):
    """An epoch's batches without a Python list per batch: batch k is `order[bounds[k, 0]:bounds[k, 1]]`, read
    as a list of corpus indices. Slicing gives another Batches (a rank's share, a group of micro-batches), so
    an epoch of millions of pairs costs one index array.

    order (N,) int: corpus indices, batch by batch.  bounds (K, 2) int64: where each batch starts and ends.
    """

    def __init__(self, order: np.ndarray, bounds: np.ndarray):
        self.order, self.bounds = order, bounds

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return Batches(self.order, self.bounds[k])
        start, end = self.bounds[k]
        return self.order[start:end].tolist()

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == list(b) for a, b in zip(self, other))

    def __repr__(self) -> str:
        return f"Batches({len(self)} batches of {int(np.sum(self.bounds[:, 1] - self.bounds[:, 0]))} indices)"


class TokenBatchSampler:
    """Batches of corpus indices whose padded size n_sentences * max(S, T) stays within `max_tokens`.

    With `shuffle`, each epoch shuffles the corpus, sorts chunks of `bucket_size` examples by length,
    packs them greedily and shuffles the batch order; the result is a pure function of
    (seed, epoch, lengths), so training can resume at any batch of any epoch. Without `shuffle`,
    batches follow ascending length (for validation and translation). An example longer than
    `max_tokens` gets a batch of its own. Everything is held in numpy arrays (a few bytes a pair), so
    the lengths of a memory-mapped corpus of millions of pairs are batched in seconds. With `mixture` =
    (pairs of each corpus, the copies an epoch draws of each; xattn.corpora), the corpora lying one after
    another, each shuffled epoch draws every pair of corpus k floor(f_k) times and a seeded sample of the rest
    of f_k once more, before shuffling and packing as above.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        bucket_size: int = 8192,
        mixture: tuple[Sequence[int], Sequence[float]] | None = None,
    ):
        if len(src_lengths) != len(tgt_lengths):
            raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths")
        if max_tokens <= 0 or bucket_size <= 0 or seed < 0:
            raise XattnError(f"max_tokens, bucket_size must be positive and seed >= 0, got "
                             f"{max_tokens}, {bucket_size}, {seed}")
        self.src_lengths, self.tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
        self.max_tokens, self.shuffle, self.seed, self.bucket_size = max_tokens, shuffle, seed, bucket_size
        if mixture is not None and sum(mixture[0]) != len(src_lengths):
            raise ValueError(f"a mixture of {sum(mixture[0])} pairs for {len(src_lengths)} lengths")
        self.mixture = mixture
        self._lengths = np.maximum(self.src_lengths, self.tgt_lengths)
        self._index = np.int32 if len(self._lengths) < 2**31 else np.int64
        self._last: tuple[int, Batches] | None = None

    def batches(self, epoch: int = 0) -> Batches:
        """The batches of `epoch`, in order, each a list of corpus indices (the last epoch asked is kept)."""
        if self._last is None or self._last[0] != (epoch if self.shuffle else 0):
            self._last = (epoch if self.shuffle else 0), self._make(epoch)
        return self._last[1]

    def _make(self, epoch: int) -> Batches:
        if not self.shuffle:
            order = np.argsort(self._lengths, kind="stable").astype(self._index)
            return Batches(order, self._pack(order, 0))
        rng = np.random.default_rng([self.seed, epoch])
        drawn = self._drawn(rng) if self.mixture is not None else len(self._lengths)
        order = rng.permutation(drawn).astype(self._index)
        bounds = []
        for start in range(0, len(order), self.bucket_size):
            chunk = order[start : start + self.bucket_size]
            order[start : start + len(chunk)] = chunk[np.argsort(self._lengths[chunk], kind="stable")]
            bounds.append(self._pack(order[start : start + len(chunk)], start))
        bounds = np.concatenate(bounds) if bounds else np.zeros((0, 2), dtype=np.int64)
        return Batches(order, bounds[rng.permutation(len(bounds))])

    def _drawn(self, rng: np.random.Generator) -> np.ndarray:
        """The corpus indices an epoch of the mixture draws, in corpus order (see the class)."""
        drawn, start = [], 0
        for n, factor in zip(*self.mixture):
            whole, extra = copies(n, factor)
            drawn += [np.arange(start, start + n)] * whole + [start + np.sort(rng.choice(n, extra, replace=False))]
            start += n
        return np.concatenate(drawn)

    def _pack(self, indices: np.ndarray, offset: int) -> np.ndarray:
        """(K, 2) bounds, offset by `offset`, of the greedy packing of `indices` (sorted by ascending length,
        so a batch's longest example is its last): a batch takes the next example while
        (examples + 1) * its length <= max_tokens."""
        lengths = self._lengths[indices]
        starts, start, n = [], 0, len(indices)
        while start < n:
            room = self.max_tokens // max(int(lengths[start]), 1)  # no batch from here holds more examples
            window = lengths[start : start + room]
            fits = np.arange(1, len(window) + 1) * window <= self.max_tokens
            starts.append(start)
            start += max(1, len(window) if fits.all() else int(np.argmin(fits)))
        bounds = np.empty((len(starts), 2), dtype=np.int64)
        bounds[:, 0] = starts
        bounds[:-1, 1], bounds[-1:, 1] = bounds[1:, 0], n
        return bounds + offset

    def __len__(self) -> int:
        """Number of batches in epoch 0 (other epochs may differ slightly)."""
        return len(self.batches(0))

    def padding_fraction(self, batches: Sequence[Sequence[int]]) -> float:
        """Fraction of padded positions over the src and tgt tensors of `batches`. An epoch's Batches (one
        contiguous run of `order`) is measured in a few array operations, without a list per batch."""
        if isinstance(batches, Batches) and len(batches):
            bounds = batches.bounds[np.argsort(batches.bounds[:, 0], kind="stable")]
            if np.array_equal(bounds[1:, 0], bounds[:-1, 1]):
                run = batches.order[bounds[0, 0]:bounds[-1, 1]]
                src, tgt = self.src_lengths[run], self.tgt_lengths[run]
                starts, sizes = bounds[:, 0] - bounds[0, 0], bounds[:, 1] - bounds[:, 0]
                real = int(src.sum(dtype=np.int64)) + int(tgt.sum(dtype=np.int64))
                longest = np.maximum.reduceat(src, starts).astype(np.int64) + np.maximum.reduceat(tgt, starts)
                padded = int(np.sum(sizes * longest))
                return 1.0 - real / padded if padded else 0.0
        real = padded = 0
        for batch in batches:
            src, tgt = self.src_lengths[list(batch)], self.tgt_lengths[list(batch)]
            real += int(src.sum() + tgt.sum())
            padded += len(batch) * int(src.max() + tgt.max())
        return 1.0 - real / padded if padded else 0.0
