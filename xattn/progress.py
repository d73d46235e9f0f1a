"""How training reports progress: a bar on a terminal, one plain line per logged step anywhere else.

Progress is measured against the limit that binds: of `train.max_steps` and `train.max_minutes`, the one
the run will reach first at its pace so far (the time budget until the first step sets a pace, or the steps
when there is no time budget). A step budget with a time cap (the quickstart's 900 steps, at most 10
minutes) then reads as steps, and a time budget with a far ceiling of steps reads as time. Where stderr is
not a terminal (CI, a pipe, a log file) nothing is redrawn with carriage returns; every `train.log_every`
steps one line says where training stands:

    step 200  epoch 3  loss 2.345  lr 5.0e-04  4012 tok/s  1:02 elapsed, 0:58 left of the 2:00 budget
    step 200/900  epoch 3  loss 2.345  lr 5.0e-04  4012 tok/s  0:25 elapsed, about 1:28 left (cap 10:00)

Times count across resumes. Messages printed with `echo` go to stdout and leave a bar intact.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Protocol, TextIO

from tqdm import tqdm

from xattn.config import TrainConfig


def clock(seconds: float) -> str:
    """62 -> '1:02', 3725 -> '1:02:05'."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


@dataclass(frozen=True)
class StepStatus:
    """Where training stands after an optimizer step."""
    step: int
    epoch: int
    loss: float             # mean training NLL per token over the last steps
    lr: float
    tokens_per_s: float
    seconds: float          # wall time of the run so far, across resumes


@dataclass(frozen=True)
class Budget:
    """What a run is measured against: its step limit and its time budget, whichever binds."""
    max_steps: int
    seconds: float = 0.0    # 0: no time budget

    @classmethod
    def of(cls, tc: TrainConfig) -> Budget:
        return cls(tc.max_steps, tc.max_minutes * 60)

    @property
    def timed(self) -> bool:
        return self.seconds > 0

    def by_time(self, step: int, seconds: float) -> bool:
        """Whether the time budget ends the run before its step limit, at the pace so far."""
        return self.timed and (step == 0 or self.max_steps * seconds / step > self.seconds)

    def fraction(self, step: int, seconds: float) -> float:
        """How much of the run is done: of the two limits, the nearer one's share (0 to 1)."""
        return min(max(step / self.max_steps, seconds / self.seconds if self.timed else 0.0), 1.0)

    def steps(self, step: int, seconds: float) -> str:
        return f"step {step}" if self.by_time(step, seconds) else f"step {step}/{self.max_steps}"

    def left(self, step: int, seconds: float) -> float | None:
        """Seconds to go: exact under the time budget, else estimated from the pace so far (None before it)."""
        if self.by_time(step, seconds):
            return max(self.seconds - seconds, 0.0)
        return (self.max_steps - step) * seconds / step if step else None


def timing(s: StepStatus, budget: Budget, short: bool = False) -> str:
    """How long the run has taken and has to go, against the binding limit."""
    left = budget.left(s.step, s.seconds)
    if budget.by_time(s.step, s.seconds):
        return f"{clock(left)} left of {clock(budget.seconds)}" if short else \
            f"{clock(s.seconds)} elapsed, {clock(left)} left of the {clock(budget.seconds)} budget"
    cap = f" (cap {clock(budget.seconds)})" if budget.timed else ""
    estimate = f"about {clock(left)} left{cap}" if left is not None else ""
    return estimate if short else f"{clock(s.seconds)} elapsed" + (f", {estimate}" if estimate else "")


def line(s: StepStatus, budget: Budget) -> str:
    """The plain progress line of one logged step."""
    return (f"{budget.steps(s.step, s.seconds)}  epoch {s.epoch}  loss {s.loss:.3f}  lr {s.lr:.1e}  "
            f"{s.tokens_per_s:.0f} tok/s  {timing(s, budget)}")


def bar_text(s: StepStatus, budget: Budget) -> str:
    """What follows the bar: shorter than `line`, since the bar itself shows how much of the budget is used."""
    return (f"{budget.steps(s.step, s.seconds)}  loss {s.loss:.3f}  {s.tokens_per_s:.0f} tok/s  "
            f"{timing(s, budget, short=True)}").rstrip()


class Display(Protocol):
    def update(self, status: StepStatus) -> None: ...
    def close(self) -> None: ...


class NoDisplay:
    """Prints nothing: quiet runs and DDP ranks other than 0."""

    def update(self, status: StepStatus) -> None:
        pass

    def close(self) -> None:
        pass


class LineDisplay:
    """One line per logged step and no carriage returns, for CI logs, pipes and files."""

    def __init__(self, budget: Budget, log_every: int, stream: TextIO):
        self.budget, self.log_every, self.stream = budget, log_every, stream

    def update(self, status: StepStatus) -> None:
        if status.step % self.log_every == 0:
            self.stream.write(line(status, self.budget) + "\n")
            self.stream.flush()

    def close(self) -> None:
        pass


class BarDisplay:
    """A bar over the binding limit (Budget.fraction, in percent), redrawn in place on a terminal."""

    def __init__(self, budget: Budget, step: int, seconds: float, stream: TextIO):
        self.budget = budget
        self.bar = tqdm(total=100.0, initial=100 * budget.fraction(step, seconds), file=stream,
                        dynamic_ncols=True, bar_format="train {percentage:3.0f}%|{bar:12}| {desc}")

    def update(self, status: StepStatus) -> None:
        self.bar.set_description_str(bar_text(status, self.budget), refresh=False)
        self.bar.update(100 * self.budget.fraction(status.step, status.seconds) - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def open_display(tc: TrainConfig, step: int, seconds: float, enabled: bool = True,
                 stream: TextIO | None = None) -> Display:
    """The display for a run resuming at (`step`, `seconds`): a bar if `stream` (default stderr) is a terminal."""
    if not enabled:
        return NoDisplay()
    stream, budget = stream or sys.stderr, Budget.of(tc)
    if stream.isatty():
        return BarDisplay(budget, step, seconds, stream)
    return LineDisplay(budget, tc.log_every, stream)


def echo(message: str) -> None:
    """Print a message on stdout without breaking a bar; flushed, so it keeps its place in a merged log."""
    tqdm.write(message)
    sys.stdout.flush()


class RunningRate:
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
