"""Cross-attention heatmaps as PNG files (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from xattn.io import atomic_write


def plot_attention(weights: np.ndarray, src_tokens: list[str], tgt_tokens: list[str], path: str | Path,
                   title: str | None = None) -> Path:
    """Write a (T, S) attention map as a heatmap: target tokens down, source tokens across.

    `weights` may also be (L, H, T, S); then the heads of the last layer are averaged, the view
    most often used to read alignments from cross-attention.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weights = np.asarray(weights, dtype=np.float32)
    if weights.ndim == 4:
        weights = weights[-1].mean(axis=0)  # (T, S)
    T, S = weights.shape
    if (T, S) != (len(tgt_tokens), len(src_tokens)):
        raise ValueError(f"weights {weights.shape} do not match {len(tgt_tokens)} target x {len(src_tokens)} source tokens")
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * S + 1.5), max(3.0, 0.4 * T + 1.2)))
    image = ax.imshow(weights, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(S), src_tokens, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(T), tgt_tokens, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04)
    fig.tight_layout()
    path = Path(path)
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png"))
    plt.close(fig)
    return path
