"""Decoding speed of the working tree against an earlier revision, on the same model and sentences.

Two versions of the xattn package cannot live in one process, so the revision is checked out into a
temporary git worktree (removed at the end) and every timing runs in a fresh worker process whose
PYTHONPATH is one version's source root. A worker sets the C allocator as `xattn translate` does (where the
version has xattn.allocator), loads `Translator.from_dir(model, device="cpu")`
(with `quantize="int8"` for the int8 modes), translates the first 50 sentences untimed, then times
the translation of all of them (in one call, or one call per sentence in the `_single` modes; in the `_attention`
modes with the cross-attention returned, which the hash then covers, bit for bit; in the `_long` ones LONG
sentences joined into one line, one line each) and prints the seconds, a hash of the output texts and their BLEU
against the references (sacreBLEU 13a, cased). Within each of
`--repeats` repetitions the two versions take turns on every mode, the first turn alternating
between repetitions, so that slow spells of the machine hit both alike; figures are the medians.

Sentences: the first `--sentences` of Multi30k test_2016_flickr (de), the same file for both versions.
Threads: whatever the environment gives (OMP_NUM_THREADS), the same for both.

usage: python benchmarks/decode_versions.py [--model DIR] [--against 3cdbd37]
                                            [--repeats 5] [--sentences 1000] [--modes greedy beam5 ...]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, cached_model, data_dir, model_fingerprint, write_result

MODEL = ["train.max_minutes=20"]
"""The default model: Multi30k de->en trained for 20 minutes (in the benchmark cache, see common.py)."""
MODES = {"greedy": (1, None), "beam5": (5, None), "greedy_int8": (1, "int8"), "beam5_int8": (5, "int8"),
         "greedy_single": (1, None), "beam5_attention": (5, None), "beam5_attention_long": (5, None)}
"""mode -> (beam size, quantize); `_single` modes translate one sentence per call (a server's lone client),
`_attention` ones return the cross-attention of every layer and head, `_long` ones join LONG sentences a line."""
LONG = 30
"""Sentences joined into one line in the `_long` modes (30 test sentences: about 480 source tokens)."""


def worker(model: str, texts_file: str, refs_file: str, mode: str) -> None:
    """Time one translation of the sentences in `texts_file` with the xattn found on sys.path; print JSON."""
    import torch
    import xattn
    from xattn.config import DecodeConfig
    from xattn.evaluation import evaluate
    from xattn.translator import Translator

    try:  # as `xattn translate` runs, where the version has it (xattn.allocator)
        from xattn.allocator import keep_freed_memory
    except ImportError:
        pass
    else:
        keep_freed_memory()
    import numpy as np

    beam, quantize = MODES[mode]
    texts = Path(texts_file).read_text(encoding="utf-8").splitlines()
    refs = Path(refs_file).read_text(encoding="utf-8").splitlines()
    if mode.endswith("_long"):
        texts, refs = ([" ".join(lines[i: i + LONG]) for i in range(0, len(lines), LONG)] for lines in (texts, refs))
    translator = Translator.from_dir(model, device="cpu", quantize=quantize)
    cfg = DecodeConfig(beam_size=beam, n_best=1)
    attention = "_attention" in mode
    translator.translate(texts[:50] if len(texts) > 50 else texts[:1], cfg, return_attention=attention)
    start = time.perf_counter()
    if mode.endswith("_single"):
        results = [translator.translate([text], cfg)[0] for text in texts]
    else:
        results = translator.translate(texts, cfg, return_attention=attention)
    seconds = time.perf_counter() - start
    out = [t.text for t in results]
    digest = hashlib.sha256("\n".join(out).encode("utf-8"))
    for t in results if attention else ():
        digest.update(np.asarray(t.cross_attention, dtype=np.float32).tobytes())
    digest = digest.hexdigest()[:16]
    bleu = evaluate(out, refs)["bleu"].score
    print(json.dumps({"seconds": seconds, "hash": digest, "bleu": round(bleu, 2), "sentences": len(texts),
                      "threads": torch.get_num_threads(), "xattn": xattn.__file__}))


def run_worker(source_root: Path, model: str, texts_file: Path, mode: str) -> dict:
    """One timed turn in a fresh process that imports xattn from `source_root` only."""
    env = dict(os.environ, PYTHONPATH=str(source_root))
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--texts", str(texts_file),
           "--refs", str(refs_of(texts_file)), "--modes", mode]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"worker for {source_root} ({mode}) failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["xattn"]).resolve().is_relative_to(source_root.resolve()):
        raise RuntimeError(f"worker imported {result['xattn']}, not the xattn of {source_root}")
    return result


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def summary(turns: list[dict]) -> dict:
    seconds = statistics.median(t["seconds"] for t in turns)
    return {"median_s": round(seconds, 3), "sentences_per_s": round(turns[0]["sentences"] / seconds, 1),
            "bleu": turns[0]["bleu"], "times_s": [round(t["seconds"], 3) for t in turns]}


def refs_of(texts_file: Path) -> Path:
    """The references beside the sources a run translates."""
    return texts_file.with_name("refs.txt")


def compare(versions: dict[str, Path], args, texts_file: Path) -> dict:
    """Interleaved turns of every version on every mode; medians, new/old speed ratio, identical outputs."""
    turns = {(name, mode): [] for name in versions for mode in args.modes}
    for repeat in range(args.repeats):
        order = list(versions) if repeat % 2 == 0 else list(reversed(versions))
        for mode in args.modes:
            for name in order:
                turns[(name, mode)].append(run_worker(versions[name], args.model, texts_file, mode))
                print(f"repeat {repeat + 1} {mode} {name}: {turns[(name, mode)][-1]['seconds']:.2f} s", flush=True)
    figures = {}
    for mode in args.modes:
        old, new = summary(turns[("old", mode)]), summary(turns[("new", mode)])
        hashes = {t["hash"] for name in versions for t in turns[(name, mode)]}
        figures[mode] = {"old": old, "new": new, "identical_outputs": len(hashes) == 1,
                         "speed_new_over_old": round(new["sentences_per_s"] / old["sentences_per_s"], 3)}
        print(mode, json.dumps(figures[mode]), flush=True)
    figures["threads"] = turns[("new", args.modes[0])][0]["threads"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model directory (default: the cached multi30k-de-en model of "
                        f"`xattn train multi30k-de-en {' '.join(MODEL)}`, trained first if missing)")
    parser.add_argument("--against", default="3cdbd37", help="the git revision to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--modes", nargs="+", choices=list(MODES),
                        default=[m for m in MODES if not m.endswith(("_single", "_attention", "_long"))])
    parser.add_argument("--result", default="decode_speed_versions", help="results/NAME.json to write")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--texts", help=argparse.SUPPRESS)
    parser.add_argument("--refs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.model, args.texts, args.refs, args.modes[0])
    from xattn.datasets import multi30k

    args.model = str(Path(args.model).resolve()) if args.model else str(cached_model("multi30k-de-en", MODEL))
    pairs = multi30k("de", "en", "test_2016_flickr", data_dir())[: args.sentences]
    against = git("rev-parse", "--short", args.against)
    with tempfile.TemporaryDirectory() as tmp:
        old_root = Path(tmp, f"xattn-{against}")
        git("worktree", "add", "--detach", str(old_root), against)
        try:
            texts_file = Path(tmp, "texts.txt")
            texts_file.write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
            refs_of(texts_file).write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
            figures = compare({"old": old_root, "new": ROOT}, args, texts_file)
        finally:
            git("worktree", "remove", "--force", str(old_root))
    figures["settings"] = {"against": against, "new": "working tree", "sentences": len(pairs),
                           "repeats": args.repeats, "model": model_fingerprint(args.model), "modes": args.modes}
    print("->", write_result(args.result, figures))


if __name__ == "__main__":
    main()
