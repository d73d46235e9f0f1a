"""Issue 20: corpora of millions of pairs. For synthetic corpora of 1M, 3M and 10M pairs (Multi30k sentences
joined one to three at a time, a fixed seed per size, written as .gz first):

- prepare: `xattn prepare` wall time, peak RSS of the whole process tree (the encoding workers included,
  sampled every 0.2 s), bytes on disk per token, pairs per second;
- train: `xattn train` (the multi30k-de-en preset's model) on the prepared directory: seconds from the
  command to the first optimizer step, and RSS after 50 steps (anonymous and file-backed), beside the same
  training on Multi30k (29,000 pairs) as the baseline the data adds to;
- ddp: two CPU processes (torchrun, gloo) training on the 10M corpus: RSS and PSS per process, and the
  prepared files each maps;
- speed: tokens/s training on Multi30k from the prepared directory against the in-memory path of the commit
  before prepared corpora (--before, run from a git worktree), side by side, interleaved, several repetitions.

Everything is kept in WORK (default ~/.cache/xattn/data_scale, outside the repository): the corpora, the
prepared directories, and partial.json, the parts measured so far, so a run cut short goes on where it
stopped (--fresh measures again). One process trains at a time.

usage: python benchmarks/data_scale.py [--sizes 1000000 3000000 10000000] [--parts prepare,train,ddp,speed]
                                       [--before 6281ac2] [--repeats 5] [--work DIR] [--fresh]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import ROOT, START_COMMIT, data_dir, write_result

WORK = Path(os.environ.get("XATTN_DATA_SCALE", Path.home() / ".cache" / "xattn" / "data_scale"))
PRESET = "multi30k-de-en"


# ---------------------------------------------------------------------------------------------- corpora

def corpus(work: Path, n: int) -> tuple[Path, Path]:
    """WORK/corpus-N.de.gz and .en.gz: N pairs of one to three Multi30k training sentences joined."""
    src, tgt = work / f"corpus-{n}.de.gz", work / f"corpus-{n}.en.gz"
    if src.is_file() and tgt.is_file():
        return src, tgt
    sides = [gzip.open(Path(data_dir()) / f"train.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
             for lang in ("de", "en")]
    rng, tmp = random.Random(n), [p.with_name(p.name + ".tmp") for p in (src, tgt)]
    print(f"writing {n:,} synthetic pairs", file=sys.stderr, flush=True)
    with gzip.open(tmp[0], "wt", encoding="utf-8", compresslevel=1) as fs, \
            gzip.open(tmp[1], "wt", encoding="utf-8", compresslevel=1) as ft:
        for start in range(0, n, 100_000):
            picks = [[rng.randrange(len(sides[0])) for _ in range(rng.choice((1, 2, 3)))]
                     for _ in range(min(100_000, n - start))]
            fs.write("".join(" ".join(sides[0][i] for i in p) + "\n" for p in picks))
            ft.write("".join(" ".join(sides[1][i] for i in p) + "\n" for p in picks))
    for t, p in zip(tmp, (src, tgt)):
        os.replace(t, p)
    return src, tgt


def data_keys(src: Path, tgt: Path) -> list[str]:
    val = Path(data_dir())
    return ["data.dataset=null", f"data.train_src={src}", f"data.train_tgt={tgt}", f"data.valid_src={val}/val.de.gz",
            f"data.valid_tgt={val}/val.en.gz"]


# --------------------------------------------------------------------------------------------- memory

def children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def status(pid: int, pss: bool = True) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile (kB) of a process, and (`pss`) Pss from smaps_rollup; {} when it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        out = {k: int(fields[k].split()[0]) for k in ("VmRSS", "RssAnon", "RssFile") if k in fields}
        if not pss:
            return out
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        out["Pss"] = int(next(line.split()[1] for line in rollup.splitlines() if line.startswith("Pss:")))
        return out
    except (OSError, StopIteration, ValueError):
        return {}


def tree(pid: int) -> list[int]:
    """The process and its descendants."""
    links, todo, found = children(), [pid], []
    while todo:
        found.append(p := todo.pop())
        todo += links.get(p, [])
    return found


class PeakTree(threading.Thread):
    """The largest sum of RSS over a process and its descendants: the tree listed every 2 s, its RSS read
    every 0.25 s (cheaply, to take little of the CPU being measured)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak_kb, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        members, listed = [self.pid], 0.0
        while not self.done.wait(0.25):
            if time.monotonic() - listed > 2:
                members, listed = tree(self.pid), time.monotonic()
            self.peak_kb = max(self.peak_kb, sum(status(p, pss=False).get("VmRSS", 0) for p in members))


def launch(args: list[str], env: dict | None = None, log: Path | None = None) -> subprocess.Popen:
    env = os.environ | {"OMP_NUM_THREADS": "1"} | (env or {})
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w") if log else subprocess.DEVNULL)


def xattn(*args: str) -> list[str]:
    return [sys.executable, "-m", "xattn", *args]


# --------------------------------------------------------------------------------------------- parts

def prepare_part(work: Path, n: int) -> dict:
    src, tgt = corpus(work, n)
    out = work / f"prepared-{n}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = launch(xattn("prepare", PRESET, *data_keys(src, tgt), "--out", str(out)), log=work / f"prepare-{n}.log")
    peak = PeakTree(proc.pid)
    peak.start()
    if proc.wait() != 0:
        raise SystemExit(f"xattn prepare failed: {(work / f'prepare-{n}.log').read_text()[-2000:]}")
    seconds = time.perf_counter() - start
    peak.done.set()
    peak.join()
    manifest = json.loads((out / "manifest.json").read_text())
    tokens = manifest["tokens"]["src"] + manifest["tokens"]["tgt"]
    disk = sum(f.stat().st_size for f in out.iterdir())
    ids = sum(f.stat().st_size for f in out.glob("*.bin"))
    return {"pairs_in": n, "pairs_kept": manifest["pairs"], "tokens": tokens, "seconds": round(seconds, 1),
            "pairs_per_s": round(n / seconds), "peak_tree_rss_mb": round(peak.peak_kb / 1024),
            "bytes_per_token": round(disk / tokens, 3), "bytes_per_token_ids_only": round(ids / tokens, 3),
            "disk_mb": round(disk / 2**20, 1), "cleaning": manifest["cleaning"],
            "input_gz_mb": round((src.stat().st_size + tgt.stat().st_size) / 2**20, 1)}


TRAIN = ["train.max_steps=50", "train.log_every=1", "train.eval_every=100000", "train.eval_bleu_sentences=8",
         "train.max_minutes=0"]


def train_part(work: Path, data: list[str], name: str, threads: int = 2) -> dict:
    """`xattn train` for 50 steps: seconds from the command to the first step's log line, RSS at step 50."""
    out = work / f"run-{name}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = launch(xattn("train", PRESET, *data, *TRAIN, f"train.threads={threads}", "--out", str(out)),
                  log=work / f"train-{name}.log")
    first = at_50 = None
    while proc.poll() is None:
        steps = logged_steps(out)
        if first is None and steps:
            first = time.perf_counter() - start
        if steps and max(steps) >= 50 and at_50 is None:
            at_50 = status(proc.pid)
            proc.terminate()
        time.sleep(0.05)
    if first is None or at_50 is None:
        raise SystemExit(f"xattn train did not reach step 50: {(work / f'train-{name}.log').read_text()[-2000:]}")
    return {"seconds_to_first_step": round(first, 1), "rss_mb_at_step_50": mb(at_50)}


def logged_steps(out: Path) -> list[int]:
    try:
        return [r["step"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r]
    except (OSError, ValueError):
        return []


def mb(kb: dict) -> dict:
    return {k: round(v / 1024) for k, v in kb.items()}


def ddp_part(work: Path, n: int) -> dict:
    """Two gloo processes on the prepared corpus of `n` pairs: per-process memory at step 20, mapped files."""
    src, tgt = corpus(work, n)
    out, prepared = work / "run-ddp", work / f"prepared-{n}"
    shutil.rmtree(out, ignore_errors=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port, "-m",
            "xattn", "train", PRESET, *data_keys(src, tgt), f"data.prepared={prepared}", *TRAIN, "train.max_steps=20",
            "train.threads=1", "train.device=cpu", "--out", str(out)]
    start = time.perf_counter()
    proc = launch(args, log=work / "train-ddp.log")
    ranks = None
    while proc.poll() is None:
        if (steps := logged_steps(out)) and max(steps) >= 20 and ranks is None:
            workers = [p for p in children().get(proc.pid, [])]
            ranks = {pid: {**mb(status(pid)), "maps": mapped(pid, prepared)} for pid in workers}
            proc.terminate()
        time.sleep(0.1)
    if not ranks or len(ranks) != 2:
        raise SystemExit(f"the DDP run did not reach step 20 with two processes: "
                         f"{(work / 'train-ddp.log').read_text()[-2000:]}")
    maps = [r.pop("maps") for r in ranks.values()]
    return {"pairs": n, "processes": list(ranks.values()), "same_files_mapped": maps[0] == maps[1] and bool(maps[0]),
            "files_mapped": maps[0], "seconds_to_step_20": round(time.perf_counter() - start, 1)}


def mapped(pid: int, folder: Path) -> list[str]:
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in lines if str(folder) in line})


def speed_part(work: Path, before: str, repeats: int) -> dict:
    """tokens/s on Multi30k, this tree (prepared corpus) against `before` (in memory), interleaved."""
    tree = work / f"tree-{before}"
    if not tree.is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), before], cwd=ROOT, check=True,
                       capture_output=True)
    runs: dict[str, list[float]] = {"prepared": [], "before": []}
    data = [f"data.data_dir={data_dir()}", "train.max_steps=60", "train.log_every=1", "train.eval_every=100000",
            "train.eval_bleu_sentences=8", "train.threads=2"]
    for r in range(repeats):
        for name, root in (("prepared", ROOT), ("before", tree)):
            out = work / f"speed-{name}"
            shutil.rmtree(out, ignore_errors=True)
            env = {"PYTHONPATH": str(root)}
            proc = launch(xattn("train", PRESET, *data, "--out", str(out)), env=env, log=work / f"speed-{name}.log")
            while proc.poll() is None:
                if (steps := logged_steps(out)) and max(steps) >= 60:
                    proc.terminate()
                time.sleep(0.1)
            records = [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "loss" in r]
            rates = [rec["tokens_per_s"] for rec in records if 11 <= rec["step"] <= 60]
            runs[name].append(round(statistics.median(rates), 1))
            print(f"speed {name} repeat {r}: {runs[name][-1]} tokens/s", file=sys.stderr, flush=True)
    ratio = statistics.median(runs["prepared"]) / statistics.median(runs["before"])
    return {"before_commit": before, "steps_measured": "11-60 of 60, median of each run's per-step tokens/s",
            "tokens_per_s": runs, "ratio_prepared_over_before": round(ratio, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 3_000_000, 10_000_000])
    p.add_argument("--parts", default="prepare,train,ddp,speed")
    p.add_argument("--before", default="6281ac2", help="the commit of the in-memory path")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--work", type=Path, default=WORK)
    p.add_argument("--fresh", action="store_true", help="measure every part again")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    partial_path = args.work / "partial.json"
    partial = {} if args.fresh or not partial_path.is_file() else json.loads(partial_path.read_text())

    def measured(key: str, fn) -> None:
        if key not in partial:
            print(f"measuring {key}", file=sys.stderr, flush=True)
            partial[key] = fn() | {"commit": START_COMMIT}
            partial_path.write_text(json.dumps(partial, indent=2))
        print(key, json.dumps(partial[key]), file=sys.stderr, flush=True)

    parts = args.parts.split(",")
    for n in args.sizes:
        if "prepare" in parts:
            measured(f"prepare-{n}", lambda: prepare_part(args.work, n))
        if "train" in parts:
            src, tgt = corpus(args.work, n)
            keys = [*data_keys(src, tgt), f"data.prepared={args.work / f'prepared-{n}'}"]
            measured(f"train-{n}", lambda: train_part(args.work, keys, str(n)))
    if "train" in parts:
        measured("train-multi30k", lambda: train_part(args.work, [f"data.data_dir={data_dir()}"], "multi30k"))
    if "ddp" in parts:
        measured(f"ddp-{max(args.sizes)}", lambda: ddp_part(args.work, max(args.sizes)))
    if "speed" in parts:
        measured("speed", lambda: speed_part(args.work, args.before, args.repeats))
    print(write_result("data_scale", {"device": "cpu", "work": str(args.work), "summary": summary(partial),
                                      "parts": partial}))


def summary(parts: dict) -> dict:
    """Per corpus size: the prepare figures, and what the data adds to a training process' RSS at step 50
    (against the same training on Multi30k's 29,000 pairs)."""
    base = parts.get("train-multi30k", {}).get("rss_mb_at_step_50", {})
    out = {}
    for key, part in parts.items():
        if key.startswith("prepare-"):
            train = parts.get(f"train-{part['pairs_in']}", {})
            rss = train.get("rss_mb_at_step_50", {})
            out[str(part["pairs_in"])] = {
                "prepare_s": part["seconds"], "pairs_per_s": part["pairs_per_s"],
                "peak_tree_rss_mb": part["peak_tree_rss_mb"], "bytes_per_token": part["bytes_per_token"],
                "seconds_to_first_step": train.get("seconds_to_first_step"),
                "data_rss_mb_at_step_50": {k: rss[k] - base[k] for k in rss if k in base} if rss and base else None}
    return out


if __name__ == "__main__":
    main()
