"""Training: label-smoothed cross-entropy (plus guided alignment, xattn.guidance), AdamW with inverse-square-root
warmup, mixed precision, validation loss and BLEU, early stopping, atomic checkpoints, exact resume, checkpoint
averaging, DDP.

A run writes into one model directory (see checkpoint.py). `train_state/` holds what resuming needs:
the last weights, optimizer, schedule position, RNG states and data position; running the same
command again continues from there, and the loss curve continues as if never interrupted.
"""
from __future__ import annotations

import dataclasses
import math
import signal
import time
from pathlib import Path

import torch

from xattn import corpora, distributed as dist
from xattn.analysis.choice import save_guided
from xattn.checkpoint import CONFIG, load_weights, read_weights, save_model_dir, save_weights, tokenizer_hashes
from xattn.config import DecodeConfig, RunConfig, TrainConfig, save_config
from xattn.corpus import Corpus, check_valid_fits
from xattn.data import Batch, TokenBatchSampler
from xattn.devices import amp_dtype, resolve_device
from xattn.errors import XattnError
from xattn.evaluation import bleu
from xattn.io import json_text
from xattn.losses import label_smoothed_loss
from xattn.train_state import (LOG, STATE_DIR, Manifest, Progress, data_identity, kept_for_averaging,  # noqa: F401
                               lock_run_dir, open_run_dir, published_before, refuse_another_run, release_run_dir,
                               remove_leftovers, rng_state, run_identity, set_rng_state)  # (LOG, STATE_DIR: faults.py)
from xattn.progress import RunningRate, StepStatus, echo, open_display
from xattn.recipes import Factory, freeze, from_config, guided_alignment
from xattn.translator import Translator


# what stops training at the next step, checkpointed: Ctrl+C, SIGTERM, SIGHUP (a closed terminal; torchrun passes it on)
STOPS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warmup to `peak` over `warmup` steps, then peak * sqrt(warmup / step) (Vaswani et al. 2017)."""
    step = max(step, 1)
    return peak * min(step / max(warmup, 1), math.sqrt(max(warmup, 1) / step))


class Trainer:
    """Trains the model of a RunParts factory into a model directory, as a RunConfig's train section says.

    `cfg` fixes the device, threads and mixed precision; the factory (default `from_config(cfg, out_dir)`)
    gives the corpus, the model and which of its parameters train (the others stay as they are, and the
    optimizer never sees them), and its RunParts.cfg is the run's config from then on: build both from one.
    """

    def __init__(self, cfg: RunConfig, out_dir: str | Path, quiet: bool = False, factory: Factory | None = None,
                 flags: dict[str, str] | None = None):
        self.out_dir, self.quiet = Path(out_dir), quiet
        self.flags = flags or {}  # how the caller's command line names a config key, for messages
        self.ctx = dist.setup(cfg.train.device, cfg.train.ddp_timeout)
        self.device = self.ctx.device if self.ctx.world > 1 else resolve_device(cfg.train.device)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.amp = amp_dtype(cfg.train.amp, self.device)
        with self.ctx.first() as mine:
            if mine:  # before its manifest is read (a folder without a run: from the run's first write, its tokenizers)
                lock_run_dir(self.out_dir)
        self.state_dir, manifest = open_run_dir(self.out_dir)
        factory = factory or from_config(cfg, self.out_dir)
        if manifest is not None:  # before a corpus is prepared for a run that would be refused
            refuse_another_run(self.out_dir, manifest, {"data": data_identity(getattr(factory, "data", cfg.data))},
                               partial=True)
        parts = factory(self.ctx, manifest is None)
        self.corpus: Corpus = parts.corpus
        stats = self.corpus.stats
        duplicates = f", {stats.duplicate} repeated" if cfg.data.dedup else ""
        self._print(f"corpus: {len(self.corpus.train)} training pairs in {self.corpus.train.folder} (dropped: "
                    f"{stats.empty} empty, {stats.too_long} longer than {cfg.data.max_len} tokens, {stats.ratio} over "
                    f"length ratio {cfg.data.max_ratio:g}{duplicates}), {len(self.corpus.valid)} validation pairs")
        if corpora.validates_on_training(cfg.data):
            self._print("note: the validation files are the training files: validation BLEU and early stopping "
                        "measure how well the model learned its training pairs")
        self.cfg, self.base = parts.cfg, parts.base
        check_valid_fits(self.corpus, self.cfg.data, self.cfg.model)
        self.guide = guided_alignment(self.cfg, self.corpus, self._print)
        self.identity = run_identity(self.cfg, self.corpus.fingerprint, tokenizer_hashes(self.out_dir),
                                     self.ctx.world) | parts.identity
        if manifest is not None:
            refuse_another_run(self.out_dir, manifest, self.identity)
        tc: TrainConfig = self.cfg.train
        self.model = parts.model.to(self.device)
        trained = freeze(self.model, parts.trainable)
        self.ddp_model = self.ctx.wrap(self.model)  # DDP all-reduces only the parameters that train
        self.optimizer = torch.optim.AdamW(trained, lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp == torch.float16)
        mix = corpora.mixture(self.cfg.data, self.corpus.train.manifest.get("corpora", [len(self.corpus.train)]))
        self.sampler = TokenBatchSampler(self.corpus.train.src_lengths(), self.corpus.train.tgt_lengths(),
                                         tc.max_tokens, shuffle=True, seed=tc.seed, mixture=mix)
        if mix is not None:
            self._print(corpora.summary(mix))
        self.progress = Progress()
        self._stop_signal: int | None = None  # the signal that asked training to stop at the next step
        first = self.sampler.batches(0)
        self.ctx.shard(first)  # (an epoch too small for the processes refused before the run's first checkpoint)
        self._print(f"batches: {len(first)} per epoch of at most {tc.max_tokens} tokens, "
                    f"{100 * self.sampler.padding_fraction(first):.1f}% padding")
        if manifest is None:
            self._start()
        else:
            self._resume(manifest)

    # ---------------------------------------------------------------------------- start and resume

    def _start(self) -> None:
        """A new run (rank 0 writes): the checkpoint of step 0, then config.yaml."""
        rngs = self.ctx.gather(rng_state())
        with self.ctx.first() as mine:
            if mine:  # config.yaml after the first checkpoint: without one, it is never this run's
                self._take_over()
                self._save_state(rngs)
                save_config(self.cfg, self.out_dir / CONFIG)

    def _resume(self, manifest: Manifest) -> None:
        """Continue from the last complete checkpoint; config.yaml takes this run's budgets."""
        state = self.state_dir.load_state()
        load_weights(self.model, self.state_dir.dir / manifest.weights, self.identity["tokenizers"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:  # the checkpoint's would stay, though config.yaml says this run's
            group["weight_decay"], group["betas"] = self.cfg.train.weight_decay, tuple(self.cfg.train.betas)
        if state["scaler"] or not self.scaler.is_enabled():  # (a run resumed in fp16 whose scaler was off: anew)
            self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        set_rng_state(state["rng_ranks"][self.ctx.rank] if "rng_ranks" in state else state["rng"])  # one a process
        with self.ctx.first() as mine:
            if mine:
                self._take_over()
                log = self.out_dir / LOG
                if log.is_file() and log.stat().st_size > manifest.log_bytes:
                    with log.open("r+b") as f:
                        f.truncate(manifest.log_bytes)  # records written after the checkpoint are written again
                p = self.progress  # the checkpoint's best weights, published after it: a kill may have come before
                if p.best_step == p.step and p.best_score > -math.inf and (p.averaged or not p.finished) and \
                        published_before(self.out_dir, self.state_dir):
                    if p.averaged:
                        self._on_weights(self._average(self.state_dir.manifest.averaging), self._save_model)
                    else:
                        self._save_model()
        self._print(f"resuming {self.out_dir} at step {self.progress.step} (epoch {self.progress.epoch})")

    def _take_over(self) -> None:
        """Hold the run directory (made now if new); remove the files or checkpoint a killed process half wrote."""
        lock_run_dir(self.out_dir, make=True)
        if removed := remove_leftovers(self.out_dir, self.state_dir):
            self._print(f"{self.out_dir}: removed {len(removed)} half-written file(s) of an interrupted run "
                        f"({', '.join(removed[:4])}{', ...' if len(removed) > 4 else ''})")

    def _save_state(self, rngs: list[dict], for_averaging: bool = False) -> None:
        """Write a checkpoint of the last weights, optimizer, RNG streams (`rngs`: each process's, rng_state())
        and progress (rank 0 only); `for_averaging`: these weights join the last train.average_last kept for
        averaging."""
        state = {"progress": dataclasses.asdict(self.progress), "optimizer": self.optimizer.state_dict(),
                 "scaler": self.scaler.state_dict(), "rng": rngs[0]} | ({"rng_ranks": rngs} if len(rngs) > 1 else {})
        log = self.out_dir / LOG
        self.state_dir.write(self.progress.step, lambda path: save_weights(self.model, path, self.identity["tokenizers"]),
                             state, log.stat().st_size if log.is_file() else 0, self.identity,
                             self.cfg.train.average_last, for_averaging)

    # ------------------------------------------------------------------------------------- steps

    def _train_step(self, batches: list[Batch]) -> tuple[float, int, float | None]:
        """One optimizer step over `batches` (gradient accumulation) -> (mean NLL per token, target tokens, mean
        guided-alignment loss per target piece with links, or None without guidance)."""
        tc, model, guide = self.cfg.train, self.ddp_model, self.guide
        model.train()
        n_tokens = sum(b.n_tgt_tokens for b in batches)
        total_nll, aligned, aligned_rows = 0.0, 0.0, 0
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            with self.ctx.no_sync(model, last=i == len(batches) - 1), self._autocast():
                out = model(batch.src, batch.tgt_in, cross_layers=guide.cross_layers if guide else ())
                loss, nll = label_smoothed_loss(out.logits, batch.tgt_out, self.cfg.model.pad_id, tc.label_smoothing)
                if guide is not None:
                    term, value, rows = guide(out.cross_attn, batch.links)
                    loss, aligned, aligned_rows = loss + term, aligned + value, aligned_rows + rows
                self.scaler.scale(loss / n_tokens).backward()
            total_nll += float(nll)
        lr = inverse_sqrt_lr(self.progress.step + 1, tc.lr, tc.warmup)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if tc.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return total_nll / max(n_tokens, 1), n_tokens, aligned / max(aligned_rows, 1) if guide else None

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None)

    # ---------------------------------------------------------------------------------- validate

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation NLL per token, perplexity and BLEU (greedy) of the current weights."""
        self.model.eval()
        valid = self.corpus.valid
        sampler = TokenBatchSampler(valid.src_lengths(), valid.tgt_lengths(), self.cfg.train.max_tokens, shuffle=False)
        nll = tokens = 0.0
        for indices in sampler.batches():
            batch = valid.collate(indices).to(self.device)
            with self._autocast():
                logits = self.model(batch.src, batch.tgt_in).logits
            nll += float(label_smoothed_loss(logits, batch.tgt_out, self.cfg.model.pad_id, 0.0)[1])
            tokens += batch.n_tgt_tokens
        n = self.cfg.train.eval_bleu_sentences or len(self.corpus.valid_pairs)
        pairs = self.corpus.valid_pairs[:n]
        translator = Translator(self.model, self.corpus.tokenizers, self.device)
        hyps = [t.text for t in translator.translate([s for s, _ in pairs], DecodeConfig(beam_size=1))]
        score = bleu(hyps, [t for _, t in pairs]).score
        return {"valid_nll": nll / max(tokens, 1), "valid_ppl": math.exp(min(nll / max(tokens, 1), 50)),
                "valid_bleu": score}

    # -------------------------------------------------------------------------------------- loop

    def fit(self) -> Progress:
        """Train until max_steps, max_epochs, max_minutes, early stopping or an interrupt: a first signal of STOPS
        stops training at the next step, checkpointed; one but SIGINT is then raised again, for the handler it found."""
        tc, p, window = self.cfg.train, self.progress, RunningRate()
        start = time.time() - p.seconds
        stop_reason = self._limit_reached()
        if stop_reason is not None and p.finished:
            key = f"train.{'patience' if stop_reason == 'early_stopping' else stop_reason}"
            self._print(f"{self.out_dir}: already trained to {stop_reason} (step {p.step}); raise "
                        f"{self.flags.get(key, key + '=')} to go on")
            p.stop_reason = stop_reason
            return p
        p.finished = False  # training goes on, or only its end (averaging) is left to redo
        with self.ctx.first() as mine:
            if mine:  # a resume's settings, once they apply (a run already done keeps its own)
                save_config(self.cfg, self.out_dir / CONFIG)
        previous = {s: signal.signal(s, self._on_signal) for s in STOPS if signal.getsignal(s) != signal.SIG_IGN}
        display = open_display(tc, p.step, p.seconds, enabled=not self.quiet and self.ctx.rank == 0)
        try:
            while stop_reason is None:
                batches = self.ctx.shard(self.sampler.batches(p.epoch))
                while p.batch < len(batches) and stop_reason is None:
                    group = [self.corpus.train.collate(ix) for ix in batches[p.batch: p.batch + tc.accumulate]]
                    nll, n_tokens, aligned = self._train_step(group)
                    p.step, p.batch, p.seconds = p.step + 1, p.batch + len(group), time.time() - start
                    p.target_tokens += n_tokens * self.ctx.world
                    window.add(nll, n_tokens * self.ctx.world)
                    lr = self.optimizer.param_groups[0]["lr"]
                    display.update(StepStatus(p.step, p.epoch, window.loss, lr, window.rate, p.seconds))
                    if p.step % tc.log_every == 0:
                        with self.ctx.first():  # (rank 0 writes: a full disk ends every rank with its line)
                            self._log({"step": p.step, "epoch": p.epoch, "loss": nll, "lr": lr,
                                       "tokens_per_s": window.rate, "seconds": round(p.seconds, 2)}
                                      | ({"alignment_loss": aligned} if aligned is not None else {}))
                    stop_reason = self._after_step()
                if p.batch >= len(batches):
                    p.epoch, p.batch = p.epoch + 1, 0
                    if p.epoch >= tc.max_epochs and stop_reason is None:
                        stop_reason = "max_epochs"  # (its last step evaluated already if it was due: saved only)
                        self._checkpoint(evaluate=p.step % tc.eval_every != 0)
        finally:
            display.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
        p.stop_reason = stop_reason
        self._finish(stop_reason)
        if self._stop_signal not in (None, signal.SIGINT):  # stopped at a checkpoint, as asked; the signal now goes
            signal.raise_signal(self._stop_signal)         # where it would have (the CLI: a line, then the end by it)
        return p

    def _limit_reached(self) -> str | None:
        tc, p = self.cfg.train, self.progress
        reached = {"max_steps": p.step >= tc.max_steps, "max_minutes": 0 < tc.max_minutes * 60 <= p.seconds,
                   "max_epochs": p.epoch >= tc.max_epochs, "early_stopping": 0 < tc.patience <= p.bad_evals}
        return next((reason for reason, hit in reached.items() if hit), None)

    def _after_step(self) -> str | None:
        tc, p = self.cfg.train, self.progress
        reason = self._limit_reached() or ("interrupted" if self._stop_signal is not None else None)
        reason = self.ctx.agree(reason)
        if reason == "interrupted":  # (a step due for evaluation evaluated first: a resume starts after it)
            self._checkpoint(evaluate=p.step % tc.eval_every == 0)
        elif reason is not None or p.step % tc.eval_every == 0:
            patience_over = self._checkpoint(evaluate=True)
            reason = reason or self.ctx.agree("early_stopping" if patience_over else None)
        return reason

    def _checkpoint(self, evaluate: bool) -> bool:
        """Evaluate (rank 0), keep best/last/averaging checkpoints; True when patience is exhausted."""
        tc, p = self.cfg.train, self.progress
        patience_over, improved = False, False
        rngs = self.ctx.gather(rng_state())
        with self.ctx.first() as mine:
            if mine and evaluate:
                scores = self.validate()
                improved = scores["valid_bleu"] > p.best_score
                p.best_score, p.best_step, p.bad_evals = (scores["valid_bleu"], p.step, 0) if improved else \
                    (p.best_score, p.best_step, p.bad_evals + 1)
                p.averaged = p.averaged and not improved  # the best is no longer an average once beaten
                patience_over = bool(tc.patience) and p.bad_evals >= tc.patience
                self._log({"step": p.step, "epoch": p.epoch, **scores, "best": improved})
                self._print(f"step {p.step}: valid nll {scores['valid_nll']:.3f}, BLEU {scores['valid_bleu']:.2f}"
                            f"{' (best)' if improved else ''}")
            if mine:  # the best published after the checkpoint that records it (_resume publishes it again if need be)
                self._save_state(rngs, for_averaging=evaluate)
                if improved:
                    self._save_model()
        return patience_over

    def _finish(self, reason: str | None) -> None:
        """Average the kept checkpoints (unless interrupted) and mark training finished in the checkpoint; an
        average that validates better is published after the checkpoint that records it, as any best weights."""
        p = self.progress
        rngs = self.ctx.gather(rng_state()) if reason != "interrupted" else []
        with self.ctx.first() as mine:
            if mine and reason != "interrupted":
                kept = kept_for_averaging(self.state_dir.manifest.averaging, self.cfg.train.average_last)
                average = self._validate_average(kept) if len(kept) > 1 else None
                p.finished = True
                self._save_state(rngs)
                if average is not None:
                    self._on_weights(average, self._save_model)
        if reason == "interrupted":
            self._print(f"interrupted at step {p.step}; run the same command again to resume")
        else:
            self._print(f"done ({reason}) at step {p.step}; best valid BLEU {p.best_score:.2f} at step {p.best_step}")
        release_run_dir(self.out_dir)  # (lock_run_dir: this process writes there no more)

    def _validate_average(self, kept: list[list]) -> dict[str, torch.Tensor] | None:
        """The average of the `kept` checkpoints ([step, weights file]) if it validates better (then the best:
        Progress.averaged), else None."""
        p, average = self.progress, self._average(kept)
        kept = len(kept)
        scores = self._on_weights(average, self.validate)
        better = scores["valid_bleu"] > p.best_score
        self._log({"step": p.step, "averaged": kept, **scores, "best": better})
        self._print(f"average of last {kept} checkpoints: BLEU {scores['valid_bleu']:.2f}"
                    f"{' (kept as model.safetensors)' if better else ' (not better; best kept)'}")
        if not better:
            return None
        p.best_score, p.best_step, p.averaged = scores["valid_bleu"], p.step, True
        return average

    def _average(self, kept: list[list]) -> dict[str, torch.Tensor]:
        """The mean of the `kept` checkpoints (frozen parameters left out: they stay bit-identical)."""
        tensors = [read_weights(self.state_dir.dir / name)[0] for _, name in kept]
        frozen = {name for name, p in self.model.named_parameters() if not p.requires_grad}
        return {k: sum(t[k].float() for t in tensors) / len(tensors) for k in tensors[0] if k not in frozen}

    def _on_weights(self, weights: dict[str, torch.Tensor], fn):
        """fn() run with `weights` in the model, whose own are then put back."""
        last = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(weights, strict=False)
        try:
            return fn()
        finally:
            self.model.load_state_dict(last)

    # ----------------------------------------------------------------------------------- helpers

    def _save_model(self) -> None:
        """config.yaml and model.safetensors (the best or averaged weights); with guided alignment, the layer and
        heads it taught stored as the model's alignment choice (xattn.analysis.choice)."""
        save_model_dir(self.out_dir, self.model, self.cfg, base=self.base)
        if self.guide is not None:
            save_guided(self.out_dir, self.guide.layer, self.guide.heads, self.guide.weight)

    def _on_signal(self, signum, frame) -> None:
        if self._stop_signal is not None:
            raise KeyboardInterrupt
        self._stop_signal = signum

    def _log(self, record: dict) -> None:
        if self.ctx.rank == 0:
            with (self.out_dir / LOG).open("a", encoding="utf-8") as f:
                f.write(json_text(record) + "\n")

    def _print(self, message: str) -> None:
        if self.ctx.rank == 0 and not self.quiet:
            echo(message)


def train(cfg: RunConfig, out_dir: str | Path, quiet: bool = False, factory: Factory | None = None,
          flags: dict[str, str] | None = None) -> Progress:
    """Train (or resume) a model directory; returns where training stopped. `factory`: the parts to train
    (default: those `xattn train` builds from the config); `flags`: {config key: the caller's flag for it},
    named in messages instead of the key."""
    try:  # (a refusal while the trainer is built leaves the process group, and the run directory, too)
        return Trainer(cfg, out_dir, quiet, factory, flags).fit()
    except BaseException:
        release_run_dir(Path(out_dir))
        raise
    finally:
        dist.teardown()

