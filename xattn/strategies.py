"""Transfer strategies (Gheini, Ren & May 2021), without torch: which parameter groups a fine-tuned child trains
(xattn/transfer.py trains them; the command line lists them)."""
from __future__ import annotations

from dataclasses import dataclass

from xattn.errors import ParameterError

SIDES = ("src", "tgt")
GROUPS = ("src", "tgt", "enc", "dec", "xattn")


@dataclass(frozen=True)
class Strategy:
    """What a child trains: the new side's embeddings plus `body` groups; `reinit` groups start random."""
    name: str
    side: str | None               # "src" or "tgt": the side whose language changes; None: decided by the data
    body: tuple[str, ...] = ()     # groups trained besides the new side's embeddings
    reinit: tuple[str, ...] = ()   # groups re-initialised at random before training
    from_parent: bool = True       # False: nothing comes from the parent (training from scratch)

    def groups(self, side: str) -> tuple[str, ...]:
        """The groups that train when `side` is the one whose language changes."""
        return GROUPS if not self.from_parent else (side, *self.body)


def _strategies() -> dict[str, Strategy]:
    table = {"scratch": Strategy("scratch", None, from_parent=False)}
    for side in SIDES:
        table[side] = Strategy(side, side)
        table[f"{side}+body"] = Strategy(f"{side}+body", side, ("enc", "dec", "xattn"))
        table[f"{side}+xattn"] = Strategy(f"{side}+xattn", side, ("xattn",))
        table[f"{side}+randxattn"] = Strategy(f"{side}+randxattn", side, ("xattn",), reinit=("xattn",))
    return table


STRATEGIES = _strategies()
"""scratch; src / tgt (the new embeddings only); src+body / tgt+body (ordinary fine-tuning); src+xattn /
tgt+xattn (new embeddings and cross-attention); src+randxattn / tgt+randxattn (the same, cross-attention
re-initialised)."""


def strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ParameterError("strategy", f"unknown strategy {name!r}; one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
