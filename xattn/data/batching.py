"""Token ids in batches: padded Batches, a tokenized corpus in memory, the token-budget sampler.

Shapes: B batch, S source length (tokens + eos), T target length (tokens + 1).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from xattn.data.text import Pair
from xattn.errors import XattnError
from xattn.tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerPair


@dataclass
class Batch:
    """One padded training batch; padding is `pad_id` on the right.

    src (B, S) int64: tokens + eos.  tgt_in (B, T) int64: bos + tokens.  tgt_out (B, T) int64: tokens + eos.
    n_tgt_tokens: non-pad positions in tgt_out.  indices: corpus index of each row.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_tgt_tokens: int
    indices: list[int]

    def __len__(self) -> int:
        return len(self.indices)

    def to(self, device: torch.device | str) -> Batch:
        return replace(self, src=self.src.to(device), tgt_in=self.tgt_in.to(device), tgt_out=self.tgt_out.to(device))


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
) -> Batch:
    """Token ids without bos/eos -> a Batch (src gets eos; tgt_in gets bos, tgt_out gets eos)."""
    tgt_out = pad_sequences([[*t, eos_id] for t in tgt_ids], pad_id)
    return Batch(
        src=pad_sequences([[*s, eos_id] for s in src_ids], pad_id),
        tgt_in=pad_sequences([[bos_id, *t] for t in tgt_ids], pad_id),
        tgt_out=tgt_out,
        n_tgt_tokens=int((tgt_out != pad_id).sum()),
        indices=list(indices),
    )


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


class TokenBatchSampler:
    """Batches of corpus indices whose padded size n_sentences * max(S, T) stays within `max_tokens`.

    With `shuffle`, each epoch shuffles the corpus, sorts chunks of `bucket_size` examples by length,
    packs them greedily and shuffles the batch order; the result is a pure function of
    (seed, epoch, lengths), so training can resume at any batch of any epoch. Without `shuffle`,
    batches follow ascending length (for validation and translation). An example longer than
    `max_tokens` gets a batch of its own.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        bucket_size: int = 8192,
    ):
        if len(src_lengths) != len(tgt_lengths):
            raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target lengths")
        if max_tokens <= 0 or bucket_size <= 0 or seed < 0:
            raise XattnError(f"max_tokens, bucket_size must be positive and seed >= 0, got "
                             f"{max_tokens}, {bucket_size}, {seed}")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
        self.max_tokens, self.shuffle, self.seed, self.bucket_size = max_tokens, shuffle, seed, bucket_size
        self._lengths = np.maximum(self.src_lengths, self.tgt_lengths)

    def batches(self, epoch: int = 0) -> list[list[int]]:
        """The batches of `epoch`, in order, each a list of corpus indices."""
        if not self.shuffle:
            return self._pack(np.argsort(self._lengths, kind="stable"))
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self._lengths))
        batches = []
        for start in range(0, len(order), self.bucket_size):
            chunk = order[start : start + self.bucket_size]
            batches += self._pack(chunk[np.argsort(self._lengths[chunk], kind="stable")])
        return [batches[i] for i in rng.permutation(len(batches))]

    def _pack(self, indices: np.ndarray) -> list[list[int]]:
        batches, current, longest = [], [], 0
        for i, n in zip(indices.tolist(), self._lengths[indices].tolist()):
            if current and (len(current) + 1) * max(longest, n) > self.max_tokens:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, n)
        if current:
            batches.append(current)
        return batches

    def __len__(self) -> int:
        """Number of batches in epoch 0 (other epochs may differ slightly)."""
        return len(self.batches(0))

    def padding_fraction(self, batches: Sequence[Sequence[int]]) -> float:
        """Fraction of padded positions over the src and tgt tensors of `batches`."""
        real = padded = 0
        for batch in batches:
            src, tgt = self.src_lengths[list(batch)], self.tgt_lengths[list(batch)]
            real += int(src.sum() + tgt.sum())
            padded += len(batch) * int(src.max() + tgt.max())
        return 1.0 - real / padded if padded else 0.0
