import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

import xattn

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_configure(config) -> None:
    """Prepared corpora go to a cache of this session's, not the user's (~/.cache/xattn/prepared)."""
    import tempfile

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="xattn-test-cache-")
MULTI30K = Path(os.environ.get("XATTN_DATA", SHARED_DATA / "multi30k"))


def tiny_config(**overrides) -> xattn.ModelConfig:
    base = dict(src_vocab_size=40, tgt_vocab_size=50, d_model=16, n_heads=2, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=32, dropout=0.0)
    return xattn.ModelConfig(**(base | overrides))


def tiny_model_dir(path: Path, **overrides) -> tuple[xattn.Transformer, object]:
    """A model directory at `path`: a word-level joint tokenizer (needs SentencePiece) and a seeded
    1+1-layer model; returns the model and the tokenizer pair."""
    from xattn.checkpoint import save_model_dir
    from xattn.tokenizer import train_tokenizers

    lines = [" ".join(f"word{(i * 7 + j) % 23}" for j in range(1 + i % 5)) for i in range(200)]
    pair = train_tokenizers(lines, lines, path, vocab_size=40, joint=True, model_type="word")
    vocab = pair.src.vocab_size
    cfg = tiny_config(**(dict(src_vocab_size=vocab, tgt_vocab_size=vocab, n_encoder_layers=1, n_decoder_layers=1)
                         | overrides))
    torch.manual_seed(0)
    model = xattn.Transformer(cfg)
    save_model_dir(path, model, xattn.RunConfig(model=cfg))
    return model, pair


NUMBERS_TINY = ["model.d_model=16", "model.n_heads=2", "model.n_encoder_layers=1", "model.n_decoder_layers=1",
                "model.d_ff=32", "model.share_embeddings=true", "model.tie_output=true", "data.dataset=numbers",
                "data.numbers_size=300", "data.vocab_size=120", "train.max_tokens=400", "train.amp=none",
                "train.eval_every=3", "train.eval_bleu_sentences=8", "train.threads=1", "decode.beam_size=2"]
"""Overrides of the numbers-de-en preset for a model that trains in seconds."""


def trained_numbers(out: Path, *overrides: str) -> Path:
    """A numbers-task model directory at `out`, trained for 3 steps with NUMBERS_TINY and `overrides`."""
    from xattn.config import load_config
    from xattn.presets import resolve_config
    from xattn.training import train

    train(load_config(resolve_config("numbers-de-en"), NUMBERS_TINY + ["train.max_steps=3", *overrides]), out,
          quiet=True)
    return out


@pytest.fixture(scope="session")
def numbers_model(tmp_path_factory) -> Path:
    """A model directory trained for 3 steps on the numbers task (do not change it; copy it)."""
    return trained_numbers(tmp_path_factory.mktemp("numbers") / "model")


@pytest.fixture(scope="session")
def numbers_model_en_de(tmp_path_factory) -> Path:
    """numbers_model's task the other way round (English number words -> German; do not change it; copy it)."""
    return trained_numbers(tmp_path_factory.mktemp("numbers-en-de") / "model", "data.src_lang=en", "data.tgt_lang=de")


@pytest.fixture(scope="session")
def hansards() -> Path:
    """The Hansards en-fr gold alignments (gold.talp, 1-based, English first) and their sentences (test.en-fr)."""
    path = SHARED_DATA / "alignment" / "hansards-en-fr"
    if not (path / "gold.talp").is_file():
        pytest.skip(f"no Hansards gold alignments at {path}")
    return path


@pytest.fixture
def tiny_model():
    torch.manual_seed(0)
    return xattn.Transformer(tiny_config()).eval()


# Tests use tiny models; one thread avoids contention on small machines (the test command runs two workers,
# one per core) and keeps results repeatable.
torch.set_num_threads(1)

# Hypothesis times nothing: its deadline per example and its health check of slow data generation are wall-clock
# bounds, which a machine loaded by the other test worker can break.
settings.register_profile("xattn", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("xattn")


# ------------------------------------------------------------------ a real browser (Debian's Chromium)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]


def _unavailable(reason: str):
    """Without a browser the view is untested: an error in CI, a skip elsewhere."""
    pytest.fail(reason) if os.environ.get("CI") == "true" else pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    if not Path(CHROMIUM).is_file():
        _unavailable(f"{CHROMIUM} is missing (Debian: apt-get install chromium)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def guard():
    """guard(page, allowed, expected=None) -> page: the page may load only the URLs `allowed(url)` accepts (any
    other is refused), and may neither raise a script error nor log one (a Content-Security-Policy violation, a
    missing file) except where `expected(url)` says the resource's error is part of the test. Checked at the end."""
    refused, errors = [], []

    def watch(page, allowed, expected=lambda url: False):
        page.route("**/*", lambda route: route.continue_() if allowed(route.request.url) else
                   (refused.append(route.request.url), route.abort()))
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda m: m.type == "error" and not expected(m.location.get("url", ""))
                and errors.append(m.text))
        page.on("dialog", lambda dialog: (errors.append(dialog.message), dialog.dismiss()))
        return page

    yield watch
    assert not refused, f"the page tried to reach {refused}"
    assert not errors, errors
