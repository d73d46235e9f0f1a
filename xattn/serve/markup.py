"""`format: html`: the text of an HTML fragment or page translated, its markup kept and carried over to the
translation by the word alignment read from cross-attention (as Bergamot, Firefox's translator, moves tags with
its alignment).

The HTML is cut into blocks: the text between two block boundaries (any element that is not inline, a line
break, a comment's neighbours don't count), with the inline elements (`b`, `a`, `span`, ...) inside it. Each
block's text, its white space collapsed as a browser shows it and its character references decoded, is what the
model translates (one text; the server cuts it into sentences). Markup outside blocks is kept as written.
Nothing is translated inside `script`, `style`, `pre`, `code`, `textarea`, `svg`, `math`, `template` and the
like, nor inside an element marked `translate="no"` or of class `notranslate` (HTML's and Google's conventions);
inside a block, such an element, an empty inline element (an `img`, a `<span></span>`) or a comment is kept
whole and placed after the translation of the word it followed.

The inline elements go on the translated words by the alignment: each target word takes the elements around the
source word it is linked to (its first), a word linked to none those its linked neighbours on both sides share,
and an element whose words come apart in the translation is written once per run of them (`<a>` twice, its
attributes each time). The markup of an element is written as the source wrote its start tag; end tags as
`</name>`. Attributes (`title`, `alt`) are not translated.
"""
from __future__ import annotations

import html
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser

from xattn.serve.limits import ApiError
from xattn.words import split_words

INLINE = frozenset("a abbr acronym b bdi bdo big cite data del dfn em font i ins label mark q rb rp rt ruby s "
                   "small span strike strong sub sup time tt u".split())
"""Elements that sit inside a sentence: their text is translated with the words around it."""
KEPT = frozenset("script style pre code kbd samp var textarea svg math template xmp listing plaintext "
                 "noembed iframe object".split())
"""Elements whose content is never translated (code, and what is not text)."""
KEPT_INLINE = frozenset("code kbd samp var".split())
"""Of those, the ones that may sit inside a sentence: kept whole there, as an empty inline element is."""
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
"""Elements without an end tag."""
VOID_INLINE = frozenset("img input wbr".split())
"""Of those, the ones that sit inside a sentence (a `br` ends a block)."""
SPACE = re.compile(r"[ \t\n\r\f]+")
ITEM = re.compile(r"\bq\[(\d+)\]")
"""HTML's white space, which a browser shows as one space (not U+00A0)."""


@dataclass
class Element:
    """An inline element inside a block: its start and end tag as written out (no end tag: it was left open), the
    characters of the block's text it holds, [start, end), and where its markup began in the block's `raw` and
    `atoms` (to keep it whole if it holds no word)."""
    start_tag: str
    end_tag: str
    start: int
    raw_at: int
    atoms_at: int
    end: int = -1


@dataclass
class Atom:
    """Markup kept whole inside a block, at character `at` of its text, and whether white space stood before and
    after it (a browser shows `mehr<img> ende` and `x <code>y</code> z` apart)."""
    at: int
    markup: str
    before: bool = False
    after: bool = False


@dataclass
class Block:
    """Text to translate, with its inline elements (in the order they open: an outer one before those inside it)
    and its atoms (markup kept whole, at a character offset of the text)."""
    text: str = ""
    elements: list[Element] = field(default_factory=list)
    atoms: list[Atom] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)  # the block as written: what stands in for it if it has no word

    def words(self, start: int = 0, end: int | None = None) -> list[str]:
        return split_words(self.text[start:end])


@dataclass
class Page:
    """An HTML text as markup kept (str) and blocks to translate, in order."""
    parts: list[str | Block]

    @property
    def blocks(self) -> list[Block]:
        return [p for p in self.parts if isinstance(p, Block)]

    def render(self, translations: list[Translated]) -> str:
        """The page with each block's translation in place of the block, its inline markup placed by the links."""
        found = iter(translations)
        return "".join(p if isinstance(p, str) else placed(p, next(found)) for p in self.parts)


@dataclass(frozen=True)
class Translated:
    """A block's translation, its words and word links (source word, target word), as serve/sentences.Joined gives
    them."""
    text: str
    source_words: list[str]
    target_words: list[str]
    links: list[tuple[int, int]]


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
        self.open: list[tuple[str, Element]] = []  # the block's inline elements still open, by tag name
        self.kept: list[str] | None = None          # the markup of an element kept whole, while inside it
        self.kept_tag, self.kept_depth, self.kept_inline = "", 0, False

    # markup of an element kept whole: collected until its end tag
    def _keep(self, markup: str, tag: str | None = None, opening: bool = False) -> bool:
        if self.kept is None:
            return False
        self.kept.append(markup)
        if tag == self.kept_tag:
            self.kept_depth += 1 if opening else -1
            if self.kept_depth == 0:
                whole, self.kept = "".join(self.kept), None
                self._atom(whole) if self.kept_inline else self._markup(whole)
        return True

    def handle_starttag(self, tag: str, attrs: list) -> None:
        markup = self.get_starttag_text() or f"<{tag}>"
        if self._keep(markup, None if tag in VOID else tag, opening=True):
            return
        values = dict(attrs)
        untranslated = tag in KEPT or values.get("translate", "").lower() == "no" \
            or "notranslate" in (values.get("class") or "").split()
        if untranslated and tag not in VOID:
            self.kept, self.kept_tag, self.kept_depth = [markup], tag, 1
            if not (kept_inline := tag in INLINE or tag in KEPT_INLINE):
                self.end_block()
            self.kept_inline = kept_inline
            return
        if tag in VOID_INLINE:
            self._atom(markup)
        elif tag in INLINE:
            block = self._block()
            element = Element(markup, f"</{tag}>", len(block.text), len(block.raw), len(block.atoms))
            block.elements.append(element)
            block.raw.append(markup)
            self.open.append((tag, element))
        else:
            self._markup(markup)

    def handle_startendtag(self, tag: str, attrs: list) -> None:  # <br/>, <img/>: void however written
        markup = self.get_starttag_text() or f"<{tag}/>"
        if self._keep(markup):
            return
        if tag in VOID_INLINE or tag in INLINE:
            self._atom(markup)
        else:
            self._markup(markup)

    def handle_endtag(self, tag: str) -> None:
        markup = f"</{tag}>"
        if self._keep(markup, tag):
            return
        if tag in INLINE and any(name == tag for name, _ in self.open):
            while self.open[-1][0] != tag:  # (an element left open inside it ends with it, as a browser ends it)
                self._ended(self.open.pop()[1], "")
            self.block.raw.append(markup)
            self._ended(self.open.pop()[1], markup)
        elif tag in INLINE:  # an end tag of nothing open: kept where it stands
            self._atom(markup)
        else:
            self._markup(markup)

    def handle_data(self, data: str) -> None:
        if self._keep(data if self.cdata_elem else html.escape(data, quote=False)):
            return
        if not data.strip(" \t\n\r\f") and self.block is None:
            self.parts.append(data)
            return
        block = self._block()
        block.raw.append(data if self.cdata_elem else html.escape(data, quote=False))
        data = SPACE.sub(" ", data)
        if block.atoms and block.atoms[-1].at == len(block.text) and data.startswith(" "):
            block.atoms[-1].after = True
        block.text += data[1:] if data.startswith(" ") and block.text.endswith(" ") else data

    def handle_comment(self, data: str) -> None:
        if not self._keep(markup := f"<!--{data}-->"):
            self._atom(markup) if self.block is not None else self._markup(markup)

    def handle_decl(self, decl: str) -> None:
        self._keep(f"<!{decl}>") or self._markup(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self._keep(f"<?{data}>") or self._markup(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self._keep(f"<![{data}]>") or self._markup(f"<![{data}]>")

    def close(self) -> None:
        super().close()
        if self.kept is not None:  # an element kept whole that never ended: kept to the end, as written
            whole, self.kept = "".join(self.kept), None
            self._atom(whole) if self.kept_inline else self._markup(whole)

    def _block(self) -> Block:
        if self.block is None:
            self.block = Block()
            self.parts.append(self.block)
        return self.block

    def _atom(self, markup: str) -> None:
        block = self._block()
        block.atoms.append(Atom(len(block.text), markup, block.text.endswith(" ")))
        block.raw.append(markup)

    def _markup(self, markup: str) -> None:
        self.end_block()
        self.parts.append(markup)

    def _ended(self, element: Element, end_tag: str) -> None:
        """`element` ends here, with `end_tag` ("": left open). One that holds no word is an atom: kept whole, with
        whatever is inside it."""
        block = self.block
        element.end, element.end_tag = len(block.text), end_tag
        if block.words(element.start, element.end):
            return
        del block.atoms[element.atoms_at:]
        del block.elements[next(k for k, e in enumerate(block.elements) if e is element):]  # (and those inside it)
        block.atoms.append(Atom(element.start, "".join(block.raw[element.raw_at:]),
                                block.text[element.start - 1:element.start] == " ", element.start < len(block.text)))

    def end_block(self) -> None:
        """The block ends here (a block boundary, or the end): its elements still open end with it."""
        if self.block is None:
            return
        while self.open:
            self._ended(self.open.pop()[1], "")
        if not self.block.words():  # nothing to translate: it stays as written
            self.parts[-1] = "".join(self.block.raw)
        self.block = None


def spans(words: list[str], text: str) -> list[tuple[int, int]]:
    """Where each of `words` (the words of `text`, in order: xattn.words) stands in `text`."""
    out, at = [], 0
    for word in words:
        start = text.index(word, at)
        out.append((start, at := start + len(word)))
    return out


def placed(block: Block, translation: Translated) -> str:
    """The translation of `block` as HTML: escaped, with the block's inline elements and atoms placed by its links."""
    text, links = translation.text, translation.links
    offset = len(block.text) - len(block.text.lstrip(" "))
    source = [(start + offset, end + offset) for start, end in spans(translation.source_words, block.text.strip(" "))]
    target = spans(translation.target_words, text)
    inside = [tuple(k for k, e in enumerate(block.elements) if e.start < end and e.end > start)
              for start, end in source]  # each source word's elements, the outer first
    whole = shared(*inside) if inside else ()
    first: dict[int, int] = {}
    for i, j in sorted(links):
        first.setdefault(j, i)
    stacks = []
    for j in range(len(target)):  # a word linked to nothing: what its nearest linked neighbours share
        if j in first:
            stacks.append(inside[first[j]])
            continue
        before = next((inside[first[k]] for k in range(j - 1, -1, -1) if k in first), whole)
        after = next((inside[first[k]] for k in range(j + 1, len(target)) if k in first), whole)
        stacks.append(shared(before, after))
    follows: dict[int, list[Atom]] = {}  # atoms by the target word they follow (-1: before the first)
    linked = {i for i, _ in links}
    for atom in block.atoms:
        before = [i for i, (start, _) in enumerate(source) if start < atom.at]  # (one inside a word follows it)
        if before and before[-1] == len(source) - 1:
            anchor = len(target) - 1  # after the last word
        else:
            anchor = next((max(j for i, j in links if i == k) for k in reversed(before) if k in linked), -1)
        follows.setdefault(anchor, []).append(atom)
    lead = block.text.startswith(" ") and not any(a.at == 0 for a in block.atoms)  # (else the atom's space)
    out, current, done = [" " if lead else ""], (), 0
    out.append(kept(follows.get(-1, []), ""))
    for j, (start, end) in enumerate(target):
        keep = len(shared(current, stacks[j]))
        out += [block.elements[k].end_tag for k in reversed(current[keep:])]
        out.append(kept(follows.get(j - 1, []) if j else [], html.escape(text[done:start], quote=False)))
        out += [block.elements[k].start_tag for k in stacks[j][keep:]]
        out.append(html.escape(text[start:end], quote=False))
        current, done = stacks[j], end
    out += [block.elements[k].end_tag for k in reversed(current)]
    out.append(html.escape(text[done:], quote=False))
    out.append(kept(follows.get(len(target) - 1, []) if target else [], ""))
    trail = block.text.endswith(" ") and not any(a.at == len(block.text) and a.before for a in block.atoms)
    out.append(" " if trail else "")
    return "".join(out)


def kept(atoms: list[Atom], gap: str) -> str:
    """Atoms where the translation has `gap` between two words: after it if white space stood before them, before it
    if not (`mehr<img> ende`); the gap alone if there are none."""
    if not atoms:
        return gap
    markup = "".join(a.markup for a in atoms)
    if atoms[0].before:
        return (gap or " ") + markup + (" " if atoms[-1].after else "")
    return markup + (gap or (" " if atoms[-1].after else ""))


def shared(*stacks: tuple) -> tuple:
    """The elements words share from the outside in."""
    n = 0
    while n < min(map(len, stacks)) and len({s[n] for s in stacks}) == 1:
        n += 1
    return stacks[0][:n]


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
    owners = [(i, n, len(page.blocks)) for i, page in enumerate(pages) for n in range(1, len(page.blocks) + 1)]
    try:
        yield
    except ApiError as e:
        def name(m: re.Match) -> str:
            i, n, count = owners[int(m[1])]
            return f"q[{i}]" if count == 1 else f"q[{i}]: block {n}"
        raise ApiError(e.status, ITEM.sub(name, e.message), e.error_type, e.headers) from None
