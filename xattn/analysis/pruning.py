"""Head masks and physical pruning (Michel, Levy & Neubig 2019).

A head mask (model.HeadMask) scales each head's output before the heads are merged; a mask file says it
per place and layer, in YAML:

    cross: [[1, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1]]   # one list per layer, one factor per head in [0, 1]
    enc_self: [[1, 1, 1, 0], null, null]                 # null: that layer unmasked; places left out: unmasked

Pruning removes heads for good: `prune_model` shrinks each attention module (`prune_heads`: the query,
key, value and output projections and the score function's per-head parameters) and describes the result
in model.heads, so the smaller model saves, loads and translates like any other; its output equals the
model's under the mask with 0 on the removed heads. Layers and heads are numbered from 0.
"""
from __future__ import annotations

import copy
import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from xattn.checks import Check, read_record, validate, within
from xattn.config import ModelConfig
from xattn.errors import ParameterError, XattnError
from xattn.model import HeadMask, Transformer, layout_problem
from xattn.registry import PLACES
from xattn.shortlist import FILE as SHORTLIST

Removal = dict[str, list[list[int]]]
"""Per place, per layer: the heads to remove."""


def attention_module(model: Transformer, place: str, layer: int) -> torch.nn.Module:
    stack = model.encoder if place == "enc_self" else model.decoder
    return getattr(stack.layers[layer], "cross_attn" if place == "cross" else "self_attn")


@dataclass(frozen=True)
class MaskFile:
    """A head mask file: per place, one entry per layer, each a list of factors in [0, 1] (one per head) or
    null (that layer unmasked); a place left out is unmasked."""
    enc_self: list[list[float] | None] | None = None
    dec_self: list[list[float] | None] | None = None
    cross: list[list[float] | None] | None = None

    CHECKS: ClassVar[dict[str, Check]] = {place: within(0, 1) for place in PLACES}

    def __post_init__(self) -> None:
        validate(self, "")


def read_head_mask(path: str | Path, cfg: ModelConfig) -> HeadMask:
    """The head mask in the YAML file `path` (MaskFile), checked against the model's layers and heads."""
    from xattn.yamlfile import read_yaml

    path = Path(path)
    record = read_record(MaskFile, read_yaml(path), str(path))
    mask: HeadMask = {}
    for place in PLACES:
        layers = getattr(record, place)
        if layers is None:
            continue
        if problem := layout_problem(cfg, place, layers):
            raise XattnError(f"{path}: {problem}")
        mask[place] = [None if factors is None else torch.tensor(factors, dtype=torch.float32) for factors in layers]
    return mask


def removal_of_mask(mask: HeadMask, where: str) -> Removal:
    """The heads a 0/1 mask removes (its zeros); any other factor is an error naming `where`."""
    removal: Removal = {}
    for place, layers in mask.items():
        removal[place] = []
        for i, factors in enumerate(layers):
            values = [] if factors is None else factors.tolist()
            if any(v not in (0.0, 1.0) for v in values):
                raise XattnError(f"{where}: {place} layer {i}: pruning needs factors of 0 (remove) or 1 (keep)")
            removal[place].append([h for h, v in enumerate(values) if v == 0.0])
    return removal


def mask_of_removal(cfg: ModelConfig, removal: Removal) -> HeadMask:
    """The 0/1 head mask that zeroes the heads of `removal` (the masked equivalent of pruning them)."""
    mask: HeadMask = {}
    for place, layers in removal.items():
        mask[place] = []
        for i, heads in enumerate(layers):
            factors = torch.ones(cfg.heads_of(place, i))
            factors[list(heads)] = 0.0
            mask[place].append(factors)
    return mask


def prune_model(model: Transformer, removal: Removal) -> Transformer:
    """A copy of `model` without the heads of `removal`; its config's model.heads describes what is left."""
    cfg = model.cfg
    heads = {place: cfg.heads_per_layer(place) for place in PLACES}
    pruned = copy.deepcopy(model)
    for place, layers in removal.items():
        for i, remove in enumerate(layers):
            if bad := [h for h in remove if not 0 <= h < heads[place][i]]:
                raise XattnError(f"{place} layer {i} has no head {bad[0]} (heads 0 to {heads[place][i] - 1})")
            if remove:
                keep = [h for h in range(heads[place][i]) if h not in set(remove)]
                attention_module(pruned, place, i).prune_heads(keep)
                heads[place][i] = len(keep)
    pruned.cfg = dataclasses.replace(cfg, heads=heads)  # made canonical: unchanged places drop out
    return pruned


def prune_dir(model_dir: str | Path, removal: Removal, out_dir: str | Path) -> Transformer:
    """Write the pruned model of `model_dir` to `out_dir`: config, tokenizers, its shortlist and whole weights (a
    pruned child no longer fits its parent), and the stored alignment head choice with its heads renumbered, or
    dropped when it loses a head; a coverage penalty is set to 0 when no cross-attention head is left. Returns
    the pruned model."""
    from xattn.analysis import choice
    from xattn.checkpoint import copy_tokenizers, load_model_dir, save_model_dir
    from xattn.config import ParentConfig
    from xattn.io import atomic_dir

    model_dir, out = Path(model_dir), Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ParameterError("out_dir", f"{out} exists and is not empty; prune into a new directory")
    loaded = load_model_dir(model_dir)
    pruned = prune_model(loaded.model, removal)
    decode = loaded.config.decode
    if decode.coverage_penalty and not any(pruned.cfg.heads_per_layer("cross")):  # (no attention to cover by:
        decode = dataclasses.replace(decode, coverage_penalty=0.0)                  # every beam search refused)
    cfg = dataclasses.replace(loaded.config, model=pruned.cfg, parent=ParentConfig(), decode=decode)
    record = choice.stored(model_dir, loaded.model.cfg)
    with atomic_dir(out) as tmp:  # all or nothing
        copy_tokenizers(model_dir, tmp)
        if (model_dir / SHORTLIST).is_file():  # the same vocabularies and tokenizers: the lists still hold
            shutil.copyfile(model_dir / SHORTLIST, tmp / SHORTLIST)
        save_model_dir(tmp, pruned, cfg)
        if record is not None:
            layer = record.settings.choice.layer
            settings = remapped(record.settings, removal.get("cross"), loaded.model.cfg.heads_of("cross", layer))
            if settings is not None:  # the choice, not its score: that was measured on the unpruned weights
                kept = {k: v for k, v in record.figures.items() if k not in ("aer", "pairs", "gold")}
                choice.save(tmp, settings, kept)
    return pruned


def remapped(settings, removed: list[list[int]] | None, heads_before: int):
    """AlignSettings with its heads renumbered after removing `removed` (per layer) from the cross-attention;
    None when the choice loses a head (one it names, or any of the layer's `heads_before` when it takes their
    mean), since its stored AER was measured with that head."""
    gone = set(removed[settings.choice.layer]) if removed else set()
    chosen = set(settings.choice.heads) if settings.choice.heads is not None else set(range(heads_before))
    if not gone & chosen:
        return settings if not gone else dataclasses.replace(settings, choice=dataclasses.replace(
            settings.choice, heads=tuple(h - sum(g < h for g in gone) for h in settings.choice.heads)))
    return None


def least_important(cfg: ModelConfig, table: list[dict], places: list[str], fraction: float, where: str) -> Removal:
    """The round(fraction * heads) heads of `places` with the lowest scores in `table` (rows of
    importance.head_importance, which must cover exactly the model's heads), ranked together."""
    heads = {(p, i, h) for p in PLACES for i in range(cfg.layers_of(p)) for h in range(cfg.heads_of(p, i))}
    scored = {(r["place"], r["layer"], r["head"]): r["score"] for r in table}
    if set(scored) != heads:
        odd = sorted(set(scored) ^ heads)[0]
        raise XattnError(f"{where}: the table does not list this model's heads ({odd[0]} layer {odd[1]} head {odd[2]} "
                         f"{'is not in the model' if odd in scored else 'is missing'}); run `xattn heads importance` again")
    pool = sorted((score, key) for key, score in scored.items() if key[0] in places)
    removal: Removal = {p: [[] for _ in range(cfg.layers_of(p))] for p in places}
    for _, (place, layer, head) in pool[: round(fraction * len(pool))]:
        removal[place][layer].append(head)
    return removal
