"""eflomal as the statistical peer of the alignment benchmark, and the text normalisation both sides share.

eflomal (Östling & Tiedemann 2016; PyPI package ``eflomal``) is a Bayesian IBM1 + HMM + fertility aligner
trained by Gibbs sampling. One ``eflomal-align`` run aligns both directions and writes Pharaoh links
(``i-j``, 0-based, source index first, in both files). This module runs it in two settings:

``"priors"``
    eflomal aligns the Multi30k training corpus both ways, ``eflomal-makepriors`` turns those alignments into
    Dirichlet priors (lexical, jump and fertility counts), and the test pairs are then aligned on their own
    with ``--priors``. The test sentences take no part in learning, as for the neural models.
``"concat"``
    eflomal's ordinary use: one run over the training corpus with the test pairs appended, from which the
    links of the last ``len(test)`` pairs are kept. The test sentences themselves (unsupervised) are seen.

Text goes through :func:`normalise` first, in the benchmark's caller as here: the Hansards test set is
tokenised in its own way (see ``../shared/data/alignment/README.md``) and the Multi30k captions are raw, so
:func:`tokenise` reproduces the Hansards conventions on raw text, and leaves the already tokenised Hansards
text token for token as it is (so the gold link indices stay valid; checked by ``__main__``).
:func:`tokenise_words` also tells which word of the raw line each token comes from, so links eflomal finds
between tokens become links between the raw words (:func:`word_links`) that a training corpus' links index.

Tokenisation decisions, all made to match the Hansards test text:

- Everything is lowercased (after HTML entities are decoded, ``&amp;`` is in Multi30k, and NFC normalisation;
  curly quotes and apostrophes become ``"`` and ``'``).
- Punctuation ``. , ! ? ; : " « » ( ) [ ] { } … %`` is split from words, and ``$ €`` from either end.
  ``...`` is one token.
- Hyphens and slashes become tokens of their own: ``t-shirt`` -> ``t - shirt``, ``peut-être`` ->
  ``peut - être`` (Hansards: ``hang - up``, ``au - dessus``). ``--`` stays one token.
- Numbers keep their inner ``.`` and ``,`` (``1,800``, ``6.42``).
- A final ``.`` stays on a dotted acronym (``p.m.``, also at the end of a line, as in Hansards), and on a
  known abbreviation (``mr. mrs. ms. dr. st. hon. no. m. mme.`` ...) unless it is the line's last word,
  where it ends the sentence.
- English: ``'s 're 've 'll 'd 'm`` are split off as tokens (``man's`` -> ``man 's``, as Hansards'
  ``Minister 's``); ``n't`` is expanded, because the Hansards English has ``does not``/``cannot`` and never
  ``n't``: ``doesn't`` -> ``does not``, ``can't`` -> ``cannot``, ``won't`` -> ``will not``. A quote ``'`` at
  the start or end of a word is split off. Other inner apostrophes stay (``o'clock``).
- French elisions are EXPANDED to the full word, as in Hansards (``le opposition``, ``je ai``, ``se il``,
  ``quelque un``): ``l'`` -> ``le`` (whatever the gender, as Hansards does), ``d'`` -> ``de``, ``j'`` -> ``je``,
  ``qu'`` -> ``que``, ``n'`` -> ``ne``, ``s'`` -> ``se``, ``c'`` -> ``ce``, ``m'`` -> ``me``, ``t'`` -> ``te``,
  ``jusqu'`` ``lorsqu'`` ``puisqu'`` ``quelqu'`` -> ``jusque`` ``lorsque`` ``puisque`` ``quelque``.
  Any other apostrophe keeps with the first part: ``aujourd'hui`` -> ``aujourd' hui`` (as Hansards).
- French article contractions are expanded: ``du`` -> ``de le``, ``au`` -> ``à le``, ``aux`` -> ``à les``,
  ``des`` -> ``de les``. ``des`` is ambiguous (also the plural indefinite article), but the Hansards French
  expands every one of them: it has 85 ``de les`` and not a single ``des``, ``du`` or ``aux``. Before a hyphen
  they stay (``au - dessus``, the one ``au`` in Hansards).

The commands (source = first side, e.g. English; files one sentence a line)::

    # "priors"
    eflomal-align --overwrite -s train.src -t train.tgt -f train.fwd -r train.rev
    eflomal-makepriors -s train.src -t train.tgt -f train.fwd -r train.rev -p train.priors
    eflomal-align --overwrite -s test.src -t test.tgt -p train.priors -f test.fwd -r test.rev
    # "concat" (concat.* = train.* followed by test.*)
    eflomal-align --overwrite -s concat.src -t concat.tgt -f concat.fwd -r concat.rev

The only eflomal settings used are its defaults (model 3, 3 samplers, iterations 5000/sqrt(sentences) scaled
by model). eflomal has no seed option: its binary seeds itself from ``/dev/urandom``. With ``seed`` given,
each command runs in a private mount namespace (``unshare --mount``) where a file of 8 bytes derived from the
seed is bind-mounted over ``/dev/urandom``, which makes runs repeatable when ``OMP_NUM_THREADS=1`` (the
samplers then draw their states in a fixed order). That needs root or unprivileged user namespaces; where
neither works the run goes on unseeded and ``run.json`` in the work folder says ``"seeded": false``.
eflomal has no thread option either; it uses OpenMP (two directions and the samplers in parallel), so
threads are set with ``OMP_NUM_THREADS`` (1 by default here).

Run ``python benchmarks/eflomal_peer.py [--seeds 1 2 3 4 5]`` for the standalone check: both settings, AER on
Hansards pairs 100..446 for each direction, their intersection and grow-diag-final (xattn's own AER and
symmetrisation); its figures are in benchmarks/README.md.
"""
from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import unicodedata
import warnings
from importlib import metadata
from pathlib import Path
from typing import Iterable, Sequence

from xattn.analysis.alignment import Links
from xattn.words import split_words

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
HANSARDS = SHARED / "alignment" / "hansards-en-fr"
SETTINGS = ("priors", "concat")
TUNE = 100
"""Hansards pairs 0..99 are for tuning; scores are reported on pairs 100..446."""



# ----------------------------------------------------------------------------------------------- tokenisation

_LEADING = set('"«»“”„([{<¿¡$€')
_TRAILING = set('"«»“”),]}>.!?;:%…$€')
_INNER = re.compile(r'(\.\.\.|…|--+|-|/|[,;:!?"«»()\[\]{}%])')
_NUMBER = re.compile(r"^\d[\d.,]*\w*$|^\w*\d[\d.,]*\d\w*$")
_ACRONYM = re.compile(r"^(?:[^\W\d_]\.){2,}$")
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "hon", "no", "jr", "sr", "vs", "etc", "messrs", "prof", "gen",
                  "col", "lt", "sgt", "capt", "rev", "m", "mm", "mme", "mlle", "ste"}
_EN_CLITIC = re.compile(r"^(\w+)('(?:s|re|ve|ll|d|m))$")
_EN_CLITICS = {"'s", "'re", "'ve", "'ll", "'d", "'m"}
_EN_NOT = {"ca": "cannot", "wo": "will", "sha": "shall"}
_FR_ELISIONS = {"l": "le", "d": "de", "j": "je", "qu": "que", "n": "ne", "s": "se", "c": "ce", "m": "me",
                "t": "te", "jusqu": "jusque", "lorsqu": "lorsque", "puisqu": "puisque", "quelqu": "quelque"}
_FR_CONTRACTIONS = {"du": ["de", "le"], "au": ["à", "le"], "aux": ["à", "les"], "des": ["de", "les"]}


def _clean(text: str) -> str:
    text = unicodedata.normalize("NFC", html.unescape(text))
    for a, b in (("’", "'"), ("‘", "'"), ("`", "'"), ("´", "'"), ("“", '"'), ("”", '"'), ("\u00a0", " ")):
        text = text.replace(a, b)
    return text


def _apostrophes(piece: str, lang: str) -> list[str]:
    if "'" not in piece or piece == "'":
        return [piece]
    if lang == "en":
        if piece in _EN_CLITICS:
            return [piece]
        if piece.endswith("n't") and len(piece) > 3:
            base = piece[:-3]
            return [_EN_NOT[base]] if base == "ca" else [_EN_NOT.get(base, base), "not"]
        m = _EN_CLITIC.match(piece)
        return [m.group(1), m.group(2)] if m else [piece]
    out: list[str] = []
    while "'" in piece:
        head, rest = piece.split("'", 1)
        if head in _FR_ELISIONS:
            out.append(_FR_ELISIONS[head])
        elif head:
            out.append(head + "'")
        piece = rest
    return out + ([piece] if piece else [])


def _chunk(chunk: str, last: bool, lang: str) -> list[str]:
    lead: list[str] = []
    trail: list[str] = []
    quote_ok = lang == "en" and chunk not in _EN_CLITICS and not _EN_CLITIC.match(chunk)
    while chunk and (chunk[0] in _LEADING or (chunk[0] == "'" and (lang == "en" or len(chunk) == 1)
                                               and chunk not in _EN_CLITICS)):
        lead.append(chunk[0])
        chunk = chunk[1:]
    while chunk:
        if chunk in ("...", "…") or _ACRONYM.match(chunk) or (
                not last and chunk.endswith(".") and chunk[:-1] in _ABBREVIATIONS):
            break
        if chunk.endswith("..."):
            trail.insert(0, "...")
            chunk = chunk[:-3]
        elif len(chunk) > 1 and (chunk[-1] in _TRAILING or chunk[-1] == "'" and quote_ok):
            trail.insert(0, chunk[-1])
            chunk = chunk[:-1]
        else:
            break
    if not chunk:
        core: list[str] = []
    elif _NUMBER.match(chunk) or _ACRONYM.match(chunk) or chunk == "..." or (
            chunk.endswith(".") and chunk[:-1] in _ABBREVIATIONS):
        core = [chunk]
    else:
        core = [p for part in _INNER.split(chunk) if part for p in _apostrophes(part, lang)]
    return lead + core + trail


def tokenise_words(line: str, lang: str) -> tuple[list[str], list[int]]:
    """(:func:`tokenise`'s tokens of `line`, the word of `line` each token comes from): words as xattn.words
    splits the raw line, which is what word links of a training corpus index (data.train_links). A word may
    give several tokens (``man's`` -> ``man 's``, ``du`` -> ``de le``) and a token never spans two words."""
    if lang not in ("en", "fr"):
        raise ValueError(f"tokenise knows 'en' and 'fr', not {lang!r}")
    # _clean may turn a character inside a word into a space (an entity, U+00A0) and str.split splits at a few
    # characters xattn.words keeps inside a word, so a word may hold several chunks
    chunks = [(c, w) for w, word in enumerate(split_words(line)) for c in _clean(word).lower().split()]
    tokens = [(t, w) for i, (c, w) in enumerate(chunks) for t in _chunk(c, i == len(chunks) - 1, lang)]
    if lang == "fr":
        texts = [t for t, _ in tokens]
        tokens = [(e, w) for i, (t, w) in enumerate(tokens)
                  for e in (_FR_CONTRACTIONS[t] if t in _FR_CONTRACTIONS and texts[i + 1:i + 2] != ["-"] else [t])]
    return [t for t, _ in tokens], [w for _, w in tokens]


def tokenise(line: str, lang: str) -> list[str]:
    """Lowercased Hansards-style tokens of one line of raw (or already tokenised) text; lang is 'en' or 'fr'."""
    return tokenise_words(line, lang)[0]


def word_links(links: Links, src_word_of: Sequence[int], tgt_word_of: Sequence[int]) -> Links:
    """Links between tokens (as :func:`tokenise_words` makes them) -> links between the raw words they come
    from: (i, j) becomes (src_word_of[i], tgt_word_of[j]); links of two tokens of the same words merge."""
    return {(src_word_of[i], tgt_word_of[j]) for i, j in links}


def normalise(line: str, lang: str) -> str:
    """The text every system of the alignment benchmark sees: :func:`tokenise` joined by single spaces."""
    return " ".join(tokenise(line, lang))


def unseen_rate(train_sentences: Iterable[str], test_sentences: Iterable[str]) -> float:
    """Share of the test word tokens that never occur in the training text (both already normalised:
    whitespace-separated tokens, compared exactly)."""
    seen = {w for s in train_sentences for w in s.split()}
    test = [w for s in test_sentences for w in s.split()]
    return sum(w not in seen for w in test) / max(1, len(test))


# ------------------------------------------------------------------------------------------------------ eflomal

def eflomal_version() -> str:
    return metadata.version("eflomal")


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: pip install eflomal")
    return found


_UNSHARE: list[str] | None = None


def _unshare_prefix() -> list[str]:
    """The unshare options that let a bind mount over /dev/urandom work here ([] when none does)."""
    global _UNSHARE
    if _UNSHARE is None:
        _UNSHARE = []
        if shutil.which("unshare"):
            for opts in (["--mount"], ["--mount", "--map-root-user"]):
                probe = ["unshare", *opts, "sh", "-c", "mount --bind /dev/null /dev/urandom"]
                if subprocess.run(probe, capture_output=True).returncode == 0:
                    _UNSHARE = ["unshare", *opts]
                    break
    return _UNSHARE


def _run(cmd: list[str], seed: int | None, workdir: Path, log: list) -> bool:
    """Run one eflomal command; with a seed, inside a mount namespace whose /dev/urandom is a fixed file."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    seeded = seed is not None and bool(_unshare_prefix())
    if seed is not None and not seeded:
        warnings.warn("eflomal cannot be seeded here (no usable `unshare --mount`): this run is not repeatable")
    full = cmd
    if seeded:
        seed_file = workdir / f"seed-{seed}.bin"
        state = hashlib.sha256(f"eflomal-seed-{seed}".encode()).digest()[:8]
        seed_file.write_bytes(state if any(state) else b"\x01" * 8)  # xorshift needs a non-zero state
        full = [*_unshare_prefix(), "sh", "-c", 'mount --bind "$0" /dev/urandom && exec "$@"', str(seed_file), *cmd]
    t0 = time.perf_counter()
    done = subprocess.run(full, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    log.append({"command": [Path(cmd[0]).name, *cmd[1:]], "seconds": round(time.perf_counter() - t0, 2),
                **({"seeded": seeded} if seed is not None else {})})
    return seeded


def _write(path: Path, lines: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            if "\n" in line or "|||" in line:
                raise ValueError(f"unexpected text in a sentence: {line!r}")
            f.write(line.strip() + "\n")


def _read_links(path: Path) -> list[Links]:
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    return [{tuple(map(int, link.split("-"))) for link in line.split()} for line in lines]


def run_links(workdir: str | Path, setting: str, train_pairs: int) -> tuple[list[Links], ...]:
    """(training forward, training backward, test forward, test backward): the links a run of
    :func:`eflomal_alignments` left in `workdir`, the training pairs' too. "priors": those of the run over the
    training corpus alone, whose priors aligned the test pairs; "concat": the first `train_pairs` of the one run."""
    work = Path(workdir)
    if setting == "priors":
        return tuple(_read_links(work / name) for name in ("train.fwd", "train.rev", "test.fwd", "test.rev"))
    forward, backward = _read_links(work / "concat.fwd"), _read_links(work / "concat.rev")
    return forward[:train_pairs], backward[:train_pairs], forward[train_pairs:], backward[train_pairs:]


def eflomal_alignments(train_src: Sequence[str], train_tgt: Sequence[str], test_src: Sequence[str],
                       test_tgt: Sequence[str], setting: str, workdir: str | Path,
                       seed: int | None = 1) -> tuple[list[Links], list[Links]]:
    """eflomal's links for the test pairs, as (forward, backward): one set of (i, j) per pair, 0-based, i into
    the source (test_src) side and j into the target side in both directions; forward has at most one link
    per target word, backward at most one per source word.

    Sentences are whitespace-tokenised, already :func:`normalise` d. ``setting`` is "priors" or "concat" (module
    docstring). ``workdir`` receives the input, link and priors files and ``run.json`` (version, commands,
    seconds, seeded). ``seed`` None leaves eflomal seeding itself from /dev/urandom.
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, not {setting!r}")
    if len(train_src) != len(train_tgt) or len(test_src) != len(test_tgt):
        raise ValueError("source and target sides differ in length")
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    align, makepriors = _tool("eflomal-align"), _tool("eflomal-makepriors")
    log: list = []
    seeded = True
    if setting == "priors":
        _write(work / "train.src", train_src)
        _write(work / "train.tgt", train_tgt)
        _write(work / "test.src", test_src)
        _write(work / "test.tgt", test_tgt)
        seeded &= _run([align, "--overwrite", "-s", str(work / "train.src"), "-t", str(work / "train.tgt"),
                        "-f", str(work / "train.fwd"), "-r", str(work / "train.rev")], seed, work, log)
        _run([makepriors, "-s", str(work / "train.src"), "-t", str(work / "train.tgt"), "-f", str(work / "train.fwd"),
              "-r", str(work / "train.rev"), "-p", str(work / "train.priors")], None, work, log)
        seeded &= _run([align, "--overwrite", "-s", str(work / "test.src"), "-t", str(work / "test.tgt"),
                        "-p", str(work / "train.priors"), "-f", str(work / "test.fwd"), "-r", str(work / "test.rev")],
                       seed, work, log)
    else:
        _write(work / "concat.src", [*train_src, *test_src])
        _write(work / "concat.tgt", [*train_tgt, *test_tgt])
        seeded &= _run([align, "--overwrite", "-s", str(work / "concat.src"), "-t", str(work / "concat.tgt"),
                        "-f", str(work / "concat.fwd"), "-r", str(work / "concat.rev")], seed, work, log)
    _, _, forward, backward = run_links(work, setting, len(train_src))
    if not (len(forward) == len(backward) == len(test_src)):
        raise RuntimeError(f"eflomal wrote {len(forward)}/{len(backward)} link lines for {len(test_src)} pairs")
    for links, src, tgt in zip(forward, test_src, test_tgt):
        if any(i >= len(src.split()) or j >= len(tgt.split()) for i, j in links):
            raise RuntimeError("eflomal link out of range: the sentences were not tokenised as given")
    (work / "run.json").write_text(json.dumps(
        {"eflomal": eflomal_version(), "setting": setting, "seed": seed, "seeded": seed is not None and seeded,
         "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1"), "train_pairs": len(train_src),
         "test_pairs": len(test_src), "steps": log}, indent=2) + "\n")
    return forward, backward


# ------------------------------------------------------------------------------------------------- evaluation

def load_hansards(path: str | Path = HANSARDS / "test.en-fr") -> tuple[list[str], list[str]]:
    """The English and French sides of the Hansards test set, as given (tokenised, truecased)."""
    en, fr = [], []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        e, f = line.split("|||")
        en.append(" ".join(e.split()))
        fr.append(" ".join(f.split()))
    return en, fr


def _main() -> None:
    import argparse
    import gzip
    import statistics

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default="/tmp/eflomal_peer", help="work folder (outside the repository)")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--data", default=os.environ.get("XATTN_DATA", str(SHARED / "multi30k")))
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    def read(name: str) -> list[str]:
        with gzip.open(Path(args.data) / name, "rt", encoding="utf-8") as f:
            return f.read().splitlines()

    train_en = [normalise(s, "en") for s in read("train.en.gz")]
    train_fr = [normalise(s, "fr") for s in read("train.fr.gz")]
    raw_en, raw_fr = load_hansards()
    test_en = [normalise(s, "en") for s in raw_en]
    test_fr = [normalise(s, "fr") for s in raw_fr]
    changed = sum(len(a.split()) != len(b.split()) for a, b in zip(test_en + test_fr, raw_en + raw_fr))
    assert changed == 0, f"normalise changed the token count of {changed} Hansards lines"
    unchanged = sum(a == b.lower() for a, b in zip(test_en + test_fr, raw_en + raw_fr))
    print(f"eflomal {eflomal_version()}; normalise keeps {unchanged}/{2 * len(raw_en)} Hansards lines "
          f"(lowercased) unchanged, every token count equal")
    print(f"unseen test tokens (Hansards vs Multi30k train): en {unseen_rate(train_en, test_en):.2%}, "
          f"fr {unseen_rate(train_fr, test_fr):.2%}")
    from xattn.analysis.aer import score
    from xattn.analysis.alignment import read_alignments, symmetrise

    def aer(links, gold) -> float:
        return score(links, gold).aer

    gold = read_alignments(HANSARDS / "gold.talp", one_indexed=True)[TUNE:]
    for setting in args.settings:
        runs = []
        for seed in args.seeds:
            t0 = time.perf_counter()
            fwd, bwd = eflomal_alignments(train_en, train_fr, test_en, test_fr, setting,
                                          Path(args.work) / f"{setting}-{seed}", seed=seed)
            seconds = time.perf_counter() - t0
            fwd, bwd = fwd[TUNE:], bwd[TUNE:]
            scores = {"forward": aer(fwd, gold), "backward": aer(bwd, gold),
                      "intersect": aer([f & b for f, b in zip(fwd, bwd)], gold),
                      "grow-diag-final": aer([symmetrise(f, b, "grow-diag-final", len(e.split()), len(r.split()))
                                              for f, b, e, r in zip(fwd, bwd, test_en[TUNE:], test_fr[TUNE:])], gold)}
            seeded = json.loads((Path(args.work) / f"{setting}-{seed}" / "run.json").read_text())["seeded"]
            print(f"{setting:6} seed {seed} ({'seeded' if seeded else 'UNSEEDED'}) {seconds:6.1f} s  AER "
                  + "  ".join(f"{k} {100 * v:.2f}" for k, v in scores.items()), flush=True)
            runs.append(scores)
        if len(runs) > 1:
            print(f"{setting:6} mean ± sd of {len(runs)} seeds: AER " + "  ".join(
                f"{k} {100 * statistics.mean(r[k] for r in runs):.2f} ± "
                f"{100 * statistics.stdev(r[k] for r in runs):.2f}" for k in runs[0]))


if __name__ == "__main__":
    _main()
