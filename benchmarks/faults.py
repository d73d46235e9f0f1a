"""Kill -9 a real training run at many moments, resume it each time, and compare with a run never interrupted.

A reference run trains the numbers-de-en preset, made short, into its own directory. Interrupted runs
train with the same command into another one and are killed with SIGKILL, again and again, until a
process ends by itself. The kill moments come from a seeded schedule: the k-th file-system event of a
kind since the start, watched with inotify (a checkpoint file's temporary file created, written to,
renamed into place; the best weights, config.yaml or a log record written), or a delay after the start.
After every kill, before the restart, the directory must load (`load_model_dir` if model.safetensors is
there, `TrainStateDir.read`, a step that never goes back). A kill resumed bit-exactly when the records
logged after it equal the reference's at the same positions (floats compared exactly, timings left
out); a finished run must equal the reference in its whole log, its best and last weights, best step
and score. The budget is a step budget: a wall-clock budget would end at another step after a resume.
How to read the result: benchmarks/README.md.

usage: python benchmarks/faults.py [--kills 60] [--min-inside 25] [--steps 80] [--seed 0]
                                   [--out runs/faults] [--max-minutes 180] [section.key=value ...]
Writes benchmarks/results/faults.json. Linux only (inotify).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from common import ROOT, write_result

sys.path.insert(0, str(ROOT))  # the xattn of this checkout, also where another one is installed

import torch  # noqa: E402

import xattn  # noqa: E402
from xattn.checkpoint import CONFIG, WEIGHTS, load_model_dir, read_weights  # noqa: E402
from xattn.config import load_config  # noqa: E402
from xattn.train_state import LOCK, MANIFEST, Manifest, TrainStateDir  # noqa: E402
from xattn.training import LOG, STATE_DIR  # noqa: E402

PRESET = "numbers-de-en"
RUN_OVERRIDES = ["train.max_minutes=0", "train.eval_every=5", "train.eval_bleu_sentences=20", "train.log_every=1",
                 "train.average_last=3", "train.threads=1", "model.d_model=256", "model.d_ff=1024",
                 "model.n_encoder_layers=2", "model.n_decoder_layers=2", "data.numbers_size=3000"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
TIMINGS = ("tokens_per_s", "seconds")                   # log fields that differ between identical runs
REFERENCE_TIMEOUT = 3600                                 # seconds; every other process gets 2x the reference's + 2 min
REMOVED = re.compile(r"removed (\d+) half-written file\(s\) of an interrupted run[^\n]*")

# ------------------------------------------------------------------------------ file-system events

IN_MODIFY, IN_MOVED_TO, IN_CREATE = 0x2, 0x80, 0x100


class Inotify:
    """File-system events in some folders, through libc's inotify: (folder key, file name, mask)."""

    def __init__(self, folders: dict[str, Path]):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.keys = {}
        for key, path in folders.items():
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), IN_MODIFY | IN_MOVED_TO | IN_CREATE)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch failed for {path}")
            self.keys[wd] = key

    def read(self, timeout: float) -> list[tuple[str, str, int]]:
        """The events that arrive within `timeout` seconds (none if none do)."""
        if not select.select([self.fd], [], [], timeout)[0]:
            return []
        data, events, at = os.read(self.fd, 1 << 16), [], 0
        while at < len(data):
            wd, mask, _cookie, size = struct.unpack_from("iIII", data, at)  # struct inotify_event, then the name
            events.append((self.keys.get(wd, "?"), data[at + 16: at + 16 + size].rstrip(b"\0").decode(), mask))
            at += 16 + size
        return events

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class EventKind:
    folder: str         # "." (the model directory) or "train_state"
    mask: int
    pattern: str        # the file name, as a regular expression
    checkpoint: bool    # a step of writing a train_state checkpoint


def temp_of(pattern: str) -> str:
    """The name `atomic_write` gives the temporary file of a target named `pattern`."""
    return rf"\.{pattern}\..+\.tmp"


WEIGHTS_N, STATE_N, MANIFEST_RE = r"weights-\d+\.safetensors", r"state-\d+\.pt", re.escape(MANIFEST)
BEST, CONFIG_RE = re.escape(WEIGHTS), re.escape(CONFIG)
LIBRARY_TEMP = r"\.tmp\w+"  # safetensors (0.8) writes a temporary file of its own, then renames it over xattn's
CHECKPOINT_FILE = re.compile(rf"{STATE_DIR}/.+|{temp_of(BEST)}|{LIBRARY_TEMP}")  # a leftover of a checkpoint write
EVENTS = {
    "weights temp created": EventKind(STATE_DIR, IN_CREATE, temp_of(WEIGHTS_N), True),
    "weights temp written to": EventKind(STATE_DIR, IN_MODIFY, f"{temp_of(WEIGHTS_N)}|{LIBRARY_TEMP}", True),
    "weights renamed into place": EventKind(STATE_DIR, IN_MOVED_TO, WEIGHTS_N, True),
    "state temp created": EventKind(STATE_DIR, IN_CREATE, temp_of(STATE_N), True),
    "state temp written to": EventKind(STATE_DIR, IN_MODIFY, temp_of(STATE_N), True),
    "state renamed into place": EventKind(STATE_DIR, IN_MOVED_TO, STATE_N, True),
    "manifest temp created": EventKind(STATE_DIR, IN_CREATE, temp_of(MANIFEST_RE), True),
    "manifest renamed into place": EventKind(STATE_DIR, IN_MOVED_TO, MANIFEST_RE, True),
    "best weights temp created": EventKind(".", IN_CREATE, temp_of(BEST), False),
    "best weights temp written to": EventKind(".", IN_MODIFY, f"{temp_of(BEST)}|{LIBRARY_TEMP}", False),
    "best weights renamed into place": EventKind(".", IN_MOVED_TO, BEST, False),
    "config.yaml temp created": EventKind(".", IN_CREATE, temp_of(CONFIG_RE), False),
    "config.yaml renamed into place": EventKind(".", IN_MOVED_TO, CONFIG_RE, False),
    "log record written": EventKind(".", IN_MODIFY, re.escape(LOG), False),
}


@dataclass(frozen=True)
class KillPlan:
    """Kill at the k-th event of a kind since the start, or `delay` seconds after the start."""
    kind: str           # a key of EVENTS, or "delay"
    k: int = 0
    delay: float = 0.0

    def __str__(self) -> str:
        return f"{self.delay:.2f} s after the start" if self.kind == "delay" else f"{self.kind} #{self.k}"


def draw_plan(rng: random.Random, checkpoint_only: bool, eval_every: int, run_seconds: float) -> KillPlan:
    """The next kill moment: mostly inside checkpoint writes, else at other writes or after a delay."""
    roll = 0.0 if checkpoint_only else rng.random()
    if roll < 0.55:
        return KillPlan(rng.choice([k for k, e in EVENTS.items() if e.checkpoint]), rng.choice((1, 1, 2, 3)))
    if roll < 0.8:
        kind = rng.choice([k for k, e in EVENTS.items() if not e.checkpoint])
        return KillPlan(kind, rng.randint(1, 2 * eval_every) if kind == "log record written" else rng.randint(1, 2))
    return KillPlan("delay", delay=round(rng.uniform(0.02, 0.25) * run_seconds, 2))


def wait_for(watcher: Inotify, plan: KillPlan | None, seen: list[str], timeout: float) -> str | None:
    """Wait up to `timeout` s for events; once the plan's k-th has come, the event as text."""
    kind = EVENTS.get(plan.kind) if plan else None
    for folder, name, mask in watcher.read(timeout):
        if kind and folder == kind.folder and mask & kind.mask and re.fullmatch(kind.pattern, name):
            if name.startswith(".") and name in seen:
                continue  # the writes to one temporary file count once
            seen.append(name)
            if len(seen) == plan.k:
                return f"{plan}: {folder}/{name}"
    return None


def launch(cmd: list[str], out: Path, plan: KillPlan | None, timeout: float) -> tuple[str | None, int, float, str]:
    """Run the training command, SIGKILL it at the plan's moment -> (that moment, exit code, seconds, output).

    Both folders are watched from before the start, so the first checkpoint's events are seen too; a
    process that outlives `timeout` is killed and reads as failed (no moment, exit code -9)."""
    for folder in (out, out / STATE_DIR):
        folder.mkdir(parents=True, exist_ok=True)
    watcher, seen, moment = Inotify({".": out, STATE_DIR: out / STATE_DIR}), [], None
    start = time.monotonic()
    with tempfile.TemporaryFile() as output:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=output, stderr=subprocess.STDOUT)
        try:
            while moment is None and proc.poll() is None and time.monotonic() - start < timeout:
                elapsed = time.monotonic() - start
                if plan is not None and plan.kind == "delay" and elapsed >= plan.delay:
                    moment = f"{plan} ({elapsed:.2f} s)"
                else:
                    moment = wait_for(watcher, plan, seen, 0.05)
        finally:
            proc.kill()  # at once, before anything else; a process that has exited is not affected
            proc.wait()
            watcher.close()
        output.seek(0)
        text = output.read().decode(errors="replace")
    if proc.returncode != -signal.SIGKILL:
        moment = None  # it ended by itself before the kill reached it
    return moment, proc.returncode, time.monotonic() - start, text


# --------------------------------------------------------------------------- what a kill left

@dataclass
class Inspection:
    problems: list[str]         # what makes the directory unloadable or lose progress (goal: none)
    manifest: Manifest | None   # the last complete checkpoint
    leftovers: dict[str, int]   # hidden (temporary) files and train_state files no manifest lists -> mtime (ns)
    log: bytes                  # log.jsonl
    log_stamp: tuple[int, int]  # its (mtime, size): changed if a process truncated or appended to it


def inspect(out: Path) -> Inspection:
    """Check a model directory whose process is dead: loadable? its checkpoint, leftovers and log."""
    problems, manifest = [], None
    if (out / WEIGHTS).is_file():
        try:
            load_model_dir(out)
        except Exception as e:  # any failure counts, not only the errors xattn expects
            problems.append(f"load_model_dir: {type(e).__name__}: {e}")
    try:
        manifest = TrainStateDir(out / STATE_DIR).read()
    except Exception as e:
        problems.append(f"TrainStateDir.read: {type(e).__name__}: {e}")
    listed = {MANIFEST, *(manifest.files if manifest else ())}
    # every hidden file, not only those `is_temporary` knows: libraries that xattn calls write temporary files too
    found = [(f.name, f) for f in out.iterdir() if f.is_file() and f.name.startswith(".") and f.name != LOCK]
    if (out / STATE_DIR).is_dir():
        found += [(f"{STATE_DIR}/{f.name}", f) for f in (out / STATE_DIR).iterdir() if f.name not in listed]
    leftovers = {name: f.stat().st_mtime_ns for name, f in sorted(found)}
    log = out / LOG
    stamp = (log.stat().st_mtime_ns, log.stat().st_size) if log.is_file() else (0, 0)
    return Inspection(problems, manifest, leftovers, log.read_bytes() if log.is_file() else b"", stamp)


def records(log: bytes) -> list[dict]:
    """The complete records of log.jsonl without their timings; a last line without "\\n" was cut by a kill."""
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in log.split(b"\n")[:-1]]


def duplicates(log: list[dict]) -> list[str]:
    """Records logged twice: the same kind (training step, validation, average) at the same step."""
    keys = [("train" if "loss" in r else "average" if "averaged" in r else "validation", r.get("step")) for r in log]
    return sorted({f"{kind} at step {step}" for kind, step in keys if keys.count((kind, step)) > 1})


def same_tensors(path: Path, reference: dict[str, torch.Tensor]) -> bool:
    tensors = read_weights(path)[0]
    return tensors.keys() == reference.keys() and all(torch.equal(tensors[k], reference[k]) for k in tensors)


@dataclass
class Reference:
    records: list[dict]
    best: dict[str, torch.Tensor]       # model.safetensors
    last: dict[str, torch.Tensor]       # the weights of the last train_state checkpoint
    progress: dict                      # training.Progress of the last checkpoint, as saved
    seconds: float


def reference_run(cmd: list[str], out: Path, timeout: float) -> Reference:
    shutil.rmtree(out, ignore_errors=True)
    moment, code, seconds, output = launch(cmd, out, None, timeout)
    if code != 0:
        raise SystemExit(f"the reference run failed (exit code {code}):\n{output[-3000:]}")
    state = TrainStateDir(out / STATE_DIR)
    manifest = state.read()
    return Reference(records((out / LOG).read_bytes()), read_weights(out / WEIGHTS)[0],
                     read_weights(state.dir / manifest.weights)[0], state.load_state()["progress"], seconds)


def compare_final(out: Path, ref: Reference) -> dict:
    """A finished run against the reference: log records, best and last weights, best step and score.
    Files left over are reported beside, not counted against "identical"."""
    try:
        state = TrainStateDir(out / STATE_DIR)
        manifest = state.read()
        progress, log = state.load_state()["progress"], records((out / LOG).read_bytes())
        checks = {"log_identical": log == ref.records,
                  "best_weights_identical": same_tensors(out / WEIGHTS, ref.best),
                  "last_weights_identical": same_tensors(state.dir / manifest.weights, ref.last),
                  "best_step_and_score_equal": [progress[k] for k in ("best_step", "best_score")]
                  == [ref.progress[k] for k in ("best_step", "best_score")],
                  "finished": progress["finished"] and progress["step"] == ref.progress["step"]}
    except Exception as e:
        return {"identical": False, "error": f"{type(e).__name__}: {e}", "leftovers": []}
    return {"identical": all(checks.values()) and not duplicates(log), **checks,
            "duplicate_records": duplicates(log), "leftovers": list(inspect(out).leftovers)}


# ------------------------------------------------------------------------------- interrupted runs

@dataclass
class Start:
    """One process of an interrupted run."""
    plan: KillPlan | None
    resumed_from: int           # the bytes of log.jsonl it keeps: the log_bytes of the checkpoint it resumes
    moment: str | None          # what it was killed at; None if it ended by itself
    returncode: int
    seconds: float
    output: str
    after: Inspection
    inside: list[str]           # the leftovers of a checkpoint write that it left (not those it found)
    new_records: int = 0
    records_match: bool | None = None   # None: it logged no record

    @property
    def killed(self) -> bool:
        return self.moment is not None

    @property
    def failed(self) -> bool:
        return not self.killed and self.returncode != 0


@dataclass
class Tally:
    """Kills so far across runs, against the targets and the deadline."""
    kills: int
    min_inside: int
    deadline: float
    done: int = 0
    inside: int = 0

    def wants_kills(self) -> bool:
        return (self.done < self.kills or self.inside < self.min_inside) and time.monotonic() < self.deadline


def check_start(start: Start, before: Inspection | None, had_checkpoint: bool, ref: Reference) -> None:
    """Progress never goes back; the records this process logged equal the reference's at their positions."""
    now, old = start.after.manifest, before.manifest if before else None
    if now is None and had_checkpoint and not start.after.problems:
        start.after.problems.append("train_state has no checkpoint, but had one before")
    if now is not None and old is not None and now.step < old.step:
        start.after.problems.append(f"train_state went back from step {old.step} to step {now.step}")
    if before is not None and start.after.log_stamp == before.log_stamp:
        return  # killed before it touched log.jsonl; what is there beyond the resume point is older
    log = start.after.log
    kept, new = len(records(log[:start.resumed_from])), records(log[start.resumed_from:])
    start.new_records = len(new)
    if new:
        start.records_match = new == ref.records[kept: kept + len(new)]


def interrupted_run(name: str, cmd: list[str], out: Path, ref: Reference, tally: Tally,
                    next_plan: Callable[[bool], KillPlan], kills_per_run: int) -> list[Start]:
    """Start the command on one directory, kill it, restart it, ... until a process ends by itself.

    A restart follows every kill, also one that left a problem: whether xattn gets past it is part of the result."""
    shutil.rmtree(out, ignore_errors=True)
    starts, before, kills = [], None, 0
    while True:
        plan = next_plan(tally.done >= tally.kills) if tally.wants_kills() and kills < kills_per_run else None
        resumed_from = before.manifest.log_bytes if before and before.manifest else 0
        moment, code, seconds, output = launch(cmd, out, plan, 2 * ref.seconds + 120)
        after = inspect(out)
        inside = [f for f, t in after.leftovers.items()
                  if CHECKPOINT_FILE.fullmatch(f) and (before is None or before.leftovers.get(f) != t)]
        start = Start(plan, resumed_from, moment, code, seconds, output, after, inside)
        check_start(start, before, any(s.after.manifest for s in starts), ref)
        starts.append(start)
        report_start(name, len(starts), start)
        if not start.killed:
            return starts
        kills, tally.done, tally.inside = kills + 1, tally.done + 1, tally.inside + bool(inside)
        before = start.after


def report_start(name: str, number: int, start: Start) -> None:
    after = start.after
    at = f"step {after.manifest.step} (checkpoint {after.manifest.serial})" if after.manifest else "no checkpoint"
    what = f"killed at {start.moment}" if start.killed else \
        f"ended with exit code {start.returncode}{f' before {start.plan}' if start.plan else ''}"
    match = {None: "", True: f", {start.new_records} records as the reference's",
             False: f", {start.new_records} records DIFFER from the reference's"}[start.records_match]
    print(f"{name} process {number}: {what} after {start.seconds:.1f} s; {at}, {len(after.leftovers)} leftover(s)"
          f" ({len(start.inside)} new from a checkpoint write)"
          f"{match}{''.join('; PROBLEM ' + p for p in after.problems)}", flush=True)
    if start.failed:
        print(start.output[-2000:], flush=True)


# --------------------------------------------------------------------------------------- figures

def kill_rows(name: str, starts: list[Start], final: dict) -> list[dict]:
    """One row per kill: where, what it left, and whether the run resumed bit-exactly after it.

    A kill is judged by the processes after it up to the first that logged records (none failed, those
    records equal the reference's), else by the finished run's comparison. What a later kill left on
    disk is that kill's row."""
    rows = []
    for i, start in enumerate(starts):
        if not start.killed:
            continue
        exact, later = None, starts[i + 1:]
        for s in later:
            if s.failed or s.records_match is False:
                exact = False
            elif s.records_match:
                exact = True
            if exact is not None:
                break
        message = REMOVED.search(later[0].output) if later else None
        rows.append({"run": name, "process": i + 1, "moment": start.moment, "kind": start.plan.kind,
                     "checkpoint_step": start.after.manifest.step if start.after.manifest else None,
                     "inside_checkpoint_write": bool(start.inside), "leftovers": list(start.after.leftovers),
                     "problems": start.after.problems, "next_process_message": message and message.group(0),
                     "resumed_bit_exactly": exact if exact is not None else bool(later) and final["identical"]})
    return rows


def figures(runs: dict[str, tuple[list[Start], dict]], ref: Reference, args, seconds: float) -> dict:
    rows = [row for name, (starts, final) in runs.items() for row in kill_rows(name, starts, final)]
    by_kind = {}
    for row in rows:
        entry = by_kind.setdefault(row["kind"], {"kills": 0, "inside_checkpoint_write": 0})
        entry["kills"] += 1
        entry["inside_checkpoint_write"] += row["inside_checkpoint_write"]
    messages = [m.group(0) for starts, _ in runs.values() for s in starts for m in REMOVED.finditer(s.output)]
    unloadable = [row for row in rows if row["problems"]]
    return {
        "config": load_config(Path(args.out).resolve() / "reference" / CONFIG).to_dict(),
        "budget": {"train.max_steps": args.steps, "train.max_minutes": 0, "kills": args.kills,
                   "min_inside": args.min_inside, "kills_per_run": args.kills_per_run, "seed": args.seed},
        "reference": {"wall_s": round(ref.seconds, 1), "records": len(ref.records),
                      **{k: ref.progress[k] for k in ("step", "best_step", "best_score")}},
        "kills": len(rows), "kills_inside_checkpoint_writes": sum(r["inside_checkpoint_write"] for r in rows),
        "targets_met": len(rows) >= args.kills and sum(r["inside_checkpoint_write"] for r in rows) >= args.min_inside,
        "kills_resumed_bit_exactly": sum(r["resumed_bit_exactly"] for r in rows), "kills_by_event": by_kind,
        "runs": len(runs), "runs_finished_identical": sum(final["identical"] for _, final in runs.values()),
        "runs_with_files_left_at_the_end": sum(bool(final["leftovers"]) for _, final in runs.values()),
        "directories_left_unloadable": len({r["run"] for r in unloadable}),
        "unloadable": [{k: r[k] for k in ("run", "process", "moment", "leftovers", "problems")} for r in unloadable],
        "failed_processes": [s.output[-1500:] for starts, _ in runs.values() for s in starts if s.failed],
        "half_written_messages": len(messages), "half_written_message_examples": messages[:5],
        "final": {name: final for name, (_, final) in runs.items()},
        "wall_s": round(seconds, 1), "kill_table": rows,
    }


# ------------------------------------------------------------------------------------------ main

def preset_config() -> str:
    """The numbers-de-en run config: by name where xattn ships presets, else the file in configs/."""
    from xattn import presets
    if hasattr(presets, "resolve_config"):
        return str(presets.resolve_config(PRESET))
    return str(ROOT / "configs" / f"{PRESET}.yaml")


def overrides(args: argparse.Namespace) -> list[str]:
    return [*RUN_OVERRIDES, f"train.max_steps={args.steps}", *args.overrides]


def command(args: argparse.Namespace, out: Path) -> list[str]:
    # not --quiet: the message about removed half-written files is one of the things checked
    return [sys.executable, "-m", "xattn", "train", preset_config(), *overrides(args), "--out", str(out)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=60, help="at least this many kills in all")
    parser.add_argument("--min-inside", type=int, default=25, help="at least this many inside checkpoint writes")
    parser.add_argument("--kills-per-run", type=int, default=25, help="then the run may finish")
    parser.add_argument("--max-runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=80, help="train.max_steps of every run")
    parser.add_argument("--seed", type=int, default=0, help="of the kill schedule")
    parser.add_argument("--out", default="runs/faults")
    parser.add_argument("--max-minutes", type=float, default=180, help="no new kills after this")
    parser.add_argument("--keep", action="store_true", help="keep the directories of runs that passed")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="more config overrides")
    args = parser.parse_args()
    if not Path(xattn.__file__).resolve().is_relative_to(ROOT):
        raise SystemExit(f"imported {xattn.__file__}, not the xattn of {ROOT}")
    torch.set_num_threads(1)
    began, root = time.monotonic(), Path(args.out).resolve()
    eval_every = load_config(preset_config(), overrides(args)).train.eval_every  # a bad override fails here
    ref = reference_run(command(args, root / "reference"), root / "reference", REFERENCE_TIMEOUT)
    print(f"reference: {ref.progress['step']} steps, {len(ref.records)} records, {ref.seconds:.1f} s", flush=True)
    tally, rng, runs = Tally(args.kills, args.min_inside, began + 60 * args.max_minutes), random.Random(args.seed), {}
    next_plan = lambda checkpoint_only: draw_plan(rng, checkpoint_only, eval_every, ref.seconds)  # noqa: E731
    while tally.wants_kills() and len(runs) < args.max_runs:
        name = f"run-{len(runs) + 1}"
        starts = interrupted_run(name, command(args, root / name), root / name, ref, tally, next_plan,
                                 args.kills_per_run)
        final = compare_final(root / name, ref) if not starts[-1].killed and not starts[-1].failed \
            else {"identical": False, "error": "did not finish", "leftovers": []}
        runs[name] = (starts, final)
        print(f"{name}: {sum(s.killed for s in starts)} kills; finished run equals the reference: "
              f"{final['identical']} {json.dumps({k: v for k, v in final.items() if k != 'identical'})}", flush=True)
        if final["identical"] and not final["leftovers"] and not args.keep:
            shutil.rmtree(root / name)
    result = figures(runs, ref, args, time.monotonic() - began)
    path = write_result("faults", result)
    print(f"{result['kills']} kills ({result['kills_inside_checkpoint_writes']} inside checkpoint writes), "
          f"{result['kills_resumed_bit_exactly']} resumed bit-exactly; {result['runs_finished_identical']} of "
          f"{result['runs']} runs identical to the reference at the end; "
          f"{result['directories_left_unloadable']} directories left unloadable; {result['wall_s']} s -> {path}")


if __name__ == "__main__":
    main()
