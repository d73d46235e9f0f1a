import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from xattn.checkpoint import load_model_dir
from xattn.config import load_config
from xattn.errors import XattnError
from xattn.losses import label_smoothed_loss
from xattn.train_state import lock_run_dir, release_run_dir
from xattn.training import Trainer, inverse_sqrt_lr, train

TINY = ["model.d_model=16", "model.n_heads=2", "model.n_encoder_layers=1", "model.n_decoder_layers=1",
        "model.d_ff=32", "model.share_embeddings=true", "model.tie_output=true",
        "data.dataset=numbers", "data.numbers_size=300", "data.vocab_size=120",
        "train.max_tokens=400", "train.warmup=5", "train.lr=0.003", "train.amp=none", "train.eval_every=3",
        "train.eval_bleu_sentences=8", "train.log_every=1", "train.max_minutes=0", "train.threads=1"]


def _cfg(*extra):
    return load_config(None, TINY + list(extra))


def _losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_label_smoothed_loss_by_hand():
    logits = torch.tensor([[[2.0, 0.5, -1.0, 0.0], [0.0, 1.0, 3.0, 0.5]]])
    target = torch.tensor([[2, 0]])  # second position is padding (pad_id=0)
    loss, nll = label_smoothed_loss(logits, target, pad_id=0, smoothing=0.1)
    logp = logits[0, 0].log_softmax(-1)
    assert nll.item() == pytest.approx(-logp[2].item(), rel=1e-6)
    assert loss.item() == pytest.approx((0.9 * -logp[2] + 0.1 * -logp.mean()).item(), rel=1e-6)


def test_inverse_sqrt_schedule():
    assert inverse_sqrt_lr(50, 1e-3, 100) == pytest.approx(5e-4)
    assert inverse_sqrt_lr(100, 1e-3, 100) == pytest.approx(1e-3)
    assert inverse_sqrt_lr(400, 1e-3, 100) == pytest.approx(5e-4)


def test_training_writes_a_model_directory(tmp_path):
    progress = train(_cfg("train.max_steps=6"), tmp_path, quiet=True)
    assert progress.step == 6
    for name in ("config.yaml", "model.safetensors", "spm.model", "log.jsonl", "train_state/manifest.json"):
        assert (tmp_path / name).is_file(), name
    manifest = json.loads((tmp_path / "train_state/manifest.json").read_text())
    assert manifest["step"] == 6 and sorted(p.name for p in (tmp_path / "train_state").iterdir()) == \
        sorted(["manifest.json", *manifest["files"]])
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "valid_bleu" in r] == [3, 6]
    assert all(math.isfinite(r["loss"]) and r["tokens_per_s"] >= 0 for r in records if "loss" in r)
    loaded = load_model_dir(tmp_path)
    assert loaded.model.cfg.src_vocab_size == loaded.tokenizers.src.vocab_size


def test_resume_continues_the_loss_curve_exactly(tmp_path):
    full, parts = tmp_path / "full", tmp_path / "parts"
    train(_cfg("train.max_steps=8"), full, quiet=True)
    train(_cfg("train.max_steps=3"), parts, quiet=True)
    train(_cfg("train.max_steps=8"), parts, quiet=True)
    a, b = _losses(full), _losses(parts)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in range(1, 9):
        assert b[step] == pytest.approx(a[step], rel=1e-6, abs=1e-7), step


def test_interrupt_saves_state_and_resume_picks_up(tmp_path):
    trainer = Trainer(_cfg("train.max_steps=50"), tmp_path, quiet=True)
    trainer._stop_signal = signal.SIGINT  # as if Ctrl+C came during the first step
    assert trainer.fit().step == 1
    resumed = Trainer(_cfg("train.max_steps=4"), tmp_path, quiet=True)
    assert resumed.progress.step == 1
    assert resumed.fit().step == 4


def test_resume_refuses_a_different_model(tmp_path):
    train(_cfg("train.max_steps=2"), tmp_path, quiet=True)
    with pytest.raises(XattnError, match=r"other model, data or tokenizer settings \(model.d_ff: 32 -> 64\)"):
        Trainer(_cfg("train.max_steps=4", "model.d_ff=64"), tmp_path, quiet=True)


def test_checkpoint_averaging(tmp_path):
    train(_cfg("train.max_steps=9", "train.average_last=3"), tmp_path, quiet=True)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert any(r.get("averaged") == 3 for r in records)
    manifest = json.loads((tmp_path / "train_state/manifest.json").read_text())
    assert [step for step, _ in manifest["averaging"]] == [3, 6, 9]
    assert all((tmp_path / "train_state" / name).is_file() for _, name in manifest["averaging"])


def test_unknown_config_key_names_the_nearest(tmp_path):
    with pytest.raises(XattnError, match=r"train.max_step .*'max_steps'"):
        _cfg("train.max_step=3")


WORKER = textwrap.dedent("""
    import sys, hashlib, torch.distributed as dist
    from xattn.config import load_config
    from xattn.training import Trainer
    if __name__ == "__main__":  # preparing the corpus starts processes that import this file again (spawn)
        out = sys.argv[1]
        trainer = Trainer(load_config(None, sys.argv[2:]), out, quiet=True)
        trainer.fit()
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in trainer.model.parameters())).hexdigest()
        open(f"{out}/rank{trainer.ctx.rank}.sha", "w").write(f"{digest} {trainer.progress.step}")
        dist.destroy_process_group()
""")


def test_ddp_two_cpu_processes_hold_identical_weights(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "run"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    # --standalone: a rendezvous on a port the system gives (one found free beforehand could be taken meanwhile)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(worker), str(out), *TINY, "train.max_steps=4", "train.device=cpu"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rank0, rank1 = (out / "rank0.sha").read_text(), (out / "rank1.sha").read_text()
    assert rank0 == rank1 and rank0.endswith(" 4")


def test_ddp_processes_resume_each_with_its_own_random_streams(tmp_path):
    """Each process's dropout draws for its own batches; a checkpoint kept rank 0's streams alone and gave them to
    every process on resume, so a resumed run under torchrun trained other weights than one never stopped."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = os.environ | {"OMP_NUM_THREADS": "1"}

    def run(out, steps):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker),
               str(out), *TINY, f"train.max_steps={steps}", "train.device=cpu", "train.eval_every=100",
               "model.dropout=0.3"]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return (out / "rank0.sha").read_text(), (out / "rank1.sha").read_text()
    straight = run(tmp_path / "straight", 4)
    run(tmp_path / "parts", 2)
    assert run(tmp_path / "parts", 4) == straight


COLLECTIVES = textwrap.dedent("""
    import gc, json, sys, weakref, torch, torch.distributed as dist
    from torch.distributed import distributed_c10d
    from xattn.distributed import Context
    if __name__ == "__main__":
        rank, store = int(sys.argv[1]), sys.argv[2]
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        handed = []
        for name in ("all_reduce", "all_gather", "broadcast"):
            def spy(*args, real=getattr(distributed_c10d, name), **kwargs):
                for arg in args:
                    handed.extend((weakref.ref(t), t._use_count()) for t in (arg if isinstance(arg, list) else [arg])
                                  if isinstance(t, torch.Tensor))
                return real(*args, **kwargs)
            setattr(dist, name, spy), setattr(distributed_c10d, name, spy)
        ctx = Context(rank, 2)
        gathered = [ctx.gather({"rank": rank, "bytes": "x" * 10 ** k * (rank + 1)}) for k in (1, 4, 2)]
        agreed = [ctx.agree(reason) for reason in (None, "max_steps" if rank else None)]
        with ctx.first() as mine:  # (a gather: the others wait for rank 0's block)
            pass
        gc.collect()
        print(json.dumps({"gathered": [[(g["rank"], len(g["bytes"])) for g in gather] for gather in gathered],
                          "agreed": agreed, "handed": len(handed), "freed": sum(ref() is None for ref, _ in handed),
                          "python_alone": sum(count < 2 for _, count in handed)}))
        dist.destroy_process_group()
""")


def test_collectives_hand_gloo_only_tensors_that_cpp_code_holds_for_good(tmp_path):
    """gloo's worker thread lets go of a finished collective's tensors a moment after the caller returned; one that
    this leaves to Python alone makes the thread take the GIL, and a process already shutting down aborted there
    (SIGABRT after a torchrun training had written everything, one run in about twenty on a busy machine; at once
    after a refusal that rank 0 shared). Each tensor handed over is held by C++ code besides, and never freed."""
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, str(script), str(rank), str(tmp_path / "store")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], [err[-2000:] for _, err in outputs]
    for out, _ in outputs:
        report = json.loads(out)
        assert report["gathered"] == [[[0, 10 ** k], [1, 2 * 10 ** k]] for k in (1, 4, 2)]
        assert report["agreed"] == [None, "max_steps"]
        assert report["handed"] > 0 and report["freed"] == report["python_alone"] == 0


FULL_DISK = textwrap.dedent("""
    import errno, sys
    from xattn import training
    from xattn.cli.main import main
    if __name__ == "__main__":
        where, write = sys.argv.pop(1), getattr(training.Trainer, sys.argv[1])
        def full(self, *args, **kwargs):  # rank 0's disk fills at step 2's checkpoint, or its log record
            if self.ctx.rank == 0 and self.progress.step >= 2:
                raise OSError(errno.ENOSPC, "No space left on device", str(self.out_dir / where))
            return write(self, *args, **kwargs)
        setattr(training.Trainer, sys.argv.pop(1), full)
        sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("refusal", ["directory held", "prepared corpus damaged", "disk full at a checkpoint",
                                     "disk full at a log record"])
def test_a_refusal_on_rank_0_ends_every_rank_with_its_line(tmp_path, refusal):
    """Rank 0 alone takes the run directory, reads a prepared corpus through and writes the checkpoints. When another
    training held the directory, an array no longer matched its SHA-256 or the disk filled, rank 0 ended with its
    line and the others with the process group's traceback at their next collective."""
    from xattn.cli.main import main

    out, config, extra, launch = tmp_path / "run", tmp_path / "run" / "config.yaml", [], ["-m", "xattn"]
    train(_cfg("train.max_steps=1"), out, quiet=True)
    if refusal == "prepared corpus damaged":
        assert main(["prepare", str(config), "--out", str(tmp_path / "prepared"), "--workers", "1"]) == 0
        arrays = [f for f in (tmp_path / "prepared").iterdir() if f.suffix != ".json"]
        array = max(arrays, key=lambda f: f.stat().st_size)
        data = bytearray(array.read_bytes())
        data[0] ^= 1
        array.write_bytes(bytes(data))
        out, extra = tmp_path / "new", [f"data.prepared={tmp_path / 'prepared'}"]
    elif refusal.startswith("disk full"):
        (tmp_path / "full.py").write_text(FULL_DISK)
        where = ["train_state", "_save_state"] if refusal.endswith("checkpoint") else ["log.jsonl", "_log"]
        out, extra = tmp_path / "new", ["train.eval_every=2", "train.max_steps=4"]
        launch = [str(tmp_path / "full.py"), *where]
    lock_run_dir(tmp_path / "run")  # another training writing there
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *launch,
               "train", str(config), "train.max_steps=2", "train.device=cpu", *extra, "--out", str(out)]
        result = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"},
                                timeout=300)
    finally:
        release_run_dir(tmp_path / "run")
    line = {"directory held": "another training (process", "prepared corpus damaged": "SHA-256",
            "disk full at a checkpoint": "train_state: No space left on device",
            "disk full at a log record": "log.jsonl: No space left on device"}[refusal]
    assert result.returncode != 0 and result.stderr.count(line) == 2, result.stderr[-2000:]
    for sign in ("[rank1]", "RuntimeError", "Connection closed", "terminate called"):
        assert sign not in result.stderr, result.stderr[-3000:]


def test_the_processes_wait_for_each_other_as_long_as_train_ddp_timeout_says(monkeypatch):
    """PyTorch's defaults (30 minutes on gloo, 10 on NCCL) ended a torchrun run while rank 0 prepared a large corpus
    alone and the others waited."""
    from datetime import timedelta

    import torch.distributed as torch_dist

    from xattn import distributed

    joined = {}
    monkeypatch.setenv("WORLD_SIZE", "2"), monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(torch_dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch_dist, "init_process_group", lambda backend, **kwargs: joined.update(kwargs))
    cfg = _cfg("train.ddp_timeout=240", "train.device=cpu")
    assert distributed.setup(cfg.train.device, cfg.train.ddp_timeout) == distributed.Context(1, 2)
    assert joined == {"timeout": timedelta(hours=4)}
    with pytest.raises(XattnError, match="train.ddp_timeout"):
        _cfg("train.ddp_timeout=0")


def test_a_new_directory_is_held_from_the_runs_first_write_there(tmp_path):
    """Held from its first checkpoint, a new directory took the tokenizers of two runs started into it at once, and
    the one that went on could end with the other's."""
    import fcntl

    from xattn.train_state import LOCK

    out = tmp_path / "run"
    out.mkdir()
    with open(out / LOCK, "a+") as other:  # another training, started into it a moment before
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(XattnError, match="another training"):
            Trainer(_cfg("train.max_steps=1"), out, quiet=True)
    assert [f.name for f in out.iterdir()] == [LOCK]


def test_a_run_that_went_on_in_a_new_directory_meanwhile_is_not_overwritten(tmp_path, monkeypatch):
    """A run that found the directory new, then held it only after another run into it had started, overwrote that
    run's tokenizers and removed its checkpoint as half written."""
    from xattn import recipes

    out, build, other = tmp_path / "run", recipes.from_config, []

    def late(cfg, out_dir):  # the other run trains to its end while this one prepares its corpus
        if not other:
            other.append(None)
            other[0] = train(_cfg("train.max_steps=1", "data.vocab_size=100"), out, quiet=True)
        return build(cfg, out_dir)
    monkeypatch.setattr("xattn.training.from_config", late)
    with pytest.raises(XattnError, match="another training started a run there meanwhile"):
        train(_cfg("train.max_steps=1"), out, quiet=True)
    assert other[0].step == 1 and (out / "train_state" / "manifest.json").is_file()
    monkeypatch.setattr("xattn.training.from_config", build)
    assert train(_cfg("train.max_steps=2", "data.vocab_size=100"), out, quiet=True).step == 2  # it resumes


def test_an_ignored_sighup_stays_ignored(tmp_path):
    """Under nohup a closed terminal's SIGHUP is ignored; training took it as a request to stop and returned its
    model cut short to the script that called it."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        trainer = Trainer(_cfg("train.max_steps=3"), tmp_path, quiet=True)
        real = trainer._train_step

        def step(batches):
            signal.raise_signal(signal.SIGHUP)  # the terminal closes
            return real(batches)
        trainer._train_step = step
        progress = trainer.fit()
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert progress.stop_reason == "max_steps" and progress.step == 3


def test_an_interrupt_on_a_step_due_for_evaluation_evaluates_it_first(tmp_path):
    """The resumed run starts after the step; without its evaluation, the best weights, the checkpoints kept for
    averaging and the count towards patience differed from a run never stopped."""
    full, parts = tmp_path / "full", tmp_path / "parts"
    done = train(_cfg("train.max_steps=3", "train.eval_every=1"), full, quiet=True)
    trainer = Trainer(_cfg("train.max_steps=3", "train.eval_every=1"), parts, quiet=True)
    trainer._stop_signal = signal.SIGINT  # as if Ctrl+C came during the first step, one due for evaluation
    assert trainer.fit().stop_reason == "interrupted"
    resumed = train(_cfg("train.max_steps=3", "train.eval_every=1"), parts, quiet=True)

    def evaluated(out):
        return [r["step"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "valid_bleu" in r]
    assert evaluated(parts) == evaluated(full) == [1, 2, 3]
    assert (resumed.best_step, resumed.bad_evals) == (done.best_step, done.bad_evals)


def test_the_last_step_of_the_last_epoch_is_evaluated_once(tmp_path):
    trainer = Trainer(_cfg("train.max_steps=1000"), tmp_path, quiet=True)
    steps = len(trainer.sampler.batches(0))
    train(_cfg("train.max_steps=1000", "train.max_epochs=1", f"train.eval_every={steps}"), tmp_path / "run",
          quiet=True)
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "valid_bleu" in r] == [steps]


def test_a_resume_keeps_no_more_checkpoints_for_averaging_than_average_last_asks(tmp_path):
    """Lowered or set to 0 on resume, train.average_last was ignored: the checkpoints kept before were averaged."""
    train(_cfg("train.max_steps=9", "train.average_last=3"), tmp_path / "off", quiet=True)
    train(_cfg("train.max_steps=12", "train.average_last=0"), tmp_path / "off", quiet=True)
    records = [json.loads(line) for line in (tmp_path / "off" / "log.jsonl").read_text().splitlines()]
    assert [r["averaged"] for r in records if "averaged" in r] == [3]  # the first run's, none after the resume
    assert json.loads((tmp_path / "off/train_state/manifest.json").read_text())["averaging"] == []
    train(_cfg("train.max_steps=9", "train.average_last=3"), tmp_path / "two", quiet=True)
    train(_cfg("train.max_steps=10", "train.average_last=2"), tmp_path / "two", quiet=True)
    records = [json.loads(line) for line in (tmp_path / "two" / "log.jsonl").read_text().splitlines()]
    assert [r["averaged"] for r in records if "averaged" in r] == [3, 2]
    manifest = json.loads((tmp_path / "two/train_state/manifest.json").read_text())
    assert [step for step, _ in manifest["averaging"]] == [9, 10]


def test_an_epoch_too_small_for_the_processes_is_refused_before_the_first_checkpoint(tmp_path, monkeypatch):
    """Refused after it, the run directory held a run whose settings the suggested fix (a lower train.max_tokens)
    was then refused for."""
    from xattn import distributed
    monkeypatch.setattr(distributed, "setup", lambda device, timeout: distributed.Context(rank=0, world=1000))
    monkeypatch.setattr(distributed.Context, "wrap", lambda self, model: model)
    monkeypatch.setattr(distributed.Context, "gather", lambda self, value: [value] * self.world)
    with pytest.raises(XattnError, match="for 1000 training processes: lower train.max_tokens"):
        Trainer(_cfg("train.max_steps=2"), tmp_path, quiet=True)
    assert not (tmp_path / "train_state").exists()


def test_early_stopping_after_patience(tmp_path):
    progress = train(_cfg("train.max_steps=20", "train.eval_every=1", "train.patience=2", "train.lr=1e-9"),
                     tmp_path, quiet=True)
    assert progress.stop_reason == "early_stopping" and progress.step == 3


def test_corpus_counts_what_cleaning_dropped(tmp_path):
    (tmp_path / "a.de").write_text("eins zwei\n\ndrei\n" + "vier " * 30 + "\n")
    (tmp_path / "a.en").write_text("one two\nempty\nthree\nfour\n")
    cfg = _cfg("data.dataset=null", f"data.train_src={tmp_path}/a.de", f"data.train_tgt={tmp_path}/a.en",
               f"data.valid_src={tmp_path}/a.de", f"data.valid_tgt={tmp_path}/a.en", "data.vocab_size=30",
               "data.max_ratio=5")
    from xattn.corpus import prepare_corpus
    corpus = prepare_corpus(cfg.data, tmp_path / "m")
    assert (corpus.stats.kept, corpus.stats.empty, corpus.stats.ratio) == (2, 1, 1)
    assert len(corpus.valid_pairs) == 3


def test_label_smoothed_loss_equals_torch_cross_entropy():
    torch.manual_seed(0)
    logits, target = torch.randn(3, 5, 11), torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0
    loss, nll = label_smoothed_loss(logits, target, pad_id=0, smoothing=0.2)
    flat = logits.flatten(0, 1), target.flatten()
    expected = torch.nn.functional.cross_entropy(*flat, ignore_index=0, label_smoothing=0.2, reduction="sum")
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, torch.nn.functional.cross_entropy(*flat, ignore_index=0, reduction="sum"))


def _xattn_only(cfg, out: Path, identity: dict | None = None):
    """A factory like `xattn train`'s whose run trains only the cross-attention (what fine-tuning will hand in)."""
    from xattn.recipes import from_config

    def build(ctx, new):
        parts = from_config(cfg, out)(ctx, new)
        parts.trainable = frozenset(parts.model.parameter_groups()["xattn"])
        parts.identity = identity if identity is not None else {"recipe": "xattn only"}
        return parts
    return build


def test_a_factory_decides_what_trains_and_the_rest_stays_bit_identical(tmp_path):
    from xattn.recipes import from_config

    cfg = _cfg("train.max_steps=3")
    initial = from_config(cfg, tmp_path / "probe")(__import__("xattn.distributed").distributed.setup("cpu"), True).model
    trainer = Trainer(cfg, tmp_path / "run", quiet=True, factory=_xattn_only(cfg, tmp_path / "run"))
    trained = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trained == set(trainer.model.parameter_groups()["xattn"])
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(trained)
    trainer.fit()
    after = load_model_dir(tmp_path / "run").model.state_dict()
    before = initial.state_dict()
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= trained  # every frozen parameter is exactly as initialised
    # the recipe is part of the run's identity: resuming with another one is refused
    with pytest.raises(XattnError, match="recipe: 'xattn only' -> 'other'"):
        Trainer(_cfg("train.max_steps=5"), tmp_path / "run", quiet=True,
                factory=_xattn_only(cfg, tmp_path / "run", {"recipe": "other"}))
    longer = _cfg("train.max_steps=5")
    resumed = Trainer(longer, tmp_path / "run", quiet=True, factory=_xattn_only(longer, tmp_path / "run"))
    assert resumed.progress.step == 3 and resumed.fit().step == 5


def test_unknown_trainable_names_are_refused(tiny_model):
    from xattn.recipes import freeze

    with pytest.raises(ValueError, match="not parameters of the model: decoder.layers.9"):
        freeze(tiny_model, frozenset({"decoder.layers.9.cross_attn.q_proj.weight"}))
    assert len(freeze(tiny_model, None)) == len(list(tiny_model.parameters()))


def test_resume_refuses_another_training_subset(tmp_path):
    train(_cfg("train.max_steps=2", "data.train_subset=200"), tmp_path, quiet=True)
    with pytest.raises(XattnError, match=r"data.train_subset: 200 -> 100"):
        Trainer(_cfg("train.max_steps=4", "data.train_subset=100"), tmp_path, quiet=True)


def test_a_resume_takes_the_weight_decay_and_betas_it_is_given(tmp_path, capsys):
    """The optimizer's checkpoint holds the first run's weight decay and betas; a resume that changes them (as
    config.yaml then says) trains with the new ones."""
    from safetensors.torch import load_file

    from xattn.cli.main import main

    from conftest import NUMBERS_TINY

    base = ["train", "numbers-de-en", *NUMBERS_TINY]
    for name in ("same", "changed"):
        assert main([*base, "train.max_steps=2", "--out", str(tmp_path / name)]) == 0
    assert main([*base, "train.max_steps=4", "--out", str(tmp_path / "same")]) == 0
    assert main([*base, "train.max_steps=4", "train.weight_decay=0.5", "train.betas=[0.5,0.6]",
                 "--out", str(tmp_path / "changed")]) == 0
    capsys.readouterr()
    same, changed = (load_file(next((tmp_path / name / "train_state").glob("weights-*.safetensors")))
                     for name in ("same", "changed"))
    assert any(not torch.equal(same[k], changed[k]) for k in same)


def test_a_second_training_into_a_run_directory_in_use_is_refused_and_the_first_keeps_it(tmp_path):
    """The same command run again while the first runs: the second resumed from the live run's checkpoint,
    deleted its files and cut its log, and both wrote there (a helper's probe: a mixed run, or one of the two failing
    on a checkpoint file the other had removed). Held while the first process lives, however it ends."""
    from conftest import NUMBERS_TINY

    out = tmp_path / "run"
    args = [sys.executable, "-m", "xattn", "train", "numbers-de-en", *NUMBERS_TINY, "train.eval_every=100000",
            "--out", str(out)]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([*args, "train.max_steps=1000000"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(2400):  # a bound against hanging, not a timing check
            if (out / "train_state" / "manifest.json").is_file() or first.poll() is not None:
                break
            time.sleep(0.05)
        log = (out / "log.jsonl").read_bytes() if (out / "log.jsonl").exists() else b""
        second = subprocess.run([*args, "train.max_steps=1000000"], env=env, capture_output=True, text=True,
                                timeout=300)
        assert second.returncode == 2 and second.stderr == (
            f"xattn train: error: {out}: another training (process {first.pid}) is writing there; wait for it to "
            "end, or train into another directory\n"), second.stderr
        assert (out / "log.jsonl").read_bytes().startswith(log)  # not cut back under the first
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 130, first.stderr.read()
    finally:
        first.kill()
    third = subprocess.run([*args, "train.max_steps=1"], env=env, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr  # the lock went with the first process


def test_the_best_model_is_published_after_the_checkpoint_that_records_it_and_again_on_resume(tmp_path, monkeypatch):
    """model.safetensors was written before the checkpoint of its step: a kill between the two left it ahead of
    train_state/, and a resumed run with another budget ended with weights of a trajectory it never took (a
    helper's probe). Now a kill between the two leaves the checkpoint ahead, and resuming publishes its weights."""
    from xattn.checkpoint import WEIGHTS, read_weights

    class Killed(Exception):
        pass
    published, real = [], Trainer._save_model

    def save_model(self):
        published.append((self.progress.step, self.state_dir.manifest.step))
        if self.progress.step == 3:
            raise Killed  # as a kill after the checkpoint of step 3, before its weights were published
        real(self)
    monkeypatch.setattr(Trainer, "_save_model", save_model)
    out = tmp_path / "run"
    with pytest.raises(Killed):
        train(_cfg("train.max_steps=6", "train.lr=0.01"), out, quiet=True)
    assert published == [(3, 3)] and not (out / WEIGHTS).exists()  # the checkpoint first
    monkeypatch.setattr(Trainer, "_save_model", real)
    trainer = Trainer(_cfg("train.max_steps=3", "train.lr=0.01"), out, quiet=True)  # resumed at step 3
    checkpoint = read_weights(trainer.state_dir.dir / trainer.state_dir.manifest.weights)[0]
    best = read_weights(out / WEIGHTS)[0]
    assert trainer.progress.best_step == 3 and all(torch.equal(best[k], checkpoint[k]) for k in checkpoint)


def test_a_training_refused_before_its_first_checkpoint_creates_no_directory(tmp_path):
    """The run directory's lock made --out before the run's checks, and a refused run left it behind (a review)."""
    with pytest.raises(XattnError, match="not a prepared corpus"):
        train(_cfg(f"data.prepared={tmp_path / 'nowhere'}"), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()


def test_an_average_kept_as_the_best_is_published_after_the_checkpoint_that_records_it_and_again_on_resume(
        tmp_path, monkeypatch):
    """The average of the last checkpoints was published before the finished checkpoint: a kill between the two,
    then a resume with a larger budget, kept that average where an uninterrupted run would not (a review). Now the
    checkpoint records it (Progress.averaged) first, and resuming publishes it again from the kept checkpoints."""
    from xattn.checkpoint import WEIGHTS, read_weights

    class Killed(Exception):
        pass
    scores = iter([1.0, 2.0, 3.0, 10.0, 5.0, 6.0])  # evaluations at steps 3, 6 and 9, the average's (the best), and
    #                                               after the resume, step 12's and its average's
    monkeypatch.setattr(Trainer, "validate", lambda self: {"valid_nll": 1.0, "valid_bleu": next(scores)})
    on_disk, real = [], Trainer._save_model

    def save_model(self):
        on_disk.append(self.state_dir.load_state()["progress"])
        if self.progress.best_score == 10.0:
            raise Killed  # as a kill before the average is published
        real(self)
    monkeypatch.setattr(Trainer, "_save_model", save_model)
    out = tmp_path / "run"
    with pytest.raises(Killed):
        train(_cfg("train.max_steps=9", "train.average_last=3"), out, quiet=True)
    assert on_disk[-1]["finished"] and on_disk[-1]["averaged"] and on_disk[-1]["best_step"] == 9  # the checkpoint first
    monkeypatch.setattr(Trainer, "_save_model", real)
    trainer = Trainer(_cfg("train.max_steps=12", "train.average_last=3"), out, quiet=True)  # a larger budget
    kept = [read_weights(trainer.state_dir.dir / name)[0] for _, name in trainer.state_dir.manifest.averaging]
    best = read_weights(out / WEIGHTS)[0]
    assert all(torch.allclose(best[k], sum(t[k].float() for t in kept) / 3) for k in best)
    assert not all(torch.equal(best[k], kept[-1][k]) for k in best)  # not the last weights
    progress = trainer.fit()  # training goes on: the average stays the best until an evaluation beats it
    assert progress.best_step == 9 and all(torch.equal(best[k], read_weights(out / WEIGHTS)[0][k]) for k in best)


def test_running_a_finished_run_again_leaves_its_published_average_as_it_is(tmp_path, monkeypatch):
    """The re-publishing on resume ran on every re-run of a finished run whose best is an average, rewriting
    model.safetensors and, with guided alignment, analysis.yaml's stored choice (a review). Only a checkpoint newer
    than the published weights is published again."""
    from xattn.checkpoint import WEIGHTS

    scores = iter([1.0, 2.0, 3.0, 10.0])
    monkeypatch.setattr(Trainer, "validate", lambda self: {"valid_nll": 1.0, "valid_bleu": next(scores)})
    out = tmp_path / "run"
    cfg = _cfg("train.max_steps=9", "train.average_last=3")
    assert train(cfg, out, quiet=True).averaged
    published = (out / WEIGHTS).stat().st_mtime_ns
    time.sleep(0.05)  # (a rewrite would have a later time)
    assert train(cfg, out, quiet=True).stop_reason == "max_steps"
    assert (out / WEIGHTS).stat().st_mtime_ns == published


def test_a_run_already_done_keeps_its_config(tmp_path, capsys):
    """A re-run of a finished run with a smaller budget trains nothing ("already trained to max_steps"), but wrote
    its settings into config.yaml all the same, which then named a budget the weights never had (a probe)."""
    from tests.conftest import NUMBERS_TINY
    from xattn.cli.main import main

    out = tmp_path / "run"
    assert main(["train", "numbers-de-en", *NUMBERS_TINY, "train.max_steps=4", "--out", str(out)]) == 0
    before = (out / "config.yaml").read_bytes()
    assert main(["train", "numbers-de-en", *NUMBERS_TINY, "train.max_steps=2", "--out", str(out)]) == 0
    assert "already trained to max_steps" in capsys.readouterr().out
    assert (out / "config.yaml").read_bytes() == before
    assert main(["train", "numbers-de-en", *NUMBERS_TINY, "train.max_steps=5", "--out", str(out)]) == 0  # goes on:
    assert "max_steps: 5" in (out / "config.yaml").read_text()  # its settings are the run's now
