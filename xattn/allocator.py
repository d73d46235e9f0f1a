"""The C allocator under PyTorch's CPU tensors, set to keep the memory that decoding frees.

PyTorch's CPU tensors come from the C library's malloc, and decoding allocates and frees thousands of them a
second. By default glibc gives freed memory back to the kernel: blocks of 128 KiB or more are mapped and unmapped
one by one until its adaptive threshold has risen past them, and free memory at the top of a heap above its trim
threshold is returned after every batch. Each time the memory comes back as fresh pages, which the kernel faults in
and zeroes. `keep_freed_memory` sets glibc's thresholds so that blocks under 32 MiB come from the heap and the heaps
keep what is freed (the main heap returns free memory at its top only beyond KEEP_BYTES; a thread's heap, at most
64 MiB, never shrinks), as caching allocators such as jemalloc keep theirs: fewer page faults, and quicker decoding
(the figures: benchmarks/README.md, Translation speed). The cost: the process's memory stays near the peak that each
thread decoding in it has reached, instead of shrinking between batches.

It is a setting of the whole process, so the library never makes it by itself: the CLI's decoding verbs (translate,
evaluate, attention, diagnose) and `xattn serve` make it, and a program that uses xattn may call this itself. It is
not made where the process's allocator is not glibc's (musl, macOS, Windows, or jemalloc or tcmalloc preloaded),
where the environment sets glibc's malloc itself (MALLOC_*_ variables, glibc.malloc tunables), or with
XATTN_KEEP_MEMORY=0 (or false, no, off).
"""
from __future__ import annotations

import ctypes
import os
import threading

KEEP_BYTES = 256 << 20
"""Free memory the main heap keeps at its top (M_TRIM_THRESHOLD), and the headroom it asks the kernel for at once
(M_TOP_PAD)."""
MMAP_BYTES = 32 << 20
"""Blocks from this size up are mapped on their own (M_MMAP_THRESHOLD; glibc's largest on 64-bit systems)."""
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_",
                 "MALLOC_ARENA_MAX")
"""glibc's environment variables for its malloc: a process started with one is left as its user set it."""

_lock = threading.Lock()
_state: bool | None = None  # whether it was made, once tried


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep what decoding frees (module docstring), once per process; whether it is set. All
    three thresholds together: setting any of them freezes glibc's adaptive mapping threshold where it is (128 KiB in
    a fresh process), and a trim threshold alone then maps and unmaps every larger tensor, many times the page faults
    of the default."""
    global _state
    with _lock:
        if _state is None:
            _state = not _declined() and _set_thresholds()
        return _state


def _declined() -> bool:
    """Whether the environment turns it off, or sets glibc's malloc itself."""
    if os.environ.get("XATTN_KEEP_MEMORY", "1").strip().lower() in ("0", "false", "no", "off"):
        return True
    return any(name in os.environ for name in USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def _set_thresholds() -> bool:
    try:
        process, libc = ctypes.CDLL(None), ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # glibc's
        mallopt = libc.mallopt
        if not _glibc_allocates(process, libc):  # another allocator preloaded: glibc's thresholds would tune nothing
            return False
    except (OSError, AttributeError, TypeError):  # not glibc (TypeError: Windows' ctypes takes no None)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # (today's glibc takes all three; were one refused, those before it would stay set, the adaptive threshold off)
    return all(mallopt(param, value) == 1 for param, value in
               ((M_MMAP_THRESHOLD, MMAP_BYTES), (M_TRIM_THRESHOLD, KEEP_BYTES), (M_TOP_PAD, KEEP_BYTES)))


PROBE_BYTES = 64 << 20
"""A block glibc's malloc always maps on its own (above its largest mapping threshold, 32 MiB), never touched."""


def _glibc_allocates(process: ctypes.CDLL, libc: ctypes.CDLL) -> bool:
    """Whether the process's malloc is glibc's: a block it allocates shows in glibc's own count of mapped bytes (a
    preloaded jemalloc or tcmalloc keeps counts of its own). Comparing malloc's address in the process with libc's
    took the program's own PLT entry, which Debian's python3 has, for another allocator, and the setting was never
    made there."""
    fields = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]
    info = getattr(libc, "mallinfo2", None)
    if info is None:  # glibc before 2.33: the same fields as int
        info, fields = libc.mallinfo, [(name, ctypes.c_int) for name, _ in fields]
    info.argtypes, info.restype = [], type("Mallinfo", (ctypes.Structure,), {"_fields_": fields})
    malloc, free = process.malloc, process.free
    malloc.argtypes, malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    free.argtypes, free.restype = [ctypes.c_void_p], None
    before = info().hblkhd
    block = malloc(PROBE_BYTES)
    if not block:
        return False
    try:
        return info().hblkhd - before >= PROBE_BYTES
    finally:
        free(block)
