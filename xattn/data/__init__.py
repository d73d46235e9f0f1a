"""The corpus path: parallel text read and cleaned (text.py), token ids in batches (batching.py), and
prepared corpora, token ids in flat arrays that every process memory-maps (prepared.py)."""
from xattn.data.batching import Batch, TokenBatchSampler, TokenizedCorpus, collate, pad_sequences, tokenize_pairs
from xattn.data.text import FilterStats, Pair, clean_pairs, read_lines, read_parallel, read_tsv

__all__ = ["Batch", "FilterStats", "Pair", "TokenBatchSampler", "TokenizedCorpus", "clean_pairs", "collate",
           "pad_sequences", "read_lines", "read_parallel", "read_tsv", "tokenize_pairs"]
