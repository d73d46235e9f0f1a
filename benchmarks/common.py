"""Shared by the benchmark scripts: machine description, result files, timing."""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "multi30k"


def data_dir() -> str:
    return os.environ.get("XATTN_DATA", str(DEFAULT_DATA))


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def machine() -> dict:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "gpu": gpu,
            "torch": torch.__version__, "python": platform.python_version()}


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=ROOT).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


START_COMMIT = commit()


def write_result(name: str, figures: dict) -> Path:
    """benchmarks/results/NAME.json with commit (at the script's start), date, machine, command and the figures."""
    record = {"benchmark": name, "commit": START_COMMIT, "date": datetime.date.today().isoformat(),
              "machine": machine(), "command": " ".join([Path(sys.executable).name, *sys.argv]), **figures}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def model_fingerprint(model_dir: str | Path) -> dict:
    """Which model a result was measured on: its weights' tensor SHA-256 and training record."""
    from xattn.checkpoint import WEIGHTS, read_weights, tensors_digest

    tensors, fingerprint = read_weights(Path(model_dir) / WEIGHTS)
    log = Path(model_dir) / "log.jsonl"
    evals = [json.loads(line) for line in log.read_text().splitlines() if "valid_bleu" in line] if log.is_file() else []
    return {"dir": str(model_dir), "tensors_sha256": fingerprint.tensors if fingerprint else tensors_digest(tensors),
            "trained_steps": max((e["step"] for e in evals), default=None),
            "best_valid_bleu": max((e["valid_bleu"] for e in evals), default=None)}


def median_time(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times
