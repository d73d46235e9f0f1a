"""xattn.words: one rule for what a word is, the tokenizer's, in every verb that counts words."""
import unicodedata

import pytest

from xattn.cli.main import main
from xattn.words import SEPARATORS, is_separator, split_words, strip_separators

ODD = ["\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\x0b"]
"""Characters that str.split() splits at but SentencePiece drops or keeps as a character: inside a word."""


def test_the_separators_are_the_whitespace_controls_and_unicode_separators():
    unicode = {chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) in ("Zs", "Zl", "Zp")}
    assert set(SEPARATORS) == {"\t", "\n", "\f", "\r"} | unicode


def test_split_words():
    assert split_words(" eins\u3000zwei\t drei\u00a0") == ["eins", "zwei", "drei"]
    assert split_words("a\x1cb c\x85d e\x0bf") == ["a\x1cb", "c\x85d", "e\x0bf"]
    assert split_words("") == split_words(" \t") == []
    assert strip_separators("\u2028 \x1ceins \x85") == "\x1ceins \x85"


def test_a_word_of_the_text_is_a_word_of_the_tokenizer(numbers_model):
    from xattn.tokenizer import load_tokenizers

    tok = load_tokenizers(numbers_model).src
    spaced = tok.encode("eins zwei")
    for ch in sorted(set(SEPARATORS) | {c for c in map(chr, range(0x110000)) if c.isspace()}):
        assert (tok.encode(f"eins{ch}zwei") == spaced) == is_separator(ch), repr(ch)


@pytest.fixture()
def odd_files(tmp_path):
    src = ["drei hundert vier", *(f"eins{ch}zwei drei" for ch in ODD), f"sieben {ODD[0]} acht"]
    tgt = ["three hundred four", *(f"one{ch}two three" for ch in ODD), f"seven {ODD[4]} eight"]
    for name, lines in (("src.txt", src), ("tgt.txt", tgt)):
        (tmp_path / name).write_bytes("".join(f"{line}\n" for line in lines).encode())
    return tmp_path, src, tgt


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_translate_alignment_and_align_take_the_lines_plain_translate_takes(numbers_model, odd_files, capsys):
    from xattn.analysis.alignment import parse_links

    work, src, tgt = odd_files
    code, out, err = run(capsys, "translate", numbers_model, "-i", work / "src.txt", "--alignment")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == len(src)
    for line, source in zip(lines, src):
        text, _, links = line.rpartition(" ||| ")
        parse_links(links, lengths=(len(split_words(source)), len(split_words(text))))  # every index is a word
    code, out, err = run(capsys, "align", numbers_model, "--src", work / "src.txt", "--tgt", work / "tgt.txt")
    assert code == 0, err
    for line, s, t in zip(out.splitlines(), src, tgt):
        parse_links(line, lengths=(len(split_words(s)), len(split_words(t))))
