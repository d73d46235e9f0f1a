"""Transfer to a new language by fine-tuning part of a parent model (Gheini, Ren & May 2021).

The parameter groups are `Transformer.parameter_groups()`: src (source embeddings, learned source positions),
tgt (target embeddings, the output projection, learned target positions), enc, dec and xattn (each decoder
layer's cross-attention and its LayerNorm). A strategy names the side whose language changes, which gets a
new vocabulary and fresh embeddings, and the groups that train besides; everything else keeps the parent's
weights, frozen.

(So far: the strategies and the parameter accounting. Loading a parent, new vocabularies, delta checkpoints
and composition come next.)
"""
from __future__ import annotations

from dataclasses import dataclass

from xattn.errors import XattnError
from xattn.model import Transformer

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
        raise XattnError(f"--strategy: unknown strategy {name!r}; one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def trainable_names(model: Transformer, strat: Strategy, side: str) -> frozenset[str]:
    """Parameter names (as model.named_parameters() gives them) that `strat` trains for a new `side`."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    groups = model.parameter_groups()
    return frozenset(name for group in strat.groups(side) for name in groups[group])


def parameter_table(model: Transformer, trainable: frozenset[str]) -> list[dict]:
    """Per group and in total: parameters that train, parameters in all, and the trained share (0 to 1).

    A parameter shared by two names (tied embeddings) counts once, under the group of the name PyTorch
    reports first, as in parameter_groups().
    """
    sizes = dict((name, p.numel()) for name, p in model.named_parameters())
    rows = []
    for group, names in model.parameter_groups().items():
        total = sum(sizes[n] for n in names)
        trained = sum(sizes[n] for n in names if n in trainable)
        rows.append({"group": group, "trained": trained, "total": total})
    all_total, all_trained = sum(r["total"] for r in rows), sum(r["trained"] for r in rows)
    rows.append({"group": "all", "trained": all_trained, "total": all_total})
    return [r | {"share": r["trained"] / r["total"] if r["total"] else 0.0} for r in rows]


def format_parameter_table(rows: list[dict]) -> list[str]:
    """The table `xattn finetune` prints before training."""
    lines = [f"{'group':<6} {'trained':>11} {'of':>11} {'share':>7}"]
    lines += [f"{r['group']:<6} {r['trained']:>11,} {r['total']:>11,} {100 * r['share']:>6.1f}%" for r in rows]
    return lines
