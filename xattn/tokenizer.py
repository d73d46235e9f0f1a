"""SentencePiece tokenizers: training from in-memory text, loading, and the src/tgt pair.

Special ids are fixed for every model xattn trains: pad=0, bos=1, eos=2, unk=3.
A model imported from Marian (opus-mt) numbers its pieces differently from its SentencePiece model;
its piece -> id table is a JSON file next to the SentencePiece model (`vocab_file`), and then every
id this module hands out or takes is a model id.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from xattn.errors import ItemError, ParameterError, XattnError
from xattn.io import atomic_write_bytes, read_json, sha256_file

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
MODEL_TYPES = ("unigram", "bpe", "char", "word")
JOINT_MODEL = "spm.model"
SRC_MODEL = "spm.src.model"
TGT_MODEL = "spm.tgt.model"
VOCAB_SUFFIX = ".vocab.json"
LANGUAGE_CODE = re.compile(r">>[^<>\s]+<<")
"""A target-language token of a multilingual Marian model (`>>fr<<`), at the start of a source text."""
SMALL_BATCH = 128
"""Texts below which Tokenizer.encode_batch encodes one text per SentencePiece call: a call on a list starts a pool
of threads, which costs more than encoding a few texts one by one (the figures: benchmarks/README.md, Serving
under load)."""


def vocab_file(model_path: str | Path) -> Path:
    """Where the optional piece -> id table of a SentencePiece model lives: spm.src.model -> spm.src.vocab.json."""
    return Path(model_path).with_suffix(VOCAB_SUFFIX)


class Tokenizer:
    """A loaded SentencePiece model; ids are plain Python ints, without bos/eos unless added by the caller.

    With `vocab` (piece -> id), ids are those of the table instead of SentencePiece's own; a piece
    missing from the table becomes the table's unknown piece.
    """

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path, vocab: dict[str, int] | None = None):
        self._sp = processor
        self.path = path
        self._ids = vocab
        self._pieces = {i: piece for piece, i in vocab.items()} if vocab is not None else None

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise XattnError(f"{path}: tokenizer model not found")
        processor = spm.SentencePieceProcessor()
        try:
            processor.load(str(path))
        except (OSError, RuntimeError) as e:
            raise XattnError(f"{path}: not a SentencePiece model ({e})") from e
        table = vocab_file(path)
        return cls(processor, path, read_vocab(table) if table.is_file() else None)

    @property
    def vocab(self) -> dict[str, int]:
        """piece -> id for every id: the table if there is one, else SentencePiece's own numbering."""
        if self._ids is not None:
            return dict(self._ids)
        return {self._sp.id_to_piece(i): i for i in range(self._sp.get_piece_size())}

    @property
    def vocab_size(self) -> int:
        return max(self._ids.values()) + 1 if self._ids is not None else self._sp.get_piece_size()

    def _special(self, sp_id: int, default_piece: str) -> int:
        if self._ids is None:
            return sp_id
        return self._ids.get(self._sp.id_to_piece(sp_id) if sp_id >= 0 else default_piece, -1)

    @property
    def pad_id(self) -> int:
        return self._special(self._sp.pad_id(), "<pad>")

    @property
    def bos_id(self) -> int:
        return self._special(self._sp.bos_id(), "<s>")

    @property
    def eos_id(self) -> int:
        return self._special(self._sp.eos_id(), "</s>")

    @property
    def unk_id(self) -> int:
        return self._special(self._sp.unk_id(), "<unk>")

    def encode(self, text: str) -> list[int]:
        """One sentence -> token ids (L,), no bos/eos."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str], name: str = "texts") -> list[list[int]]:
        """N sentences -> N lists of token ids, no bos/eos; a text that is not a valid string is an ItemError naming
        it as `name`[i]. With a table (an imported Marian model), a language code the text starts with (`>>fr<< ...`)
        is one token, and the rest of the text is encoded after it, as MarianTokenizer does."""
        texts = list(texts)
        if not all(isinstance(text, str) and "\0" not in text for text in texts):  # one pass over the texts
            check_texts(texts, name)  # SentencePiece would take bytes, a list as a batch, and a NUL as an unknown piece
        out_type = str if self._ids is not None else int
        codes = [self._code_of(text) for text in texts] if self._ids is not None else None
        pieced = texts if codes is None else [text[len(code):] for text, code in zip(texts, codes)]
        try:
            if len(texts) < SMALL_BATCH:  # one call per text (SMALL_BATCH)
                encoded = [self._sp.encode(text, out_type=out_type) for text in pieced]
            else:
                encoded = self._sp.encode(pieced, out_type=out_type)
        except (RuntimeError, TypeError):
            check_texts(texts, name)
            raise
        if codes is None:
            return encoded
        return [self._to_ids([code] if code else []) + self._to_ids(pieces) for code, pieces in zip(codes, encoded)]

    def _to_ids(self, pieces: list[str]) -> list[int]:
        unk = self.unk_id
        return [self._ids.get(piece, unk) for piece in pieces]

    def _code_of(self, text: str) -> str:
        """The language code a text starts with (`>>fr<<`: a multilingual opus-mt model reads the target language from
        it, a token of its vocabulary that its SentencePiece model lacks, which MarianTokenizer keeps whole, as the
        unknown piece when the vocabulary has no such code); "" for none."""
        found = LANGUAGE_CODE.match(text) if text.startswith(">>") else None
        return found[0] if found is not None else ""

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> detokenised text; pad, bos and eos ids are dropped."""
        specials = {self.pad_id, self.bos_id, self.eos_id}
        if self._ids is not None:
            return self._sp.decode_pieces(self.pieces(i for i in ids if int(i) not in specials))
        return self._sp.decode([int(i) for i in ids if int(i) not in specials])

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """Token ids -> their pieces, e.g. ['▁Ein', '▁Hund', '</s>']."""
        if self._pieces is not None:
            return [self._pieces.get(int(i), "<unk>") for i in ids]
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"


def text_list(name: str, value: object, one_string: str) -> list[str]:
    """`value`, a list or tuple of strings, as a list; anything else is a ParameterError naming `name` (`one_string`:
    what a lone string gets), not a mapping's keys or a string's characters read as texts, and an item that is not
    a string an ItemError naming it (`name`[i]). The tokenizer checks what is in each string."""
    if isinstance(value, str):
        raise ParameterError(name, one_string)
    if not isinstance(value, (list, tuple)):
        raise ParameterError(name, f"a list of strings, got {type(value).__name__}")
    if (bad := next((i for i, text in enumerate(value) if not isinstance(text, str)), None)) is not None:
        raise ItemError(name, bad, f"expected a string, got {type(value[bad]).__name__}")
    return list(value)


def check_texts(texts: Sequence[object], name: str) -> None:
    """Raise an ItemError naming (`name`[i]) the first text that is not a string of valid Unicode without NUL
    characters (as the command line and the server refuse them: binary data, or UTF-16 text read as UTF-8)."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ItemError(name, i, f"expected a string, got {type(text).__name__}")
        if (at := text.find("\0")) >= 0:
            raise ItemError(name, i, f"holds a NUL character (at character {at + 1}): binary data, or UTF-16 text read "
                            "as UTF-8; give text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ItemError(name, i, f"not valid Unicode ({e.reason} at character {e.start + 1})") from None


def read_vocab(path: Path) -> dict[str, int]:
    """A piece -> id JSON table (Marian's vocab.json); ids must be distinct non-negative integers."""
    table = read_json(path)
    if not isinstance(table, dict) or not table or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in table.values()):
        raise XattnError(f"{path}: expected a JSON object of piece -> non-negative integer id")
    if len(set(table.values())) != len(table):
        raise XattnError(f"{path}: two pieces share an id")
    return table


def train_sentencepiece(
    texts: Iterable[str],
    model_path: str | Path,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
) -> Tokenizer:
    """Train a SentencePiece model on `texts` and write it atomically to `model_path`.

    The vocabulary may come out smaller than `vocab_size` on a small corpus (no hard limit).
    The learned vocabulary depends only on the texts and options, not on the thread count.
    """
    if model_type not in MODEL_TYPES:
        raise XattnError(f"unknown tokenizer model_type {model_type!r}; valid: {', '.join(MODEL_TYPES)}")
    if vocab_size < 8:
        raise XattnError(f"vocab_size must be at least 8, got {vocab_size}")
    sentences = (t for t in texts if t.strip())  # streamed: SentencePiece keeps its own copy, Python none
    first = next(sentences, None)
    if first is None:
        raise XattnError(f"{model_path}: no non-empty sentences to train the tokenizer on")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain([first], sentences),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
            hard_vocab_limit=False,
            num_threads=min(16, os.cpu_count() or 1),
            minloglevel=2,
        )
    except RuntimeError as e:  # "INTERNAL: src/x.cc(638) [check] What went wrong." -> "What went wrong."
        reason = str(e).rpartition("] ")[2] or str(e)
        if too_small := re.search(r"required_chars\. \d+ vs (\d+)", reason):
            reason = f"the text needs at least {too_small[1]} pieces (its characters and the special ones); " \
                     "raise data.vocab_size"
        raise XattnError(f"SentencePiece training failed with vocab_size={vocab_size}: {reason}") from None
    model_path = Path(model_path)
    atomic_write_bytes(model_path, model.getvalue())
    vocab_file(model_path).unlink(missing_ok=True)  # a table left by an import would not fit the new model
    return Tokenizer.load(model_path)


@dataclass(frozen=True)
class TokenizerPair:
    """Source and target tokenizers; with `joint` they are the same object (one shared model)."""

    src: Tokenizer
    tgt: Tokenizer
    joint: bool

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.src.path,) if self.joint else (self.src.path, self.tgt.path)


def train_tokenizers(
    src_texts: Iterable[str],
    tgt_texts: Iterable[str],
    out_dir: str | Path,
    vocab_size: int,
    joint: bool,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
) -> TokenizerPair:
    """Train `spm.model` (joint) or `spm.src.model` + `spm.tgt.model` in `out_dir`.

    Files of the other layout left in `out_dir` are removed so that `load_tokenizers` is unambiguous.
    """
    out_dir = Path(out_dir)
    options = dict(vocab_size=vocab_size, model_type=model_type, character_coverage=character_coverage)
    if joint:
        tok = train_sentencepiece(itertools.chain(src_texts, tgt_texts), out_dir / JOINT_MODEL, **options)
        stale = (SRC_MODEL, TGT_MODEL)
        pair = TokenizerPair(tok, tok, joint=True)
    else:
        src = train_sentencepiece(src_texts, out_dir / SRC_MODEL, **options)
        tgt = train_sentencepiece(tgt_texts, out_dir / TGT_MODEL, **options)
        stale = (JOINT_MODEL,)
        pair = TokenizerPair(src, tgt, joint=False)
    for name in stale:
        (out_dir / name).unlink(missing_ok=True)
    return pair


def load_tokenizers(out_dir: str | Path) -> TokenizerPair:
    """Load whichever layout `out_dir` holds: `spm.model`, or `spm.src.model` + `spm.tgt.model`."""
    out_dir = Path(out_dir)
    has_joint = (out_dir / JOINT_MODEL).is_file()
    has_src, has_tgt = (out_dir / SRC_MODEL).is_file(), (out_dir / TGT_MODEL).is_file()
    if has_joint and (has_src or has_tgt):
        raise XattnError(f"{out_dir}: both {JOINT_MODEL} and {SRC_MODEL}/{TGT_MODEL} exist; remove one layout")
    if has_joint:
        tok = Tokenizer.load(out_dir / JOINT_MODEL)
        return TokenizerPair(tok, tok, joint=True)
    if has_src and has_tgt:
        return TokenizerPair(Tokenizer.load(out_dir / SRC_MODEL), Tokenizer.load(out_dir / TGT_MODEL), joint=False)
    if has_src or has_tgt:
        missing = TGT_MODEL if has_src else SRC_MODEL
        raise XattnError(f"{out_dir}: {missing} is missing")
    raise XattnError(f"{out_dir}: no tokenizer found (expected {JOINT_MODEL} or {SRC_MODEL} + {TGT_MODEL})")


# ------------------------------------------------------------------------------ the files of a directory

def tokenizer_files(directory: Path, names=(JOINT_MODEL, SRC_MODEL, TGT_MODEL)) -> list[Path]:
    """The tokenizer files of `directory` among models `names` and their id tables, those that exist."""
    files = [Path(directory) / n for n in names] + [vocab_file(Path(directory) / n) for n in names]
    return [f for f in files if f.is_file()]


def tokenizer_hashes(directory: Path) -> dict[str, str]:
    """SHA-256 of each tokenizer file in `directory` (models and their id tables), by file name."""
    return {f.name: sha256_file(f) for f in tokenizer_files(directory)}


def copy_tokenizers(directory: Path, out: Path, names=(JOINT_MODEL, SRC_MODEL, TGT_MODEL)) -> None:
    """Copy the tokenizer files of `directory` (models `names` and their id tables) into `out`."""
    for f in tokenizer_files(directory, names):
        shutil.copyfile(f, Path(out) / f.name)
