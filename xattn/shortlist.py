"""Lexical shortlists: decoding over the few target tokens a batch's sources can translate into.

The output projection (target vocabulary x d_model) is the largest matrix a decoder step multiplies by;
most of its rows cannot be the next token of a given sentence. As Marian's lexical shortlists and
CTranslate2's vocabulary map do, a shortlist lists for every source token the target tokens that occur
most often in the translations of the training sentences holding it, ranked by the Dice coefficient
2 c(s, t) / (c(s) + c(t)) over sentence pairs (c: pairs containing a token, or both); the `frequent`
most frequent target tokens are on every list. A sentence may produce the tokens of its own source tokens'
lists, with EOS, UNK and its forced prefix's tokens (`Shortlist.candidates`): the output projection of a
batch is cut to the union of its sentences' lists, and each sentence's softmax is taken over its own list,
every other token -inf (decoding/step.py), so that a sentence gets the same translation whichever other
sentences share its batch (CTranslate2's vocabulary map and Marian's shortlists score the whole union). Built by `xattn shortlist` from a model's training corpus, stored in
the model directory as shortlist.safetensors, used with `translate --shortlist` (DecodeConfig.shortlist).
The BLEU it costs and the speed it gains: benchmarks/README.md, Translation speed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from xattn.decoding.processors import Vocab
from xattn.errors import XattnError
from xattn.tokenizer import tokenizer_hashes

FILE = "shortlist.safetensors"
CHUNK = 20_000  # sentence pairs counted at a time


@dataclass(frozen=True)
class Shortlist:
    frequent: np.ndarray        # (M,) int64: target ids on every list (the most frequent, then EOS and UNK)
    table: np.ndarray           # (V_src, k) int32: per source id its best target ids, best first; -1 where fewer
    pairs: int = 0              # sentence pairs it was counted on

    @property
    def per_source(self) -> int:
        return self.table.shape[1]

    def candidates(self, src: Tensor, always: Sequence[int] = (), prefix: Tensor | None = None,
                   pad: int = -1) -> Vocab:
        """What each sentence of a batch may produce: src (B, S) source ids (pad's list is empty). A sentence's
        list: the lists of its source ids, the frequent ids, `always` and its own forced prefix (prefix (B, P),
        `pad` where it has ended). Vocab.ids: the sorted ids of all the lists, on src's device."""
        device = src.device
        listed = torch.from_numpy(self.table).to(device)[src].flatten(1).long()  # (B, S * k), -1 where none
        also = torch.tensor(list(always), dtype=torch.long, device=device)
        on_every = torch.cat([torch.from_numpy(self.frequent).to(device), also])
        own = torch.cat([listed, prefix.long().to(device)], 1) if prefix is not None else listed  # (B, S * k + P)
        own = own.masked_fill(own.eq(pad), -1)
        ids = torch.unique(torch.cat([own[own >= 0], on_every]))  # (W,) sorted
        column = torch.full((int(ids.max()) + 1,), len(ids), dtype=torch.long, device=device)
        column[ids] = torch.arange(len(ids), device=device)
        allowed = torch.zeros(src.shape[0], len(ids) + 1, dtype=torch.bool, device=device)  # a last column for -1
        allowed.scatter_(1, torch.where(own >= 0, column[own.clamp(min=0)], len(ids)), True)
        allowed[:, column[on_every]] = True
        return Vocab(ids, allowed[:, :-1])

    def save(self, folder: str | Path, metadata: dict) -> Path:
        from safetensors.torch import save

        from xattn.io import atomic_write_bytes

        path = Path(folder) / FILE
        tensors = {"frequent": torch.from_numpy(self.frequent), "table": torch.from_numpy(self.table)}
        atomic_write_bytes(path, save(tensors, {"pairs": str(self.pairs), **{k: json.dumps(v) for k, v in metadata.items()}}))
        return path

    @classmethod
    def load(cls, folder: str | Path, src_vocab: int, tgt_vocab: int) -> Shortlist:
        """The model directory's shortlist, checked against its vocabulary sizes; refused in one line."""
        from safetensors import SafetensorError, safe_open

        path = Path(folder) / FILE
        if not path.is_file():
            raise XattnError(f"{folder}: this model has no shortlist ({FILE}); build one with `xattn shortlist {folder}`")
        try:
            with safe_open(str(path), "np") as f:
                frequent, table = f.get_tensor("frequent").astype(np.int64), f.get_tensor("table").astype(np.int32)
                metadata = f.metadata() or {}
                pairs = int(metadata.get("pairs", 0))
                made_for = json.loads(metadata["tokenizers"]) if "tokenizers" in metadata else None
        except (SafetensorError, OSError, KeyError, ValueError) as e:
            raise XattnError(f"{path}: not a shortlist ({e}); build it again with `xattn shortlist {folder}`") from None
        if made_for is not None and made_for != tokenizer_hashes(folder):  # ids of other pieces, of the same number
            raise XattnError(f"{path}: made for other tokenizers than this model's (the SHA-256 of its "
                             f"{', '.join(made_for)} differ); build it again with `xattn shortlist {folder}`")
        if table.ndim != 2 or table.shape[0] != src_vocab or frequent.ndim != 1 \
                or (table.size and int(table.max()) >= tgt_vocab) or (frequent.size and int(frequent.max()) >= tgt_vocab) \
                or (frequent.size and int(frequent.min()) < 0):
            raise XattnError(f"{path}: made for another vocabulary (table {tuple(table.shape)}, this model has "
                             f"{src_vocab} source and {tgt_vocab} target ids); build it again with `xattn shortlist`")
        return cls(frequent, table, pairs)


def build(src: list[np.ndarray], tgt: list[np.ndarray], vocab: tuple[int, int], specials: list[int],
          per_source: int = 50, frequent: int = 100) -> Shortlist:
    """Count a shortlist over sentence pairs of id arrays `src`/`tgt`. `vocab`: (source, target) sizes;
    `specials`: target ids on every list besides the `frequent` most frequent (EOS, UNK). `xattn shortlist`
    feeds `Counts` chunk by chunk instead, to count corpora of any size."""
    counts = Counts(*vocab)
    for start in range(0, len(src), CHUNK):
        counts.add(src[start:start + CHUNK], tgt[start:start + CHUNK])
    return counts.shortlist(per_source, frequent, specials)


class Counts:
    """Sentence-pair counts of source tokens, target tokens and (source, target) co-occurrences."""

    def __init__(self, src_vocab: int, tgt_vocab: int):
        self.V = (src_vocab, tgt_vocab)
        self.src = np.zeros(src_vocab, np.int64)
        self.tgt = np.zeros(tgt_vocab, np.int64)
        self.keys = np.zeros(0, np.int64)     # s * V_tgt + t, sorted
        self.joint = np.zeros(0, np.int64)
        self.pairs = 0

    def add(self, src: list[np.ndarray], tgt: list[np.ndarray]) -> None:
        s_ids, s_len = unique_per_sentence(src, self.V[0])
        t_ids, t_len = unique_per_sentence(tgt, self.V[1])
        np.add.at(self.src, s_ids, 1)
        np.add.at(self.tgt, t_ids, 1)
        combos = s_len * t_len                      # (n,) co-occurring pairs of each sentence pair
        sent = np.repeat(np.arange(len(combos)), combos)
        r = np.arange(int(combos.sum())) - np.repeat(np.cumsum(combos) - combos, combos)
        s_start, t_start = np.cumsum(s_len) - s_len, np.cumsum(t_len) - t_len
        keys = s_ids[s_start[sent] + r // t_len[sent]] * self.V[1] + t_ids[t_start[sent] + r % t_len[sent]]
        new, n = np.unique(keys, return_counts=True)
        keys, joint = np.concatenate([self.keys, new]), np.concatenate([self.joint, n])
        self.keys, index = np.unique(keys, return_inverse=True)
        self.joint = np.bincount(index, weights=joint, minlength=len(self.keys)).astype(np.int64)
        self.pairs += len(src)

    def shortlist(self, per_source: int, frequent: int, specials: list[int]) -> Shortlist:
        always = np.argsort(-self.tgt, kind="stable")[:frequent]
        always = np.unique(np.concatenate([always[self.tgt[always] > 0], np.asarray(specials, np.int64)]))
        s, t = self.keys // self.V[1], self.keys % self.V[1]
        dice = 2 * self.joint / (self.src[s] + self.tgt[t])
        keep = ~np.isin(t, always)
        s, t, dice = s[keep], t[keep], dice[keep]
        order = np.lexsort((t, -dice, s))          # by source, then best first (ties: smaller id)
        s, t = s[order], t[order]
        rank = np.arange(len(s)) - np.searchsorted(s, s)  # position within its source's run
        top = rank < per_source
        table = np.full((self.V[0], per_source), -1, np.int32)
        table[s[top], rank[top]] = t[top]
        return Shortlist(always, table, self.pairs)


def unique_per_sentence(sentences: list[np.ndarray], vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ids of each sentence, concatenated (sorted within a sentence), and their counts."""
    lengths = np.fromiter((len(x) for x in sentences), np.int64, len(sentences))
    flat = np.concatenate([np.asarray(x, np.int64) for x in sentences]) if len(sentences) else np.zeros(0, np.int64)
    keys = np.unique(np.repeat(np.arange(len(sentences)), lengths) * vocab + flat)
    return keys % vocab, np.bincount(keys // vocab, minlength=len(sentences))
