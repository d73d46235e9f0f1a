"""Several training corpora with weights (OpenNMT-py's corpus weights, fairseq's `--upsample-primary`): the
`data.corpora` entries, and how many of each corpus' pairs an epoch draws.

Corpus 0 is the one `data.dataset` or `data.train_*` names; `data.corpora` lists more, each a mapping of `src`
and `tgt` (two line-aligned files) or `tsv`, optionally `links` (its word links, as data.train_links), and
either `upsample` or `weight` (corpus 0 takes data.upsample or data.weight):
  upsample F  an epoch draws F copies of the corpus: every pair floor(F) times, and a seeded sample of
              (F - floor(F)) of its pairs once more (another sample each epoch); 0.5 draws half of it.
  weight W    the corpus' share of an epoch, relative to the others' weights; an epoch draws as many pairs as
              the corpora hold together, round(total * W / sum of weights) of them from this corpus.
All corpora use the same one of the two (a corpus without the key counts 1); without either, an epoch draws
every pair once, as with one corpus. `xattn prepare` writes the corpora one after another into one prepared
directory; only the sampler (xattn.data.batching) reads the weights, so changing them prepares nothing again.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar

from xattn.checks import Check, ConfigError, build, validate, within

KINDS = ("upsample", "weight")


@dataclass(frozen=True)
class CorpusSpec:
    """One entry of data.corpora."""
    src: str | None = None              # source-language file, plain or .gz ...
    tgt: str | None = None              # ... and the target-language file, line-aligned
    tsv: str | None = None              # or one file of source<TAB>target lines
    links: str | None = None            # its word links, one line per pair (as data.train_links)
    upsample: float | None = None       # copies per epoch (fractions allowed)
    weight: float | None = None         # share of an epoch, relative to the other corpora's weights

    CHECKS: ClassVar[dict[str, Check]] = dict(upsample=within(0, lo_open=True), weight=within(0, lo_open=True))
    LOCATIONS: ClassVar[tuple[str, ...]] = ("src", "tgt", "tsv", "links")

    def key(self, k: int) -> str:
        return f"data.corpora[{k}]"


def specs(corpora: list) -> list[CorpusSpec]:
    """data.corpora as CorpusSpecs; an entry that is not a mapping, an unknown key (with the nearest), a value
    out of range, or an entry without its files is a ConfigError naming `data.corpora[k].key`."""
    out = []
    for k, entry in enumerate(corpora):
        where = f"data.corpora[{k}]"
        if not isinstance(entry, dict):
            raise ConfigError(where, f"expected a mapping such as {{src: a.de, tgt: a.en, upsample: 2}}, got {entry!r}")
        spec = build(CorpusSpec, entry, where)
        validate(spec, where)
        if bool(spec.src) != bool(spec.tgt) or bool(spec.src) == bool(spec.tsv):
            raise ConfigError(f"{where}.src", "give src and tgt (two line-aligned files) or tsv (one file)")
        out.append(spec)
    return out


def check_sources(data) -> None:
    """Each source of pairs of DataConfig `data` named once, so that none is silently left unread where pairs are
    read (DataConfig.require_pairs): files beside a dataset, a TSV beside src/tgt files, a folder for data that is
    not Multi30k."""
    files = [key for key in ("train_src", "train_tsv", "valid_src", "valid_tsv") if getattr(data, key)]
    if data.dataset is not None and files:  # the dataset would be read, the files silently not
        raise ConfigError(f"data.{files[0]}", f"names a file of your own, but data.dataset is {data.dataset}, "
                          "which would be read instead; set data.dataset=null to train on your files")
    for prefix in ("train", "valid"):
        if getattr(data, f"{prefix}_tsv") and getattr(data, f"{prefix}_src"):  # the TSV would silently win
            raise ConfigError(f"data.{prefix}_tsv", f"names the {'training' if prefix == 'train' else 'validation'} "
                              f"pairs, and so do data.{prefix}_src and data.{prefix}_tgt; give one")
    if data.data_dir is not None and data.dataset != "multi30k":
        raise ConfigError("data.data_dir", "only Multi30k is read from a folder; this data is "
                          f"{data.dataset or 'the files the config names'}")


def validates_on_training(data) -> bool:
    """Whether DataConfig `data` names its training files (or TSV) as its validation ones too."""
    def same(a: str | None, b: str | None) -> bool:
        return bool(a and b) and os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    return same(data.train_tsv, data.valid_tsv) or \
        same(data.train_src, data.valid_src) and same(data.train_tgt, data.valid_tgt)


def check(data) -> None:
    """The rules data.corpora, data.upsample and data.weight of DataConfig `data` follow (see the module)."""
    entries, seen = specs(data.corpora), set()
    for name, holder in [("data", data), *((f"data.corpora[{i}]", spec) for i, spec in enumerate(entries))]:
        kinds = {kind for kind in KINDS if getattr(holder, kind) is not None}
        if len(kinds) > 1 or kinds and seen and kinds != seen:  # named: the first corpus that mixes them
            raise ConfigError("data.weight" if name == "data" else name, "mixes upsample and weight; give every corpus "
                              "one kind (data.upsample or data.weight for the first)")
        seen = seen or kinds
    for kind in KINDS:
        if getattr(data, kind) is not None and not entries:
            raise ConfigError(f"data.{kind}", "weighs the training corpus against those of data.corpora, which lists "
                              "none")


Mixture = tuple[list[int], list[float]]
"""(the pairs of each corpus, the copies of each an epoch draws): what the sampler reads (TokenBatchSampler)."""


def mixture(data, counts: list[int]) -> Mixture | None:
    """The copies of each corpus an epoch of DataConfig `data` draws (see the module); `counts`: each corpus'
    pairs, as prepared (the manifest's `corpora`). None when every pair is drawn once."""
    entries = specs(data.corpora)
    kind = next((k for k in KINDS if getattr(data, k) is not None or any(getattr(s, k) is not None for s in entries)),
                None)
    if kind is None:
        return None
    values = [getattr(data, kind)] + [getattr(s, kind) for s in entries]
    values = [1.0 if v is None else float(v) for v in values]
    if len(values) != len(counts):
        raise ConfigError("data.corpora", f"lists {len(values) - 1} corpora besides the first, but the prepared "
                          f"directory holds {len(counts) - 1}")
    if kind == "weight":
        if empty := [i for i, (w, n) in enumerate(zip(values, counts)) if w > 0 and n == 0]:  # its share of every
            name = "data.weight" if empty[0] == 0 else f"data.corpora[{empty[0] - 1}]"        # epoch would be lost
            raise ConfigError(name, "no pair of this corpus is left after cleaning, so its weight would shrink every "
                              "epoch; remove it")
        total = sum(counts)
        values = [round(total * w / sum(values)) / n if n else 0.0 for w, n in zip(values, counts)]
    return list(counts), values


def summary(mix: Mixture) -> str:
    """One line on what an epoch draws from each corpus."""
    drawn = draws(*mix)
    return "corpora: " + ", ".join(f"{d} of {n} pairs ({f:.3g}x)" for n, f, d in zip(*mix, drawn)) + \
        f" per epoch, {sum(drawn)} in all"


def copies(n: int, factor: float) -> tuple[int, int]:
    """(every pair's copies, pairs drawn once more) of a corpus of `n` pairs an epoch draws `factor` times."""
    whole = math.floor(factor)
    return whole, round((factor - whole) * n)


def draws(counts: list[int], factors: list[float]) -> list[int]:
    """How many pairs an epoch draws from each corpus."""
    return [whole * n + extra for n, f in zip(counts, factors) for whole, extra in [copies(n, f)]]


def identity(data: dict[str, Any]) -> dict[str, Any]:
    """A DataConfig's fields (as data) without the corpora's files, for a run's identity: their content is in
    the corpus fingerprint, and a resumed run may move them."""
    if data.get("corpora"):
        data = data | {"corpora": [{k: v for k, v in c.items() if k not in CorpusSpec.LOCATIONS}
                                   for c in data["corpora"] if isinstance(c, dict)]}
    return data
