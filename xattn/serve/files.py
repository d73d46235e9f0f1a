"""POST /translate_file: a plain-text file (.txt, UTF-8) in a multipart form, translated line by line with its
lines kept, and held for download for a while: LibreTranslate answers {"translatedFileUrl"} and serves the file
at that address, and its clients fetch it from there.
"""
from __future__ import annotations

import re
import secrets
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePath
from typing import Callable
from urllib.parse import quote

from starlette.datastructures import Headers, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser, parse_options_header

from xattn.serve.limits import ApiError, Limits

EXTENSIONS = (".txt",)
KEEP_FILES = 64
KEEP_BYTES = 32_000_000
KEEP_SECONDS = 3600.0
"""Translated files are kept for download: the newest KEEP_FILES, KEEP_BYTES together (the newest one always),
each for KEEP_SECONDS at most. Memory stays bounded however many files clients translate."""


@dataclass(frozen=True)
class Upload:
    """A file field of a multipart form."""
    filename: str
    data: bytes


async def multipart(headers: Headers, raw: bytes, max_files: int, max_part_size: int) -> dict[str, list]:
    """The fields of a multipart body already read (its size bounded by the caller), each a list of its values:
    text, or an Upload for a file. A malformed body is 422, a field over `max_part_size` 413."""
    async def body():
        yield raw
    try:
        # (the body's size, read whole and bounded by the caller, bounds the fields; the texts' count is checked as
        # a JSON list's, 413 too_many_items: at 64 fields the parser's own 422 came first)
        form = await MultiPartParser(headers, body(), max_files=max_files, max_fields=4096,
                                     max_part_size=max_part_size).parse()
    except MultiPartException as e:
        files = file_fields(headers.get("content-type", ""), raw)
        if "too many files" in e.message.lower() and len(files) > max_files:  # (the parser names no field)
            raise ApiError(422, f"{files[max_files]}: "
                           + ("a file, where this route takes text fields only; send it without a filename"
                              if max_files == 0 else f"one file too many: this route takes {max_files} (`file`)"),
                           "invalid_request") from None
        status = 413 if "size" in e.message.lower() else 422
        raise ApiError(status, f"body: {e.message}", "invalid_request") from None
    check_parts(headers.get("content-type", ""), raw)
    fields: dict[str, list] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            value = Upload(value.filename or "", await value.read())
        fields.setdefault(key, []).append(value)
    await form.close()
    return fields


def check_parts(content_type: str, raw: bytes) -> None:
    """What the parser lets through in a multipart body (already parsed), each a 422 naming what is wrong:
    - a body cut off before its closing boundary (`--BOUNDARY--`): the parser silently drops the last field;
    - a field name, text field or file name not in the body's charset (UTF-8 unless its Content-Type names another,
      as the parser reads it): the parser reads other bytes as Latin-1, which would translate mangled text (or name
      the download so) silently;
    - a part with a Content-Transfer-Encoding (base64, quoted-printable): RFC 7578 retired them, and the parser
      hands the encoded text on as the field's value.
    `file`'s content is file_text's to check."""
    charset, parts = split_parts(content_type, raw)
    if not parts or not parts[-1].startswith(b"--"):
        raise ApiError(422, "body: the multipart form ends before its closing boundary (--BOUNDARY--): cut off?",
                       "invalid_request")
    for part in parts[:-1]:
        head, _, data = part.partition(b"\r\n\r\n")
        name = decoded(part_name(head), charset, "body: a multipart field name")
        coding = re.search(rb"(?im)^content-transfer-encoding:[ \t]*([^\s;]+)", head)
        if coding and coding[1].lower() not in (b"7bit", b"8bit", b"binary"):
            raise ApiError(422, f"{name}: Content-Transfer-Encoding {coding[1].decode('latin-1')} is not supported in "
                           "a form (RFC 7578); send the field as it is", "invalid_request")
        if filename := FILENAME.search(head):  # (the download's name)
            decoded(filename[1] or filename[2] or b"", charset, f"{name}: its file name")
        elif name != "file":
            decoded(data.removesuffix(b"\r\n"), charset, name)


def split_parts(content_type: str, raw: bytes) -> tuple[str, list[bytes]]:
    """The charset of a multipart body (UTF-8 unless its Content-Type names another) and its parts after the first
    boundary, the last being what follows the closing one (`--...`; none such: cut off). The Content-Type is read
    by the parser's own reading (a parameter given twice: the last; RFC 2231's `boundary*=`: left out), so that
    these checks look at the parts it parsed (reading the first of two boundaries, they looked at others, and a
    Latin-1 text went through as UTF-8)."""
    params = parse_options_header(content_type)[1]
    parts = (b"\r\n" + raw).split(b"\r\n--" + params.get(b"boundary", b""))  # a boundary starts a line, as the
    return params.get(b"charset", b"UTF-8").decode("latin-1"), parts[1:]  # parser reads it


def part_name(head: bytes) -> bytes:
    """The field name in a part's head (b"" when it has none)."""
    quoted, bare = next(iter(re.findall(rb'(?i)\bname\s*=\s*(?:"([^"]*)"|([^;\s]*))', head)), (b"", b""))
    return quoted or bare


def file_fields(content_type: str, raw: bytes) -> list[str]:
    """The names of a multipart body's file fields (parts with a filename), in order."""
    heads = [part.partition(b"\r\n\r\n")[0] for part in split_parts(content_type, raw)[1][:-1]]
    return [part_name(head).decode("utf-8", "replace") for head in heads if FILENAME.search(head)]


FILENAME = re.compile(rb'(?i)\bfilename\s*=\s*(?:"([^"]*)"|([^;\s]*))')
"""A part's file name, as the parser finds it (any case, spaces around `=`; not RFC 5987's `filename*=`)."""


def decoded(data: bytes, charset: str, field: str) -> str:
    try:
        return data.decode(charset)
    except LookupError:
        raise ApiError(422, f"Content-Type: charset {charset!r} is unknown; send UTF-8", "invalid_request") from None
    except UnicodeDecodeError:
        raise ApiError(422, f"{field}: not {charset} (multipart/form-data)", "invalid_request") from None


def file_text(upload: Upload | str | None, limits: Limits) -> tuple[str, str]:
    """The name and text of the form's `file`: a .txt file, UTF-8 (a BOM is dropped) without NUL bytes, of at
    most `max_chars` characters (the limit of one /translate request)."""
    if upload is None:
        raise ApiError(422, "file: missing; send the text as the multipart/form-data file field `file`",
                       "invalid_request")
    if not isinstance(upload, Upload):
        raise ApiError(422, "file: a text field, not a file; send it as a file (with a filename)", "invalid_request")
    name = PurePath(upload.filename.replace("\\", "/")).name
    if (extension := PurePath(name).suffix).lower() not in EXTENSIONS:
        raise ApiError(400, f"file: {extension or 'a name without extension'} is not supported; send a .txt file "
                       "(UTF-8 plain text)", "unsupported_format")
    if upload.data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise ApiError(422, "file: UTF-16 text (its byte-order mark); send it as UTF-8", "invalid_request")
    if (nul := upload.data.find(b"\0")) >= 0:
        raise ApiError(422, f"file: binary data (a NUL byte at offset {nul}), not UTF-8 text", "invalid_request")
    try:
        text = upload.data.decode("utf-8").removeprefix("\ufeff")  # (utf-8-sig would shift the offsets below)
    except UnicodeDecodeError as e:
        raise ApiError(422, f"file: not UTF-8 text (byte 0x{upload.data[e.start]:02x} at offset {e.start})",
                       "invalid_request") from None
    if len(text) > limits.max_chars:
        raise ApiError(413, f"file: {len(text)} characters, over the limit of {limits.max_chars}",
                       "too_many_characters")
    return name, text


@dataclass(frozen=True)
class Document:
    """A text as lines, by the rule every verb reads text with (lines.read_lines): a line ends at \n (a \r before it
    is part of its ending) and nowhere else, so a \r elsewhere stays in its line, and a text whose lines end in \r
    alone is refused. Each line: the text to translate (stripped; "" for a blank line) with what surrounds it (its
    leading and trailing whitespace, its line ending), which the translation keeps as they are."""
    lines: tuple[tuple[str, str, str], ...]  # (before, text, after)

    @classmethod
    def parse(cls, text: str) -> Document:
        if "\n" not in text and "\r" in text.rstrip("\r"):
            raise ApiError(422, "file: lines end in a carriage return alone (\\r, old Mac style); convert them to \\n",
                           "invalid_request")
        pieces = re.split(r"(\r?\n)", text)
        lines = []
        for content, ending in zip(pieces[0::2], pieces[1::2] + [""]):
            stripped = content.strip()
            if not stripped:
                if content or ending:  # not the nothing after a last line ending
                    lines.append((content + ending, "", ""))
                continue
            start = len(content) - len(content.lstrip())
            lines.append((content[:start], stripped, content[start + len(stripped):] + ending))
        return cls(tuple(lines))

    def texts(self) -> tuple[list[str], list[int]]:
        """The lines to translate, and their line numbers (from 1); none is a 422."""
        kept = [(text, n) for n, (_, text, _) in enumerate(self.lines, 1) if text]
        if not kept:
            raise ApiError(422, "file: no text to translate (every line is blank)", "invalid_request")
        return [t for t, _ in kept], [n for _, n in kept]

    def rebuild(self, translations: list[str]) -> str:
        """The text with each line to translate replaced by its translation (in the order of texts())."""
        it = iter(translations)
        return "".join(before + (next(it) if text else "") + after for before, text, after in self.lines)


FIELD = re.compile(r"^q(\[(\d+)\])?:")  # what an error is about: the request's texts (q) or one of them (q[i])
ITEM = re.compile(r"\b(?:q|texts)\[(\d+)\]")  # a text named inside a message (the translator's texts[i] too)


@contextmanager
def named_lines(numbers: list[int]):
    """An ApiError raised inside, naming q[i] (a text of the request that translates a file's lines, wherever the
    message names it), names the file's line instead; one about q, the file."""
    try:
        yield
    except ApiError as e:
        message = FIELD.sub(lambda m: f"file: line {numbers[int(m[2])]}:" if m[2] else "file:", e.message)
        message = ITEM.sub(lambda m: f"line {numbers[int(m[1])]}", message)
        for request, file in WORDING:
            message = message.replace(request, file)
        about_file = e.status in (413, 422) and not message.startswith("file")  # (not a 429, 503 or 504)
        raise ApiError(e.status, f"file: {message}" if about_file else message, e.error_type, e.headers) from None


WORDING = (("the request asks for", "its lines ask for"), (" texts x ", " lines x "),
           ("; send fewer or shorter texts, or a smaller beam", "; send a shorter file"))
"""A request's words in the errors of check_work, as they read of a file (whose decoding settings are the model's)."""


class Store:
    """Translated files for download under random names (128 bits: the address is the only key, as in
    LibreTranslate), within KEEP_FILES, KEEP_BYTES and KEEP_SECONDS. Used from the event loop only."""

    def __init__(self, files: int = KEEP_FILES, total_bytes: int = KEEP_BYTES, seconds: float = KEEP_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.files, self.total_bytes, self.seconds, self.clock = files, total_bytes, seconds, clock
        self._kept: OrderedDict[str, tuple[float, str, bytes]] = OrderedDict()  # oldest first

    def put(self, filename: str, data: bytes) -> str:
        name = secrets.token_urlsafe(16)
        self._kept[name] = (self.clock(), filename, data)
        self._expire()
        while len(self._kept) > 1 and (len(self._kept) > self.files or self.size() > self.total_bytes):
            self._kept.popitem(last=False)
        return name

    def get(self, name: str) -> tuple[str, bytes] | None:
        """The file's download name and content; None when unknown or no longer kept."""
        self._expire()
        kept = self._kept.get(name)
        return kept and kept[1:]

    def size(self) -> int:
        return sum(len(data) for _, _, data in self._kept.values())

    def _expire(self) -> None:
        while self._kept and self.clock() - next(iter(self._kept.values()))[0] > self.seconds:
            self._kept.popitem(last=False)


def download_name(filename: str, target: str) -> str:
    """notes.txt translated into en: notes_en.txt (as LibreTranslate names it)."""
    path = PurePath(filename)
    return f"{path.stem}_{target}{path.suffix}"


def attachment(filename: str) -> str:
    """A Content-Disposition header for `filename` (RFC 6266: filename* for names that need quoting)."""
    quoted = quote(filename)
    return f'attachment; filename="{filename}"' if quoted == filename else f"attachment; filename*=utf-8''{quoted}"
