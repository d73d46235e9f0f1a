"""Bad input through the CLI's entry point: every case exits 2 with one line on stderr, no traceback,
and leaves every file that was already there as it was. Cases run in-process through `main`;
a few run through a real subprocess to check the installed entry point does the same."""
import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import xattn
from xattn.cli.main import main
from xattn.errors import ItemError, ParameterError
from tests.conftest import NUMBERS_TINY

IMPORTANCE_TOP = b"# weights: " + b"f" * 64 + b"\n# method: gradient\nlayer\tplace\thead\tscore\n"


@pytest.fixture(scope="module")
def space(tmp_path_factory, numbers_model) -> Path:
    """A workspace: a trained model directory `model`, corpus files, and damaged copies made per case."""
    root = tmp_path_factory.mktemp("errors")
    shutil.copytree(numbers_model, root / "model")
    files = {"src.txt": b"eins\nzwei\n", "ref.txt": b"one\n", "good.txt": b"eins\nzwei\n",
             "bad-utf8.txt": b"eins\nvier\xffzig\n", "cr-only.de": b"eins\rzwei\rdrei\r", "cr-only.en": b"one\rtwo\rthree\r",
             "a.de": b"eins\nzwei\n", "a.en": b"one\n", "empty.de": b"\n\n", "empty.en": b" \n\n",
             "latin1.yaml": "model:\n  d_model: 16 # größe\n".encode("latin-1"), "scalar.yaml": b"model: 5\n",
             "list.yaml": b"- model\n", "twice.yaml": b"train:\n  lr: 1\n  lr: 2\n",
             "bad.yaml": b"model: {d_model: [\n", "unknown.yaml": b"modle:\n  d_model: 16\n",
             "file-not-dir": b"I am a file\n", "nothing.txt": b"",
             "aer-gold.talp": b"1-1 2-2 2p3\n1-1 2p2\n", "aer-gold-bad.talp": b"1-1 2-2\n1-1 2x2\n",
             "aer-gold-zero.talp": b"1-1 0-2\n1-1\n", "aer-gold-possible.talp": b"1p1\n\n", "aer-hyp-none.align": b"\n\n", "aer-gold-far.talp": b"1-1 2-2\n1-1 3-2\n",
             "aer-hyp.align": b"0-0 1-2 2-2\n1-1\n", "aer-hyp-far.align": b"0-0 1-3\n1-1\n", "aer-hyp-short.align": b"0-0\n",
             "aer-hyp-possible.align": b"0-0 1p2\n1-1\n", "aer-pairs.txt": b"a b c ||| x y z\nd e ||| u v\n",
             "aer-pairs-bad.txt": b"a b c ||| x y z\nd e u v\n", "aer-pairs-short.txt": b"a b c ||| x y z\n",
             "aer-src.txt": b"a b c\nd e\n", "aer-tgt.txt": b"x y z\nu v\n",
             "importance-twice.tsv": IMPORTANCE_TOP + b"0\tcross\t1\t0.5\n0\tcross\t1\t0.9\n",
             "importance-other.tsv": IMPORTANCE_TOP + b"0\tcross\t1\t0.5\n",
             "mask-above-1.yaml": b"cross: [[1, 2]]\n", "m30k-nope.yaml": b"data: {dataset: multi30k, data_dir: nope}\n", "long.de": b"eins zwei drei vier\n" * 3,
             "long.en": b"one two three four five\n" * 3, "links-short.txt": b"0-0\n", "links-far.txt": b"0-0\n0-1\n"}
    for name, data in files.items():
        (root / name).write_bytes(data)
    with gzip.open(root / "corrupt.de.gz", "wb") as f:
        f.write(b"eins\nzwei\n")
    (root / "corrupt.de.gz").write_bytes((root / "corrupt.de.gz").read_bytes()[:-6])
    (root / "invalid.de.gz").write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x07")  # an invalid deflate block
    prepared_corpora(root)
    return root


def prepared_corpora(root: Path) -> None:
    """prepared: the tiny numbers config's corpus; prepared-short: a copy with src.bin cut short; prepared-spm: a
    copy with a damaged tokenizer; prepared-files: made from src.txt + good.txt."""
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.data.prepare import prepare

    prepare(load_config(resolve_config("numbers-de-en"), NUMBERS_TINY).data, root / "prepared", workers=1)
    shutil.copytree(root / "prepared", root / "prepared-short")
    (root / "prepared-short" / "src.bin").write_bytes((root / "prepared" / "src.bin").read_bytes()[:-2])
    shutil.copytree(root / "prepared", root / "prepared-spm")
    (root / "prepared-spm" / "spm.model").write_bytes(b"not a model")
    files = [f"data.train_src={root}/src.txt", f"data.train_tgt={root}/good.txt", "data.vocab_size=20"]
    prepare(load_config(resolve_config("numbers-de-en"), NUMBERS_TINY + ["data.dataset=null", *files]).data,
            root / "prepared-files", workers=1)


def damaged(space: Path, name: str, change) -> str:
    """A copy of the trained model directory with `change(dir)` applied."""
    target = space / f"model-{name}"
    if not target.exists():
        shutil.copytree(space / "model", target)
        change(target)
    return str(target)


def edit_model_config(key, value, section="model"):
    def change(d: Path):
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg[section][key] = value
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return change


def poison_weights(d: Path):
    path = str(d / "model.safetensors")
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    tensors = load_file(path)
    tensors["decoder.layers.0.cross_attn.q_proj.weight"][0, 0] = float("nan")
    save_file(tensors, path, metadata=meta)


def other_tokenizer(d: Path):
    from xattn.tokenizer import train_sentencepiece
    train_sentencepiece([f"zahl{i} wort{i % 7}" for i in range(300)], d / "spm.model", vocab_size=60)


def truncate(name: str):
    return lambda d: (d / name).write_bytes((d / name).read_bytes()[:100])


def bad_manifest(d: Path):
    manifest = d / "train_state" / "manifest.json"
    record = json.loads(manifest.read_text())
    record["files"][record["weights"]] = "0" * 64
    manifest.write_text(json.dumps(record))


def manifest_key_twice(d: Path):
    manifest = d / "train_state" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"step":', '"step": 999999,\n "step":', 1))


def analysis(text: str):
    return lambda d: (d / "analysis.yaml").write_text(text)


def remove(name: str):
    return lambda d: shutil.rmtree(d / name) if (d / name).is_dir() else (d / name).unlink()


def pruned(mask: str):
    """The trained model pruned by `xattn prune --heads` with the head mask `mask` (its stdout dropped)."""
    def change(d: Path):
        mask_file = d.parent / f"{d.name}.mask.yaml"
        mask_file.write_text(mask)
        shutil.rmtree(d)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert main(["prune", str(d.parent / "model"), "--heads", str(mask_file), "--out", str(d)]) == 0
    return change


M = "{model}"  # the trained model directory
TRAIN = ["train", "numbers-de-en", *NUMBERS_TINY, "train.max_steps=2"]

CASES = {
    # decoding flags
    # views and tools of cross-attention on a model whose every cross-attention head was pruned
    "attention without cross heads": (["attention", "{damaged:no-cross-heads}", "drei vier", "-o", "{space}/x.html"],
                                      "no cross-attention heads left (all pruned)"),
    "align without cross heads": (["align", "{damaged:no-cross-heads}", "--pairs", "{space}/aer-pairs.txt"],
                                  "no cross-attention heads left (all pruned)"),
    "importance without heads": (["heads", "importance", "{damaged:no-heads-at-all}"],  # (a table of no rows, exit 0)
                                 "every attention head of this model was pruned; there is none to rank"),
    "alignment without cross heads": (["translate", "{damaged:no-cross-heads}", "--alignment"],
                                      "no cross-attention heads left (all pruned)"),
    # prepare
    "prepare over an existing directory": (["prepare", "numbers-de-en", "--out", "{space}"], "--out: "),
    "train from an empty config file": (["train", "{space}/nothing.txt", "--out", "{space}/new-empty"],
                                        "nothing.txt: empty; expected a mapping with sections"),  # (it trained)
    "override of a dotted key": ([*TRAIN, "train.foo.bar=1", "--out", "{space}/new-dotted"],
                                 "train: error: unknown config key train.foo.bar"),  # (it named the preset file)
    "train on a prepared corpus of a damaged tokenizer": ([*TRAIN, "data.prepared={space}/prepared-spm", "--out",
                                                          "{space}/new-spm"],
                                                         "prepared-spm/spm.model: its SHA-256 differs"),  # (new-spm's)
    "prepare a prepared corpus": (["prepare", "numbers-de-en", "data.prepared={space}/prepared", "--out",
                                   "{space}/new-prepared"], "data.prepared: "),  # (it was ignored)
    "shortlist data dir with src": (["shortlist", M, "--src", "{space}/src.txt", "--tgt", "{space}/ref.txt",
                                     "--data-dir", "{space}"], "--data-dir: not used with --src and --tgt"),
    "prepare workers 0": (["prepare", "numbers-de-en", "--out", "{space}/new-prepared", "--workers", "0"],
                          "--workers: must be in [1, 256], got 0"),
    "prepare spm_sample 0": (["prepare", "numbers-de-en", "data.spm_sample=0", "--out", "{space}/new-prepared"],
                             "data.spm_sample: must be"),
    "prepare where no pair survives cleaning": (["prepare", "numbers-de-en", "data.dataset=null", "data.max_len=2",
                                                 "data.train_src={space}/long.de", "data.train_tgt={space}/long.en",
                                                 "data.vocab_size=30", "--out", "{space}/new-prepared"],
                                                "no training pairs left"),
    "train with no dataset and no files": ([*TRAIN, "data.dataset=null", "--out", "{space}/new-run"],
                                           "data.dataset: is null: set data.train_src"),
    "prepare with no dataset and no files": (["prepare", "numbers-de-en", "data.dataset=null", "--out",
                                              "{space}/new-prepared"], "data.dataset: is null: set data.train_src"),
    "train on own files beside a dataset": ([*TRAIN, "data.train_src={space}/src.txt",  # read numbers, silently
                                             "data.train_tgt={space}/good.txt", "--out", "{space}/new-run"],
                                            "data.train_src: names a file of your own, but data.dataset is numbers"),
    "prepare a TSV beside src and tgt files": (["prepare", "numbers-de-en", "data.dataset=null",
                                                "data.train_src={space}/src.txt", "data.train_tgt={space}/good.txt",
                                                "data.train_tsv={space}/src.txt", "--out", "{space}/new-prepared"],
                                               "data.train_tsv: names the training pairs, and so do data.train_src "
                                               "and data.train_tgt; give one"),
    "prepare numbers with a data_dir override": (["prepare", "numbers-de-en", "data.data_dir={space}", "--out",
                                                  "{space}/new-prepared"],
                                                 "data.data_dir: only Multi30k is read from a folder; this data is "
                                                 "numbers"),
    "train on a prepared corpus of other settings": ([*TRAIN, "data.prepared={space}/prepared", "data.max_len=50",
                                                      "--out", "{space}/new-run"], "data.max_len: data.prepared="),
    "train on a damaged prepared corpus": ([*TRAIN, "data.prepared={space}/prepared-short", "--out",
                                            "{space}/new-run"], "prepared-short/src.bin: 4158 bytes where manifest.json says 4160 (cut short or changed)"),
    "train on a prepared corpus of other files": (
        [*TRAIN, "data.dataset=null", "data.train_src={space}/ref.txt", "data.train_tgt={space}/good.txt",
         "data.valid_src={space}/src.txt", "data.valid_tgt={space}/good.txt", "data.vocab_size=20",
         "data.prepared={space}/prepared-files", "--out", "{space}/new-run"], "data.train_src: "),
    "train on what is not a prepared corpus": ([*TRAIN, "data.prepared={space}", "--out", "{space}/new-run"],
                                               "not a prepared corpus (no manifest.json)"),
    "prepare misaligned files": (["prepare", "numbers-de-en", "data.dataset=null", "data.train_src={space}/a.de",
                                  "data.train_tgt={space}/a.en", "--out", "{space}/new-prepared"], "line counts differ"),
    # guided alignment: the links file and the alignment section
    "prepare with a short links file": (["prepare", "numbers-de-en", "data.dataset=null", "data.train_src={space}/src.txt",
                                         "data.train_tgt={space}/good.txt", "data.train_links={space}/links-short.txt",
                                         "data.vocab_size=20", "--out", "{space}/new-prepared"],
                                        "links-short.txt: line 2: missing; the links file has 1 lines"),
    "train with a link beyond its words": ([*TRAIN, "data.dataset=null", "data.train_src={space}/src.txt",
                                            "data.train_tgt={space}/good.txt", "data.valid_src={space}/src.txt",
                                            "data.valid_tgt={space}/good.txt", "data.train_links={space}/links-far.txt",
                                            "data.vocab_size=20", "--out", "{space}/new-run"],
                                           "links-far.txt: line 2: link '0-1': index 1 is beyond the 1 words of the second side"),
    "guidance without links": ([*TRAIN, "alignment.weight=0.5"], "alignment.weight: 0.5 needs the links"),
    "guided layer out of range": ([*TRAIN, "alignment.weight=1", "data.train_links={space}/links-short.txt",
                                   "alignment.layer=3"], "alignment.layer: 3 is not a decoder layer of this model (0 to 0)"),
    "guided head out of range": ([*TRAIN, "alignment.weight=1", "data.train_links={space}/links-short.txt",
                                  "alignment.heads=0,2"], "alignment.heads: layer 0 has no head 2"),
    "guided unknown key": ([*TRAIN, "alignment.layers=0"], "unknown config key alignment.layers (did you mean 'layer'?)"),
    "corpora unknown key": ([*TRAIN, "data.corpora=[{src: a.de, tgt: a.en, wieght: 2}]"],
                            "unknown config key data.corpora[0].wieght (did you mean 'weight'?)"),
    "corpora with a short links file": ([*TRAIN, "data.corpora=[{src: {space}/src.txt, tgt: {space}/good.txt, "
                                         "links: {space}/links-short.txt, upsample: 2}]", "--out", "{space}/new-run"],
                                        "links-short.txt: line 2: missing; the links file has 1 lines"),
    "beam 0": (["translate", M, "--beam", "0"], "--beam: must be in [1, 1024], got 0"),
    "beam negative": (["translate", M, "--beam", "-3"], "--beam"),
    "n-best above beam": (["translate", M, "--n-best", "5", "--beam", "2"], "--n-best: 5 is above --beam (2)"),
    "n-best above the model's beam": (["translate", M, "--n-best", "3"], "--n-best: 3 is above decode.beam_size (2)"),
    "max-len-a negative": (["translate", M, "--max-len-a", "-1"], "--max-len-a"),
    "max-len-b negative": (["translate", M, "--max-len-b", "-2"], "--max-len-b"),
    "max length zero": (["translate", M, "--max-len-a", "0", "--max-len-b", "0"], "nothing could be generated"),
    "max length below one token": (["translate", M, "--max-len-a", "0.1", "--max-len-b", "0"],
                                   "--max-len-b: the maximum output length leaves a sentence of 6 source tokens"),
    "min length above the maximum": (["translate", M, "--min-len", "40", "--max-len-b", "20", "--beam", "2"],
                                     "--min-len: 40 is above the"),
    "temperature zero": (["translate", M, "--sample", "--temperature", "0"], "--temperature"),
    "temperature nan": (["translate", M, "--sample", "--temperature", "nan"], "--temperature"),
    "top-p above 1": (["translate", M, "--sample", "--top-p", "1.5"], "--top-p"),
    "top-k without sample": (["translate", M, "--top-k", "5"], "--top-k: applies to sampling only; set --sample"),
    "beam with sample": (["translate", M, "--sample", "--beam", "2"], "--beam: applies to beam search, not to sampling (samples: --num-samples)"),
    "n-best with sample": (["translate", M, "--sample", "--n-best", "2", "--num-samples", "2"],
                           "--n-best: applies to beam search, not to sampling"),
    "temperature without sample": (["translate", M, "--temperature", "0.5"], "--temperature: applies to sampling only; set --sample"),
    "attention reference and beam": (["attention", M, "eins", "--reference", "one", "--beam", "2", "-o",
                                      "{space}/a.png"], "--beam: not used with --reference"),
    "diagnose hyp and sample": (["diagnose", M, "--src", "{space}/good.txt", "--hyp", "{space}/good.txt", "--sample"],
                                "--sample: not used with --hyp"),
    "evaluate n-best": (["evaluate", M, "--split", "val", "--n-best", "2"], "unrecognized arguments: --n-best 2"),
    "stopping with sample": (["translate", M, "--sample", "--stopping", "early"],
                             "--stopping: applies to beam search"),
    "empty output path": (["translate", M, "-o", ""], "argument --output/-o: an empty path"),
    "empty model path": (["translate", ""], "argument model: an empty path"),
    "train out empty": ([*TRAIN, "--out", ""], "argument --out: an empty path"),
    "override after an option, bad": (["train", "numbers-de-en", "--quiet", "model.n_heads=0", "--out", "{space}/new-o"],
                                      "model.n_heads: must be >= 1"),
    "flag after an option, unknown": (["train", "numbers-de-en", "--quiet", "--bogus"], "unrecognized arguments: --bogus"),
    "num-samples zero": (["translate", M, "--sample", "--num-samples", "0"], "--num-samples"),
    "seed negative": (["translate", M, "--sample", "--seed", "-1"], "--seed"),
    "length penalty inf": (["translate", M, "--length-penalty", "inf"], "--length-penalty"),
    # greedy search or sampling: the penalty changes only scores, which these do not show (it was ignored silently)
    "diagnose over alone below under": (["diagnose", M, "--src", "{space}/good.txt", "--over", "0.1"],
                                        "--over: 0.1 is not above the under threshold (0.2, --under)"),
    "length penalty, greedy translate": (["translate", M, "--beam", "1", "--length-penalty", "2"],
                                         "--length-penalty: with greedy search or sampling it changes only the "
                                         "translations' scores, which translate prints with --scores"),
    "length penalty, sampled evaluate": (["evaluate", M, "--split", "val", "--sample", "--length-penalty", "2"],
                                         "which evaluate does not report"),
    "length penalty, greedy attention": (["attention", M, "eins", "--beam", "1", "--length-penalty", "2", "-o",
                                          "{space}/a.png"], "which attention does not show"),
    "length penalty, greedy diagnose": (["diagnose", M, "--src", "{space}/good.txt", "--beam", "1", "--length-penalty",
                                         "2"], "which diagnose does not report"),
    "max-tokens zero": (["translate", M, "--max-tokens", "0"], "--max-tokens"),
    "beam not a number": (["translate", M, "--beam", "abc"], "argument --beam: invalid int value"),
    "unknown flag": (["translate", M, "--bem", "3"], "unrecognized arguments"),
    "quantize int4": (["translate", M, "--quantize", "int4"], "--quantize"),
    "device cuda": (["translate", M, "--device", "cuda"], "--device=cuda: no CUDA device"),
    "device tpu": (["translate", M, "--device", "tpu"], "'tpu' is not a device"),
    "device empty": (["translate", M, "--device", ""], "--device: '' is not a device"),  # not auto, silently
    "evaluate device cuda:3": (["evaluate", M, "--device", "cuda:3"], "--device=cuda:3"),
    # config values
    "n_heads 0": ([*TRAIN, "model.n_heads=0"], "model.n_heads: must be >= 1"),
    "d_model not divisible": ([*TRAIN, "model.d_model=30", "model.n_heads=4"], "divisible"),
    "eval_every 0": ([*TRAIN, "train.eval_every=0"], "train.eval_every"),
    "log_every 0": ([*TRAIN, "train.log_every=0"], "train.log_every"),
    "lr nan": ([*TRAIN, "train.lr=nan"], "train.lr: must be a finite number > 0, got nan"),
    "lr negative": ([*TRAIN, "train.lr=-1e-3"], "train.lr"),
    "threads negative": ([*TRAIN, "train.threads=-1"], "train.threads"),
    "device tpu (config)": ([*TRAIN, "train.device=tpu"], "train.device"),
    "device cuda (config)": ([*TRAIN, "train.device=cuda"], "train.device=cuda: no CUDA device"),
    "amp fp16 on cpu": ([*TRAIN, "train.device=cpu", "train.amp=fp16"], "train.amp=fp16 needs a CUDA device"),
    "amp unknown": ([*TRAIN, "train.amp=fp8"], "train.amp"),
    "max_steps negative": ([*TRAIN, "train.max_steps=-5"], "train.max_steps"),
    "max_steps zero": ([*TRAIN, "train.max_steps=0"], "train.max_steps"),
    "max_minutes negative": ([*TRAIN, "train.max_minutes=-1"], "train.max_minutes"),
    "encoder layers negative": ([*TRAIN, "model.n_encoder_layers=-1"], "model.n_encoder_layers"),
    "decoder layers zero": ([*TRAIN, "model.n_decoder_layers=0"], "model.n_decoder_layers"),
    "label smoothing 2": ([*TRAIN, "train.label_smoothing=2"], "train.label_smoothing"),
    "dropout 1": ([*TRAIN, "model.dropout=1"], "model.dropout"),
    "betas one value": ([*TRAIN, "train.betas=0.9"], "train.betas"),
    "betas out of range": ([*TRAIN, "train.betas=0.9,1.5"], "train.betas"),
    "d_model fraction": ([*TRAIN, "model.d_model=1.5"], "model.d_model: expected int"),
    "bool for int": ([*TRAIN, "model.d_model=true"], "model.d_model"),
    "bool not bool": ([*TRAIN, "model.tie_output=maybe"], "model.tie_output"),
    "language unknown": ([*TRAIN, "data.src_lang=xx"], "data.src_lang"),
    "vocab_size tiny": ([*TRAIN, "data.vocab_size=3"], "data.vocab_size"),
    "vocab_size below the characters": ([*TRAIN, "data.vocab_size=9", "--out", "{space}/new-vocab"],
                                        "numbers de-en train: cannot train the tokenizer on this text (SentencePiece "
                                        "training failed with vocab_size=9: the text needs at least 31 pieces"),
    "numbers_size 0": ([*TRAIN, "data.numbers_size=0"], "data.numbers_size"),
    "max_ratio below 1": ([*TRAIN, "data.max_ratio=0.5"], "data.max_ratio"),
    "pad outside vocab": ([*TRAIN, "model.pad_id=100000"], "model.pad_id"),
    "learned positions too few": ([*TRAIN, "model.positions=learned", "model.max_positions=20"], "model.max_positions"),
    "unknown key": ([*TRAIN, "train.max_step=3"], "did you mean 'max_steps'"),
    "unknown section": ([*TRAIN, "trian.lr=3"], "unknown section"),
    "override without section": ([*TRAIN, "lr=3"], "expected section.key=value"),
    "data dir without multi30k": (["prepare", "multi30k-de-en", "--data-dir", "{space}", "--out",
                                   "{space}/new-prepared"], "error: --data-dir: {space}: no train.de.gz there"),
    "heads importance split unknown": (["heads", "importance", M, "--split", "nope"],
                                       "xattn heads importance: error: --split: unknown numbers split 'nope'"),
    "data dir a file": (["prepare", "multi30k-de-en", "--data-dir", "{space}/src.txt", "--out", "{space}/new-prepared"],
                        "error: --data-dir: {space}/src.txt: not a folder"),  # (it said: no train.de.gz there)
    "data dir of a config file without multi30k": (["prepare", "{space}/m30k-nope.yaml", "--out", "{space}/new-prepared"],
                                                    "error: {space}/m30k-nope.yaml: data.data_dir: nope: no such folder"),
    "data dir override without multi30k": (["prepare", "multi30k-de-en", "data.data_dir={space}/nope", "--out",
                                            "{space}/new-prepared"], "error: data.data_dir: {space}/nope: no such folder"),
    "prune a place given twice": (["prune", M, "--fraction", "0.5", "--places", "cross,cross", "--out",
                                   "{space}/new-pruned"], "--places: cross is given twice"),
    "decode n_best above beam (config)": ([*TRAIN, "decode.n_best=4"], "decode.n_best"),
    "config section scalar": (["train", "{space}/scalar.yaml"], "section 'model' must be a mapping"),
    "config a list": (["train", "{space}/list.yaml"], "expected a mapping"),
    "config key twice": (["train", "{space}/twice.yaml"], "twice.yaml: line 3: invalid YAML ('lr' is given twice)"),
    "config not UTF-8": (["train", "{space}/latin1.yaml"], "latin1.yaml: line 2: not UTF-8"),
    "config bad YAML": (["train", "{space}/bad.yaml"], "invalid YAML"),
    "config unknown section": (["train", "{space}/unknown.yaml"], "did you mean 'model'"),
    "config missing": (["train", "{space}/nope.yaml"], "config file not found"),
    "config is a directory": (["train", "{space}"], "is a directory, not a config file"),
    "preset misspelt": (["train", "numbers-de-fr"], "no preset of that name"),
    "quickstart no budget": (["quickstart", "--minutes", "0", "--out", "{space}/new-qs"], "--minutes: must be a number above 0"),
    "quickstart infinite budget": (["quickstart", "--minutes", "inf", "--out", "{space}/new-qs"],
                                   "--minutes: must be a number above 0, got inf"),
    "quickstart minutes nan": (["quickstart", "--minutes", "nan", "--out", "{space}/new-qs"], "--minutes"),
    "quickstart bad override": (["quickstart", "model.n_heads=0", "--out", "{space}/new-qs"], "model.n_heads"),
    # a flag that would be silently ignored, or silently beat an override
    "quickstart dataset override": (["quickstart", "data.dataset=multi30k", "--out", "{space}/new-qs"],
                                    "data.dataset=: the quickstart's dataset is chosen by --dataset"),
    "quickstart minutes twice": (["quickstart", "--minutes", "1", "train.max_minutes=0.5", "--out", "{space}/new-qs"],
                                 "--minutes and train.max_minutes= are both given"),
    "train data-dir for numbers": ([*TRAIN, "--data-dir", "{space}", "--out", "{space}/new-dd"],
                                   "--data-dir: only Multi30k is read from a folder"),
    "train data-dir twice": ([*TRAIN, "data.data_dir={space}", "--data-dir", "{space}", "--out", "{space}/new-dd"],
                             "--data-dir and data.data_dir= are both given"),
    "evaluate data-dir for numbers": (["evaluate", M, "--split", "val", "--data-dir", "{space}"],
                                      "--data-dir: only Multi30k"),
    "coverage with greedy": (["translate", M, "--beam", "1", "--coverage-penalty", "0.2"],
                             "--coverage-penalty: applies to beam search with --beam 2 or more (--beam is 1: greedy search)"),
    "coverage and top-k with greedy": (["translate", M, "--beam", "1", "--coverage-penalty", "0.2", "--top-k", "5"],
                                       "--coverage-penalty: applies to beam search with --beam 2 or more (--beam is 1: greedy search)"),
    "attention no-links encoder": (["attention", M, "eins", "--kind", "encoder-self", "--no-links", "-o",
                                    "{space}/a.png"], "--no-links: only cross-attention"),
    "attention reference compile": (["attention", M, "eins", "--reference", "one", "--compile", "-o",
                                     "{space}/a.png"], "--compile: not used with --reference"),
    # input files and streams
    "stdin invalid UTF-8": (["translate", M], "stdin: line 2: invalid UTF-8", b"eins\nvier\xffzig\n"),
    "input invalid UTF-8": (["translate", M, "-i", "{space}/bad-utf8.txt"], "bad-utf8.txt: line 2: invalid UTF-8"),
    "stdin NUL": (["translate", M], "stdin: line 2: holds a NUL byte: binary data, or UTF-16 text", b"eins\nvier\x00\n"),
    "stdin UTF-16": (["translate", M], "stdin: line 1: holds a NUL byte", "eins\nvier\n".encode("utf-16-le")),
    "input missing": (["translate", M, "-i", "{space}/nope.txt"], "nope.txt: no such file"),
    "input a directory": (["translate", M, "-i", "{space}"], "is a directory"),
    "input CR-only": (["translate", M, "-i", "{space}/cr-only.de"], "carriage return alone"),
    "output a directory": (["translate", M, "-i", "{space}/good.txt", "-o", "{space}"], "is a directory"),
    # refused before any work, not after it
    "evaluate output a directory": (["evaluate", M, "--split", "val", "-o", "{space}"], "{space} is a directory"),
    "diagnose output a directory": (["diagnose", M, "--src", "{space}/good.txt", "-o", "{space}"], "is a directory"),
    "aer both stdin": (["aer", "--gold", "-", "--hyp", "-"], "--gold and --hyp: both read stdin (-); give one of them "
                       "as a file"),  # (the second read nothing: "line counts differ: - has 20 lines, - has 0")
    "diagnose both stdin": (["diagnose", M, "--src", "-", "--hyp", "-"], "--src and --hyp: both read stdin (-)"),
    "translate prefix and input stdin": (["translate", M, "--prefix", "-"], "--input/-i and --prefix: both read "
                                         "stdin (-)"),
    "importance output a directory": (["heads", "importance", M, "-o", "{space}"], "{space} is a directory"),
    "attention output a directory": (["attention", M, "eins", "-o", "{space}"], "{space} is a directory"),
    "output a directory not there yet": (["translate", M, "-i", "{space}/good.txt", "-o", "{space}/out/"],
                                         "{space}/out/ names a directory (it ends in /)"),  # (a file named out)
    # an output that is an input would replace it with what was made from it (exit 0 before)
    "output is the input": (["translate", M, "-i", "{space}/good.txt", "-o", "{space}/good.txt"],
                            "--output/-o {space}/good.txt: is the input --input/-i too"),
    "evaluate output is the source": (["evaluate", M, "--src", "{space}/good.txt", "--ref", "{space}/good.txt", "-o",
                                       "{space}/good.txt"], "is the input --src too"),
    "align output is the pairs": (["align", M, "--pairs", "{space}/aer-pairs.txt", "-o", "{space}/aer-pairs.txt"],
                                  "is the input --pairs too"),
    "importance table is the reference": (["heads", "importance", M, "--src", "{space}/good.txt", "--ref",
                                           "{space}/ref.txt", "-o", "{space}/ref.txt"], "is the input --ref too"),
    "translate output is the prefix": (["translate", M, "-i", "{space}/good.txt", "--prefix", "{space}/src.txt", "-o",
                                        "{space}/src.txt"], "is the input --prefix too"),
    "aer gold without sure links": (["aer", "--gold", "{space}/aer-gold-possible.talp", "--hyp",
                                     "{space}/aer-hyp-none.align"], "no links in the hypothesis: nothing to score"),
    "attention sentence not unicode": (["attention", M, "eins \udcff", "-o", "{space}/x.html"],
                                       "error: SENTENCE: not valid Unicode"),  # (it said texts[0])
    "attention sentence not unicode with a reference": (["attention", M, "eins \udcff", "--reference", "one", "-o",
                                                         "{space}/x.html"], "error: SENTENCE: not valid Unicode"),
    "attention reference not unicode": (["attention", M, "eins", "--reference", "one \udcff", "-o", "{space}/x.html"],
                                        "error: --reference: not valid Unicode"),  # (it said targets[0])
    "prefix count differs": (["translate", M, "-i", "{space}/good.txt", "--prefix", "{space}/ref.txt"], "line counts differ"),
    "evaluate counts differ": (["evaluate", M, "--src", "{space}/src.txt", "--ref", "{space}/ref.txt"], "line counts differ"),
    "evaluate empty files": (["evaluate", M, "--src", "{space}/nothing.txt", "--ref", "{space}/nothing.txt"],
                             "nothing.txt: no lines to translate and score"),
    "evaluate src alone": (["evaluate", M, "--src", "{space}/src.txt"], "--src and --ref go together"),
    "evaluate split with src": (["evaluate", M, "--src", "{space}/src.txt", "--ref", "{space}/src.txt", "--split",
                                 "val"], "--split: not used with --src and --ref"),
    "importance split with src": (["heads", "importance", M, "--src", "{space}/src.txt", "--ref", "{space}/src.txt",
                                   "--split", "test"], "--split: not used with --src and --ref"),
    "evaluate split unknown": (["evaluate", M, "--split", "dev"], "unknown numbers split 'dev'"),
    "corpus CR-only": ([*TRAIN, "data.dataset=null", "data.train_src={space}/cr-only.de", "data.train_tgt={space}/cr-only.en",
                        "data.valid_src={space}/cr-only.de", "data.valid_tgt={space}/cr-only.en", "--out", "{space}/new-cr"],
                       "cr-only.de: lines end in a carriage return alone"),
    "corpus empty": ([*TRAIN, "data.dataset=null", "data.train_src={space}/empty.de", "data.train_tgt={space}/empty.en",
                      "data.valid_src={space}/a.de", "data.valid_tgt={space}/a.de", "--out", "{space}/new-empty"],
                     "empty.de + {space}/empty.en: the training set is empty"),
    "corpus counts differ": ([*TRAIN, "data.dataset=null", "data.train_src={space}/a.de", "data.train_tgt={space}/a.en",
                              "data.valid_src={space}/a.de", "data.valid_tgt={space}/a.de", "--out", "{space}/new-counts"],
                             "line counts differ: {space}/a.de has 2 lines, {space}/a.en has 1"),
    "corpus gzip truncated": ([*TRAIN, "data.dataset=null", "data.train_src={space}/corrupt.de.gz",
                               "data.train_tgt={space}/a.de", "data.valid_src={space}/a.de", "data.valid_tgt={space}/a.de",
                               "--out", "{space}/new-gz"], "corrupt.de.gz: cannot read"),
    "corpus gzip invalid": ([*TRAIN, "data.dataset=null", "data.train_src={space}/invalid.de.gz",
                             "data.train_tgt={space}/a.de", "data.valid_src={space}/a.de", "data.valid_tgt={space}/a.de",
                             "--out", "{space}/new-gz2"],
                            "invalid.de.gz: cannot read (corrupt gzip data: Error -3 while decompressing data: invalid "
                            "block type)"),  # (zlib's own error, a traceback)
    "translate input gzip invalid": (["translate", "{model}", "-i", "{space}/invalid.de.gz"],
                                     "invalid.de.gz: cannot read (corrupt gzip data"),
    "corpus src without tgt": ([*TRAIN, "data.dataset=null", "data.train_src={space}/a.de"], "data.train_src"),
    # word alignments
    "aer gold malformed": (["aer", "--gold", "{space}/aer-gold-bad.talp", "--hyp", "{space}/aer-hyp.align"],
                           "aer-gold-bad.talp: line 2: '2x2' is not a link (expected i-j for sure or ipj for possible)"),
    "aer gold index 0, one-indexed": (["aer", "--gold", "{space}/aer-gold-zero.talp", "--hyp", "{space}/aer-hyp.align",
                                       "--gold-one-indexed"],
                                      "aer-gold-zero.talp: line 1: link '0-2': index 0 is not a word (1 is the first word)"),
    "aer gold beyond its sentence": (["aer", "--gold", "{space}/aer-gold-far.talp", "--hyp", "{space}/aer-hyp.align",
                                      "--gold-one-indexed", "--pairs", "{space}/aer-pairs.txt"],
                                     "aer-gold-far.talp: line 2: link '3-2': index 3 is beyond the 2 words of the first side"),
    "aer gold beyond its sentence, reversed": (["aer", "--gold", "{space}/aer-gold-far.talp", "--hyp",
                                                "{space}/aer-hyp.align", "--gold-one-indexed", "--reverse", "--pairs",
                                                "{space}/aer-pairs.txt"],
                                               "(with --reverse, the gold's first side is the target side of the sentences)"),
    "aer hyp beyond its sentence": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp", "{space}/aer-hyp-far.align",
                                     "--gold-one-indexed", "--pairs", "{space}/aer-pairs.txt"],
                                    "aer-hyp-far.align: line 1: link '1-3': index 3 is beyond the 3 words of the second side"),
    "aer hyp beyond its sentence (src, tgt)": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp",
                                                "{space}/aer-hyp-far.align", "--gold-one-indexed", "--src",
                                                "{space}/aer-src.txt", "--tgt", "{space}/aer-tgt.txt"],
                                               "aer-hyp-far.align: line 1: link '1-3': index 3 is beyond"),
    "aer hyp possible link": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp", "{space}/aer-hyp-possible.align"],
                              "aer-hyp-possible.align: line 1: a hypothesis has links i-j only"),
    "aer counts differ": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp", "{space}/aer-hyp-short.align"],
                          "line counts differ: {space}/aer-gold.talp has 2 lines, {space}/aer-hyp-short.align has 1"),
    "aer pairs count differs": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp", "{space}/aer-hyp.align", "--pairs",
                                 "{space}/aer-pairs-short.txt"],
                                "line counts differ: {space}/aer-hyp.align has 2 lines, {space}/aer-pairs-short.txt has 1"),
    "aer src count differs": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp", "{space}/aer-hyp.align", "--src",
                               "{space}/aer-src.txt", "--tgt", "{space}/ref.txt"],
                              "line counts differ: {space}/aer-src.txt has 2 lines, {space}/ref.txt has 1"),
    "aer pairs malformed": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp", "{space}/aer-hyp.align", "--pairs",
                             "{space}/aer-pairs-bad.txt"],
                            "aer-pairs-bad.txt: line 2: expected 'source ||| target', found 0 '|||' separators"),
    "aer src without tgt": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp", "{space}/aer-hyp.align", "--src",
                             "{space}/aer-src.txt"], "--src and --tgt go together"),
    "aer pairs and src": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp", "{space}/aer-hyp.align", "--pairs",
                           "{space}/aer-pairs.txt", "--src", "{space}/aer-src.txt", "--tgt", "{space}/aer-tgt.txt"],
                          "give --pairs or --src and --tgt, not both"),
    "align backward of the same direction": (["align", M, "--pairs", "{space}/aer-pairs.txt", "--backward", M, "--sym",
                                              "union"], "translates de->en, but the reverse of"),
    "aer gold missing": (["aer", "--gold", "{space}/nope.talp", "--hyp", "{space}/aer-hyp.align"],
                         "nope.talp: no such file"),
    "aer hyp a directory": (["aer", "--gold", "{space}/aer-gold.talp", "--hyp", "{space}"], "is a directory"),
    "aer hyp not given": (["aer", "--gold", "{space}/aer-gold.talp"], "the following arguments are required: --hyp"),
    "aer gold empty path": (["aer", "--gold", "", "--hyp", "{space}/aer-hyp.align"], "argument --gold: an empty path"),
    # files xattn reads besides the config: checked by the same typed rules, tied to the weights they describe
    "analysis choice without heads": (["align", "{damaged:no-heads}", "--pairs", "{space}/aer-pairs.txt"],
                                      "analysis.yaml: alignment.heads: expected 'mean' or distinct head numbers, got []"),
    "analysis choice of a fractional layer": (["diagnose", "{damaged:layer-1.5}", "--src", "{space}/good.txt"],
                                              "analysis.yaml: alignment.layer: expected int, got 1.5"),
    "analysis section misspelt": (["align", "{damaged:misspelt-section}", "--pairs", "{space}/aer-pairs.txt"],
                                  "analysis.yaml: unknown section 'alignmnet' (did you mean 'alignment'?)"),
    "importance row twice": (["prune", M, "--fraction", "0.5", "--importance", "{space}/importance-twice.tsv", "--out",
                              "{space}/new-prune"],
                             "importance-twice.tsv: line 5: cross layer 0 head 1 is given twice (first on line 4)"),
    "importance of other weights": (["prune", M, "--fraction", "0.5", "--importance", "{space}/importance-other.tsv",
                                     "--out", "{space}/new-prune"],
                                    "importance-other.tsv: measured on other weights than this model's"),
    "head mask factor above 1": (["translate", M, "--head-mask", "{space}/mask-above-1.yaml"],
                                 "mask-above-1.yaml: cross[0][1]: must be in [0, 1], got 2"),
    "diagnose threshold infinite": (["diagnose", M, "--src", "{space}/good.txt", "--detached", "inf"],
                                    "--detached: must be a finite number in [0, 1), got inf"),
    "diagnose detached share of 1": (["diagnose", M, "--src", "{space}/good.txt", "--detached", "1"],
                                     "--detached: must be in [0, 1), got 1.0"),  # (a share above it: none, silently)
    "diagnose under above over": (["diagnose", M, "--src", "{space}/good.txt", "--under", "5", "--over", "4"],
                                  "--under: 5 is not below the over threshold (4)"),
    # output directories
    "train out is a file": ([*TRAIN, "--out", "{space}/file-not-dir"], "exists and is not a directory"),
    "train out holds a model": ([*TRAIN, "--out", "{damaged:no-state}"], "holds a model but no training state"),
    "train out other model": ([*TRAIN, "model.d_ff=64", "--out", M], "model.d_ff: 32 -> 64"),
    "train out other data": ([*TRAIN, "data.numbers_size=400", "--out", M], "data.numbers_size: 300 -> 400"),
    "train out other seed": ([*TRAIN, "train.seed=7", "--out", M], "train.seed: 1 -> 7"),
    "train out other tokenizer": ([*TRAIN, "--out", "{damaged:tokenizer}"], "spm.model"),
    "train out damaged checkpoint": ([*TRAIN, "--out", "{damaged:manifest}"], "does not match its checksum"),
    "train out manifest key twice": ([*TRAIN, "--out", "{damaged:manifest-twice}"],
                                     "manifest.json: invalid JSON ('step' is given twice in one object)"),
    "export out is a file": (["export", M, "{space}/file-not-dir"], "file-not-dir: a file of that name exists; name "
                             "a new directory"),
    "export out cannot be made": (["export", M, "/proc/xattn-out"], "/proc/xattn-out: No such file or directory"),
    "import out is a file": (["import", M, "{space}/file-not-dir"], "{space}/file-not-dir"),
    "import not a Marian dir": (["import", M, "{space}/new-import"], "config.json"),
    "export no model": (["export", "{space}/nope", "{space}/new-export"], "not a model directory"),
    # model directories
    "model missing": (["translate", "{space}/nope"], "not a model directory"),
    "model is a file": (["translate", "{space}/file-not-dir"], "is a file, not a model directory"),
    "model NaN weights": (["translate", "{damaged:nan}"], "decoder.layers.0.cross_attn.q_proj.weight holds NaN"),
    "model n_heads edited": (["translate", "{damaged:heads}"], "model.n_heads is 4, but model.safetensors was saved with 2"),
    "model d_model edited": (["translate", "{damaged:dmodel}"], "model.d_model is 32"),
    "model bad config value": (["translate", "{damaged:dropout}"], "config.yaml: model.dropout"),
    "model unknown config key": (["translate", "{damaged:beam-sise}"],
                                 "config.yaml: unknown config key decode.beam_sise (did you mean 'beam_size'?)"),
    "model other tokenizer": (["translate", "{damaged:tokenizer}"], "spm.model: is not the tokenizer"),
    "model truncated weights": (["translate", "{damaged:truncated}"], "model.safetensors: cannot read weights"),
    "model truncated tokenizer": (["translate", "{damaged:spm}"], "spm.model: not a SentencePiece model"),
    "model config not UTF-8": (["translate", "{damaged:latin1}"], "not UTF-8"),
    "model without weights": (["translate", "{damaged:no-weights}"], "no model.safetensors"),
    "model without config": (["translate", "{damaged:no-config}"], "no config.yaml"),
}

DAMAGE = {"nan": poison_weights, "heads": edit_model_config("n_heads", 4), "dmodel": edit_model_config("d_model", 32),
          "dropout": edit_model_config("dropout", 2), "beam-sise": edit_model_config("beam_sise", 3, "decode"),
          "tokenizer": other_tokenizer,
          "truncated": truncate("model.safetensors"), "spm": truncate("spm.model"), "manifest": bad_manifest,
          "manifest-twice": manifest_key_twice,
          "latin1": lambda d: (d / "config.yaml").write_bytes((d / "config.yaml").read_bytes() + "# ä\n".encode("latin-1")),
          "no-heads": analysis("alignment: {layer: 0, heads: [], method: naive}\n"),
          "layer-1.5": analysis("alignment: {layer: 1.5, heads: mean, method: naive}\n"),
          "misspelt-section": analysis("alignmnet: {layer: 0, heads: mean, method: naive}\n"),
          "no-cross-heads": pruned("cross: [[0, 0]]\n"),
          "no-heads-at-all": pruned("enc_self: [[0, 0]]\ndec_self: [[0, 0]]\ncross: [[0, 0]]\n"),
          "no-weights": remove("model.safetensors"), "no-config": remove("config.yaml"), "no-state": remove("train_state")}


def expand(text: str, space: Path) -> str:
    if text.startswith("{damaged:"):
        name = text[len("{damaged:"):-1]
        return damaged(space, name, DAMAGE[name])
    return text.replace(M, str(space / "model")).replace("{space}", str(space))


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def run_main(argv: list[str], stdin: bytes, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_and_changes_nothing(name, space, monkeypatch, capsys):
    args, message, *stdin = CASES[name]
    argv = [expand(a, space) for a in args]
    message = expand(message, space)
    before = snapshot(space)
    code, _, err = run_main(argv, stdin[0] if stdin else b"eins\n", monkeypatch, capsys)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.endswith("\n") and "Traceback" not in err, err
    assert message in err, err
    after = snapshot(space)
    assert {k: v for k, v in after.items() if k in before} == before, "a file that was there changed"
    assert not [k for k in set(after) - set(before) if k.startswith("model")], "new files in a model directory"


@pytest.mark.parametrize("args, stdin, message", [
    (["translate", M], b"vier\xffzig\n", "stdin: line 1: invalid UTF-8"),
    (["translate", "{damaged:nan}"], b"eins\n", "holds NaN"),
    ([*TRAIN, "model.n_heads=0"], b"", "model.n_heads"),
])
def test_the_installed_entry_point_behaves_the_same(args, stdin, message, space):
    argv = [expand(a, space) for a in args]
    result = subprocess.run([sys.executable, "-m", "xattn", *argv], input=stdin, capture_output=True, timeout=120,
                            env=os.environ | {"OMP_NUM_THREADS": "1"})
    err = result.stderr.decode()
    assert result.returncode == 2 and len(err.splitlines()) == 1 and message in err, err


def test_an_output_that_is_the_input_read_from_stdin_is_refused(space, tmp_path):
    """`translate -o corpus.de < corpus.de` replaced the corpus with its translation, exit 0; stdin is an input
    only where the verb reads it (here: no -i)."""
    corpus, other = tmp_path / "corpus.de", tmp_path / "other.de"
    corpus.write_text("eins\n")
    other.write_text("zwei\n")
    for args, code in ((["-o", str(corpus)], 2), (["-i", "-", "-o", str(corpus)], 2),
                       (["-i", str(other), "-o", str(corpus)], 0)):  # stdin is the output, but is not read
        with corpus.open("rb") as stdin:
            result = subprocess.run([sys.executable, "-m", "xattn", "translate", str(space / "model"), *args],
                                    stdin=stdin, capture_output=True, timeout=120,
                                    env=os.environ | {"OMP_NUM_THREADS": "1"})
        err = result.stderr.decode()
        assert result.returncode == code, err
        if code == 2:
            assert err == f"xattn translate: error: --output/-o {corpus}: is the input --input/-i (read from stdin) " \
                "too; the output would replace what it is made from: write it elsewhere\n"
            assert corpus.read_text() == "eins\n"


def test_lines_split_at_newline_only(space, monkeypatch, capsys):
    lines = ["eins\x0czwei", "drei\u2028vier", "fünf\x85", "", "sechs\x1c\x1d\x1eneun\x0b", "sieben", "acht"]
    data = ("\n".join(lines[:-2]) + "\nsieben\r\nacht").encode()  # CRLF on one line, no final newline
    (space / "ff.txt").write_bytes(data)
    from xattn.lines import read_lines
    assert read_lines(space / "ff.txt") == lines
    code, out, _ = run_main(["translate", str(space / "model"), "--scores"], data, monkeypatch, capsys)
    assert code == 0 and out.count("\n") == len(lines) and len(out.split("\n")) == len(lines) + 1
    assert main(["translate", str(space / "model"), "-i", str(space / "ff.txt"), "-o", str(space / "ff.out")]) == 0
    assert (space / "ff.out").read_text().count("\n") == len(lines)


def test_python_api_refuses_text_that_is_not_a_list_of_valid_strings(space):
    import xattn
    translator = xattn.load(space / "model", device="cpu")
    for texts, message in ((["ein\ud800s"], r"texts\[0\]: not valid Unicode"), (["eins", None], r"texts\[1\]: expected a string"),
                           ("eins", "got one string")):
        with pytest.raises(xattn.XattnError, match=message):
            translator.translate(texts)


def test_damaged_model_directories_stay_loadable_after_a_resume(space):
    """A resume rewrites config.yaml (new budgets) and keeps model.safetensors loadable with it."""
    out = space / "resumed"
    shutil.copytree(space / "model", out)
    assert main([*[expand(a, space) for a in TRAIN[:-1]], "train.max_steps=6", "--quiet", "--out", str(out)]) == 0
    import xattn
    assert xattn.load(out, device="cpu").config.train.max_steps == 6
    assert torch.isfinite(torch.tensor(xattn.load(out, device="cpu").translate(["eins"])[0].score))


def test_a_sequence_beyond_learned_positions_is_an_error_and_decoding_stays_within():
    import xattn
    from tests.conftest import tiny_config
    model = xattn.Transformer(tiny_config(positions="learned", max_positions=8)).eval()
    with pytest.raises(xattn.XattnError, match="longer than model.max_positions=8"):
        model.encode(torch.randint(3, 40, (1, 9)))
    from xattn.decoding import search
    hyps = search(model, torch.randint(3, 40, (2, 7)), xattn.DecodeConfig(beam_size=2, max_len_a=3, min_len=7))
    assert all(len(h.tokens) <= 7 for hyps_ in hyps for h in hyps_)
    for beam in (1, 2):  # a min_len the positions cannot hold was cut to them silently, the translation ending short
        with pytest.raises(xattn.XattnError, match=r"min_len: 8 is above the 7 output tokens the model's 8 learned"):
            search(model, torch.randint(3, 40, (2, 7)), xattn.DecodeConfig(beam_size=beam, max_len_a=3, min_len=8))


def test_python_api_device_errors_are_xattn_errors(space):
    import xattn
    for device, message in (("tpu", "'tpu' is not a device"), ("cuda:7", "device=cuda:7")):
        with pytest.raises(xattn.XattnError, match=message):
            xattn.load(space / "model", device=device)


def test_cpu_0_is_the_cpu_as_torch_names_it(space, monkeypatch, capsys):
    """`--device cpu:0` (torch's own name for the CPU) was refused as not a device; it is the CPU, for the CLI, the
    library and a config's train.device."""
    import torch

    from xattn.checks import validate
    from xattn.config import TrainConfig
    from xattn.devices import resolve_device
    from xattn.errors import XattnError
    code, out, err = run_main(["translate", str(space / "model"), "--device", "cpu:0"], b"eins\n", monkeypatch, capsys)
    assert code == 0 and out.strip(), err
    assert resolve_device("cpu:0") == torch.device("cpu")
    validate(TrainConfig(device="cpu:0"), "train")
    for wrong in ("cpu:1", "cpu0", "mps:1"):
        with pytest.raises(XattnError, match=f"'{wrong}' is not a device"):
            resolve_device(wrong)


def test_int8_without_a_device_runs_on_the_cpu_where_a_gpu_is(space, monkeypatch, capsys):
    """int8 decodes on the CPU only: with a GPU present, `--quantize int8` without --device picked the GPU and was
    refused as `device: ...`, a flag not given."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    code, out, err = run_main(["translate", str(space / "model"), "--quantize", "int8"], b"eins\n", monkeypatch, capsys)
    assert code == 0 and out.strip(), err


def test_overrides_may_follow_options(space, capsys):
    out = space / "after-options"
    argv = ["train", "numbers-de-en", "--quiet", "--out", str(out), *NUMBERS_TINY, "train.max_steps=1",
            "data.numbers_size=200"]
    assert main(argv) == 0, capsys.readouterr().err
    import xattn
    config = xattn.load(out, device="cpu").config
    assert (config.train.max_steps, config.data.numbers_size, config.model.d_model) == (1, 200, 16)


def test_help_with_stdout_closed_is_quiet_as_before(space):
    result = subprocess.run([sys.executable, "-m", "xattn", "translate", "--help"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, timeout=120, preexec_fn=lambda: os.close(1))
    assert result.returncode == 0 and "Traceback" not in result.stderr.decode(), result.stderr.decode()


@pytest.mark.parametrize("stream, message", [(0, "stdin is closed; give the input as a file"),
                                             (1, "stdout is closed; write the output to a file"),
                                             ("full", "writing the output: No space left on device")])
def test_a_closed_or_full_standard_stream_is_one_line_and_exit_2(stream, message, space):
    """`<&-`, `>&-` and `> /dev/full` (an AttributeError, silence from print(), or an OSError before)."""
    argv = [sys.executable, "-m", "xattn", "translate", str(space / "model"), "-i", str(space / "src.txt")]
    if stream == 0:
        argv = argv[:-2]  # from stdin
    with open("/dev/full", "w") as full:
        result = subprocess.run(argv, stdout=full if stream == "full" else subprocess.DEVNULL, stderr=subprocess.PIPE,
                                timeout=120, env=os.environ | {"OMP_NUM_THREADS": "1"},
                                preexec_fn=(lambda: os.close(stream)) if stream in (0, 1) else None)
    err = result.stderr.decode()
    assert result.returncode == 2 and len(err.splitlines()) == 1 and message in err, err


def test_python_api_names_its_own_parameters(space):
    import xattn
    from xattn.analysis import teacher_forced

    translator = xattn.load(space / "model")
    for call, message in ((lambda: translator.translate(["eins"], {"beam_size": 2}), "cfg: a DecodeConfig, got dict"),
                          (lambda: translator.translate(["eins"], prefixes=[None]), r"prefixes\[0\]: expected a string"),
                          (lambda: translator.translate(["eins"], prefixes=["ein\0s"]), r"prefixes\[0\]: holds a NUL"),
                          (lambda: translator.translate({"eins": 1}), "texts: a list of strings, got dict"),
                          (lambda: translator.translate(None), "texts: a list of strings, got NoneType"),
                          (lambda: translator.translate(t for t in ["eins"]), "texts: a list of strings, got generator"),
                          (lambda: teacher_forced(translator, "eins", "ones"), "sources: a list of source sentences"),
                          (lambda: teacher_forced(translator, ["eins"], [None]), r"targets\[0\]: expected a string"),
                          (lambda: translator.translate(["eins"], return_attention=True, attention_heads=(0, ())),
                           "attention_heads: no heads given"),
                          (lambda: translator.translate(["eins"], xattn.DecodeConfig(min_len=40, max_len_b=20)),
                           "min_len: 40 is above the"),
                          (lambda: translator.translate(["eins"], prefixes="one"),
                           "prefixes: a list of one prefix per text"),
                          (lambda: translator.translate(["eins"], prefixes=["one", "two"]),
                           "prefixes: 2 prefixes for 1 texts"),
                          (lambda: translator.translate(["eins"], attention_heads=(0, None)),
                           "attention_heads: applies with return_attention=True"),
                          (lambda: translator.translate(["eins"], return_attention=True, attention_heads=(1.5, None)),
                           r"attention_heads: \(layer, heads\): a layer number and a tuple"),
                          (lambda: translator.translate(["eins"], return_attention=True, attention_heads=1),
                           r"attention_heads: \(layer, heads or None\), got 1"),
                          (lambda: translator.translate(["eins"], return_attention=True, attention_heads=(0, (1, 1))),
                           "attention_heads: head 1 of layer 0 is given twice"),  # (accepted: its mean counted it twice)
                          (lambda: translator.translate(["eins"], attention_from="rescore"),
                           "attention_from: applies with return_attention=True"),  # (silently unused)
                          # any true value returned attention; an int generator was torch's TypeError in the
                          # search; one given to a search that draws nothing was silently unused
                          (lambda: translator.translate(["eins"], return_attention="no"),
                           "return_attention: True or False, got 'no'"),
                          (lambda: translator.translate(["eins"], return_self_attention=[0]),
                           r"return_self_attention: True or False, got \[0\]"),
                          (lambda: translator.translate(["eins"], xattn.DecodeConfig(sampling=True), generator=5),
                           "generator: a torch.Generator, got int"),
                          (lambda: translator.translate(["eins"], xattn.DecodeConfig(beam_size=2),
                                                        generator=__import__("torch").Generator()),
                           r"generator: applies to sampling \(cfg.sampling\): this search draws nothing"),
                          (lambda: xattn.load(space / "model", quantize="int4"), "quantize: int8 or None, got 'int4'"),
                          # a setting the search would ignore (the model's own settings are not the caller's)
                          (lambda: translator.translate(["eins"], xattn.DecodeConfig(beam_size=1, temperature=0.1)),
                           "decode.temperature: applies to sampling only"),
                          (lambda: translator.translate(["eins"], xattn.DecodeConfig(sampling=True, n_best=3)),
                           "decode.n_best: applies to beam search, not to sampling"),
                          (lambda: translator.translate(["eins"], xattn.DecodeConfig(beam_size=1, coverage_penalty=2.0)),
                           "decode.coverage_penalty: applies to beam search with decode.beam_size 2 or more")):
        with pytest.raises(xattn.XattnError, match=message):
            call()
    import torch

    for factors, message in ((torch.tensor([1.0, float("nan")]), r"head_mask: cross layer 0: factors must be finite"),
                             (torch.tensor([1.0, 5.0]), r"head_mask: cross layer 0: factors must be in \[0, 1\]"),
                             ([1.0, 0.0], "head_mask: cross layer 0: expected a 1-D float tensor of factors, got list")):
        with pytest.raises(xattn.XattnError, match=message):
            translator.head_mask = {"cross": [factors]}
    assert translator.head_mask is None


def test_a_greedy_length_penalty_is_taken_where_the_scores_are_printed(space, monkeypatch, capsys):
    """The other side of the cases "length penalty, greedy ...": where translate prints scores, the penalty changes
    what it prints, so it is taken."""
    plain = run_main(["translate", str(space / "model"), "--beam", "1", "--scores"], b"eins\n", monkeypatch, capsys)
    scaled = run_main(["translate", str(space / "model"), "--beam", "1", "--scores", "--length-penalty", "2"], b"eins\n",
                      monkeypatch, capsys)
    assert plain[0] == scaled[0] == 0 and plain[1].split(" ||| ")[0] == scaled[1].split(" ||| ")[0]
    assert plain[1].split(" ||| ")[1] != scaled[1].split(" ||| ")[1]


def test_a_model_that_samples_by_default_can_be_searched_with_no_sample(space, monkeypatch, capsys):
    sampling = space / "sampling-model"
    if not sampling.exists():
        shutil.copytree(space / "model", sampling)
        config = (sampling / "config.yaml").read_text()
        (sampling / "config.yaml").write_text(config.replace("  sampling: false\n", "  sampling: true\n"))
    code, _, err = run_main(["translate", str(sampling), "--beam", "2"], b"eins\n", monkeypatch, capsys)
    assert code == 2 and "--beam: applies to beam search, not to sampling" in err
    assert "this model's decode settings sample: --no-sample searches" in err
    searched = run_main(["translate", str(sampling), "--no-sample", "--beam", "2"], b"eins\n", monkeypatch, capsys)
    plain = run_main(["translate", str(space / "model"), "--beam", "2"], b"eins\n", monkeypatch, capsys)
    assert searched[0] == 0 and searched[1] == plain[1]
    code, _, err = run_main(["attention", str(sampling), "eins", "--reference", "one", "--no-sample", "-o",
                             str(space / "a.png")], b"", monkeypatch, capsys)
    assert code == 2 and "--no-sample: not used with --reference" in err


def test_a_model_s_own_decode_setting_is_named_by_its_config_not_by_a_flag_not_given(space, monkeypatch, capsys):
    """A model whose config.yaml sets min_len too high for a sentence: the error named --min-len, which was never
    given; it names the config key now, and the flag only when the flag gave the value."""
    model = space / "min-len-model"
    if not model.exists():
        shutil.copytree(space / "model", model)
        config = (model / "config.yaml").read_text()
        (model / "config.yaml").write_text(config.replace("  min_len: 0\n", "  min_len: 500\n"))
    code, _, err = run_main(["translate", str(model)], b"eins\n", monkeypatch, capsys)
    assert code == 2 and err.startswith(f"xattn translate: error: stdin: line 1: {model}/config.yaml: decode.min_len: "
                                        "500 is above"), err
    code, _, err = run_main(["translate", str(model), "--min-len", "400"], b"eins\n", monkeypatch, capsys)
    assert code == 2 and err.startswith("xattn translate: error: stdin: line 1: --min-len: 400 is above"), err
    zero = space / "no-length-model"  # a flag that makes the model's own setting wrong: both named (the key bare before)
    if not zero.exists():
        shutil.copytree(space / "model", zero)
        config = (zero / "config.yaml").read_text()
        (zero / "config.yaml").write_text(config.replace("  max_len_b: 10\n", "  max_len_b: 0\n"))
    code, _, err = run_main(["translate", str(zero), "--max-len-a", "0"], b"eins\n", monkeypatch, capsys)
    assert code == 2 and err == (f"xattn translate: error: {zero}/config.yaml: decode.max_len_b: --max-len-a and "
                                 "decode.max_len_b are both 0: nothing could be generated\n"), err


def test_a_line_whose_length_a_setting_cannot_meet_is_named_by_file_and_line(space, monkeypatch, capsys):
    """--min-len above what the maximum output length allows the shortest lines: the error said "a sentence of 3
    source tokens" but not which line, in every verb that translates lines, and in the library which text."""
    src = space / "lengths.de"
    src.write_text("dreihundert vier und zwanzig tausend\n\nvier\nsieben und achtzig\n")
    ref = space / "lengths.en"
    ref.write_text("324000\n\n4\n87\n")
    too_long = ["--min-len", "8", "--max-len-a", "1", "--max-len-b", "0"]  # allows a line its tokens: "vier" has 6
    for argv in (["translate", str(space / "model"), "-i", str(src)],
                 ["evaluate", str(space / "model"), "--src", str(src), "--ref", str(ref)],
                 ["diagnose", str(space / "model"), "--src", str(src)]):
        code, out, err = run_main([*argv, *too_long], b"", monkeypatch, capsys)
        assert code == 2 and out == "" and err == f"xattn {argv[0]}: error: {src}: line 3: --min-len: 8 is above the " \
            "6 output tokens the maximum output length allows a sentence of 6 source tokens (</s> included); lower " \
            "it or raise the maximum\n", err
    code, _, err = run_main(["translate", str(space / "model"), *too_long], src.read_bytes(), monkeypatch, capsys)
    assert code == 2 and err.startswith("xattn translate: error: stdin: line 3: --min-len: 8 is above"), err
    code, _, err = run_main(["attention", str(space / "model"), "vier", "-o", str(space / "a.png"), *too_long], b"",
                            monkeypatch, capsys)
    assert code == 2 and err.startswith("xattn attention: error: SENTENCE: --min-len: 8 is above"), err
    settings = xattn.DecodeConfig(min_len=8, max_len_a=1, max_len_b=0)
    with pytest.raises(ParameterError, match=r"^texts\[1\]: min_len: 8 is above the 6 output tokens") as e:
        xattn.load(space / "model").translate(["sieben und achtzig", "vier"], settings)
    assert (e.value.name, e.value.item) == ("min_len", ("texts", 1))
    with pytest.raises(ParameterError, match=r"^texts\[0\]: max_len_b: the maximum output length leaves"):
        xattn.load(space / "model").translate(["vier"], xattn.DecodeConfig(max_len_a=0.1, max_len_b=0))


def test_a_line_too_long_for_learned_positions_is_named_by_file_and_line(tmp_path, monkeypatch, capsys):
    model = tmp_path / "learned"
    assert main(["train", "numbers-de-en", "model.positions=learned", "model.max_positions=20", "data.max_len=19",
                 "train.max_steps=3", "--out", str(model), "--quiet"]) == 0
    (tmp_path / "in.de").write_text("drei\nvier\n" + " ".join(["siebenhundertzwölf"] * 15) + "\nfünf\n")
    code, out, err = run_main(["translate", str(model), "-i", str(tmp_path / "in.de")], b"", monkeypatch, capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{tmp_path / 'in.de'}: line 3: " in err and "do not fit the model's 20 positions (learned)" in err
    with pytest.raises(ItemError, match=r"texts\[1\]: .* do not fit the model's 20 positions"):
        xattn.load(model).translate(["drei", " ".join(["siebenhundertzwölf"] * 15)])
    code, _, err = run_main(["translate", str(model), "--min-len", "25", "--max-len-b", "100"], b"drei\n", monkeypatch,
                            capsys)
    assert code == 2 and err == ("xattn translate: error: --min-len: 25 is above the 19 output tokens the model's 20 "
                                 "learned positions hold (BOS and the tokens before </s>); lower it\n")
    (tmp_path / "in.en").write_text("three\nfour\nseven hundred\nfive\n")
    code, _, err = run_main(["align", str(model), "--src", str(tmp_path / "in.de"), "--tgt", str(tmp_path / "in.en")],
                            b"", monkeypatch, capsys)
    assert code == 2 and len(err.splitlines()) == 1 and ": line 3: its " in err and "on the source side" in err, err
    # a forced prefix too long (beam search raised an IndexError, greedy cut the prefix)
    (tmp_path / "prefix.en").write_text("three\n" + " ".join(["seven hundred"] * 15) + "\nfour\n")
    (tmp_path / "short.de").write_text("drei\nvier\nfünf\n")
    for beam in ("1", "3"):
        code, _, err = run_main(["translate", str(model), "-i", str(tmp_path / "short.de"), "--prefix",
                                 str(tmp_path / "prefix.en"), "--beam", beam], b"", monkeypatch, capsys)
        assert code == 2 and err.startswith(f"xattn translate: error: {tmp_path / 'prefix.en'}: line 2: ") and \
            "(and BOS) do not fit the model's 20 positions (learned)" in err, err
    # the heads verbs too (heads importance said "a sequence of 21 positions is longer than ...", naming no line)
    (tmp_path / "gold.talp").write_text("0-0\n0-0\n0-0\n0-0\n")
    for argv, where in ((["heads", "importance", str(model), "--src", str(tmp_path / "in.de"), "--ref",
                          str(tmp_path / "in.en"), "-o", "-"], f"{tmp_path / 'in.de'}: line 3: its "),
                        (["heads", "align", str(model), "--src", str(tmp_path / "in.de"), "--tgt", str(tmp_path / "in.en"),
                          "--gold", str(tmp_path / "gold.talp"), "--no-store"], ": line 3: its ")):
        code, _, err = run_main(argv, b"", monkeypatch, capsys)
        assert code == 2 and len(err.splitlines()) == 1 and where in err and "on the source side" in err, err


def test_training_into_a_folder_of_someone_elses_files_refuses_and_keeps_them(tmp_path, monkeypatch, capsys):
    """A new run writes config.yaml and log.jsonl: in a folder that holds them and no run, they are not the run's,
    and are kept; a file that only looks like a temporary one (`.draft.tmp`) is not removed as a leftover."""
    out = tmp_path / "exp"
    out.mkdir()
    mine = {"config.yaml": "# my notes\nmodel: {d_model: 16}\n", "log.jsonl": "{\"step\": 1}\n", ".draft.tmp": "x"}
    for name, text in mine.items():
        (out / name).write_text(text)
    code, _, err = run_main([*TRAIN, "--out", str(out)], b"", monkeypatch, capsys)
    assert code == 2 and f"{out}: holds config.yaml and log.jsonl but no training run to resume" in err
    assert {p.name: p.read_text() for p in out.iterdir()} == mine
    (out / "config.yaml").unlink()
    (out / "log.jsonl").unlink()
    code, _, err = run_main([*TRAIN, "--out", str(out)], b"", monkeypatch, capsys)
    assert code == 0, err
    assert (out / ".draft.tmp").read_text() == "x" and "half-written" not in err


def test_a_corpus_that_is_a_pipe_is_refused_not_waited_for(space, tmp_path, monkeypatch, capsys):
    """A corpus is read twice (counted, then encoded): a named pipe would hang at the second open."""
    fifo = tmp_path / "corpus.de"
    os.mkfifo(fifo)
    code, _, err = run_main([*TRAIN, "data.dataset=null", f"data.train_src={fifo}", f"data.train_tgt={space}/a.en",
                             f"data.valid_src={space}/good.txt", f"data.valid_tgt={space}/good.txt", "--out",
                             str(tmp_path / "out")], b"", monkeypatch, capsys)
    assert code == 2 and f"data.train_src: {fifo} is not a regular file; a corpus is read twice" in err, err


def test_a_validation_pair_too_long_for_learned_positions_is_named_before_training(space, tmp_path, monkeypatch,
                                                                                     capsys):
    """It would fail the first evaluation, after hours of training: named with its line before any step."""
    code, _, err = run_main([*TRAIN, "model.positions=learned", "model.max_positions=20", "data.max_len=19",
                             "--out", str(tmp_path / "out")], b"", monkeypatch, capsys)
    assert code == 2 and "numbers de-en val: line " in err and "do not fit model.max_positions=20" in err, err
    assert not (tmp_path / "out" / "train_state").exists()


def test_a_translator_keeps_a_copy_of_its_head_mask(space):
    """The mask was kept by reference: a tensor changed after the check (NaN, a factor of 5) was used unchecked."""
    import torch

    import xattn

    translator = xattn.load(space / "model")
    plain = translator.translate(["eins"], xattn.DecodeConfig(beam_size=1))[0]
    factors = torch.ones(translator.model.cfg.n_heads)
    translator.head_mask = {"cross": [factors] * translator.model.cfg.n_decoder_layers}
    factors.fill_(float("nan"))
    masked = translator.translate(["eins"], xattn.DecodeConfig(beam_size=1))[0]
    assert (masked.text, masked.score) == (plain.text, plain.score)


def test_loading_and_the_search_name_their_parameters(space):
    """xattn.load(None) and compile="yes" (a TypeError, and accepted as True), a search given a head mask of NaN
    (NaN scores, no error) or of the wrong size (a RuntimeError from inside torch)."""
    import torch

    import xattn
    from xattn.decoding import search
    from xattn.errors import ParameterError

    for call, message in ((lambda: xattn.load(None), "path: a model directory"),
                          (lambda: xattn.load(3), "path: a model directory"),
                          (lambda: xattn.load(space / "model", compile="yes"), "compile: True or False, got 'yes'")):
        with pytest.raises(ParameterError, match=message):
            call()
    model = xattn.load(space / "model", quantize="int8").model
    heads, layers = model.cfg.n_heads, model.cfg.n_decoder_layers
    src = torch.tensor([[5, 6, model.cfg.eos_id]])
    for mask, message in (({"cross": [torch.full((heads,), float("nan"))] * layers}, "factors must be finite"),
                          ({"cross": [torch.ones(heads + 1)] * layers}, "head_mask: ")):
        with pytest.raises(ParameterError, match=message):
            search(model, src, xattn.DecodeConfig(beam_size=2), head_mask=mask)


def test_a_translation_stream_names_its_parameters(space):
    """Duplicate tags (a KeyError at a later step), fewer tags than texts (an IndexError later), one string (read
    character by character), no texts (a ValueError) and a beam (a ValueError) were raw errors."""
    import xattn
    from xattn.errors import ParameterError

    translator = xattn.load(space / "model")
    for cfg, setting in ((xattn.DecodeConfig(beam_size=5), "beam_size must be 1 .5 here"),
                         (xattn.DecodeConfig(beam_size=1, min_len=2), "min_len must be 0 .2 here"),
                         (xattn.DecodeConfig(beam_size=1, sampling=True), "sampling must be False .True here")):
        with pytest.raises(ParameterError, match=f"cfg: a stream runs plain greedy search: {setting}"):
            translator.stream(cfg)
    with pytest.raises(ParameterError, match="cfg: a DecodeConfig, got dict"):
        translator.stream({"beam_size": 1})
    stream = translator.stream(xattn.DecodeConfig(beam_size=1))
    for texts, tags, message in ((["eins", "zwei"], ["x", "x"], "tags: a tag given twice"),
                                 (["eins", "zwei"], ["x"], "tags: 1 tags for 2 texts"),
                                 ("eins", ["x"], "texts: a list of sentences, got one string"),
                                 (["eins"], "x", "tags: a list of tags, one per text, got str"),
                                 (["eins"], [["x"]], r"tags\[0\]: a tag must be hashable")):
        with pytest.raises(ParameterError, match=message):
            stream.add(texts, tags)
    with pytest.raises(ParameterError, match=r"^texts\[1\]: max_len_b: the maximum output length leaves") as e:
        translator.stream(xattn.DecodeConfig(beam_size=1, max_len_a=0.1, max_len_b=0)).add(["", "eins"], ["p", "q"])
    assert e.value.item == ("texts", 1)  # as translate() names it (the stream's own check named no text)
    stream.add([], [])
    stream.add(["eins"], ["a"])
    with pytest.raises(ParameterError, match="one of a sentence still in the stream"):
        stream.add(["zwei"], ["a"])
    done = []
    while len(stream):
        done += stream.step()
    assert [tag for tag, _ in done] == ["a"]
    assert done[0][1].text == translator.translate(["eins"], xattn.DecodeConfig(beam_size=1))[0].text


def test_a_translator_s_head_mask_changes_only_by_setting_it(space):
    """The getter gave the checked copy itself: a factor of 5 written into it was used unchecked."""
    import torch

    import xattn

    translator = xattn.load(space / "model")
    translator.head_mask = {"cross": [torch.ones(translator.model.cfg.n_heads)] * translator.model.cfg.n_decoder_layers}
    translator.head_mask["cross"][0][0] = 5.0
    assert float(translator.head_mask["cross"][0][0]) == 1.0


def test_teacher_forced_names_the_pair_a_bad_character_is_in(space):
    """A NUL in sources[1] was named by its word, 'texts[3]', with the character counted in that word."""
    import xattn
    from xattn.analysis import teacher_forced

    translator = xattn.load(space / "model")
    with pytest.raises(xattn.XattnError, match=r"^sources\[1\]: holds a NUL character \(at character 6\)"):
        teacher_forced(translator, ["eins zwei", "ein b\0c"], ["one two", "one"])


def test_a_quickstart_into_a_folder_training_refuses_prints_no_heading_first(space, monkeypatch, capsys):
    """It printed "== training de->en on numbers into X (900 steps ...)" and then the error."""
    code, out, err = run_main(["quickstart", "--out", str(space / "file-not-dir")], b"", monkeypatch, capsys)
    assert code == 2 and out == "" and "file-not-dir: exists and is not a directory" in err, (out, err)


OLD_ARGPARSE = """
import argparse, sys
def old(self, message, file=None):  # Python 3.11.2's (Debian's): a closed stream raised
    if message:
        (file or sys.stderr).write(message)
argparse.ArgumentParser._print_message = old
from xattn.cli.main import main
sys.exit(main(["translate", "--help"]))
"""


def test_help_with_stdout_closed_is_quiet_with_an_older_argparse_too():
    """Under Debian's Python 3.11.2, whose argparse lets a closed stream's error through, `--help` with stdout closed
    was a traceback (the full suite there)."""
    result = subprocess.run([sys.executable, "-c", OLD_ARGPARSE], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            timeout=120, preexec_fn=lambda: os.close(1))
    assert result.returncode == 0 and not result.stderr, result.stderr.decode()


@pytest.mark.parametrize("argv, name", [(["translate", "{m}", "-i", "{t}", "-o", "{m}/config.yaml"], "config.yaml"),
                                        (["align", "{m}", "--src", "{t}", "--tgt", "{t}", "-o", "{m}/model.safetensors"],
                                         "model.safetensors"),
                                        (["translate", "{m}", "-i", "{t}", "-o", "{m}/spm.model"], "spm.model"),
                                        (["translate", "{m}", "-i", "{t}", "-o", "{m}/head_importance.tsv"],
                                         "head_importance.tsv")])  # (the table prune --fraction reads)
def test_an_output_onto_a_file_of_the_model_is_refused(numbers_model, tmp_path, capsys, argv, name):
    """`translate -o MODEL/config.yaml` replaced the model's config with translations, exit 0 (a probe), and `align -o
    MODEL/model.safetensors` its weights: the model directory's files are the verb's inputs too. Another file
    there (a hypothesis file) is written as before."""
    import shutil

    model = tmp_path / "m"
    shutil.copytree(numbers_model, model)
    (text := tmp_path / "t.txt").write_text("drei\n")
    if name == "head_importance.tsv":  # written by heads importance, there on purpose: taken from it, again too
        for _ in range(2):
            assert main(["heads", "importance", str(model), "--src", str(text), "--ref", str(text), "-o",
                         str(model / name)]) == 0
    before = (model / name).read_bytes()
    assert main([a.format(m=model, t=text) for a in argv]) == 2
    assert f"is a file of the model directory {model}" in capsys.readouterr().err
    assert (model / name).read_bytes() == before
    assert main(["translate", str(model), "-i", str(text), "-o", str(model / "test.hyp")]) == 0
    assert main(["translate", str(model), "-i", str(text), "-o", str(model / "test.hyp")]) == 0  # (again, over it)


def test_a_figure_too_large_to_draw_is_refused_before_it_takes_the_memory(numbers_model, tmp_path, capsys):
    """A 1,100-word sentence drawn as a PNG took about 24 GB and was killed by the system (a probe; 300 words took
    2.5 GB): a figure of more than MAX_CELLS cells is one line naming the .html view, which draws any size."""
    from xattn.analysis.plots import MAX_CELLS

    text = " ".join(["drei hundert vier"] * 70)
    out = tmp_path / "long.png"
    assert main(["attention", str(numbers_model), text, "--reference", text, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cells, over the {MAX_CELLS} a PNG, SVG or PDF takes" in err and "write it as .html" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["attention", str(numbers_model), text, "--reference", text, "-o", str(tmp_path / "long.html")]) == 0
