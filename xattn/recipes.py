"""What a run trains, made outside the Trainer: the corpus, the model and which of its parameters train.

`xattn train` builds its parts from the config (`from_config`); `xattn finetune` from a parent model
(`xattn.transfer.child_factory`). The Trainer only trains what it is handed.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from xattn import distributed as dist
from xattn.config import RunConfig
from xattn.corpus import Corpus, prepare_corpus
from xattn.errors import XattnError
from xattn.losses import GuidedAlignment
from xattn.model import Transformer


@dataclass
class RunParts:
    """What a run trains, made outside the Trainer by a factory (`from_config` for `xattn train`), so that
    another recipe (fine-tuning a parent) can hand in its own model, corpus and trainable parameters."""
    cfg: RunConfig                         # with the vocabulary sizes of the corpus' tokenizers
    corpus: Corpus
    model: Transformer                     # initialised (seeded), on the CPU
    trainable: frozenset[str] | None = None  # parameter names (model.named_parameters()) to train; None: all
    identity: dict = field(default_factory=dict)  # more of the run's identity (a resume must match it too)
    base: dict[str, torch.Tensor] | None = None  # the full weights of cfg.parent: save only what differs


Factory = Callable[["dist.Context", bool], RunParts]
"""(distributed context, whether the run is new) -> RunParts; a resumed run keeps its tokenizers."""


def from_config(cfg: RunConfig, out_dir: str | Path) -> Factory:
    """The parts of `xattn train`: the corpus the config names (tokenizers trained for a new run) and a
    freshly initialised Transformer of the config's shape, every parameter trained."""
    if cfg.parent.named:
        raise XattnError("parent: only a fine-tuned child names a parent (fine-tuning writes it); remove the "
                         "parent section to train a model of its own")
    if cfg.alignment.on:  # before the corpus is prepared
        cfg.alignment.resolve(cfg.model)

    def build(ctx: dist.Context, new: bool) -> RunParts:
        corpus = prepare_corpus(cfg.data, Path(out_dir), ctx, new_tokenizers=new)
        tok = corpus.tokenizers
        model_cfg = dataclasses.replace(cfg.model, src_vocab_size=tok.src.vocab_size, tgt_vocab_size=tok.tgt.vocab_size,
                                        length_ratio=cfg.model.length_ratio or length_ratio(cfg.model, corpus))
        torch.manual_seed(cfg.train.seed)
        return RunParts(dataclasses.replace(cfg, model=model_cfg), corpus, Transformer(model_cfg))
    return build


def length_ratio(cfg, corpus: Corpus) -> float | None:
    """Source over target tokens in the training data, which hard-coded (gaussian) cross-attention centres
    its heads by; None when no cross-attention is hard-coded."""
    if not any(cfg.variant("cross", i) == "gaussian" for i in range(cfg.n_decoder_layers)):
        return None
    src, tgt = (int(lengths.sum(dtype="int64")) for lengths in (corpus.train.src_lengths(), corpus.train.tgt_lengths()))
    return round(src / max(1, tgt), 4)


def freeze(model: Transformer, trainable: frozenset[str] | None) -> list[torch.nn.Parameter]:
    """Parameters named in `trainable` (all when None) train; the others get requires_grad=False.
    Returns the trained ones. A name that is not a parameter of the model is an error (a recipe's mistake)."""
    names = dict(model.named_parameters())
    if trainable is not None and (unknown := sorted(set(trainable) - set(names))):
        raise ValueError(f"trainable names that are not parameters of the model: {', '.join(unknown[:5])}")
    for name, p in names.items():
        p.requires_grad_(trainable is None or name in trainable)
    return [p for p in names.values() if p.requires_grad]


def guided_alignment(cfg: RunConfig, corpus: Corpus, say: Callable[[str], None]) -> GuidedAlignment | None:
    """The guided-alignment term of a run's alignment section (None when it is off), checked against its model
    and training corpus; `say` reports what learns the links."""
    ac = cfg.alignment
    if not ac.on:
        return None
    layer, heads = ac.resolve(cfg.model)
    train = corpus.train
    if not train.has_links:
        raise XattnError(f"alignment.weight: {ac.weight:g}, but the training corpus ({train.folder}) has no "
                         "alignment links; set data.train_links to a Pharaoh file line-aligned with the pairs")
    which = "mean of heads" if heads is None else "head " + ",".join(map(str, heads))
    say(f"alignment: layer {layer}, {which}, learns the links of {train.manifest['links']['pairs']} pairs "
        f"(weight {ac.weight:g})")
    return GuidedAlignment(layer, heads, ac.weight)
