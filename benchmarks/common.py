"""Shared by the benchmark scripts: machine description, result files, timing, cached benchmark models."""
from __future__ import annotations

import datetime
import hashlib
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
CACHE = Path(os.environ.get("XATTN_BENCH_CACHE", Path.home() / ".cache" / "xattn" / "bench"))
"""Benchmark models, outside the repository: one directory per preset and config hash (`use_cache` moves it)."""
NOT_IN_KEY = {"train": ("threads", "device", "log_every", "ddp_timeout")}
"""Settings that do not change the model a run trains (with DataConfig.LOCATIONS)."""


def use_cache(path: Path) -> None:
    """Keep benchmark models in `path` from now on (a smoke run's own cache, say); read `common.CACHE`, not a copy."""
    global CACHE
    CACHE = Path(path)


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
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(exclude)benchmarks/results"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")  # a result being rewritten changes no code


START_COMMIT = commit()


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    """The lines of a Markdown table (the READMEs' tables, printed from a result): header, separator, rows."""
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in (header, *rows)]
    return [lines[0], "|" + "---|" * len(header), *lines[1:]]


def write_result(name: str, figures: dict, folder: Path = RESULTS) -> Path:
    """benchmarks/results/NAME.json (or FOLDER/NAME.json) with commit (at the script's start), date, machine,
    command and the figures."""
    from xattn.io import atomic_write_text

    record = {"benchmark": name, "commit": START_COMMIT, "date": datetime.date.today().isoformat(),
              "machine": machine(), "command": " ".join([Path(sys.executable).name, *sys.argv]), **figures}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return path


TRAINED_BY = "bench_trained_by.jsonl"
"""In a benchmark model's directory: one line per process that trained it (a run may go on in another session,
on another machine): commit, machine, date and the step it started from."""


def train_noted(cfg, out: Path, factory=None, quiet: bool = False):
    """xattn.training.train(cfg, out, quiet, factory), noting in out/TRAINED_BY which commit and machine
    trained it from which step (the note is taken back when the run had nothing left to train). A finished
    run is only read: several benchmarks running at once may ask for the same model."""
    from xattn.io import atomic_write_text
    from xattn.train_state import TrainStateDir
    from xattn.training import train

    if finished(out):
        return train(cfg, out, quiet=quiet, factory=factory)
    manifest = TrainStateDir(out / "train_state").read() if (out / "train_state").is_dir() else None
    start = manifest.step if manifest else 0
    note = {"commit": START_COMMIT, "machine": machine(), "date": datetime.datetime.now().isoformat("T", "seconds"),
            "from_step": start}
    out.mkdir(parents=True, exist_ok=True)
    line = json.dumps(note) + "\n"
    with (out / TRAINED_BY).open("a") as f:
        f.write(line)
    progress = train(cfg, out, quiet=quiet, factory=factory)
    if progress.step == start:
        text = (out / TRAINED_BY).read_text()
        cut = text.rindex(line)  # this process's note; another may have added its own since
        atomic_write_text(out / TRAINED_BY, text[:cut] + text[cut + len(line):])
    return progress


def trained_by(model_dir: Path) -> list[dict]:
    """The notes of train_noted, [] for a run trained before they were kept."""
    path = Path(model_dir) / TRAINED_BY
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def model_fingerprint(model_dir: str | Path) -> dict:
    """Which model a result was measured on: its weights' tensor SHA-256 and training record."""
    from xattn.checkpoint import WEIGHTS, read_weights, tensors_digest

    tensors, fingerprint = read_weights(Path(model_dir) / WEIGHTS)
    log = Path(model_dir) / "log.jsonl"
    evals = [json.loads(line) for line in log.read_text().splitlines() if "valid_bleu" in line] if log.is_file() else []
    return {"dir": str(model_dir), "tensors_sha256": fingerprint.tensors if fingerprint else tensors_digest(tensors),
            "trained_steps": max((e["step"] for e in evals), default=None),
            "best_valid_bleu": max((e["valid_bleu"] for e in evals), default=None), "trained_by": trained_by(model_dir)}


def config_key(cfg) -> str:
    """12 hex digits that change whenever a setting that shapes the trained model does."""
    from xattn.config import DataConfig

    body = cfg.to_dict()
    body.pop("decode")
    body["data"] = {k: v for k, v in body["data"].items() if k not in DataConfig.LOCATIONS}
    if body["data"].get("train_subset") is None:  # all the data, as before these keys existed
        body["data"].pop("train_subset", None)
        body["data"].pop("subset_seed", None)
    for key, default in (("spm_sample", 250_000), ("dedup", False)):  # defaults, as before the keys existed
        if body["data"].get(key) == default:
            body["data"].pop(key)
    body["train"] = {k: v for k, v in body["train"].items() if k not in NOT_IN_KEY["train"]}
    body["data"].update(linked_contents(cfg.data))
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def linked_contents(data) -> dict:
    """The files of DataConfig `data` that only newer runs name (data.train_links, data.corpora), by content:
    they are locations (left out of the key above), but two runs guided by different links, or joined by other
    corpora, train different models. {} without them, so the keys of earlier runs stay."""
    from xattn.corpora import CorpusSpec

    out = {}
    if data.train_links:
        out["train_links"] = file_sha256(data.train_links)
    if data.corpora:
        out["corpora"] = [{k: file_sha256(v) if k in CorpusSpec.LOCATIONS and v else v
                           for k, v in entry.items()} for entry in data.corpora]
    return out


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes (a missing file is an error: a key must not be made of a name alone)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def cached_dir(preset: str, overrides: list[str] = ()) -> tuple[Path, object]:
    """Where `xattn train PRESET overrides` is kept (CACHE/PRESET-KEY), and its config."""
    from xattn.config import load_config
    from xattn.presets import resolve_config

    cfg = load_config(resolve_config(preset), [f"data.data_dir={data_dir()}", *overrides])
    return CACHE / f"{preset}-{config_key(cfg)}", cfg


def cached_model(preset: str, overrides: list[str] = ()) -> Path:
    """The model `xattn train PRESET overrides` trains, kept in CACHE/PRESET-KEY: reused when its run
    finished there, resumed when it was cut short, trained when it is missing."""
    out, cfg = cached_dir(preset, overrides)
    if train_noted(cfg, out).stop_reason == "interrupted":
        raise SystemExit(f"training {out} was interrupted; run again to resume it")
    return out


def finished(model_dir: Path) -> bool:
    """Whether the training run in `model_dir` has ended (averaging included), not merely checkpointed: a
    run still training, or cut short, already has a model.safetensors."""
    from xattn.errors import XattnError
    from xattn.train_state import TrainStateDir

    state = TrainStateDir(Path(model_dir) / "train_state")
    try:
        return state.read() is not None and bool(state.load_state()["progress"]["finished"])
    except XattnError:  # a checkpoint being written just now
        return False


def median_time(fn, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def interleaved_speed(models: dict, sources: list[str], repeats: int, baseline: str) -> dict:
    """Sentences/s of each Translator in `models` on `sources`, greedy and beam 5, side by side: a warm-up,
    then `repeats` repetitions taking turns (the order reversed every other repetition); medians, and each
    model's speed over the `baseline` model's."""
    import xattn

    result = {}
    for mode, beam in (("greedy", 1), ("beam5", 5)):
        cfg = xattn.DecodeConfig(beam_size=beam)
        times = {name: [] for name in models}
        for translator in models.values():
            translator.translate(sources[:50], cfg)
        for r in range(repeats):
            for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
                start = time.perf_counter()
                models[name].translate(sources, cfg)
                times[name].append(round(time.perf_counter() - start, 3))
        base = statistics.median(times[baseline])
        result[mode] = {name: {"sentences_per_s": round(len(sources) / statistics.median(t), 1),
                               f"speed_over_{baseline}": round(base / statistics.median(t), 3), "times_s": t}
                        for name, t in times.items()}
        print(f"{mode}: " + ", ".join(f"{n} {v[f'speed_over_{baseline}']}x" for n, v in result[mode].items()), flush=True)
    return result
