"""`format: html`: HTML read as blocks of text to translate, with the markup around and inside them, and written
back with each block's translation in its place (serve/placement.py puts a block's inline markup on its
translation by the word alignment read from cross-attention, as Bergamot, Firefox's translator, moves tags by its
alignment).

A block is the text between two block boundaries (an element that is not inline, a `<br>`, a doctype, CDATA),
with the inline elements (`b`, `a`, `span`, `button`, ...) inside it. Its text, white space collapsed as a browser
shows it and character references decoded, is what the model translates (one text; the server cuts it into
sentences); a block without a letter or digit (`|`, `›`) is kept as written. Markup outside blocks is written as
it came (a comment as `<!--...-->`, text outside blocks with its references decoded and re-escaped). Nothing is
translated inside `script`, `style`, `pre`, `code`, `textarea`, `svg`, `math`, `template` and the like, nor inside
an element marked `translate="no"` or of class `notranslate` (HTML's and Google's conventions); inside a block,
such an element, an inline element with no word (an `img`, an empty `<span>`) or a comment is an atom: kept whole,
inside the inline elements it stood in. An inline element a block boundary cuts (`<a>hier<br>dort</a>`) ends with
the block and opens again in the next one, as a browser reopens it.
"""
from __future__ import annotations

import html
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from html.parser import HTMLParser

from xattn.serve.limits import ApiError
from xattn.words import split_words

INLINE = frozenset("a abbr acronym b bdi bdo big button cite data del dfn em font i ins label mark nobr q rb rp rt "
                   "ruby s small span strike strong sub sup time tt u".split())
"""Elements that sit inside a sentence: their text is translated with the words around it."""
KEPT = frozenset("script style pre code kbd samp var textarea svg math template xmp listing plaintext noembed "
                 "iframe object".split())
"""Elements whose content is never translated (code, and what is not text)."""
KEPT_BLOCK = frozenset("pre template xmp listing plaintext".split())
"""Of those, the ones that end a block; the others, inside a block, are atoms there."""
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
"""Elements without an end tag."""
VOID_INLINE = frozenset("img input wbr".split())
"""Of those, the ones that sit inside a sentence (a `br` ends a block)."""
OPTIONAL_END = frozenset("li dt dd p tr td th option optgroup rt rp tbody thead tfoot colgroup caption".split())
"""Elements whose end tag may be left out: the next of their kind (a `p`: any block) ends them."""
CLOSES_P = frozenset("address article aside blockquote details dialog div dl fieldset figcaption figure footer "
                     "form h1 h2 h3 h4 h5 h6 header hgroup hr main menu nav ol p pre section table ul".split())
"""Elements whose start ends an open `p`."""
SPACE = re.compile(r"[ \t\n\r\f]+")
"""HTML's white space, which a browser shows as one space (not U+00A0)."""
NAME = re.compile(r"\bq\[(\d+)\](?=:)")
"""A text as an error names it (q[3]: ...)."""


@dataclass(eq=False)
class Element:
    """An inline element inside a block: its tag name, start and end tag as written out, the characters of the
    block's text it holds, [start, end), and where its markup began in the block's `raw` and `atoms` (to keep it
    whole, as an atom, if it holds no word)."""
    tag: str
    start_tag: str
    start: int
    raw_at: int
    atoms_at: int
    end: int = -1


@dataclass
class Atom:
    """Markup kept whole inside a block, at character `at` of its text, inside the elements `within` (indices into
    the block's elements); whether white space stood before and after it (`mehr<img> ende`: none before)."""
    at: int
    markup: str
    within: tuple[int, ...]
    before: bool = False
    after: bool = False


@dataclass
class Block:
    """Text to translate, with its inline elements (in the order they open: an outer one before those inside it)
    and its atoms."""
    text: str = ""
    elements: list[Element] = field(default_factory=list)
    atoms: list[Atom] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)  # the block as written: what stands in for it if nothing is
    #                                               translated

    def words(self, start: int = 0, end: int | None = None) -> list[str]:
        return split_words(self.text[start:end])

    def translatable(self) -> bool:
        return any(ch.isalnum() for ch in self.text)


@dataclass(frozen=True)
class Translated:
    """A block's translation, its words and word links (source word, target word), as serve/sentences.Joined gives
    them."""
    text: str
    source_words: list[str]
    target_words: list[str]
    links: list[tuple[int, int]]


@dataclass
class Page:
    """An HTML text as markup kept (str) and blocks to translate, in order."""
    parts: list[str | Block]

    @cached_property  # (parts are not changed once read)
    def blocks(self) -> list[Block]:
        return [p for p in self.parts if isinstance(p, Block)]

    def render(self, translations: list[Translated]) -> str:
        """The page with each block's translation in place of the block, its inline markup placed by the links."""
        from xattn.serve.placement import placed

        found = iter(translations)
        return "".join(p if isinstance(p, str) else placed(p, next(found)) for p in self.parts)


def parse(text: str) -> Page:
    """`text` as a Page (an HTML fragment or a whole page; never refused: HTML is read as a browser reads it)."""
    reader = Reader()
    reader.feed(text)
    reader.close()
    reader.end_block()
    return Page(reader.parts)


class Reader(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str | Block] = []
        self.block: Block | None = None
        self.open: list[Element] = []            # the block's inline elements still open
        self.carried: list[Element] = []         # those a block boundary cut, to open again in the next block
        self.kept: list[str] | None = None       # the markup of an element kept whole, while inside it
        self.kept_tag, self.kept_inside, self.kept_atom = "", [], False  # its tag, the tags open inside it

    def _raw(self, data: str) -> str:
        """Text as written out: script and style as they came, other text (references decoded) escaped again."""
        return data if self.cdata_elem and not getattr(self, "_escapable", False) else html.escape(data, quote=False)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        markup = self.get_starttag_text() or f"<{tag}>"
        if self.kept is not None:
            if self._ends_kept(tag):
                self._end_kept()
            else:
                self.kept.append(markup)
                if tag not in VOID:
                    self.kept_inside.append(tag)
                return
        values = dict(attrs)
        if tag not in VOID and (tag in KEPT or (values.get("translate") or "").lower() == "no"
                                or "notranslate" in (values.get("class") or "").split()):
            self.kept, self.kept_tag, self.kept_inside = [markup], tag, []
            self.kept_atom = tag not in KEPT_BLOCK and (tag in INLINE or tag in KEPT)
            if not self.kept_atom:
                self.end_block()
        elif tag in VOID_INLINE:
            self._atom(markup)
        elif tag in INLINE:
            block = self._block()
            element = Element(tag, markup, len(block.text), len(block.raw), len(block.atoms))
            block.elements.append(element)
            block.raw.append(markup)
            self.open.append(element)
        else:
            self._markup(markup)

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        if tag not in VOID:  # `<div/>`, `<script src=x/>`: a browser opens them, as without the slash
            self.handle_starttag(tag, attrs)
            if tag in ("script", "style") and self.kept is not None:
                self.set_cdata_mode(tag)
            return
        markup = self.get_starttag_text() or f"<{tag}/>"
        if self.kept is not None:
            self.kept.append(markup)
        elif tag in VOID_INLINE:
            self._atom(markup)
        else:
            self._markup(markup)

    def handle_endtag(self, tag: str) -> None:
        markup = f"</{tag}>"
        if self.kept is not None:
            if tag in self.kept_inside:
                del self.kept_inside[len(self.kept_inside) - 1 - self.kept_inside[::-1].index(tag):]
                self.kept.append(markup)
                return
            if tag == self.kept_tag:
                self.kept.append(markup)
                self._end_kept()
                return
            self._end_kept()  # the end of what holds it: it ended before (its end tag left out)
        if tag in INLINE and any(e.tag == tag for e in self.open):
            while self.open[-1].tag != tag:  # (an element left open inside it ends with it, as a browser ends it)
                self._ended(self.open.pop())
            self.block.raw.append(markup)
            self._ended(self.open.pop())
        elif tag in INLINE and any(e.tag == tag for e in self.carried):  # its end, after the boundary that cut it:
            del self.carried[max(k for k, e in enumerate(self.carried) if e.tag == tag):]  # written already
        elif tag in INLINE:  # an end tag of nothing open: kept where it stands
            self._atom(markup)
        else:
            self._markup(markup)

    def handle_data(self, data: str) -> None:
        if self.kept is not None:
            self.kept.append(self._raw(data))
            return
        if not data.strip(" \t\n\r\f") and self.block is None:
            self.parts.append(data)  # (white space alone: nothing to escape)
            return
        block = self._block()
        block.raw.append(self._raw(data))
        data = SPACE.sub(" ", data)
        if block.atoms and block.atoms[-1].at == len(block.text) and data.startswith(" "):
            block.atoms[-1].after = True
        block.text += data[1:] if data.startswith(" ") and block.text.endswith(" ") else data

    def handle_comment(self, data: str) -> None:
        markup = f"<!--{data}-->"
        if self.kept is not None:
            self.kept.append(markup)
        elif self.block is not None:
            self._atom(markup)
        else:
            self._markup(markup)

    def handle_decl(self, decl: str) -> None:
        self._outside(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self._outside(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self._outside(f"<![{data}]>")

    def close(self) -> None:
        super().close()
        if self.rawdata:  # an unclosed script or style: Python 3.11's parser keeps its text unread
            rest, self.rawdata = self.rawdata, ""
            self.handle_data(rest)
        if self.kept is not None:  # an element kept whole that never ended: kept to the end, as written
            self._end_kept()

    def _outside(self, markup: str) -> None:
        if self.kept is not None:
            self.kept.append(markup)
        else:
            self._markup(markup)

    def _ends_kept(self, tag: str) -> bool:
        """Whether the start of `tag` ends the element kept whole, its end tag left out (`<li translate=no>a<li>`)."""
        if self.kept_inside or self.kept_tag not in OPTIONAL_END:
            return False
        return tag == self.kept_tag or (self.kept_tag == "p" and tag in CLOSES_P)

    def _end_kept(self) -> None:
        whole, self.kept = "".join(self.kept), None
        if self.kept_atom:
            self._atom(whole)
        else:
            self._markup(whole)

    def _block(self) -> Block:
        if self.block is None:
            self.block = Block()
            self.parts.append(self.block)
            for cut in self.carried:  # the elements a boundary cut, open again
                element = Element(cut.tag, cut.start_tag, 0, 0, 0)
                self.block.elements.append(element)
                self.block.raw.append(cut.start_tag)
                self.open.append(element)
            self.carried = []
        return self.block

    def _atom(self, markup: str) -> None:
        block = self._block()
        within = tuple(block.elements.index(e) for e in self.open)
        block.atoms.append(Atom(len(block.text), markup, within, block.text.endswith(" ")))
        block.raw.append(markup)

    def _markup(self, markup: str) -> None:
        self.end_block()
        self.parts.append(markup)

    def _ended(self, element: Element) -> None:
        """`element` ends here. One that holds no word is an atom: kept whole, with whatever is inside it, inside
        the elements still open around it."""
        block = self.block
        element.end = len(block.text)
        if block.words(element.start, element.end):
            return
        del block.atoms[element.atoms_at:]
        del block.elements[next(k for k, e in enumerate(block.elements) if e is element):]  # (and those inside it)
        within = tuple(block.elements.index(e) for e in self.open)
        block.atoms.append(Atom(element.start, "".join(block.raw[element.raw_at:]), within,
                                block.text[element.start - 1:element.start] == " ", element.start < len(block.text)))

    def end_block(self) -> None:
        """The block ends here (a block boundary, or the end): its elements still open end with it, and open again
        in the next block (a browser reopens them)."""
        if self.block is None:
            return
        cut = list(self.open)
        while self.open:
            self._ended(self.open.pop())
        self.carried = [e for e in cut if e in self.block.elements]  # (what held words; an empty one stays here)
        if not self.block.translatable():  # nothing to translate: it stays as written (its cut elements: open)
            self.parts[-1] = "".join(self.block.raw)
            self.carried = []
        self.block = None


def pages_of(req, texts: list[str]) -> list[Page]:
    """The pages of a `format: html` request's texts; what its answer, being HTML, cannot carry is a 422."""
    for name, asked in (("alternatives", req.alternatives), ("attention", req.attention != "none"),
                        ("alignment", req.alignment)):
        if asked:
            raise ApiError(422, f"{name}: not available with format html (the answer is the HTML); ask with "
                           "format text", "invalid_request")
    return [parse(text) for text in texts]


def plain(page: Page) -> str:
    """What a page says, its blocks' texts one after another (to tell its language by)."""
    return " ".join(block.text.strip(" ") for block in page.blocks)


@contextmanager
def named_blocks(pages: list[Page]):
    """An ApiError raised inside, naming q[k] (the k-th block of all the pages, each a text of the request that
    translates them), names the page and its block instead: q[i], or q[i]: block n of a page of several."""
    def name(m: re.Match) -> str:
        if int(m[1]) >= len(owners):
            return m[0]
        i, n, count = owners[int(m[1])]
        return f"q[{i}]" if count == 1 else f"q[{i}]: block {n}"
    try:
        yield
    except ApiError as e:
        owners = [(i, n, len(page.blocks)) for i, page in enumerate(pages) for n in range(1, len(page.blocks) + 1)]
        raise ApiError(e.status, NAME.sub(name, e.message), e.error_type, e.headers) from None
