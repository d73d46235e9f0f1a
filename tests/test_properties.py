"""Properties over many generated inputs (hypothesis, a bounded number of examples each): config values,
decoding flags and input text never give a traceback, a NaN score, or other than one line per input line."""
import contextlib
import dataclasses
import io
import math
import re
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xattn
from xattn.cli.main import main
from xattn.config import SECTIONS, load_config

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

KEYS = [(section, f.name) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
NUMBERS = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, -1, 0.5, 1e-9, 2**31, 2**63]))
WORDS = st.sampled_from(["nan", "inf", "-inf", "true", "false", "null", "none", "1e3", "1e999", "0x10", "",
                         "[1, 2]", "{a: 1}", "0.9,0.98", "0.9,1.5,2", "cuda", "cpu", "auto", "de", "xx", "relu",
                         "learned", "pre", "multi30k", "numbers", "é", "\x00"])
VALUES = st.one_of(NUMBERS.map(str), WORDS, st.text(max_size=6))


@settings(max_examples=400, **SETTINGS)
@given(st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=4))
def test_any_config_override_builds_or_is_a_one_line_error(overrides):
    items = [f"{section}.{key}={value}" for (section, key), value in overrides]
    try:
        cfg = load_config(None, items)
    except xattn.XattnError as e:
        assert "\n" not in str(e) and re.search(rf"\b({'|'.join(SECTIONS)})\.[a-z_]+", str(e)), str(e)
        return
    for section in SECTIONS:  # what was accepted is in range: finite numbers where numbers are
        for value in dataclasses.asdict(getattr(cfg, section)).values():
            assert not (isinstance(value, float) and math.isnan(value))


@settings(max_examples=200, **SETTINGS)
@given(st.sampled_from(KEYS), st.one_of(NUMBERS, st.text(max_size=4), st.none(), st.booleans(),
                                         st.lists(st.integers(), max_size=2)))
def test_config_dataclasses_built_in_python_check_their_values(key, value):
    section, name = key
    try:
        SECTIONS[section](**{name: value})
    except xattn.XattnError as e:
        assert f"{section}." in str(e)


def run_cli(argv: list[str], stdin: bytes) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


FLAG_VALUES = {
    "--beam": st.integers(-2, 6), "--n-best": st.integers(-1, 6), "--length-penalty": st.floats(-1, 3),
    "--coverage-penalty": st.floats(-1, 2), "--min-len": st.integers(-1, 8), "--max-len-a": st.floats(-1, 3),
    "--max-len-b": st.integers(-2, 12), "--no-repeat-ngram": st.integers(-1, 3), "--max-tokens": st.integers(-5, 200),
    "--temperature": st.floats(allow_nan=True, allow_infinity=True), "--top-k": st.integers(-1, 50),
    "--top-p": st.floats(-0.5, 1.5), "--num-samples": st.integers(-1, 4), "--seed": st.integers(-2, 10**6),
}


@st.composite
def decode_flags(draw) -> list[str]:
    chosen = draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), unique=True, max_size=5))
    argv = [part for flag in chosen for part in (flag, str(draw(FLAG_VALUES[flag])))]
    return argv + draw(st.sampled_from([[], ["--sample"], ["--stopping", "early"], ["--scores"]]))


@settings(max_examples=60, **SETTINGS)
@given(decode_flags())
def test_decoding_flags_translate_every_line_or_fail_in_one_line(numbers_model, flags):
    code, out, err = run_cli(["translate", str(numbers_model), *flags], "dreiundzwanzig\nsieben\n".encode())
    assert code in (0, 2) and "Traceback" not in err
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("xattn translate: error: ")
        return
    lines = out.splitlines()
    if any(" ||| " in line and line.split(" ||| ")[0].isdigit() for line in lines) and len(lines[0].split(" ||| ")) == 3:
        assert {line.split(" ||| ")[0] for line in lines} == {"0", "1"}
        assert all(math.isfinite(float(line.rsplit(" ||| ", 1)[1])) for line in lines)
    else:
        assert len(lines) == 2
        if "--scores" in flags:
            assert all(math.isfinite(float(line.rsplit(" ||| ", 1)[1])) for line in lines)


LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\x00"), max_size=25)
"""A line of text: any characters but a newline and NUL (refused with its line, as binary data: test_cli_errors)."""


@settings(max_examples=60, **SETTINGS)
@given(st.lists(LINE, max_size=6))
def test_any_text_gives_one_finite_scored_line_per_input_line(numbers_model, lines):
    data = "".join(f"{line}\n" for line in lines).encode()
    code, out, err = run_cli(["translate", str(numbers_model), "--scores"], data)
    assert code == 0, err
    assert out.count("\n") == len(lines) and (out.endswith("\n") or not lines)
    assert all(math.isfinite(float(line.rsplit(" ||| ", 1)[1])) for line in out.split("\n")[:-1])


@pytest.fixture(scope="module")
def translator(numbers_model):
    return xattn.load(numbers_model, device="cpu")


@settings(max_examples=60, **SETTINGS)
@given(st.lists(st.text(max_size=20), max_size=5))
def test_python_api_text_gives_a_result_per_text_or_an_error(translator, texts):
    try:
        results = translator.translate(texts, xattn.DecodeConfig(beam_size=2))
    except xattn.XattnError as e:  # the first text that is no valid Unicode or holds a NUL, named
        first = next(i for i, t in enumerate(texts) if "\0" in t or any(0xD800 <= ord(c) <= 0xDFFF for c in t))
        assert str(e).startswith(f"texts[{first}]: ")
        assert "not valid Unicode" in str(e) or "holds a NUL character" in str(e)
        return
    assert len(results) == len(texts)
    assert all(math.isfinite(r.score) and "\n" not in r.text for r in results)
