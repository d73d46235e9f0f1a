"""xattn.allocator: glibc keeps what decoding frees once the CLI decodes (the library alone never sets it), unless
the environment turns it off or sets glibc's malloc itself; each live case in a fresh process, since the setting is
the whole process's."""
import os
import platform
import resource
import subprocess
import sys

import pytest

from xattn import allocator

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                           reason="glibc's malloc only")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHURN = """
import resource, torch
from xattn.allocator import keep_freed_memory
applied = keep_freed_memory()
def churn():  # what a batch does: tensors made and freed, here 128 of 1 MiB, over any threshold glibc adapts to
    xs = [torch.ones(1 << 18) for _ in range(128)]
    del xs
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    churn()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

CLI = """
import io, sys, xattn, xattn.allocator
from xattn.cli.main import main
xattn.load(sys.argv[1], device="cpu")
print(xattn.allocator._state)  # the library alone: not set
sys.stdin = io.TextIOWrapper(io.BytesIO(b"drei vier\\n"))
sys.stdout, out = io.TextIOWrapper(io.BytesIO()), sys.stdout
assert main(["translate", sys.argv[1], "--device", "cpu"]) == 0
print(xattn.allocator._state, file=out)
"""


def run(code: str, *args: str, **env: str) -> list[str]:
    """stdout's words of `code` in a fresh process, with none of the environment's malloc settings but `env`."""
    clean = {k: v for k, v in os.environ.items() if k not in (*allocator.USER_SETTINGS, "XATTN_KEEP_MEMORY",
                                                                  "GLIBC_TUNABLES", "LD_PRELOAD")}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**clean, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


@glibc
def test_freed_tensors_are_not_faulted_in_again_once_kept():
    applied, kept = run(CHURN)
    off, returned = run(CHURN, XATTN_KEEP_MEMORY="0")
    assert (applied, off) == ("True", "False")
    # by glibc's own thresholds, much of the 128 MiB goes back after every round and is faulted in again (33,000 to
    # 164,000 pages over the five rounds, by the process's history); kept, a few hundred to 4,900 (a Zen 5 VM, where
    # kept against a tenth of the run returned's failed when that run returned 33,000): one in ten of the 163,840
    # pages the five rounds touch lies between the two
    touched = 5 * 128 * (1 << 20) // resource.getpagesize()
    assert int(kept) < touched / 10 < int(returned)


@glibc
@pytest.mark.parametrize("env, state", [({}, "True"), ({"XATTN_KEEP_MEMORY": "off"}, "False"),
                                        ({"MALLOC_ARENA_MAX": "2"}, "False"),
                                        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"}, "False")])
def test_the_cli_sets_it_and_the_library_alone_does_not(numbers_model, env, state):
    assert run(CLI, str(numbers_model), **env) == ["None", state]


class Lib:
    """A C library as ctypes shows it: a mallopt that answers `ok` and records its calls."""

    def __init__(self, ok: int = 1):
        self.calls, self.ok = [], ok
        self.gnu_get_libc_version = object()

    @property
    def mallopt(self):
        def call(param, value):
            self.calls.append((param, value))
            return self.ok
        return call


@pytest.mark.parametrize("failure", [OSError("no libc.so.6"), AttributeError("gnu_get_libc_version")])
def test_a_c_library_that_is_not_glibc_is_left_alone(monkeypatch, failure):
    def cdll(name):
        raise failure
    monkeypatch.setattr(allocator, "_state", None)
    monkeypatch.setattr(allocator.ctypes, "CDLL", cdll)
    assert allocator.keep_freed_memory() is False


@pytest.mark.parametrize("ok, preloaded, state", [(1, False, True), (0, False, False), (1, True, False)])
def test_a_refused_setting_or_another_allocator_preloaded_gives_false(monkeypatch, ok, preloaded, state):
    libc = Lib(ok)
    monkeypatch.setattr(allocator, "_state", None)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: Lib(ok) if name is None else libc)
    monkeypatch.setattr(allocator, "_glibc_allocates", lambda process, lib: not preloaded)
    assert allocator.keep_freed_memory() is state
    assert libc.calls[:1] == ([] if preloaded else [(allocator.M_MMAP_THRESHOLD, allocator.MMAP_BYTES)])


WHOSE = "import ctypes, xattn.allocator as a; print(a._glibc_allocates(ctypes.CDLL(None), ctypes.CDLL('libc.so.6')))"
JEMALLOC = next((p for p in ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2")
                 if os.path.exists(p)), None)


@glibc
def test_whose_malloc_the_process_has_is_found_by_what_glibc_counts():
    """The process's malloc and libc's were compared by address, and a program's own PLT entry for malloc, as Debian's
    python3 has, was taken for another allocator: the setting was never made there (the full suite under Debian's
    Python 3.11.2). glibc's own count of mapped bytes tells, whatever the address."""
    assert run(WHOSE) == ["True"]
    if os.path.exists("/usr/bin/python3.11"):  # Debian's, when there: a PLT entry for malloc
        done = subprocess.run(["/usr/bin/python3.11", "-c", WHOSE], capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": ROOT, "PATH": os.environ.get("PATH", "")})
        assert done.stdout.split() == ["True"], done.stderr
    if JEMALLOC is not None:
        assert run(WHOSE, LD_PRELOAD=JEMALLOC) == ["False"]
