"""A block's inline markup put on its translation by the word alignment (serve/markup.py reads the blocks).

Each target word takes the inline elements around the source word it is linked to (its first link, by source
order); a word linked to none takes what its nearest linked neighbours on both sides share (at an edge, what
holds every source word). An element that no target word took so is put on the target words linked to any of
its source words, or, with none, on the target word at its first word's relative place, so that no link (`<a
href>`) is lost. An element whose words come apart in the translation is written once for each run of them (its
start tag as the source wrote it, each time); a word's own punctuation goes where its source word's went (the
full stop of `<a>grüne Wiese</a>.` stays outside the link). An atom (markup kept whole) follows the translation
of the nearest linked source word before it, inside the elements it stood in; white space before and after it,
and at the block's edges (`&nbsp;` too), is kept as the source had it.
"""
from __future__ import annotations

import html
import re

from xattn.serve.markup import Atom, Block, Translated

PUNCTUATION = re.compile(r"(\W*)(.*?)(\W*)", re.S)
"""A word as its leading punctuation, its core and its trailing punctuation (\\W: neither letter, digit nor _)."""


def spans(words: list[str], text: str) -> list[tuple[int, int]]:
    """Where each of `words` (the words of `text`, in order: xattn.words) stands in `text`."""
    out, at = [], 0
    for word in words:
        start = text.index(word, at)
        out.append((start, at := start + len(word)))
    return out


def shared(*stacks: tuple) -> tuple:
    """The elements words share from the outside in."""
    n = 0
    while n < min(map(len, stacks)) and len({s[n] for s in stacks}) == 1:
        n += 1
    return stacks[0][:n]


def placed(block: Block, translation: Translated) -> str:
    """The translation of `block` as HTML: escaped, with the block's inline elements and atoms placed by its links
    (its text escaped, then its atoms, should its words not be found in it)."""
    try:
        source = spans(translation.source_words, block.text)
        target = spans(translation.target_words, translation.text)
    except ValueError:  # (words that are not the text's: never seen; a translation rather than an error)
        return html.escape(translation.text, quote=False) + "".join(a.markup for a in block.atoms)
    if not source:
        return "".join(block.raw)
    links = [(i, j) for i, j in translation.links if i < len(source) and j < len(target)]
    first = {j: i for i, j in sorted(links, reverse=True)}  # each target word's first linked source word
    last = {i: j for i, j in sorted(links)}                 # each source word's last linked target word
    stacks = word_elements(block, source, len(target), first, links)
    follows: dict[int, list[Atom]] = {}  # atoms inside the text, by the target word they follow
    lead, trail = [], []                 # atoms before the first source word, and after the last
    for atom in block.atoms:
        before = [i for i, (start, _) in enumerate(source) if start < atom.at]  # (one inside a word follows it)
        if not before:
            lead.append(atom)
        elif before[-1] == len(source) - 1:
            trail.append(atom)
        else:
            anchor = next((last[k] for k in reversed(before) if k in last), -1)
            (follows.setdefault(anchor, []) if anchor >= 0 else lead).append(atom)
    writer = Writer(block)
    writer.edge(block.text[:source[0][0]], lead, 0)
    writer.text(translation.text[:target[0][0]] if target else translation.text)
    edges = punctuation_edges(block, source)
    for j, (start, end) in enumerate(target):
        lead_in, tail_in = edges[first[j]] if j in first else (None, None)
        writer.word(stacks[j], translation.text[start:end], None if lead_in is None else shared(stacks[j], lead_in),
                    None if tail_in is None else shared(stacks[j], tail_in))
        if j + 1 < len(target):
            writer.between(follows.get(j, []), translation.text[end:target[j + 1][0]], stacks[j + 1])
    writer.text(translation.text[target[-1][1]:] if target else "")
    for j in sorted(k for k in follows if k >= len(target) - 1):  # (atoms of a word past the last: at the end)
        trail = follows[j] + trail
    writer.edge(block.text[source[-1][1]:], trail, source[-1][1])
    writer.move(())
    return "".join(writer.out)


def punctuation_edges(block: Block, source: list[tuple[int, int]]) -> list[tuple[tuple | None, tuple | None]]:
    """For each source word with punctuation at its start or end (`Wiese.`, `„Hund`), the elements that hold that
    punctuation (None: it has none there), so that a translated word's own punctuation goes where its source
    word's went: `<a>grüne Wiese</a>.` gives `<a>green grass</a>.`, not the full stop inside the link."""
    out = []
    for start, end in source:
        parts = PUNCTUATION.fullmatch(block.text[start:end])
        if not parts[2]:  # (punctuation alone: a word as any other)
            out.append((None, None))
            continue
        held = [tuple(k for k, e in enumerate(block.elements) if e.start <= at < e.end) for at in (start, end - 1)]
        out.append((held[0] if parts[1] else None, held[1] if parts[3] else None))
    return out


def word_elements(block: Block, source: list[tuple[int, int]], targets: int, first: dict[int, int],
                  links: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """The elements each target word is written in (indices into block.elements, outer first); `first`: each
    target word's first linked source word."""
    inside = [tuple(k for k, e in enumerate(block.elements) if e.start < end and e.end > start)
              for start, end in source]  # each source word's elements
    whole = shared(*inside)
    stacks = []
    for j in range(targets):
        if j in first:
            stacks.append(inside[first[j]])
            continue
        before = next((inside[first[k]] for k in range(j - 1, -1, -1) if k in first), whole)
        after = next((inside[first[k]] for k in range(j + 1, targets) if k in first), whole)
        stacks.append(shared(before, after))
    taken = {k for stack in stacks for k in stack}
    for k in range(len(block.elements)):
        if k in taken or not targets:
            continue
        words = [i for i, ks in enumerate(inside) if k in ks]
        if not words:
            continue
        chosen = sorted({j for i, j in links if i in words}) or [min(targets - 1, words[0] * targets // len(source))]
        for j in chosen:
            stacks[j] = tuple(sorted({*stacks[j], k}))
    return stacks


class Writer:
    """The HTML of a block's translation, written in order, with the elements open at each point."""

    def __init__(self, block: Block):
        self.block, self.out, self.current = block, [], ()

    def move(self, to: tuple) -> None:
        """Close the open elements `to` does not hold and open those it adds."""
        keep = len(shared(self.current, to))
        self.out += [f"</{self.block.elements[k].tag}>" for k in reversed(self.current[keep:])]
        self.out += [self.block.elements[k].start_tag for k in to[keep:]]
        self.current = to

    def text(self, text: str) -> None:
        self.out.append(html.escape(text, quote=False))

    def word(self, stack: tuple, text: str, lead: tuple | None = None, tail: tuple | None = None) -> None:
        """A translated word in the elements `stack`, its leading and trailing punctuation in `lead` and `tail`
        (None: in `stack` too)."""
        parts = PUNCTUATION.fullmatch(text)
        if not parts[2] or (lead is None and tail is None):
            self.move(stack)
            self.text(text)
            return
        for part, elements in ((parts[1], lead), (parts[2], stack), (parts[3], tail)):
            if part:
                self.move(stack if elements is None else elements)
                self.text(part)

    def atoms(self, atoms: list[Atom]) -> None:
        for atom in atoms:
            self.move(atom.within)
            self.out.append(atom.markup)

    def between(self, atoms: list[Atom], gap: str, next_stack: tuple) -> None:
        """What stands between two translated words: their gap, and the atoms that follow the first (after the gap
        if white space stood before them, as in `x <code>y</code> z`; before it if not, as in `mehr<img> ende`)."""
        if not atoms:
            self.move(shared(self.current, next_stack))
            self.text(gap)
        elif atoms[0].before:
            self.move(shared(self.current, atoms[0].within))
            self.text(gap or " ")
            self.atoms(atoms)
            if atoms[-1].after:
                self.move(shared(self.current, next_stack))
                self.text(" ")
        else:
            self.atoms(atoms)
            self.move(shared(self.current, next_stack))
            self.text(gap or (" " if atoms[-1].after else ""))

    def edge(self, space: str, atoms: list[Atom], offset: int) -> None:
        """The source's text before its first word or after its last (white space: ` `, `&nbsp;`), with the atoms
        there at their places (`offset`: where `space` begins in the block's text)."""
        at = 0
        for atom in atoms:
            cut = min(max(atom.at - offset, at), len(space))
            if space[at:cut]:
                self.move(shared(self.current, atom.within))
                self.text(space[at:cut])
            self.atoms([atom])
            at = cut
        if space[at:]:
            self.move(() if offset else self.current)  # (after the last word: outside every element)
            self.text(space[at:])
