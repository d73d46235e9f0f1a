"""Where and in what precision a run computes: the device a config names, and the autocast dtype."""
from __future__ import annotations

from pathlib import Path

import torch

from xattn.errors import XattnError


def amp_dtype(choice: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `choice` on `device` (None: full float32)."""
    if choice == "none":
        return None
    if choice == "fp16":
        if device.type != "cuda":
            raise XattnError("train.amp=fp16 needs a CUDA device; use bf16 or none on CPU")
        return torch.float16
    if choice == "bf16" or device.type == "cpu":
        return torch.bfloat16 if choice == "bf16" or _cpu_has_fast_bf16() else None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _cpu_has_fast_bf16() -> bool:
    """True where the CPU computes bf16 natively (AVX512-BF16 or AMX), so bf16 autocast speeds training up."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(choice: str) -> torch.device:
    """"auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N"; a one-line error for CUDA without a GPU."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice.startswith("cuda") and not torch.cuda.is_available():
        raise XattnError(f"train.device={choice}: no CUDA device is available")
    return torch.device(choice)
