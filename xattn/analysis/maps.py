"""Attention maps of sentence pairs: from a Translation, or teacher-forced for a given pair; pieces merged into
words (which pieces make a word: xattn.analysis.pieces).

Shapes: L layers, H heads, S source positions (pieces + </s>), T target positions (pieces + </s>: position t
predicts tgt_tokens[t]); R rows (queries) and C columns (keys) of a drawn map.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from xattn.analysis.pieces import BOS, UNK_SURFACE, by_words, piece_words, word_memberships
from xattn.checks import head_problem
from xattn.errors import ItemError, ParameterError, XattnError
from xattn.links import check_links
from xattn.registry import kind_problem
from xattn.words import split_words

if TYPE_CHECKING:
    from xattn.translator import Translation, Translator

# ---------------------------------------------------------------------------------------- layers and heads
# A pruned layer has fewer heads than others, maybe none. Every layer's weights are stacked with NaN in the
# places of the heads a layer lacks (model.stack_layers), so a layer's heads are its first n. One rule
# for every view and tool: a mean over heads is over the heads a layer has, and a layer without heads has
# none (NaN); a view of every layer shows such a layer empty and says so; where a layer is chosen for the
# user, it is the nearest one with heads; a layer the user names without heads, and an attention whose every
# head was pruned, are refused in one line.

def heads_per_layer(weights: np.ndarray) -> list[int]:
    """(L, H, R, C) -> how many heads each layer has (those not all NaN)."""
    if weights.shape[2] * weights.shape[3] == 0:
        return [weights.shape[1]] * weights.shape[0]
    return (~np.isnan(weights).all(axis=(2, 3))).sum(axis=1).tolist()


def require_heads(heads: Sequence[int], what: str = "attention") -> None:
    """Refuse an attention whose every head was pruned (`heads`: per layer)."""
    if not any(heads):
        raise XattnError(head_problem(heads, 0, None, what))


@dataclass(frozen=True)
class HeadChoice:
    """Which attention to read: one layer (0-based) and a list of its heads (0-based), or their mean (heads=None)."""
    layer: int
    heads: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, layer: int | str, heads: str | Sequence[int] | None = "mean") -> HeadChoice:
        """`layer` N and `heads` 0,3,5 | mean (a string, as the command line gives them); errors name the
        parameter, which the command line names as its flag."""
        try:
            layer = int(layer)
        except (TypeError, ValueError):
            raise ParameterError("layer", f"expected a layer number (0-based), got {layer!r}") from None
        if heads is None or heads == "mean":
            return cls(layer, None)
        if isinstance(heads, str):
            try:
                heads = [int(h) for h in heads.split(",")]
            except ValueError:
                raise ParameterError("heads", f"expected 'mean' or head numbers such as 0,3,5, got {heads!r}") from None
        if not heads or len(set(heads)) != len(heads):
            raise ParameterError("heads", f"expected distinct head numbers, got {','.join(map(str, heads))}")
        return cls(layer, tuple(int(h) for h in heads))

    @classmethod
    def nearest(cls, heads: Sequence[int], layer: int, what: str = "attention") -> HeadChoice:
        """The mean of heads of the layer nearest to `layer` that has heads (model.nearest_with_heads)."""
        from xattn.model import nearest_with_heads

        require_heads(heads, what)
        return cls(nearest_with_heads(heads, layer))

    def check(self, heads: Sequence[int], what: str = "attention") -> None:
        """Refuse, in one line, a layer or head the model does not have; `heads`: how many each layer has."""
        if problem := head_problem(heads, self.layer, self.heads, what):
            raise XattnError(problem)

    def check_given(self, heads: Sequence[int], what: str = "attention") -> None:
        """`check`, for a choice a caller gave as `layer` and `heads`: a ParameterError naming the one at fault (the
        command line's --layer or --heads; they went unnamed)."""
        if problem := head_problem(heads, self.layer, self.heads, what):
            on_heads = self.heads is not None and 0 <= self.layer < len(heads) and heads[self.layer] > 0
            raise ParameterError("heads" if on_heads else "layer", problem)

    def select(self, weights: np.ndarray) -> np.ndarray:
        """(L, H, R, C) -> (R, C): the chosen heads of the chosen layer, averaged."""
        heads = heads_per_layer(weights)
        self.check(heads)
        chosen = list(self.heads) if self.heads is not None else list(range(heads[self.layer]))
        return weights[self.layer, chosen].mean(axis=0)

    def __str__(self) -> str:
        return f"layer {self.layer}, " + ("mean of heads" if self.heads is None else
                                            "head " + ",".join(map(str, self.heads)))

    def to_dict(self) -> dict:
        return {"layer": self.layer, "heads": "mean" if self.heads is None else list(self.heads)}


def head_mean(weights: np.ndarray) -> np.ndarray:
    """(L, H, R, C) -> (L, R, C): each layer's mean over the heads it has; NaN for a layer without heads."""
    heads = np.array(heads_per_layer(weights), dtype=np.float64)[:, None, None]  # (L, 1, 1)
    with np.errstate(invalid="ignore"):  # 0 / 0: no heads, no mean
        return (np.nan_to_num(weights).sum(axis=1) / heads).astype(weights.dtype)


# ---------------------------------------------------------------------------------------- what is drawn

@dataclass
class AttentionMaps:
    """The attention of one sentence pair in one place, every layer and head: what plots and the HTML view draw.

    Each row is a query token's weights over the columns (key tokens); rows sum to 1 over unmasked cells.
    """
    weights: np.ndarray                 # (L, H, R, C) float32
    rows: list[str]                     # R labels: target tokens (cross, decoder-self) or source tokens (encoder-self)
    cols: list[str]                     # C labels: source tokens (cross, encoder-self) or target tokens (decoder-self)
    kind: str = "cross"                 # one of registry.ATTENTION_KINDS
    masked: np.ndarray | None = None    # (R, C) bool, True = the query may not look there (the decoder's future)
    links: list[tuple[int, int]] = field(default_factory=list)  # (col, row) cells that are alignment links
    words: bool = False                 # rows and columns are words (pieces merged) rather than pieces
    links_label: str = "alignment link" # what the links are, for the legend (say, the settings that made them)
    row_words: list[str] | None = None  # the words of the text the rows' pieces spell, when known (not `words`)
    col_words: list[str] | None = None  # the columns' (xattn.words)

    def __post_init__(self):
        L, H, R, C = self.weights.shape
        if (R, C) != (len(self.rows), len(self.cols)):
            raise ValueError(f"weights {self.weights.shape} do not match {len(self.rows)} rows x {len(self.cols)} columns")
        if problem := kind_problem(self.kind):
            raise ValueError(f"kind: {problem}")

    def view(self, choice: HeadChoice) -> np.ndarray:
        """(R, C): the chosen heads of the chosen layer, averaged."""
        return choice.select(self.weights)


# ---------------------------------------------------------------------------------------- pieces -> words

@dataclass(frozen=True)
class TextWords:
    """A side's text (None: a hypothesis, whose words are those its pieces print) and, where known, the word
    index of each of its pieces (-1 for </s>)."""
    text: str | None
    word_of: list[int] | None = None

    def resolve(self, pieces: Sequence[str], side: str, line: int | None) -> tuple[list[str], list[int]]:
        """(words, word index of each piece)."""
        if self.text is None:  # the tokenizer prints <unk> as " \u2047 "
            return piece_words(pieces, f" {UNK_SURFACE} ")
        words = split_words(self.text)
        if self.word_of is not None:
            return words, list(self.word_of)
        spelled, word_of = piece_words(pieces)
        if len(spelled) != len(words):
            where = f"line {line}: " if line is not None else ""
            raise XattnError(f"{where}the {side} tokenizer splits this {side} into {len(spelled)} words, the text has "
                             f"{len(words)} words (a character the tokenizer drops or treats as a space?)")
        return words, word_of


def groups_of(word_of: Sequence[int], labels: Sequence[str], words: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Pieces -> word groups in order of appearance; a piece of no word (</s>) is a group of its own.

    Returns (membership (N_groups, N_pieces) float 0/1, group labels).
    """
    keys: list[tuple] = []
    for k, w in enumerate(word_of):
        key = ("word", w) if w >= 0 else ("piece", k)
        if key not in keys:
            keys.append(key)
    member = np.zeros((len(keys), len(word_of)), dtype=np.float32)
    for k, w in enumerate(word_of):
        member[keys.index(("word", w) if w >= 0 else ("piece", k)), k] = 1.0
    return member, [words[i] if kind == "word" else labels[i] for kind, i in keys]


def merge_words(weights: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(L, H, R, C) piece weights -> (L, H, R_w, C_w) word weights: a row word averages its pieces' rows,
    a column word sums its pieces' columns, so rows still sum to 1. rows (R_w, R), cols (C_w, C) 0/1 membership."""
    average = rows / rows.sum(axis=1, keepdims=True)  # (R_w, R)
    return np.einsum("wr,lhrc,vc->lhwv", average, weights, cols).astype(np.float32)


# ---------------------------------------------------------------------------------------- a sentence pair

@dataclass
class PairAttention:
    """Every attention map of one sentence pair, at the piece level, with the words the pieces spell."""
    src_tokens: list[str]                     # S: source pieces + </s>
    tgt_tokens: list[str]                     # T: target pieces + </s>; position t predicts tgt_tokens[t]
    cross: np.ndarray                         # (L, H, T, S)
    decoder_self: np.ndarray | None = None    # (L, H, T, T): position t (input <s> or tgt_tokens[t-1]) over inputs
    encoder_self: np.ndarray | None = None    # (L, H, S, S)
    src_words: list[str] = field(default_factory=list)
    tgt_words: list[str] = field(default_factory=list)
    src_word_of: list[int] = field(default_factory=list)  # S: word index of each source piece, -1 for </s>
    tgt_word_of: list[int] = field(default_factory=list)  # T: word index of each target piece, -1 for </s>

    @classmethod
    def build(cls, src_tokens: list[str], tgt_tokens: list[str], cross: np.ndarray, decoder_self=None,
              encoder_self=None, src: TextWords | None = None, tgt: TextWords | None = None,
              line: int | None = None) -> PairAttention:
        """A pair from its pieces; each side's words from `src`/`tgt` (a text and, where known, its pieces'
        word membership), else from the pieces themselves (a hypothesis: the words of its printed text)."""
        src_words, src_word_of = (src or TextWords(None)).resolve(src_tokens, "source", line)
        tgt_words, tgt_word_of = (tgt or TextWords(None)).resolve(tgt_tokens, "target", line)
        return cls(src_tokens, tgt_tokens, cross, decoder_self, encoder_self, src_words, tgt_words,
                   src_word_of, tgt_word_of)

    @classmethod
    def from_translation(cls, translation: Translation, source: str | None = None, line: int | None = None,
                         tokenizer=None) -> PairAttention:
        """The attention a Translation carries (translate with return_attention=True; return_self_attention
        for decoder-self). `source`: the translated line, whose words (xattn.words) are the source words;
        with its `tokenizer` (translator.tokenizers.src) each word's pieces are known exactly."""
        if source is None:
            return cls._of(translation, None, line)
        return cls.from_translations([translation], [source], tokenizer, [line])[0]

    @classmethod
    def from_translations(cls, translations: Sequence[Translation], sources: Sequence[str], tokenizer=None,
                          lines: Sequence[int | None] | None = None) -> list[PairAttention]:
        """from_translation of each translation and its source line (`lines`: their numbers, for errors), the
        sources' words encoded in one call into the tokenizer."""
        lines = lines if lines is not None else [None] * len(sources)
        members = (word_memberships(tokenizer, sources, [t.src_tokens for t in translations]) if tokenizer
                   else [None] * len(sources))
        return [cls._of(t, TextWords(source, member), line)
                for t, source, member, line in zip(translations, sources, members, lines, strict=True)]

    @classmethod
    def _of(cls, translation: Translation, src: TextWords | None, line: int | None) -> PairAttention:
        if translation.cross_attention is None:
            raise XattnError("this Translation carries no attention; translate with return_attention=True")
        return cls.build(translation.src_tokens, translation.tgt_tokens, translation.cross_attention,
                         translation.self_attention, None, src, line=line)

    def maps(self, kind: str = "cross", words: bool = False, links: Sequence[tuple[int, int]] = ()) -> AttentionMaps:
        """One kind of attention as AttentionMaps; `words`: pieces merged into words (rows average their
        pieces, columns sum them). `links` (source word i, target word j) mark their cells (cross only)."""
        if problem := kind_problem(kind):
            raise ParameterError("kind", problem)
        if not isinstance(words, bool):
            raise ParameterError("words", f"True or False, got {words!r}")
        links = check_links("links", links, (len(self.src_words), len(self.tgt_words)))
        weights = {"cross": self.cross, "decoder-self": self.decoder_self, "encoder-self": self.encoder_self}[kind]
        if weights is None:
            raise XattnError(f"no {kind} attention was computed for this pair")
        inputs = [BOS, *self.tgt_tokens[:-1]]  # the decoder's input at each position
        row_of, rows, col_of, cols = {
            "cross": (self.tgt_word_of, self.tgt_tokens, self.src_word_of, self.src_tokens),
            "decoder-self": ([-1, *self.tgt_word_of[:-1]], inputs, [-1, *self.tgt_word_of[:-1]], inputs),
            "encoder-self": (self.src_word_of, self.src_tokens, self.src_word_of, self.src_tokens),
        }[kind]
        masked = np.triu(np.ones((len(rows), len(cols)), dtype=bool), k=1) if kind == "decoder-self" else None
        word_links = links if kind == "cross" else []
        row_words = self.tgt_words if kind != "encoder-self" else self.src_words
        col_words = self.src_words if kind != "decoder-self" else self.tgt_words
        if not words:  # a word link marks every cell of its source pieces x target pieces
            cells = [(s, t) for i, j in word_links for t, wt in enumerate(self.tgt_word_of) if wt == j
                     for s, ws in enumerate(self.src_word_of) if ws == i]
            return AttentionMaps(weights, list(rows), list(cols), kind, masked, cells, row_words=list(row_words),
                                 col_words=list(col_words))
        row_member, row_labels = groups_of(row_of, rows, row_words)
        col_member, col_labels = groups_of(col_of, cols, col_words)
        if masked is not None:  # a word cell is masked when every piece cell under it is
            masked = (row_member @ (~masked).astype(np.float32) @ col_member.T) == 0
        return AttentionMaps(merge_words(weights, row_member, col_member), row_labels, col_labels, kind, masked,
                             word_links, words=True)


# ---------------------------------------------------------------------------------------- teacher forcing

def teacher_forced(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                   kinds: Sequence[str] = ("cross",), max_tokens: int = 4096,
                   progress: Callable[[int], None] | None = None) -> list[PairAttention]:
    """The attention of given pairs: the model reads `targets[i]` as its translation of `sources[i]`.

    Batched by length so that sentences * longest side <= max_tokens; `progress(n)` after each batch of n
    pairs. Each side's words (xattn.words) must be the words its tokenizer sees (errors name the line, 1-based).
    """
    out: list[PairAttention | None] = [None] * len(sources)
    for i, pair in iter_teacher_forced(translator, sources, targets, kinds, max_tokens, progress):
        out[i] = pair
    return out  # type: ignore[return-value]


def check_positions(cfg, name: str, lengths: Sequence[int]) -> None:
    """An ItemError naming the first pair (`name`[i]: sources or targets) whose side of `lengths` tokens (</s>
    included) the model's learned positions cannot hold."""
    if (long := cfg.beyond_positions([range(n) for n in lengths])) is not None:
        raise ItemError(name, long, f"its {lengths[long]} tokens (</s> included) do not fit the model's "
                        f"{cfg.max_positions} positions (learned) on the {name[:-1]} side")


def iter_teacher_forced(translator: Translator, sources: Sequence[str], targets: Sequence[str],
                        kinds: Sequence[str] = ("cross",), max_tokens: int = 4096,
                        progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, PairAttention]]:
    """teacher_forced one pair at a time, (index, PairAttention) in batch order: memory for one batch only."""
    from xattn.tokenizer import check_texts, text_list
    from xattn.batching import pad_batch, token_batches

    sources = text_list("sources", sources, "a list of source sentences, got one string; pass [text]")
    targets = text_list("targets", targets, "a list of target sentences, got one string; pass [text]")
    for name, texts in (("sources", sources), ("targets", targets)):  # named as given, before they split into words
        check_texts(texts, name)
    if len(sources) != len(targets):
        raise XattnError(f"{len(sources)} source sentences but {len(targets)} target sentences")
    if max_tokens < 1:
        raise XattnError(f"max_tokens must be >= 1, got {max_tokens}")
    tok, cfg = translator.tokenizers, translator.model.cfg
    (src_ids, src_of), (tgt_ids, tgt_of) = (by_words(t, texts, cfg.eos_id) for t, texts in ((tok.src, sources),
                                                                                           (tok.tgt, targets)))
    for name, ids in (("sources", src_ids), ("targets", tgt_ids)):  # named here, not in a batch's encoder or decoder
        check_positions(cfg, name, [len(x) for x in ids])  # (the decoder reads BOS and all but EOS: as many)
    for batch in token_batches([max(len(s), len(t)) for s, t in zip(src_ids, tgt_ids)], max_tokens):
        src = pad_batch([src_ids[i] for i in batch], cfg.pad_id, translator.device)  # (B, S)
        forced = translator.forced_attention(src, [tgt_ids[i][:-1] for i in batch], kinds=kinds)  # EOS is predicted
        for b, i in enumerate(batch):
            yield i, PairAttention.build(
                tok.src.pieces(src_ids[i]), tok.tgt.pieces(tgt_ids[i]), forced.cross[b],
                forced.decoder_self[b] if forced.decoder_self is not None else None,
                forced.encoder_self[b] if forced.encoder_self is not None else None, TextWords(sources[i], src_of[i]),
                TextWords(targets[i], tgt_of[i]), line=i + 1)
        if progress is not None:
            progress(len(batch))


def encoder_attention(translator: Translator, text: str) -> np.ndarray:
    """(L, H, S, S): the encoder self-attention of one sentence (pieces + </s>), under the translator's head mask:
    the teacher-forced pass (Translator.forced_attention) over no target tokens, which reads the source alone."""
    import torch

    ids = translator.tokenizers.src.encode_batch([text])[0] + [translator.model.cfg.eos_id]
    src = torch.tensor([ids], device=translator.device)
    return translator.forced_attention(src, [[]], kinds=("encoder-self",)).encoder_self[0]
