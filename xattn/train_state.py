"""train_state/: what resuming a run needs, written so that a checkpoint becomes visible whole or not at all.

A checkpoint is a set of files named by a serial number (weights-000007.safetensors, state-000007.pt)
plus manifest.json, written last in one atomic rename. The manifest lists the checkpoint's files with
their SHA-256, the step, the length of log.jsonl at that moment, the weights kept for averaging, and
the run's identity, which a resume must match. The previous checkpoint's files stay until the new
manifest is in place; then every file the manifest does not list is removed. A process killed at any
moment therefore leaves the last complete checkpoint, and the files of an incomplete one are removed,
with a message, when the run starts again.
"""
from __future__ import annotations

import dataclasses
import errno
import io
import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from xattn.checkpoint import CONFIG, WEIGHTS
from xattn.checks import NON_NEGATIVE, POSITIVE, Check, one_of, read_record
from xattn import corpora
from xattn.config import DataConfig, RunConfig
from xattn.errors import XattnError
from xattn.io import atomic_write, atomic_write_text, is_temporary, json_text, make_parent, read_json, sha256_file

try:
    import fcntl
except ImportError:  # (Windows: no lock)
    fcntl = None

STATE_DIR = "train_state"  # in a run's directory: its checkpoints
LOG = "log.jsonl"          # beside it: one JSON record per logged step
LOCK = ".train.lock"       # beside it: held by the process training there (lock_run_dir)
MANIFEST = "manifest.json"
FORMAT = "xattn.train_state/1"
LEGACY = ("state.pt", "last.safetensors")  # the unchecked layout of xattn before manifests


@dataclass
class Manifest:
    serial: int                         # 1, 2, ...: numbers the files of each checkpoint
    step: int
    weights: str                        # the last weights
    state: str                          # optimizer, schedule, RNG states, progress
    averaging: list[list]               # [step, weights file] kept for checkpoint averaging, oldest first
    files: dict[str, str]               # every file of this checkpoint -> SHA-256
    log_bytes: int                      # length of log.jsonl when the checkpoint was written
    run: dict[str, Any]                 # the run's identity (see training.run_identity)
    format: str = FORMAT

    CHECKS: ClassVar[dict[str, Check]] = dict(serial=POSITIVE, step=NON_NEGATIVE, log_bytes=NON_NEGATIVE,
                                              format=one_of(FORMAT))


class TrainStateDir:
    """The train_state/ folder of a model directory."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.manifest: Manifest | None = None

    def read(self) -> Manifest | None:
        """The last complete checkpoint, its files verified; None if there is none."""
        path = self.dir / MANIFEST
        if not path.is_file():  # a new run, or one killed while writing its first checkpoint
            if any((self.dir / name).is_file() for name in LEGACY):
                raise XattnError(f"{self.dir}: written by an older xattn, without {MANIFEST}; it cannot be "
                                 "checked, so it is not resumed: train into a new directory")
            return None
        try:
            manifest = read_record(Manifest, read_json(path), f"{path}: damaged")
        except XattnError as e:
            raise XattnError(f"{e}; delete {self.dir}, config.yaml and log.jsonl beside it to train from the "
                             "start") from None
        for name, digest in manifest.files.items():
            file = self.dir / name
            if not file.is_file() or sha256_file(file) != digest:
                problem = "is missing" if not file.is_file() else "does not match its checksum in " + MANIFEST
                raise XattnError(f"{file}: {problem} (the checkpoint is damaged); delete {self.dir}, config.yaml and "
                                 "log.jsonl beside it to train from the start")
        self.manifest = manifest
        return manifest

    def load_state(self) -> dict[str, Any]:
        assert self.manifest is not None
        return torch.load(self.dir / self.manifest.state, map_location="cpu", weights_only=False)

    def write(self, step: int, write_weights: Callable[[Path], None], state: dict[str, Any], log_bytes: int,
              run: dict[str, Any], average_last: int = 0, for_averaging: bool = False) -> Manifest:
        """Write a new checkpoint: its files, then the manifest, then remove what no manifest lists.

        The weights kept for averaging are the `average_last` most recent ones (these among them if
        `for_averaging`): a resume that lowers train.average_last, or sets it to 0, keeps no more than it asks.
        """
        previous = self.manifest
        serial = previous.serial + 1 if previous else 1
        weights, state_file = f"weights-{serial:06d}.safetensors", f"state-{serial:06d}.pt"
        write_weights(self.dir / weights)
        atomic_write(self.dir / state_file, lambda tmp: save_torch(state, tmp))
        averaging = [list(a) for a in previous.averaging] if previous else []
        if for_averaging:
            averaging = [a for a in averaging if a[0] != step] + [[step, weights]]
        averaging = kept_for_averaging(averaging, average_last)
        known = previous.files if previous else {}
        names = {weights, state_file, *(name for _, name in averaging)}
        files = {name: known.get(name) or sha256_file(self.dir / name) for name in sorted(names)}
        manifest = Manifest(serial, step, weights, state_file, averaging, files, log_bytes, run)
        atomic_write_text(self.dir / MANIFEST, json_text(dataclasses.asdict(manifest), indent=1) + "\n")
        self.manifest = manifest
        self.remove_unlisted()
        return manifest

    def remove_unlisted(self) -> list[str]:
        """Delete every file the manifest does not list (an incomplete checkpoint, stale temporary files)."""
        if not self.dir.is_dir():
            return []
        keep = {MANIFEST, *(self.manifest.files if self.manifest else ())}
        removed = [f for f in self.dir.iterdir() if f.is_file() and f.name not in keep]
        for f in removed:
            f.unlink(missing_ok=True)
        return sorted(f.name for f in removed)


@dataclass
class Progress:
    """Where training stands; saved with every checkpoint so a run can resume exactly."""
    step: int = 0
    epoch: int = 0
    batch: int = 0                      # next batch of this epoch (this rank's share)
    best_score: float = -math.inf
    best_step: int = 0
    bad_evals: int = 0
    target_tokens: int = 0
    seconds: float = 0.0
    stop_reason: str | None = None      # why the last fit() ended
    finished: bool = False              # the end of training (averaging included) is done
    averaged: bool = False              # the best weights (at best_step) are the mean of the checkpoints kept for
    #                                     averaging: published again from them on resume (Trainer._resume)


def differences(saved: Any, now: Any, prefix: str = "") -> list[str]:
    """Keys whose values differ between two nested dicts, as "key: saved -> now"."""
    if isinstance(saved, dict) and isinstance(now, dict):
        keys = list(now) + [k for k in saved if k not in now]  # in the order of the identity: causes first
        return [d for k in keys for d in differences(saved.get(k), now.get(k), f"{prefix}{k}.")]
    return [] if saved == now else [f"{prefix.rstrip('.')}: {_short(saved)} -> {_short(now)}"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 20 else text[:12] + "..."


def data_identity(cfg: DataConfig) -> dict:
    """The data settings of a run's identity: without the keys that only say where the data lives."""
    data = corpora.identity({k: v for k, v in cfg.as_dict().items() if k not in DataConfig.LOCATIONS})
    if data["train_subset"] is None:  # all the data; the seed still draws SentencePiece's sample of a corpus
        del data["train_subset"]          # over data.spm_sample pairs, so only its default is left out (as before)
        if data["subset_seed"] == DataConfig.subset_seed:
            del data["subset_seed"]
    return json.loads(json_text(data))


def run_identity(cfg: RunConfig, corpus_sha256: str, tokenizers: dict[str, str], processes: int) -> dict:
    """What a resumed run must share with the run whose checkpoint it continues: the model, the data (its
    settings, without the keys that only say where it lives, and corpus.Corpus.fingerprint), the
    tokenizer files, and what fixes the order of batches. Budgets, learning rate and the like may change."""
    identity = {"tokenizers": tokenizers, "data": data_identity(cfg.data) | {"corpus_sha256": corpus_sha256},
                "model": cfg.model.as_dict(),
                "train": {"seed": cfg.train.seed, "max_tokens": cfg.train.max_tokens, "processes": processes}}
    if cfg.alignment.on:  # what the loss teaches (runs without guidance keep the identity they had)
        identity["alignment"] = cfg.alignment.as_dict()
    return json.loads(json_text(identity))  # as the manifest stores it


def refuse_another_run(out_dir: Path, manifest: Manifest, identity: dict, partial: bool = False) -> None:
    """One line when the run whose checkpoint is `manifest` (in `out_dir`) differs from this one in `identity`;
    `partial`: only in the keys it holds (what is known before the corpus is prepared)."""
    saved = manifest.run
    if "text_sha256" in saved.get("data", {}):
        raise XattnError(f"{out_dir}: a run started before training read prepared corpora (its checkpoint "
                         "names the corpus by its text); finish it with the xattn that started it, or train into "
                         "another directory")
    if partial:
        saved = {part: {k: v for k, v in saved.get(part, {}).items() if k in keys}
                 for part, keys in identity.items()}
    if diffs := differences(saved, identity):
        what = "; ".join(diffs[:3]) + ("; that is, the text of the training or validation files, or the "
                                       "tokenizers made from it, changed since the run began"
                                       if any(d.startswith("data.corpus_sha256") for d in diffs[:3]) else "")
        raise XattnError(f"{out_dir}: holds a run with other model, data or tokenizer settings ({what}); "
                         "rerun with the same settings to resume (budgets such as train.max_steps may change), or "
                         "train into another directory")


def published_before(out_dir: Path, state_dir: TrainStateDir) -> bool:
    """Whether the run's model.safetensors is missing or older than its last checkpoint: best weights that the
    checkpoint records are published after it, so a kill came between the two (a re-run of a finished run leaves
    what was published, and analysis.yaml with it, as it is)."""
    weights = out_dir / WEIGHTS
    return not weights.is_file() or weights.stat().st_mtime_ns < (state_dir.dir / MANIFEST).stat().st_mtime_ns


def open_run_dir(out_dir: Path) -> tuple[TrainStateDir, Manifest | None]:
    """A run directory's checkpoints and their manifest (None: a new run), once `out_dir` is one a run may go
    into: not a file, nor a model without training state, nor a folder whose config.yaml or log.jsonl a new
    run would replace (refused in one line)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise XattnError(f"{out_dir}: exists and is not a directory; train into a new or a model directory")
    if (out_dir / MANIFEST).is_file() and list(out_dir.glob("src.*")):  # (data/prepared.py's manifest and arrays)
        raise XattnError(f"{out_dir}: holds a prepared corpus ({MANIFEST} and its arrays), which a run would write "
                         f"its own tokenizer over; train into another directory, with data.prepared={out_dir}")
    state_dir = TrainStateDir(out_dir / STATE_DIR)
    manifest = state_dir.read()
    if manifest is None and (out_dir / WEIGHTS).is_file():
        raise XattnError(f"{out_dir}: holds a model but no training state to resume ({STATE_DIR}/{MANIFEST}); "
                         "train into a new directory")
    if manifest is None and (theirs := [n for n in (CONFIG, LOG) if (out_dir / n).exists()]):
        raise XattnError(f"{out_dir}: holds {' and '.join(theirs)} but no training run to resume (a new run "
                         "would replace them); train into a new or an empty directory")
    return state_dir, manifest


def save_torch(obj: Any, path: Path) -> None:
    """torch.save into `path`, a failed write (a full disk) raised as the OSError it is: torch makes it a RuntimeError
    ("unexpected pos 85888 vs 85776") that names nothing, and a full disk during a checkpoint was a traceback."""
    with _Noted(path, "wb") as f:
        try:
            torch.save(obj, f)
        except RuntimeError:
            if f.error is None:
                raise
            raise f.error from None


class _Noted(io.FileIO):
    """A file that writes all it is given (torch's writer ignores a short write's count: a write of over 2 GiB, which
    Linux cuts, left a truncated checkpoint) and keeps the error of a failed write (`error`)."""
    error: OSError | None = None

    def write(self, data) -> int:
        view, done = memoryview(data).cast("B"), 0
        try:
            while done < len(view):
                done += super().write(view[done:])
        except OSError as e:
            self.error = e
            raise
        return done


_HELD: dict[str, Any] = {}
"""The run directories this process holds (lock_run_dir), by resolved path: one lock per directory and process."""


def lock_run_dir(out_dir: Path, make: bool = False) -> None:
    """Hold `out_dir` for this process' training: another process training into it meanwhile (the same command run
    again while the first runs) is refused in one line. Both wrote there, deleting each other's checkpoint files and
    truncating the log under the other. An flock on LOCK, which the system releases when the process ends, however
    it ends (release_run_dir before). A directory that holds no run yet is held from the new run's first write there
    (`make`: a run refused before it creates and adds nothing); a filesystem without locks goes without."""
    key = str(out_dir.resolve())
    if fcntl is None or key in _HELD or not (make or (out_dir / STATE_DIR).is_dir()):
        return  # (a folder without a run is held once the new run first writes there: its tokenizers)
    make_parent(out_dir / LOCK, out_dir)
    held = open(out_dir / LOCK, "a+", encoding="utf-8")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = "" if e.errno not in (errno.EWOULDBLOCK, errno.EACCES) else (held.seek(0), held.read().strip())[1]
        held.close()
        if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):  # (no locks on this filesystem)
            return
        raise XattnError(f"{out_dir}: another training (process {holder or '?'}) is writing there; wait for it to "
                         "end, or train into another directory") from None
    held.seek(0)
    held.truncate()
    held.write(f"{os.getpid()}\n")
    held.flush()
    _HELD[key] = held


def hold_new_run_dir(out_dir: Path) -> None:
    """Hold `out_dir` for a new run from its first write there (lock_run_dir; until release_run_dir or the process
    ends). Refused when a run went on there since this one found none: two runs started into one new directory at
    once each wrote their tokenizers there, and the later one removed the other's checkpoint as half written."""
    out_dir.mkdir(parents=True, exist_ok=True)  # (where locks are unavailable too)
    lock_run_dir(out_dir, make=True)
    if TrainStateDir(out_dir / STATE_DIR).read() is not None:
        raise XattnError(f"{out_dir}: another training started a run there meanwhile; resume it with its command, "
                         "or train into another directory")


def release_run_dir(out_dir: Path) -> None:
    """Let go of `out_dir` (lock_run_dir), as the end of this process would."""
    if (held := _HELD.pop(str(out_dir.resolve()), None)) is not None:
        held.close()


def remove_leftovers(out_dir: Path, state_dir: TrainStateDir) -> list[str]:
    """Remove what a killed process left half-written in a run directory (its temporary files, an incomplete
    checkpoint); their names."""
    stale = [f for f in out_dir.iterdir() if f.is_file() and is_temporary(f)]
    for f in stale:
        f.unlink(missing_ok=True)
    return [f.name for f in stale] + [f"{STATE_DIR}/{n}" for n in state_dir.remove_unlisted()]


def kept_for_averaging(averaging: list[list], average_last: int) -> list[list]:
    """The last `average_last` of the checkpoints kept for averaging ([step, weights file], oldest first; 0: none)."""
    return averaging[-average_last:] if average_last else []


def rng_state() -> dict:
    """This process's random number streams (a checkpoint's `rng`)."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(rng: dict) -> None:
    """Restore what rng_state() gave (the CUDA streams of the devices there are, where their number changed)."""
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        for device, state in enumerate(rng["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, device)
