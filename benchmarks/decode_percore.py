"""One core each: xattn against CTranslate2 with one thread apiece, and where each one's time goes.

The setting of decode_speed.py (the same model, exports, 1,000 test sentences, batching and lengths), with PyTorch
on one thread and CTranslate2 with `intra_threads=1, inter_threads=1`, the engines in turns (`--turns`, medians):
what each engine does with a core, apart from how well it spreads one batch over several.

With `--perf` (Linux `perf` on the PATH), each engine and setting runs once more in a process of its own under
`perf record` (the CPU clock sampled; oneDNN's JIT kernels named through ONEDNN_JIT_PROFILE), which samples only
the timed translation (perf's control fifo), and the samples are split into matrix products (the GEMM kernels of
oneDNN, MKL and fbgemm, with their packing) and the rest. Both engines compute the same products, the model's
linear layers and attention's batched products, so xattn's product time P bounds its lead: with every other cost
cut to nothing it would be CT2's time / P as fast as CTranslate2 (`bound_over_ct2`).

usage: python benchmarks/decode_percore.py --model runs/bench/multi30k-de-en [--turns 3] [--perf] [--out NAME]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import data_dir, model_fingerprint, write_result
from decode_speed import CT2System, xattn_system

from xattn.allocator import keep_freed_memory
from xattn.datasets import multi30k
from xattn.interop.ct2 import export_ct2

SETTINGS = {"greedy": (None, 1), "beam5": (None, 5), "int8_greedy": ("int8", 1), "int8_beam5": ("int8", 5)}
PRODUCT = re.compile(r"gemm|gemv|brg|inner_product|mkl_blas|fbgemm|PackA|PackB|pack_b|matmul|_ip_|jit.*conv",
                     re.IGNORECASE)
"""Symbols of matrix-product kernels (matrix by matrix, and by vector: attention's one query a row) and their packing
(oneDNN JIT kernels, MKL, fbgemm, CTranslate2's wrappers)."""


def engine(name: str, model: Path, ct2_dirs: dict, setting: str, warm_up: list[str]):
    """One engine for one setting, warmed up: its run(texts, beam) and the beam."""
    quantize, beam = SETTINGS[setting]
    run = xattn_system(model, quantize) if name == "xattn" else CT2System(ct2_dirs[quantize], 1)
    if isinstance(run, CT2System):
        run.load(warm_up, beam)
    else:
        run(warm_up, beam)
    return run, beam


def timed_turns(model: Path, ct2_dirs: dict, texts: list[str], turns: int) -> dict:
    figures = {}
    for setting, (quantize, beam) in SETTINGS.items():
        xattn, ct2 = xattn_system(model, quantize), CT2System(ct2_dirs[quantize], 1)
        xattn(texts[:50], beam)
        times = {"xattn": [], "ct2": []}
        for _ in range(turns):
            assert torch.get_num_threads() == 1
            start = time.perf_counter()
            xattn(texts, beam)
            times["xattn"].append(time.perf_counter() - start)
            ct2.load(texts[:50], beam)  # untimed, with a warm-up; loaded only for its own turns (decode_speed.py)
            start = time.perf_counter()
            ct2(texts, beam)
            times["ct2"].append(time.perf_counter() - start)
            ct2.unload()
        row = {name: {"median_s": round(statistics.median(t), 3), "times_s": [round(x, 3) for x in t]}
               for name, t in times.items()}
        row["xattn_over_ct2"] = round(row["ct2"]["median_s"] / row["xattn"]["median_s"], 3)
        figures[setting] = row
        print(setting, row, flush=True)
    return figures


def perf_child(args, texts: list[str]) -> None:
    """Under perf record, started with its events off: warm up on the whole set (so that the memory the run takes
    is already the process's, as in a later turn), then switch them on for one timed translation."""
    torch.set_num_threads(1)
    ct2_dir = Path(args.ct2_dir)
    run, beam = engine(args.child, Path(args.model), {None: ct2_dir, "int8": ct2_dir}, args.setting, texts)
    with open(args.ctl, "w") as ctl, open(args.ack) as ack:
        ctl.write("enable\n")
        ctl.flush()
        ack.readline()
        start = time.perf_counter()
        run(texts, beam)
        print(f"{time.perf_counter() - start:.3f}")
        ctl.write("disable\n")
        ctl.flush()
        ack.readline()


def perf_shares(args, ct2_dirs: dict, name: str, setting: str, tmp: Path) -> dict:
    """Run one engine and setting under perf record; its seconds and the share of samples in products."""
    ctl, ack, data = tmp / "ctl", tmp / "ack", tmp / f"{name}-{setting}.data"
    for fifo in (ctl, ack):
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo)
    child = [sys.executable, __file__, "--model", args.model, "--child", name, "--setting", setting,
             "--ct2-dir", str(ct2_dirs[SETTINGS[setting][0]]), "--ctl", str(ctl), "--ack", str(ack)]
    out = subprocess.run(["perf", "record", "-F", "999", "-D", "-1", f"--control=fifo:{ctl},{ack}", "-o", str(data),
                          "--", *child], capture_output=True, text=True, env=os.environ | {"ONEDNN_JIT_PROFILE": "6"},
                         )
    if out.returncode:
        raise SystemExit(f"perf record of {name} {setting} failed:\n{out.stderr[-2000:]}")
    seconds = float(out.stdout.split()[-1])
    report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso,sym",
                             "--percent-limit", "0", "--field-separator", "|"],
                            capture_output=True, text=True, check=True).stdout
    shares: dict[str, float] = {"products": 0.0, "python": 0.0, "other": 0.0}
    top = []
    for line in report.splitlines():  # overhead|dso|[.] symbol (a JIT kernel's dso is "[JIT] tid N")
        fields = line.split("|")
        if line.startswith("#") or len(fields) < 3 or not fields[0].strip().endswith("%"):
            continue
        share, dso, symbol = float(fields[0].strip()[:-1]) / 100, fields[1].strip(), fields[2].strip()[4:]
        kind = "products" if PRODUCT.search(symbol) else "python" if "libpython" in dso else "other"
        shares[kind] += share
        if len(top) < 12:
            top.append(f"{100 * share:.1f}% {dso} {symbol}")
    row = {"seconds": round(seconds, 3), **{f"{k}_share": round(v, 3) for k, v in shares.items()},
           "products_s": round(seconds * shares["products"], 3), "top_symbols": top}
    print(name, setting, {k: v for k, v in row.items() if k != "top_symbols"}, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/bench/multi30k-de-en")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--perf", action="store_true", help="also split each engine's time with perf record")
    parser.add_argument("--out", default="decode_percore")
    parser.add_argument("--child", choices=["xattn", "ct2"], help=argparse.SUPPRESS)
    for hidden in ("--setting", "--ct2-dir", "--ctl", "--ack"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # as `xattn translate` runs (xattn.allocator); the setting is the process's, both engines'
    texts = [s for s, _ in multi30k("de", "en", "test_2016_flickr", data_dir())]
    if args.child:
        return perf_child(args, texts)
    if args.perf and not shutil.which("perf"):
        raise SystemExit("--perf: no perf on the PATH (Debian: linux-perf)")
    model = Path(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dirs = {None: Path(tmp, "ct2"), "int8": Path(tmp, "ct2-int8")}
        export_ct2(model, ct2_dirs[None])
        export_ct2(model, ct2_dirs["int8"], quantization="int8")
        figures = timed_turns(model, ct2_dirs, texts, args.turns)
        if args.perf:
            for setting, row in figures.items():
                row["perf"] = {name: perf_shares(args, ct2_dirs, name, setting, Path(tmp)) for name in ("xattn", "ct2")}
                products = row["perf"]["xattn"]["products_s"]
                row["bound_over_ct2"] = round(row["ct2"]["median_s"] / products, 3) if products else None
    figures["settings"] = {"threads": 1, "sentences": len(texts), "turns": args.turns,
                           "model": model_fingerprint(model)}
    print("->", write_result(args.out, figures))


if __name__ == "__main__":
    main()
