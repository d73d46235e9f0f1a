"""The corpus path: parallel text read and cleaned (text.py), token ids in batches (batching.py), and
prepared corpora, token ids in flat arrays that every process memory-maps (prepared.py)."""
from xattn.data.text import FilterStats, Pair, clean_pairs, read_lines, read_parallel, read_tsv

BATCHING = ("Batch", "TokenBatchSampler", "TokenizedCorpus", "collate", "pad_sequences", "tokenize_pairs")
"""From batching.py, imported on first use (it needs torch; preparing a corpus does not)."""


def __getattr__(name: str):
    if name in BATCHING:
        from xattn.data import batching

        return getattr(batching, name)
    raise AttributeError(f"module 'xattn.data' has no attribute {name!r}")

__all__ = ["Batch", "FilterStats", "Pair", "TokenBatchSampler", "TokenizedCorpus", "clean_pairs", "collate",
           "pad_sequences", "read_lines", "read_parallel", "read_tsv", "tokenize_pairs"]
