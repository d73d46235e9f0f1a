"""Training: label-smoothed cross-entropy, AdamW with inverse-square-root warmup, mixed precision,
validation loss and BLEU, early stopping, atomic checkpoints, exact resume, checkpoint averaging, DDP.

A run writes into one model directory (see checkpoint.py). `train_state/` holds what resuming needs:
the last weights, optimizer, schedule position, RNG states and data position; running the same
command again continues from there, and the loss curve continues as if never interrupted.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from xattn import distributed as dist
from xattn.checkpoint import load_weights, save_model_dir, save_weights
from xattn.config import DecodeConfig, RunConfig, TrainConfig
from xattn.corpus import Corpus, prepare_corpus
from xattn.data import Batch, TokenBatchSampler
from xattn.devices import amp_dtype, resolve_device
from xattn.errors import XattnError
from xattn.evaluation import bleu
from xattn.io import atomic_write, atomic_write_text
from xattn.model import Transformer
from xattn.progress import StepStatus, echo, open_display

STATE_DIR = "train_state"
LOG = "log.jsonl"


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, T, V), target (B, T) -> (smoothed loss, NLL), both summed over non-pad tokens.

    The smoothed loss is (1 - eps) * NLL + eps * mean over the vocabulary of -log p, as in
    `F.cross_entropy(label_smoothing=eps)`; one log-softmax serves both figures.
    """
    lprobs = logits.float().log_softmax(dim=-1).flatten(0, 1)  # (B*T, V)
    target = target.flatten()
    keep = target.ne(pad_id).float()  # (B*T,)
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1) * keep
    smooth = -lprobs.mean(dim=-1) * keep
    return ((1.0 - smoothing) * nll + smoothing * smooth).sum(), nll.sum().detach()


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """Linear warmup to `peak` over `warmup` steps, then peak * sqrt(warmup / step) (Vaswani et al. 2017)."""
    step = max(step, 1)
    return peak * min(step / max(warmup, 1), math.sqrt(max(warmup, 1) / step))


@dataclass
class Progress:
    """Where training stands; saved with every checkpoint so a run can resume exactly."""
    step: int = 0
    epoch: int = 0
    batch: int = 0                      # next batch of this epoch (this rank's share)
    best_score: float = -math.inf
    best_step: int = 0
    bad_evals: int = 0
    checkpoints: list[int] = field(default_factory=list)   # steps with a kept checkpoint (averaging)
    target_tokens: int = 0
    seconds: float = 0.0
    stop_reason: str | None = None      # why the last fit() ended


class Trainer:
    """Trains a Transformer as configured by a RunConfig into a model directory."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path, quiet: bool = False):
        self.out_dir, self.quiet = Path(out_dir), quiet
        self.ctx = dist.setup(cfg.train.device)
        self.device = self.ctx.device if self.ctx.world > 1 else resolve_device(cfg.train.device)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.corpus: Corpus = prepare_corpus(cfg.data, self.out_dir, self.ctx)
        stats = self.corpus.stats
        self._print(f"corpus: {len(self.corpus.train)} training pairs (dropped: {stats.empty} empty, "
                    f"{stats.too_long} longer than {cfg.data.max_len} tokens, {stats.ratio} over length ratio "
                    f"{cfg.data.max_ratio:g}), {len(self.corpus.valid)} validation pairs")
        tok = self.corpus.tokenizers
        model_cfg = dataclasses.replace(cfg.model, src_vocab_size=tok.src.vocab_size, tgt_vocab_size=tok.tgt.vocab_size)
        self.cfg = dataclasses.replace(cfg, model=model_cfg)
        tc: TrainConfig = self.cfg.train
        torch.manual_seed(tc.seed)
        self.model = Transformer(model_cfg).to(self.device)
        self.ddp_model = self.ctx.wrap(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=tc.lr, betas=tc.betas,
                                           weight_decay=tc.weight_decay)
        self.amp = amp_dtype(tc.amp, self.device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp == torch.float16)
        self.sampler = TokenBatchSampler(self.corpus.train.src_lengths(), self.corpus.train.tgt_lengths(),
                                         tc.max_tokens, shuffle=True, seed=tc.seed)
        self.progress = Progress()
        self._stop_signal = False
        first = self.sampler.batches(0)
        self._print(f"batches: {len(first)} per epoch of at most {tc.max_tokens} tokens, "
                    f"{100 * self.sampler.padding_fraction(first):.1f}% padding")
        self._maybe_resume()

    # ------------------------------------------------------------------------------------ resume

    def _state_dir(self) -> Path:
        return self.out_dir / STATE_DIR

    def _save_state(self) -> None:
        """Write last weights, optimizer, RNG and progress atomically (rank 0 only)."""
        state_dir = self._state_dir()
        save_weights(self.model, state_dir / "last.safetensors")
        state = {
            "progress": dataclasses.asdict(self.progress),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
            "config": self.cfg.to_dict(),
        }
        atomic_write(state_dir / "state.pt", lambda tmp: torch.save(state, tmp))

    def _maybe_resume(self) -> None:
        path = self._state_dir() / "state.pt"
        if not path.is_file():
            return
        state = torch.load(path, map_location="cpu", weights_only=False)
        if state["config"]["model"] != self.cfg.to_dict()["model"]:
            raise XattnError(f"{self.out_dir}: holds a run with a different model config; "
                             "use another output directory or delete it")
        load_weights(self.model, self._state_dir() / "last.safetensors")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(**state["progress"])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        if rng["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self._print(f"resuming {self.out_dir} at step {self.progress.step} (epoch {self.progress.epoch})")

    # ------------------------------------------------------------------------------------- steps

    def _train_step(self, batches: list[Batch]) -> tuple[float, int]:
        """One optimizer step over `batches` (gradient accumulation) -> (mean NLL per token, target tokens)."""
        tc, model = self.cfg.train, self.ddp_model
        model.train()
        n_tokens = sum(b.n_tgt_tokens for b in batches)
        total_nll = 0.0
        for i, batch in enumerate(batches):
            batch = batch.to(self.device)
            with self.ctx.no_sync(model, last=i == len(batches) - 1), self._autocast():
                logits = model(batch.src, batch.tgt_in).logits
                loss, nll = label_smoothed_loss(logits, batch.tgt_out, self.cfg.model.pad_id, tc.label_smoothing)
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
        return total_nll / max(n_tokens, 1), n_tokens

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None)

    # ---------------------------------------------------------------------------------- validate

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation NLL per token, perplexity and BLEU (greedy) of the current weights."""
        from xattn.translator import Translator

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
        """Train until max_steps, max_epochs, max_minutes, early stopping or an interrupt."""
        tc, p = self.cfg.train, self.progress
        window = _Window()
        start = time.time() - p.seconds
        stop_reason = self._limit_reached()
        if stop_reason is not None:
            self._print(f"{self.out_dir}: already trained to {stop_reason} (step {p.step}); raise the limit to go on")
            p.stop_reason = stop_reason
            return p
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        display = open_display(tc, p.step, p.seconds, enabled=not self.quiet and self.ctx.rank == 0)
        try:
            while stop_reason is None:
                batches = self.ctx.shard(self.sampler.batches(p.epoch))
                while p.batch < len(batches) and stop_reason is None:
                    group = [self.corpus.train.collate(ix) for ix in batches[p.batch: p.batch + tc.accumulate]]
                    nll, n_tokens = self._train_step(group)
                    p.step, p.batch = p.step + 1, p.batch + len(group)
                    p.target_tokens += n_tokens * self.ctx.world
                    p.seconds = time.time() - start
                    window.add(nll, n_tokens * self.ctx.world)
                    lr = self.optimizer.param_groups[0]["lr"]
                    display.update(StepStatus(p.step, p.epoch, window.loss, lr, window.rate, p.seconds))
                    if p.step % tc.log_every == 0:
                        self._log({"step": p.step, "epoch": p.epoch, "loss": nll, "lr": lr,
                                   "tokens_per_s": window.rate, "seconds": round(p.seconds, 2)})
                    stop_reason = self._after_step()
                if p.batch >= len(batches):
                    p.epoch, p.batch = p.epoch + 1, 0
                    if p.epoch >= tc.max_epochs and stop_reason is None:
                        stop_reason = "max_epochs"
                        self._checkpoint(evaluate=True)
        finally:
            display.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
        p.stop_reason = stop_reason
        self._finish(stop_reason)
        return p

    def _limit_reached(self) -> str | None:
        tc, p = self.cfg.train, self.progress
        if p.step >= tc.max_steps:
            return "max_steps"
        if tc.max_minutes and p.seconds >= tc.max_minutes * 60:
            return "max_minutes"
        if p.epoch >= tc.max_epochs:
            return "max_epochs"
        return None

    def _after_step(self) -> str | None:
        tc, p = self.cfg.train, self.progress
        reason = self._limit_reached() or ("interrupted" if self._stop_signal else None)
        reason = self.ctx.agree(reason)
        if reason == "interrupted":
            self._checkpoint(evaluate=False)
        elif reason is not None or p.step % tc.eval_every == 0:
            patience_over = self._checkpoint(evaluate=True)
            reason = reason or self.ctx.agree("early_stopping" if patience_over else None)
        return reason

    def _checkpoint(self, evaluate: bool) -> bool:
        """Evaluate (rank 0), keep best/last/averaging checkpoints; True when patience is exhausted."""
        tc, p = self.cfg.train, self.progress
        patience_over = False
        if self.ctx.rank == 0:
            if evaluate:
                scores = self.validate()
                improved = scores["valid_bleu"] > p.best_score
                if improved:
                    p.best_score, p.best_step, p.bad_evals = scores["valid_bleu"], p.step, 0
                    save_model_dir(self.out_dir, self.model, self.cfg)
                else:
                    p.bad_evals += 1
                patience_over = bool(tc.patience) and p.bad_evals >= tc.patience
                self._log({"step": p.step, "epoch": p.epoch, **scores, "best": improved})
                self._print(f"step {p.step}: valid nll {scores['valid_nll']:.3f}, BLEU {scores['valid_bleu']:.2f}"
                            f"{' (best)' if improved else ''}")
                if tc.average_last:
                    self._keep_for_averaging()
            self._save_state()
        self.ctx.barrier()
        return patience_over

    def _keep_for_averaging(self) -> None:
        p, keep = self.progress, self.cfg.train.average_last
        save_weights(self.model, self._state_dir() / f"ckpt-{p.step}.safetensors")
        p.checkpoints = [s for s in p.checkpoints if s != p.step] + [p.step]
        for old in p.checkpoints[:-keep]:
            (self._state_dir() / f"ckpt-{old}.safetensors").unlink(missing_ok=True)
        p.checkpoints = p.checkpoints[-keep:]

    def _finish(self, reason: str | None) -> None:
        p = self.progress
        if self.ctx.rank == 0 and reason != "interrupted" and len(p.checkpoints) > 1:
            self._average_checkpoints()
        if reason == "interrupted":
            self._print(f"interrupted at step {p.step}; run the same command again to resume")
        else:
            self._print(f"done ({reason}) at step {p.step}; best valid BLEU {p.best_score:.2f} at step {p.best_step}")
        self.ctx.barrier()

    def _average_checkpoints(self) -> None:
        """Average the kept checkpoints; keep the average as model.safetensors if it validates better."""
        from safetensors.torch import load_file

        p = self.progress
        files = [self._state_dir() / f"ckpt-{s}.safetensors" for s in p.checkpoints]
        tensors = [load_file(str(f)) for f in files]
        averaged = {k: sum(t[k].float() for t in tensors) / len(tensors) for k in tensors[0]}
        last = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(averaged, strict=False)
        scores = self.validate()
        better = scores["valid_bleu"] > p.best_score
        self._log({"step": p.step, "averaged": len(files), **scores, "best": better})
        self._print(f"average of last {len(files)} checkpoints: BLEU {scores['valid_bleu']:.2f}"
                    f"{' (kept as model.safetensors)' if better else ' (not better; best kept)'}")
        if better:
            p.best_score, p.best_step = scores["valid_bleu"], p.step
            save_model_dir(self.out_dir, self.model, self.cfg)
        self.model.load_state_dict(last)
        self._save_state()

    # ----------------------------------------------------------------------------------- helpers

    def _on_signal(self, signum, frame) -> None:
        if self._stop_signal:
            raise KeyboardInterrupt
        self._stop_signal = True

    def _log(self, record: dict) -> None:
        if self.ctx.rank != 0:
            return
        path = self.out_dir / LOG
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def _print(self, message: str) -> None:
        if self.ctx.rank == 0 and not self.quiet:
            echo(message)


class _Window:
    """Running loss and tokens/s over the last few steps, for the progress display."""

    def __init__(self, size: int = 50):
        self.items: list[tuple[float, int, float]] = []
        self.size = size

    def add(self, nll: float, tokens: int) -> None:
        self.items = (self.items + [(nll, tokens, time.time())])[-self.size:]

    @property
    def loss(self) -> float:
        return sum(n for n, _, _ in self.items) / len(self.items)

    @property
    def rate(self) -> float:
        if len(self.items) < 2:
            return 0.0
        return sum(t for _, t, _ in self.items[1:]) / max(self.items[-1][2] - self.items[0][2], 1e-9)


def train(cfg: RunConfig, out_dir: str | Path, quiet: bool = False) -> Progress:
    """Train (or resume) a model directory; returns where training stopped."""
    trainer = Trainer(cfg, out_dir, quiet)
    try:
        return trainer.fit()
    finally:
        dist.teardown()
