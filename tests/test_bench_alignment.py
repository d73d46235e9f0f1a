"""The alignment benchmark's own pieces: eflomal's token links carried back to the raw words a training corpus'
links index, and benchmark cache keys that tell apart runs guided by different links."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import alignment_guided
import common
import eflomal_peer

from xattn.words import split_words


@pytest.mark.parametrize("line, lang, tokens, word_of", [
    ("L'homme du café aujourd'hui, t-shirt.", "fr",
     "le homme de le café aujourd' hui , t - shirt .", [0, 0, 1, 1, 2, 3, 3, 3, 4, 4, 4, 4]),
    ("The man's dog doesn't run.", "en", "the man 's dog does not run .", [0, 1, 1, 2, 3, 3, 4, 4]),
    ("  Two\tdogs &amp; a cat  ", "en", "two dogs & a cat", [0, 1, 2, 3, 4]),
    ("x&nbsp;y z", "en", "x y z", [0, 0, 1]),  # an entity that is a space splits a word into two tokens
    ("au - dessus des arbres", "fr", "au - dessus de les arbres", [0, 1, 2, 3, 3, 4]),
])
def test_tokens_know_their_raw_word(line, lang, tokens, word_of):
    got, of = eflomal_peer.tokenise_words(line, lang)
    assert " ".join(got) == tokens == eflomal_peer.normalise(line, lang)
    assert of == word_of
    assert max(of) < len(split_words(line))


def test_token_links_become_word_links():
    en, en_of = eflomal_peer.tokenise_words("The man's hat.", "en")      # the man 's hat .
    fr, fr_of = eflomal_peer.tokenise_words("Le chapeau du homme.", "fr")  # le chapeau de le homme .
    assert en == ["the", "man", "'s", "hat", "."] and fr == ["le", "chapeau", "de", "le", "homme", "."]
    tokens = {(0, 0), (1, 4), (2, 2), (2, 3), (3, 1), (4, 5)}
    # "'s" (of raw word 1) links both tokens of "du" (raw word 2): one word link; "homme." is one raw word
    assert eflomal_peer.word_links(tokens, en_of, fr_of) == {(0, 0), (1, 3), (1, 2), (2, 1), (2, 3)}


def test_run_links_reads_the_training_pairs_too(tmp_path):
    (tmp_path / "concat.fwd").write_text("0-0\n0-1 1-1\n0-0\n")
    (tmp_path / "concat.rev").write_text("0-0\n1-1\n\n")
    train_fwd, train_bwd, fwd, bwd = eflomal_peer.run_links(tmp_path, "concat", 2)
    assert train_fwd == [{(0, 0)}, {(0, 1), (1, 1)}] and train_bwd == [{(0, 0)}, {(1, 1)}]
    assert fwd == [{(0, 0)}] and bwd == [set()]


def test_guidance_files_are_line_aligned_and_flipped(tmp_path):
    g = alignment_guided.Guidance("eflomal", "transductive", [{(0, 1), (2, 0)}, set()], [{(1, 0)}])
    folder = alignment_guided.guidance_files(g, ["a b"], ["c d"], tmp_path)
    assert (folder / "en-fr.links").read_text() == "0-1 2-0\n\n"
    assert (folder / "fr-en.links").read_text() == "0-2 1-0\n\n"
    assert (folder / "hansards.fr-en.links").read_text() == "0-1\n"
    assert alignment_guided.guidance_files(g, ["a b"], ["c d"], tmp_path) == folder  # named by content
    over = alignment_guided.overrides(folder, "fr->en", 0.05, 10.0, ["train.max_steps=1"])
    assert over[:3] == ["train.max_steps=1", "alignment.weight=0.05", f"data.train_links={folder / 'fr-en.links'}"]
    corpus = json.loads(over[3].split("=", 1)[1])[0]
    assert corpus["src"].endswith("hansards.fr") and corpus["links"].endswith("hansards.fr-en.links")
    assert corpus["upsample"] == 10.0


def test_cache_key_follows_the_links_content_not_their_place(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "CACHE", tmp_path / "bench")
    model = ["train.max_steps=1600", "train.max_minutes=0", "train.warmup=600", "train.eval_every=400"]
    assert common.cached_dir("multi30k-en-fr", model)[0].name == "multi30k-en-fr-2923cc165f78"  # runs before links
    a, b, c = tmp_path / "a.links", tmp_path / "b.links", tmp_path / "c.links"
    a.write_text("0-0\n")
    b.write_text("0-0\n")
    c.write_text("0-1\n")

    def key(*extra):
        return common.cached_dir("multi30k-en-fr", [*model, "alignment.weight=0.05", *extra])[0].name

    assert key(f"data.train_links={a}") == key(f"data.train_links={b}") != key(f"data.train_links={c}")
    (tmp_path / "h.en").write_text("x\n")
    (tmp_path / "h.fr").write_text("y\n")

    def corpora(links):
        entry = {"src": str(tmp_path / "h.en"), "tgt": str(tmp_path / "h.fr"), "links": str(links), "upsample": 10}
        return f"data.corpora={json.dumps([entry])}"

    assert key(f"data.train_links={a}", corpora(a)) == key(f"data.train_links={a}", corpora(b))
    assert key(f"data.train_links={a}", corpora(a)) != key(f"data.train_links={a}", corpora(c))
