"""Where and in what precision a run computes: the device a config names, and the autocast dtype."""
from __future__ import annotations

from pathlib import Path

import torch

from xattn.checks import device_name
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


def resolve_device(choice: str, key: str = "train.device") -> torch.device:
    """"auto" (CUDA when available, else CPU), "cpu", "cuda", "cuda:N" or "mps" ("cpu:0" and "mps:0" are "cpu" and
    "mps", as torch names them: one device); `key` names the setting in errors."""
    problem = device_name(str(choice))
    if problem:
        raise XattnError(f"{key}: {problem}")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice.startswith("cuda"):
        if not torch.cuda.is_available():
            raise XattnError(f"{key}={choice}: no CUDA device is available here; use cpu")
        index = torch.device(choice).index or 0
        if index >= torch.cuda.device_count():
            raise XattnError(f"{key}={choice}: there are {torch.cuda.device_count()} CUDA devices")
    if choice.startswith("mps") and not torch.backends.mps.is_available():
        raise XattnError(f"{key}={choice}: no Apple GPU (MPS) is available here; use cpu")
    return torch.device(choice.partition(":")[0] if choice in ("cpu:0", "mps:0") else choice)
