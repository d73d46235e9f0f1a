"""Analysis of cross-attention: maps and plots (later: alignments, head importance, diagnostics)."""
