"""A request's texts cut into sentences, translated one at a time, and joined back (xattn/serve/sentences.py)."""
from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest

import xattn

pytest.importorskip("fastapi")

from xattn.serve.app import create_app  # noqa: E402
from xattn.serve.sentences import Split, diagonal, split_text  # noqa: E402
from test_serve import error, started  # noqa: E402


@pytest.mark.parametrize("text, sentences, gaps", [
    ("Ein Hund rennt.", ["Ein Hund rennt."], []),
    ("  Ein Hund rennt.  ", ["Ein Hund rennt."], []),  # the text's own ends are not kept
    ("Zwei Männer spielen. Eine Frau liest.  Ein Kind isst.", ["Zwei Männer spielen.", "Eine Frau liest.",
                                                               "Ein Kind isst."], [" ", "  "]),
    ("Zeile eins\nZeile zwei", ["Zeile eins", "Zeile zwei"], ["\n"]),
    ("Eins.\r\n\r\n  Zwei.", ["Eins.", "Zwei."], ["\r\n\r\n  "]),
    ("Das kostet 3.50 Euro. Er war z.B. müde.", ["Das kostet 3.50 Euro.", "Er war z.B. müde."], [" "]),
    ("Hallo.Welt ist rund.", ["Hallo.Welt ist rund."], []),  # no whitespace: one sentence
    ("Ein Mann fährt Rad\rEine Frau liest", ["Ein Mann fährt Rad", "Eine Frau liest"], ["\r"]),  # every line break
    ("Ein Mann fährt Rad\u2028Eine Frau liest", ["Ein Mann fährt Rad", "Eine Frau liest"], ["\u2028"]),
    ("我喜欢猫。你呢？", ["我喜欢猫。", "你呢？"], [""]),  # a full stop of a script without spaces
    ("", [""], []),
    (" \n\t ", [""], []),
])
def test_a_text_is_cut_into_sentences_at_whitespace_and_lines(text, sentences, gaps):
    assert split_text(text, "de" if "我" not in text else "zh") == (sentences, gaps)


def test_sentences_are_named_by_their_text_and_place():
    split = Split.of(["Eins.", "Zwei. Drei.", ""], "de")
    assert split.sentences == ["Eins.", "Zwei.", "Drei.", ""] and split.owner == [0, 1, 1, 2]
    assert split.names == ["q[0]", "q[1]: sentence 1", "q[1]: sentence 2", "q[2]"]
    assert split.rename("texts[2]: min_len: 8 is above") == "q[1]: sentence 2: min_len: 8 is above"


def test_maps_join_along_the_diagonal_and_a_missing_head_stays_missing():
    a, b = np.full((1, 2, 2, 3), 0.5, np.float32), np.full((1, 2, 1, 2), 0.25, np.float32)
    a[0, 1] = b[0, 1] = np.nan  # a head the layer lacks (pruned)
    out = diagonal([a, b])
    assert out.shape == (1, 2, 3, 5)
    assert (out[0, 0, :2, :3] == 0.5).all() and (out[0, 0, 2:, 3:] == 0.25).all()
    assert (out[0, 0, :2, 3:] == 0).all() and (out[0, 0, 2:, :3] == 0).all()
    assert np.isnan(out[0, 1]).all()


@pytest.fixture(scope="module")
def served(numbers_model):
    c = started(create_app(str(numbers_model)))
    yield c
    c.__exit__(None, None, None)


TWO = "drei hundert. Vier und zwanzig."  # two sentences by German rules


def test_only_the_maps_an_answer_carries_are_joined():
    """Mean attention with alternatives on a text whose first sentence had fewer distinct alternatives than its
    second was a 500: the second's alternative kept its (L, H) map beside the first's (L, 1) mean, which no diagonal
    holds. Alternatives now carry no map (no answer sends one), and attention "none" joins none (alignment alone
    built a map the square of the text's sentences, sent to no one)."""
    from xattn.translator import Translation

    def sentence(text: str, *others: str) -> Translation:
        own = Translation(text, -1.0, ["x", "</s>"], ["y", "</s>"], np.ones((1, 2, 2, 2), dtype=np.float32))
        return dataclasses.replace(own, alternatives=[own, *(dataclasses.replace(own, text=o) for o in others)])

    split = Split.of(["Eins. Zwei."], "de")
    parts = [sentence("one.", "one."), sentence("two.", "second.")]
    for attention, shape in (("mean", (1, 1, 4, 4)), ("full", (1, 2, 4, 4)), ("none", None)):
        (text,) = split.join(parts, "en", attention=attention)
        maps = text.translation.cross_attention
        assert (None if maps is None else maps.shape) == shape
        assert [a.text for a in text.translation.alternatives] == ["one. two.", "one. second."]
        assert all(a.cross_attention is None for a in text.translation.alternatives)


def test_a_text_of_several_sentences_and_lines_is_translated_whole(served, numbers_model):
    """A text of several sentences was given to the model as one, which translated the first and stopped (the
    probe's "Zwei Männer spielen Fußball. Eine Frau liest ein Buch. ..." came back as one sentence): each sentence
    is now translated as `translate` translates it alone, joined by the whitespace between them."""
    tr = xattn.load(numbers_model)
    first, second = (t.text for t in tr.translate(["drei hundert.", "Vier und zwanzig."]))
    body = served.post("/translate", json={"q": [TWO, "drei hundert.\n\nVier und zwanzig.", "drei hundert."]}).json()
    assert body["translatedText"] == [f"{first} {second}", f"{first}\n\n{second}", first]
    result = body["results"][0]
    assert result["source_words"] == TWO.split() and result["target_words"] == f"{first} {second}".split()
    alone = served.post("/translate", json={"q": "drei hundert."}).json()["results"][0]
    assert result["score"] == pytest.approx(alone["score"] + served.post(
        "/translate", json={"q": "Vier und zwanzig."}).json()["results"][0]["score"], abs=2e-4)


def test_a_joined_texts_attention_links_and_alternatives_are_its_sentences(served):
    parts = [served.post("/translate", json={"q": s, "attention": "full", "alignment": True, "alternatives": 2,
                                             "beam_size": 3}).json()
             for s in ("drei hundert.", "Vier und zwanzig.")]
    whole = served.post("/translate", json={"q": TWO, "attention": "full", "alignment": True, "alternatives": 2,
                                            "beam_size": 3}).json()
    one, two, it = parts[0]["results"][0], parts[1]["results"][0], whole["results"][0]
    assert it["source_tokens"] == one["source_tokens"] + two["source_tokens"]
    assert it["target_tokens"] == one["target_tokens"] + two["target_tokens"]
    weights = np.array(it["attention"], dtype=np.float64)  # (L, H, T, S)
    T1, S1 = len(one["target_tokens"]), len(one["source_tokens"])
    assert np.allclose(weights[:, :, :T1, :S1], np.array(one["attention"]), atol=2e-4)
    assert np.allclose(weights[:, :, T1:, S1:], np.array(two["attention"]), atol=2e-4)
    assert (weights[:, :, :T1, S1:] == 0).all() and (weights[:, :, T1:, :S1] == 0).all()
    n, m = len(one["source_words"]), len(one["target_words"])
    assert it["alignment"] == sorted(one["alignment"] + [[i + n, j + m] for i, j in two["alignment"]])
    firsts = [[p["translatedText"], *p["alternatives"]] for p in parts]
    expected = [f"{a[k] if k < len(a) else a[0]} {b[k] if k < len(b) else b[0]}" for k in range(1, 3)
                for a, b in [firsts]]
    assert whole["alternatives"] == [e for e in expected if e != whole["translatedText"]][:2]


def test_a_joined_texts_mean_attention_is_its_sentences_means_and_is_bounded(served, numbers_model):
    """Mean attention was built from the whole block-diagonal map of every head and went unbounded: 833 sentences in
    one text gave a 67 MB answer (a review's probe). Each sentence's heads are averaged first, and the map's size
    counts against --max-attention-values as full attention's does (by layers, not maps)."""
    parts = [served.post("/translate", json={"q": s, "attention": "mean"}).json()["results"][0]
             for s in ("drei hundert.", "Vier und zwanzig.")]
    it = served.post("/translate", json={"q": TWO, "attention": "mean"}).json()["results"][0]
    weights = np.array(it["attention"], dtype=np.float64)  # (L, T, S)
    T1, S1 = len(parts[0]["target_tokens"]), len(parts[0]["source_tokens"])
    assert weights.shape[1:] == (T1 + len(parts[1]["target_tokens"]), S1 + len(parts[1]["source_tokens"]))
    assert np.allclose(weights[:, :T1, :S1], parts[0]["attention"], atol=2e-4)
    assert np.allclose(weights[:, T1:, S1:], parts[1]["attention"], atol=2e-4)
    from xattn.serve.limits import Limits
    c = started(create_app(str(numbers_model), dataclasses.replace(Limits(), max_attention_values=20_000)))
    try:
        assert c.post("/translate", json={"q": "Drei. " * 5, "attention": "mean"}).status_code == 200
        error(c.post("/translate", json={"q": "Drei. " * 40, "attention": "mean"}), 413,
              "attention: mean attention could hold up to")
    finally:
        c.__exit__(None, None, None)


def test_an_error_about_one_sentence_names_it(served):
    error(served.post("/translate", json={"q": ["drei", TWO], "min_len": 9, "max_len_a": 0, "max_len_b": 8}), 422,
          "q[0]: min_len: 9 is above")
    long = "Drei. Vier " + " ".join(["vier"] * 300)
    error(served.post("/translate", json={"q": long}), 413, "q[0]: sentence 2: ")


def test_a_max_length_over_the_limit_names_the_field_the_request_set(served):
    """A request that set max_len_a alone was told about max_len_b, which it never sent (the probe)."""
    error(served.post("/translate", json={"q": "drei hundert", "max_len_a": 100}), 422, "max_len_a: max_len_a * ")
    error(served.post("/translate", json={"q": "drei hundert", "max_len_b": 600}), 422, "max_len_b: max_len_a * ")


def test_a_file_line_of_two_sentences_is_translated_whole(served, numbers_model):
    first, second = (t.text for t in xattn.load(numbers_model).translate(["drei hundert.", "Vier und zwanzig."]))
    sent = served.post("/translate_file", data={"source": "de", "target": "en"},
                       files={"file": ("a.txt", io.BytesIO(f"{TWO}\ndrei hundert.\n".encode()), "text/plain")})
    assert sent.status_code == 200, sent.text
    got = served.get(sent.json()["translatedFileUrl"].removeprefix("http://testserver"))
    assert got.text == f"{first} {second}\n{first}\n"
