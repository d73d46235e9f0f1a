"""Transfer to a new language by fine-tuning part of a parent model (Gheini, Ren & May 2021).

The parameter groups are `Transformer.parameter_groups()`: src (source embeddings, learned source positions),
tgt (target embeddings, the output projection, learned target positions), enc, dec and xattn (each decoder
layer's cross-attention and its LayerNorm). A strategy names the side whose language changes, which gets a
new vocabulary and fresh embeddings, and the groups that train besides; everything else keeps the parent's
weights, frozen.

`child_factory` builds a child run for the Trainer: the parent's tokenizer on the shared side, a new one
trained on the child's data on the other, the parent's weights everywhere but the new side's embeddings.
The child's model directory stores a delta (only the tensors that differ from the parent's, that is what
its strategy trained) and names its parent in config.yaml (`parent:`, see xattn.checkpoint), unless it
is asked to store its weights whole.
"""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import torch

from xattn.config import DataConfig, ParentConfig, RunConfig
from xattn.errors import ParameterError, XattnError
from xattn.model import Transformer
from xattn.strategies import GROUPS, SIDES, Strategy


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


# ---------------------------------------------------------------------------------------- a child run

def changed_side(parent: RunConfig, child: RunConfig) -> str:
    """"src" or "tgt": the one side whose language the child changes; anything else is an error."""
    p, c = (parent.data.src_lang, parent.data.tgt_lang), (child.data.src_lang, child.data.tgt_lang)
    changed = [side for side, a, b in zip(SIDES, p, c) if a != b]
    if len(changed) != 1:
        raise XattnError(f"the parent translates {p[0]}->{p[1]} and the child {c[0]}->{c[1]}: transfer changes the "
                         "language of exactly one side (data.src_lang or data.tgt_lang)")
    return changed[0]


def check_overrides(overrides: list[str]) -> None:
    """Refuse `section.key=value` overrides that a child would silently ignore: its model section is its
    parent's (the new side's vocabulary size aside), its parent section comes from --parent, and its two
    vocabularies are separate."""
    from xattn.checks import _coerce

    for item in overrides:
        key, _, value = (part.strip() for part in item.partition("="))
        if key == "model" or key.startswith("model."):
            raise XattnError(f"override {item!r}: a child has its parent's model section (its shape); drop the "
                             "override")
        if key == "parent" or key.startswith("parent."):
            raise XattnError(f"override {item!r}: a child's parent section is written from its parent model; drop "
                             "the override")
        if key == "data.joint_vocab" and _coerce(value, bool, key):  # (read as the config reads it: 0, no, off)
            raise XattnError(f"override {item!r}: a child's source and target vocabularies are always separate")


def check_child_file(path: Path) -> None:
    """Refuse, in a child's own config file, what check_overrides refuses as an override: the file's model and
    parent sections and a joint vocabulary would be silently replaced. A packaged preset's model section is its
    template for new models, not a wish for the child, and is left alone."""
    from xattn.checks import _coerce
    from xattn.presets import PRESET_DIR
    from xattn.yamlfile import read_yaml

    if path.resolve().parent == PRESET_DIR.resolve():
        return
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        return  # load_config names what is wrong with it
    if raw.get("model"):
        raise XattnError(f"{path}: model: a child has its parent's model section (its shape); drop it from the file")
    if raw.get("parent"):
        raise XattnError(f"{path}: parent: a child's parent section is written from its parent model; drop it from "
                         "the file")
    if isinstance(raw.get("data"), dict) and _coerce(raw["data"].get("joint_vocab", False), bool,
                                                     f"{path}: data.joint_vocab"):
        raise XattnError(f"{path}: data.joint_vocab: a child's source and target vocabularies are always separate")


def child_factory(parent_dir: str | Path, strat: Strategy, cfg: RunConfig, out_dir: str | Path, full: bool = False):
    """A Trainer factory (xattn.training.Factory) for a child of the model directory `parent_dir`.

    The child has the parent's shape (its config's model section is the parent's, with the new side's
    vocabulary size), the parent's tokenizer on the shared side, and the parent's weights in every group
    but the new side's (and `strat.reinit`); `strat` decides what trains. The strategy and the parent's
    weights are part of the run's identity, so a resume checks both. The child names its parent in
    `parent:` and stores a delta against it, or (`full`, and always for `scratch`) its whole weights.
    """
    from xattn.checkpoint import load_model_dir, parent_link, tensors_digest, tokenizer_hashes, weights_of
    from xattn.corpus import prepare_corpus
    from xattn.recipes import RunParts, length_ratio
    from xattn.tokenizer import vocab_file

    if Path(out_dir).resolve() == Path(parent_dir).resolve():
        raise ParameterError("out_dir", f"{out_dir} is the parent; a child trains into a directory of its own")
    parent = load_model_dir(parent_dir)
    side = changed_side(parent.config, cfg)
    if cfg.alignment.on:  # the child has the parent's layers and heads
        cfg.alignment.resolve(parent.config.model)
    if strat.side is not None and strat.side != side:
        raise ParameterError("strategy", f"{strat.name} changes the {strat.side} side, but the child changes the "
                         f"{side} language ({parent.config.data.src_lang}->{parent.config.data.tgt_lang} to "
                         f"{cfg.data.src_lang}->{cfg.data.tgt_lang}); use {side}{strat.name[3:]}")
    if parent.config.model.share_embeddings or parent.tokenizers.joint:
        raise XattnError(f"{parent_dir}: the parent shares one vocabulary between source and target, so one side's "
                         "cannot be replaced; train the parent with data.joint_vocab=false "
                         "model.share_embeddings=false")
    kept = "tgt" if side == "src" else "src"
    inherit = {kept: getattr(parent.tokenizers, kept).path}
    if (table := vocab_file(inherit[kept])).is_file():  # (the corpus takes the .model alone: other ids, silently)
        raise XattnError(f"{parent_dir}: its {kept} tokenizer numbers its pieces by a table of its own "
                         f"({table.name}, as an imported model's does), which a child's corpus does not carry; "
                         "fine-tune a parent trained with xattn")
    data = dataclasses.replace(cfg.data, joint_vocab=False)
    parent_tensors = weights_of(parent.model)
    digest = tensors_digest(parent_tensors)
    identity = {"transfer": {"strategy": strat.name, "side": side, "parent": digest,
                             "parent_tokenizers": tokenizer_hashes(Path(parent_dir))}}
    if full:  # a run's weights are stored one way throughout (named only here, so delta runs keep their identity)
        identity["transfer"]["full"] = True
    link = parent_link(Path(out_dir), Path(parent_dir), digest, delta=not full) if strat.from_parent else ParentConfig()
    base = parent_tensors if link.needed else None

    def build(ctx, new: bool) -> RunParts:
        corpus = prepare_corpus(data, Path(out_dir), ctx, new_tokenizers=new, inherit=inherit)
        tok = corpus.tokenizers
        ratio = length_ratio(parent.config.model, corpus)  # hard-coded cross-attention: the child's own tokens
        model_cfg = dataclasses.replace(parent.config.model, src_vocab_size=tok.src.vocab_size,
                                        tgt_vocab_size=tok.tgt.vocab_size,
                                        length_ratio=ratio if ratio is not None else parent.config.model.length_ratio)
        torch.manual_seed(cfg.train.seed)
        model = Transformer(model_cfg)
        if strat.from_parent:
            inherit_weights(model, parent_tensors, fresh=(side, *strat.reinit))
        trainable = trainable_names(model, strat, side)
        child_cfg = dataclasses.replace(cfg, model=model_cfg, data=data, parent=link)
        return RunParts(child_cfg, corpus, model, trainable, identity, base)
    build.data = data  # what the child trains on, which a resume checks before preparing it
    return build


def inherit_weights(model: Transformer, parent: dict[str, torch.Tensor], fresh: tuple[str, ...]) -> None:
    """Copy the parent's tensors into `model`, except the parameters of the `fresh` groups, which keep their
    random initialisation. What is copied must be exactly the model's other parameters, shape for shape."""
    state = model.state_dict()  # parameters and persistent buffers (a hard-coded head's centres)
    named = dict(model.named_parameters()) | {n: b for n, b in model.named_buffers() if n in state}
    wanted = {name: p for name, p in named.items() if model.group_of(name) not in fresh}
    missing = sorted(set(wanted) - set(parent))
    if missing:
        raise XattnError(f"the parent lacks parameters the child takes from it: {', '.join(missing[:5])}")
    with torch.no_grad():
        for name, p in wanted.items():
            if parent[name].shape != p.shape:
                raise XattnError(f"the parent's {name} has shape {tuple(parent[name].shape)}, the child's "
                                 f"{tuple(p.shape)}")
            p.copy_(parent[name])


# --------------------------------------------------------------------------------------- composition

PARTS = {"base": GROUPS, "encoder": ("src", "enc"), "decoder": ("xattn", "dec", "tgt"), "src_embeddings": ("src",),
         "tgt_embeddings": ("tgt",)}
"""What each part of `compose` gives: a base model everything, an encoder side the source embeddings and the
encoder, a decoder side the cross-attention, the decoder and the target embeddings; later parts win."""


def compose(out_dir: str | Path, full: bool = False, *, base: str | Path | None = None,
            encoder: str | Path | None = None, decoder: str | Path | None = None,
            src_embeddings: str | Path | None = None, tgt_embeddings: str | Path | None = None) -> RunConfig:
    """Build a model directory from parts of models that share a parent (each a model directory or None; what
    each gives: PARTS), e.g. compose(out, base=child, src_embeddings=parent) or compose(out, encoder=de_en,
    decoder=fr_cs). The result names the shared parent and stores what differs from it (or, `full` or when
    the parent is not at hand, its whole weights). Returns its config."""
    parts = {"base": base, "encoder": encoder, "decoder": decoder, "src_embeddings": src_embeddings,
             "tgt_embeddings": tgt_embeddings}
    from xattn.checkpoint import (CONFIG, WEIGHTS, apply_weights, copy_tokenizers, parent_link, read_model,
                                  save_model_dir, tensors_digest, weights_of)
    from xattn.io import atomic_dir
    from xattn.tokenizer import SRC_MODEL, TGT_MODEL

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ParameterError("out_dir", f"{out} exists and is not empty; compose into a new directory")
    source: dict[str, Path] = {}
    for part, groups in PARTS.items():
        if parts.get(part) is not None:
            source.update((group, Path(parts[part])) for group in groups)
    if missing := [g for g in GROUPS if g not in source]:
        raise XattnError(f"no part gives the {', '.join(missing)} parameters; name a base model, or both an "
                         "encoder and a decoder model")
    if base is not None and Path(base) not in source.values():
        raise XattnError(f"{base}: the base model gives no part, since the other models give all of them; leave "
                         "it out")
    if len(set(source.values())) == 1:
        raise XattnError(f"every part comes from {source['src']}; there is nothing to compose")
    models = {path: read_model(path) for path in dict.fromkeys(source.values())}
    digest, root = _common_parent(models)
    src_cfg, tgt_cfg = models[source["src"]][0], models[source["tgt"]][0]
    model_cfg = dataclasses.replace(tgt_cfg.model, src_vocab_size=src_cfg.model.src_vocab_size)
    model = Transformer(model_cfg)
    tensors = {name: models[source[model.group_of(name)]][1][name] for name in weights_of(model)}  # buffers too
    apply_weights(model, tensors, out / WEIGHTS)
    base_weights = None
    if not full and (root / CONFIG).is_file():
        try:
            _, base_weights = read_model(root)
        except XattnError:  # (it no longer loads, though every part does: whole weights, as when it moved on)
            base_weights = None
        else:
            base_weights = base_weights if tensors_digest(base_weights) == digest else None  # the parent moved on
    link = parent_link(out, root, digest, delta=base_weights is not None)
    cfg = dataclasses.replace(tgt_cfg, model=model_cfg, data=composed_data(src_cfg.data, tgt_cfg.data), parent=link,
                              decode=dataclasses.replace(tgt_cfg.decode, shortlist=False))  # (no list goes with it)
    with atomic_dir(out) as tmp:  # all or nothing
        for side, name in (("src", SRC_MODEL), ("tgt", TGT_MODEL)):
            copy_tokenizers(source[side], tmp, [name])
        save_model_dir(tmp, model, cfg, base=base_weights)
    return cfg


def composed_data(src: DataConfig, tgt: DataConfig) -> DataConfig:
    """A composed model's data section: its two languages, and the dataset both sides were trained on where they
    share one that has both; never one side's files, subset or validation set (`xattn shortlist` and `evaluate`
    would read that side's text with the other side's tokenizer)."""
    langs = {"src_lang": src.src_lang, "tgt_lang": tgt.tgt_lang, "vocab_size": tgt.vocab_size, "joint_vocab": False}
    if src.dataset is not None and src.dataset == tgt.dataset:
        with contextlib.suppress(XattnError):  # (a dataset without one of the languages: none)
            return DataConfig(dataset=src.dataset, numbers_size=tgt.numbers_size, **langs)
    return DataConfig(dataset=None, **langs)


def _common_parent(models: dict) -> tuple[str, Path]:
    """The weights digest and directory of the nearest model that every part of `models` ({dir: (config,
    tensors)}) is or descends from (a part's own weights, its parent's, its grandparent's...); parts with
    no such model, of other shapes or with one shared vocabulary are refused."""
    from xattn.tokenizer import SRC_MODEL

    lines = {}
    for path, (cfg, tensors) in models.items():
        if cfg.model.share_embeddings or not (path / SRC_MODEL).is_file():
            raise XattnError(f"{path}: shares one vocabulary between source and target, so its sides cannot be "
                             "taken apart")
        lines[path] = _lineage(path, cfg, tensors)
    first = next(iter(models))
    for path in models:
        if shape := _shape_difference(models[first][0].model, models[path][0].model):
            raise XattnError(f"{first} and {path} differ in model.{shape}")
    shared = [(d, where) for d, where in lines[first] if all(d in {e for e, _ in line} for line in lines.values())]
    if not shared:
        other = next(path for path in models if path != first)
        raise XattnError(f"{first} comes from the parent model {lines[first][-1][0][:12]} and {other} from "
                         f"{lines[other][-1][0][:12]}; only parts of children of one parent fit together")
    return shared[0]


def _lineage(path: Path, cfg: RunConfig, tensors: dict) -> list[tuple[str, Path]]:
    """(weights digest, directory) of the model in `path` and of each model it descends from, nearest first,
    as far as their directories are at hand."""
    from xattn.checkpoint import CONFIG, MAX_PARENTS, parent_dir, tensors_digest
    from xattn.config import load_config

    line = [(tensors_digest(tensors), path)]
    while cfg.parent.named and len(line) <= MAX_PARENTS:
        parent = parent_dir(path, cfg.parent)
        line.append((cfg.parent.tensors, parent))
        if not (parent / CONFIG).is_file():
            break
        path, cfg = parent, load_config(parent / CONFIG)
    return line


def _shape_difference(a, b) -> str | None:
    """The first ModelConfig key on which two parts disagree, as `key (a vs b)`; the vocabulary sizes and the
    length ratio (of each model's own language pair) may differ."""
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    for key in da:
        if key not in ("src_vocab_size", "tgt_vocab_size", "length_ratio") and da[key] != db[key]:
            return f"{key} ({da[key]!r} vs {db[key]!r})"
    return None
