"""The C allocator under PyTorch's CPU tensors, set to keep the memory that decoding frees.

PyTorch's CPU tensors come from the C library's malloc, and decoding allocates and frees thousands of them a
second. By default glibc gives freed memory back to the kernel: blocks of 128 KiB or more are mapped and unmapped
one by one until its adaptive threshold has risen past them, and free memory at the top of a heap above its trim
threshold is returned after every batch. Each time the memory comes back as fresh pages, which the kernel faults in
and zeroes. `keep_freed_memory` sets glibc's thresholds so that blocks under 32 MiB come from the heap and up to
KEEP_BYTES of free memory stays with each heap, as caching allocators such as jemalloc keep theirs: fewer page
faults, and quicker decoding (the figures: benchmarks/README.md, Translation speed). The process's memory stays near
its peak instead of shrinking between batches.

It is a setting of the whole process, made once, when the first Translator on the CPU is made (inference.py);
XATTN_KEEP_MEMORY=0 in the environment leaves glibc as it is. Other C libraries (musl, macOS, Windows) are left alone.
"""
from __future__ import annotations

import ctypes
import os
import threading

KEEP_BYTES = 256 << 20
"""Free memory each heap keeps (M_TRIM_THRESHOLD), and the headroom it asks the kernel for at once (M_TOP_PAD)."""
MMAP_BYTES = 32 << 20
"""Blocks from this size up are mapped on their own (M_MMAP_THRESHOLD; glibc's largest on 64-bit systems)."""
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h

_lock = threading.Lock()
_state: bool | None = None  # whether it was applied, once tried


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep what decoding frees (module docstring), once per process; whether it is set. All
    three thresholds together: a trim threshold alone turns off glibc's adaptive mapping threshold and leaves it at
    128 KiB, which maps and unmaps every larger tensor, many times the page faults of the default."""
    global _state
    with _lock:
        if _state is None:
            _state = os.environ.get("XATTN_KEEP_MEMORY", "1") != "0" and _set_thresholds()
        return _state


def _set_thresholds() -> bool:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: another allocator's mallopt (if any) means other things
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # (TypeError: Windows' ctypes takes no None)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in
               ((M_MMAP_THRESHOLD, MMAP_BYTES), (M_TRIM_THRESHOLD, KEEP_BYTES), (M_TOP_PAD, KEEP_BYTES)))
