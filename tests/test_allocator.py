"""xattn.allocator: glibc keeps what decoding frees once a Translator is made on the CPU, unless XATTN_KEEP_MEMORY=0;
each case in a fresh process, since the setting is the whole process's."""
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
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

TRANSLATOR = """
import sys, xattn, xattn.allocator
print(xattn.allocator._state)
xattn.load(sys.argv[1], device="cpu")
print(xattn.allocator._state)
"""


def run(code: str, *args: str, keep: str | None = None) -> list[str]:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    env.pop("XATTN_KEEP_MEMORY", None)
    if keep is not None:
        env["XATTN_KEEP_MEMORY"] = keep
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_freed_tensors_are_not_faulted_in_again_once_kept():
    applied, kept = run(CHURN)
    off, returned = run(CHURN, keep="0")
    assert (applied, off) == ("True", "False")
    # by glibc's own thresholds, much of the 128 MiB goes back after every round and is faulted in again (33,000 to
    # 65,500 pages over the five rounds, by the process's history); kept, a few hundred
    assert int(returned) > 8192
    assert int(kept) < int(returned) / 10


def test_a_translator_on_the_cpu_sets_it_and_the_variable_turns_it_off(numbers_model):
    assert run(TRANSLATOR, str(numbers_model)) == ["None", "True"]
    assert run(TRANSLATOR, str(numbers_model), keep="0") == ["None", "False"]
