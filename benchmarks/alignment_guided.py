"""The guided-alignment rows of the alignment benchmark (issue 23): the links that guide a second training of the
Multi30k en->fr and fr->en models, those models (in the benchmark cache), their AER on the Hansards gold, their
BLEU on test_2016_flickr, and translate --alignment's time with a guided head. alignment.py runs it all.

Two settings:
  inductive     links of the Multi30k training pairs only; the Hansards pairs are never seen (against eflomal
                "priors").
  transductive  the 447 Hansards pairs, as the benchmark reads them (eflomal_peer.normalise), join the training
                data as a second corpus (data.corpora) with `upsample` copies an epoch and links of their own from
                the same aligner (against eflomal "concat").
Two aligners:
  eflomal  the links of the eflomal runs of the eflomal rows: "priors" aligns the training corpus alone
           (inductive), "concat" the training corpus followed by the Hansards pairs (transductive). eflomal reads
           normalised tokens; the raw word each token comes from (eflomal_peer.tokenise_words) turns its links into
           links between the words of the training lines as `xattn prepare` reads them (data.train_links).
  self     the baseline models align the same text, each with its settings tuned on the first 100 pairs
           (xattn.analysis.alignment.align_pairs, which `xattn align --backward --sym` runs).
Both directions' links are symmetrised by grow-diag-final-and (GUIDE_SYM), the usual heuristic for training
links; it is not tuned, since every candidate would cost two more trainings.

The grid (chosen on the first 100 pairs): alignment.weight (lambda) in `weights`, the Hansards copies in
`upsample` (transductive); layer and heads are the alignment section's defaults (second-to-last layer, head 0,
as Garg et al. 2019). By default it is one point, lambda 0.05 (Garg et al.'s) and 10 copies (4,470 pairs, 13%
of an epoch of 33,470), because each training takes about 40 minutes on one thread; with more points, the
variant whose symmetrised links have the lowest AER on the tuning pairs is the one a system reports.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from alignment_scoring import THRESHOLDS, Direction, both, describe, symmetrised, symmetrised_rows
from common import cached_model, data_dir, model_fingerprint
from eflomal_peer import eflomal_alignments, eflomal_version, run_links, tokenise_words, word_links

import xattn
from xattn.analysis import choice as stored_choice
from xattn.analysis.alignment import (EOS_RULES, METHODS, PUNCT_RULES, AlignSettings, Links, align_pairs, flip,
                                      format_links, parse_links, symmetrise)
from xattn.analysis.maps import HeadChoice
from xattn.cli.common import ALIGNMENT_FLAGS, settle_loaded
from xattn.cli.translate import alignment_of
from xattn.datasets import load_pairs
from xattn.evaluation import bleu
from xattn.io import atomic_write_text
from xattn.lines import read_lines
from xattn.words import split_words

GUIDE_SYM = "grow-diag-final-and"
WEIGHTS = (0.05,)
UPSAMPLE = (10.0,)
SETTINGS = {"inductive": "priors", "transductive": "concat"}
"""Each setting's eflomal run: the peer's rows and the eflomal guidance of that setting come from the same run."""
PRESETS = {"en->fr": "multi30k-en-fr", "fr->en": "multi30k-fr-en"}
SIDES = {"en->fr": ("en", "fr"), "fr->en": ("fr", "en")}


def digest(*parts) -> str:
    """12 hex digits over JSON-able parts (texts, settings): the name of a cached folder or file."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


class TrainingText:
    """The Multi30k en-fr training pairs as `xattn prepare` reads them (both directions read the same lines),
    and their eflomal tokens with the raw word each token comes from."""

    def __init__(self, en: list[str], fr: list[str]):
        self.en, self.fr = en, fr
        en_tok, fr_tok = [tokenise_words(e, "en") for e in en], [tokenise_words(f, "fr") for f in fr]
        self.norm_en, self.norm_fr = [" ".join(t) for t, _ in en_tok], [" ".join(t) for t, _ in fr_tok]
        self.en_word_of, self.fr_word_of = [w for _, w in en_tok], [w for _, w in fr_tok]

    @classmethod
    def multi30k(cls) -> TrainingText:
        pairs = load_pairs("multi30k", "en", "fr", "train", data_dir())
        if load_pairs("multi30k", "fr", "en", "train", data_dir()) != [(f, e) for e, f in pairs]:
            raise SystemExit("Multi30k fr-en training pairs are not the en-fr ones swapped: one links file cannot "
                             "serve both directions")
        return cls([e for e, _ in pairs], [f for _, f in pairs])


@dataclass
class EflomalRun:
    """One run of eflomal_peer.eflomal_alignments: links of the training pairs and of the test pairs, as
    (source = English, target = French) token links, 0-based."""
    train_forward: list[Links]
    train_backward: list[Links]
    forward: list[Links]
    backward: list[Links]
    seconds: float
    workdir: Path


def eflomal_run(train: TrainingText, en: list[str], fr: list[str], setting: str, root: Path) -> EflomalRun:
    """eflomal_alignments kept in root/SETTING-KEY (KEY: a hash of its inputs and eflomal's version): a run that
    finished there (run.json is written last) is read back instead of run again."""
    work = root / f"{setting}-{digest(eflomal_version(), setting, train.norm_en, train.norm_fr, en, fr)}"
    if not (work / "run.json").is_file():
        eflomal_alignments(train.norm_en, train.norm_fr, en, fr, setting, work)
    seconds = sum(step["seconds"] for step in json.loads((work / "run.json").read_text())["steps"])
    return EflomalRun(*run_links(work, setting, len(train.en)), round(seconds, 1), work)


def symmetrised_one(forward: list[Links], backward: list[Links], src: list[str], tgt: list[str]) -> list[Links]:
    return [symmetrise(f, b, GUIDE_SYM, len(split_words(s)), len(split_words(t)))
            for f, b, s, t in zip(forward, backward, src, tgt)]


@dataclass
class Guidance:
    """What guides a second stage: (English word, French word) links of each Multi30k training pair (words of
    its raw lines) and, transductive, of each Hansards pair (words of its normalised lines)."""
    aligner: str
    setting: str
    train: list[Links]
    hansards: list[Links] | None


def eflomal_guidance(run: EflomalRun, train: TrainingText, en: list[str], fr: list[str], setting: str) -> Guidance:
    tokens = symmetrised_one(run.train_forward, run.train_backward, train.norm_en, train.norm_fr)
    words = [word_links(links, e, f) for links, e, f in zip(tokens, train.en_word_of, train.fr_word_of)]
    hansards = symmetrised_one(run.forward, run.backward, en, fr) if setting == "transductive" else None
    return Guidance("eflomal", setting, words, hansards)


def self_links(baseline: dict[str, Path], tuned: dict[str, AlignSettings], train: TrainingText,
               root: Path) -> list[Links]:
    """The baseline models' symmetrised (English, French) links of the training pairs, with each direction's
    tuned settings; kept in root/self-KEY.links (KEY: a hash of the weights, the settings and the text)."""
    key = digest([model_fingerprint(baseline[n])["tensors_sha256"] for n in PRESETS],
                 [describe(tuned[n]) for n in PRESETS], GUIDE_SYM, train.en, train.fr)
    path = root / f"self-{key}.links"
    if not path.is_file():
        forward = align_pairs(xattn.load(baseline["en->fr"]), train.en, train.fr, tuned["en->fr"])
        backward = [flip(x) for x in align_pairs(xattn.load(baseline["fr->en"]), train.fr, train.en, tuned["fr->en"])]
        links = symmetrised_one(forward, backward, train.en, train.fr)
        atomic_write_text(path, "".join(format_links(x) + "\n" for x in links))
    return [parse_links(line, where=f"{path}: line {n}")[0] for n, line in enumerate(read_lines(path), start=1)]


def guidance_files(g: Guidance, en: list[str], fr: list[str], root: Path) -> Path:
    """A Guidance's files, written once into root/ALIGNER-SETTING-KEY (KEY: a hash of their content):
    en-fr.links and fr-en.links (Pharaoh, line-aligned with the training split, each direction's source first),
    and, transductive, hansards.en, hansards.fr and hansards.en-fr.links, hansards.fr-en.links."""
    def lines(links: list[Links], reverse: bool = False) -> str:
        return "".join(format_links(flip(x) if reverse else x) + "\n" for x in links)

    files = {"en-fr.links": lines(g.train), "fr-en.links": lines(g.train, reverse=True)}
    if g.hansards is not None:
        files |= {"hansards.en": "".join(e + "\n" for e in en), "hansards.fr": "".join(f + "\n" for f in fr),
                  "hansards.en-fr.links": lines(g.hansards), "hansards.fr-en.links": lines(g.hansards, reverse=True)}
    folder = root / f"{g.aligner}-{g.setting}-{digest(files)}"
    for name, text in files.items():
        if not (folder / name).is_file():
            atomic_write_text(folder / name, text)
    return folder


def overrides(folder: Path, direction: str, weight: float, upsample: float | None, base: list[str]) -> list[str]:
    """The training overrides of one guided model: `base`, the weight, its links, and (transductive) the
    Hansards pairs as a second corpus with their links and copies."""
    src, tgt = SIDES[direction]
    out = [*base, f"alignment.weight={weight}", f"data.train_links={folder / f'{src}-{tgt}.links'}"]
    if upsample is not None:
        corpus = {"src": str(folder / f"hansards.{src}"), "tgt": str(folder / f"hansards.{tgt}"),
                  "links": str(folder / f"hansards.{src}-{tgt}.links"), "upsample": upsample}
        out.append(f"data.corpora={json.dumps([corpus])}")  # JSON is YAML's flow style
    return out


def variants(folder: Path, setting: str, weights, upsample, base: list[str]) -> list[dict]:
    """Every grid point of a guidance: its settings and both directions' models, trained (or resumed, or read)
    through cached_model."""
    copies = upsample if setting == "transductive" else (None,)
    return [{"weight": w, "upsample": u,
             "model_dirs": {n: cached_model(PRESETS[n], overrides(folder, n, w, u, base)) for n in PRESETS}}
            for w in weights for u in copies]


def guided_direction_rows(d: Direction, gold) -> dict:
    """Each layer's mean of heads (naive and shift), the guided head as the model stores it (what `align` and
    `translate --alignment` read by default), and that head tuned: method, threshold, </s> and punctuation."""
    cfg = d.translator.model.cfg
    record = stored_choice.stored(d.model_dir, cfg)
    if record is None or record.guided is None:
        raise SystemExit(f"{d.model_dir}: no guided alignment choice in analysis.yaml; was it trained with guidance?")
    guided = stored_choice.settings_for(d.model_dir, cfg)
    layers = {f"{m} layer {layer}": both(d.links(AlignSettings(HeadChoice(layer), m)), gold)
              for m in ("naive", "shift") for layer in range(cfg.n_decoder_layers)}
    grid = [AlignSettings(guided.choice, m, t, e, p) for m in METHODS for t in THRESHOLDS for e in EOS_RULES
            for p in PUNCT_RULES]
    tuned, tuned_aer = d.best(grid, gold)
    return {"layers": layers, "guided_head": {**describe(guided), **both(d.links(guided), gold)},
            "tuned": {**describe(tuned), **tuned_aer}, "_tuned_settings": tuned}


def guided_rows(model_dirs: dict[str, Path], en: list[str], fr: list[str], gold) -> dict:
    """Both directions' rows and their tuned links symmetrised (the method chosen on the tuning pairs)."""
    directions = {"en->fr": Direction("en->fr", model_dirs["en->fr"], en, fr, english_first=True),
                  "fr->en": Direction("fr->en", model_dirs["fr->en"], fr, en, english_first=False)}
    rows = {n: guided_direction_rows(d, gold) for n, d in directions.items()}
    forward, backward = (directions[n].links(rows[n].pop("_tuned_settings")) for n in PRESETS)
    sym = symmetrised(forward, backward, en, fr)
    sym_rows = symmetrised_rows(sym, gold)
    return {"directions": rows, "symmetrised": sym_rows, "chosen": sym_rows[sym_rows["chosen_symmetrisation"]],
            "models": {n: model_fingerprint(p) for n, p in model_dirs.items()}}


def system_rows(points: list[dict], en: list[str], fr: list[str], gold, links: dict) -> dict:
    """The rows of every grid point and the one chosen by the AER of its symmetrised links on the tuning pairs."""
    rows = [{"weight": p["weight"], "upsample": p["upsample"], **guided_rows(p["model_dirs"], en, fr, gold)}
            for p in points]
    best = min(range(len(rows)), key=lambda i: (rows[i]["chosen"]["tune"]["aer"], i))
    return {"links": links, "variants": rows, "chosen_variant": best, "chosen": rows[best]["chosen"],
            "_model_dirs": points[best]["model_dirs"]}


def links_record(g: Guidance, folder: Path) -> dict:
    """What a guidance gave: its files and how many links per pair, for the result."""
    count = sum(map(len, g.train))
    return {"folder": str(folder), "symmetrisation": GUIDE_SYM, "train_pairs": len(g.train),
            "train_links_per_pair": round(count / max(1, len(g.train)), 2),
            "train_pairs_without_links": sum(not x for x in g.train),
            **({"hansards_pairs": len(g.hansards)} if g.hansards is not None else {})}


def test_bleu(model_dirs: dict[str, dict[str, Path]]) -> dict:
    """Beam-5 BLEU (cased and lowercased, sacreBLEU 13a) on Multi30k test_2016_flickr of each direction's
    models, {system: {direction: dir}}, with sacreBLEU's paired bootstrap p-value against "baseline"."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    out: dict = {}
    for n, (src, tgt) in SIDES.items():
        pairs = load_pairs("multi30k", src, tgt, "test", data_dir())
        sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
        hyps = {name: [t.text for t in xattn.load(dirs[n]).translate(sources, xattn.DecodeConfig(beam_size=5))]
                for name, dirs in model_dirs.items()}
        out[n] = {}
        for name, h in hyps.items():
            cased, lower = bleu(h, refs), bleu(h, refs, lowercase=True)
            out[n][name] = {"bleu": round(cased.score, 2), "bleu_lc": round(lower.score, 2),
                            "signature": cased.signature, "signature_lc": lower.signature}
            if name != "baseline":
                _, scores = PairedTest([("baseline", hyps["baseline"]), (name, h)], {"BLEU": BLEU()}, [refs],
                                       test_type="bs", n_samples=1000)()
                out[n][name]["p_vs_baseline"] = round(float(scores["BLEU"][1].p_value), 4)
                out[n][name]["delta_vs_baseline"] = round(cased.score - out[n]["baseline"]["bleu"], 2)
    return out


def cli_speed(model_dir: Path, repeats: int) -> dict:
    """`translate --alignment` against `translate` on the Multi30k test sentences (fr), in a process of its own, as
    each `xattn translate` runs: a process that has loaded and run a score of other models (this benchmark's)
    runs both slower and further apart (1.06-1.12x there against 1.04-1.07x fresh, at 83b7e0f)."""
    child = subprocess.run([sys.executable, __file__, "--cli-speed", str(model_dir), str(repeats)], check=True,
                           capture_output=True, text=True)
    return json.loads(child.stdout.splitlines()[-1])


def timed_cli(model_dir: Path, texts: list[str], repeats: int) -> dict:
    """`translate --alignment` against `translate`, beam 5, on `texts` (one process, the model loaded once, taking
    turns, the order reversed every other repetition, medians), the links made as the CLI makes them
    (xattn.cli.translate.alignment_of: the model's stored head, followed during the search)."""
    cfg = xattn.DecodeConfig(beam_size=5)
    tr = xattn.load(model_dir)
    settle_loaded()  # as the CLI does once its model is loaded
    links = alignment_of(argparse.Namespace(model=str(model_dir), input=None,
                                            **{flag: None for flag in ALIGNMENT_FLAGS}), tr)

    def plain():
        return [r.text for r in tr.translate(texts, cfg)]

    def aligned():
        results = tr.translate(texts, cfg, return_attention=True, attention_heads=links.heads)
        return [f"{r.text} ||| {line}" for r, line in zip(results, links(results, texts, range(1, len(texts) + 1)))]

    tr.translate(texts[:50], cfg)  # warm up
    times: dict = {plain: [], aligned: []}
    outputs = {}
    for k in range(repeats):
        for fn in (plain, aligned) if k % 2 == 0 else (aligned, plain):
            start = time.perf_counter()
            outputs[fn] = fn()
            times[fn].append(round(time.perf_counter() - start, 3))
    if [line.split(" ||| ")[0] for line in outputs[aligned]] != outputs[plain]:
        raise SystemExit(f"{model_dir}: translate --alignment printed other translations than translate")
    paired = [a / p for a, p in zip(times[aligned], times[plain])]
    return {"model": str(model_dir), "translate_seconds": times[plain], "translate_alignment_seconds": times[aligned],
            "sentences": len(texts), "process": "fresh",
            "alignment_over_plain": round(statistics.median(times[aligned]) / statistics.median(times[plain]), 3),
            "paired_ratio_median": round(statistics.median(paired), 3)}


def moonshot(systems: dict, peer: dict) -> dict:
    """Per setting: the system chosen on the tuning pairs (never on the reported ones), its reported AER and the
    gap to eflomal in the same data setting (inductive: priors; transductive: concat)."""
    out = {}
    for setting, run in SETTINGS.items():
        names = [name for name in systems if name.startswith(setting)]
        best = min(names, key=lambda name: (systems[name]["chosen"]["tune"]["aer"], name))
        ours, theirs = systems[best]["chosen"]["test"]["aer"], peer[run]["chosen"]["test"]["aer"]
        out[setting] = {"system": best, "xattn_aer": ours, f"eflomal_{run}_aer": theirs,
                        "gap_aer_points": round(ours - theirs, 2), "at_or_below_eflomal": ours <= theirs}
    return out



def guided_systems(baseline: dict[str, Path], tuned: dict[str, AlignSettings], baseline_hansards: list[Links],
                   runs: dict[str, EflomalRun], train: TrainingText, en: list[str], fr: list[str], gold,
                   grid: dict, base: list[str], root: Path) -> dict:
    """Every guided system, "SETTING ALIGNER" -> system_rows, trained in this order (inductive first, eflomal
    first). `tuned`: the baseline's tuned settings per direction; `baseline_hansards`: its symmetrised links of
    the Hansards pairs by GUIDE_SYM; `runs`: the eflomal run of each setting; `base`: every model's overrides."""
    systems, own = {}, None
    for setting, run in SETTINGS.items():
        for aligner in ("eflomal", "self"):
            if aligner == "eflomal":
                g = eflomal_guidance(runs[run], train, en, fr, setting)
            else:
                own = self_links(baseline, tuned, train, root) if own is None else own
                g = Guidance("self", setting, own, baseline_hansards if setting == "transductive" else None)
            folder = guidance_files(g, en, fr, root)
            points = variants(folder, setting, grid["weights"], grid["upsample"], base)
            systems[f"{setting} {aligner}"] = system_rows(points, en, fr, gold, links_record(g, folder))
    return systems


def report(result: dict) -> list[str]:
    """The Markdown of benchmarks/README.md's guided-alignment table, from results/alignment.json."""
    from common import markdown_table

    def aer_of(row: dict) -> str:
        return f"{row['test']['aer']:.1f}"

    def bleu_of(system: str) -> list[str]:
        cells = []
        for n in PRESETS:
            b = result["bleu"][n][system]
            cells.append(f"{b['bleu']:.2f}" + (f" ({b['delta_vs_baseline']:+.2f}, p {b['p_vs_baseline']:.3f})"
                                               if "delta_vs_baseline" in b else ""))
        return cells

    peer, sym = result["eflomal"], result["symmetrised"]
    rows = [["baseline (no guidance)", "—",
             *(f"{aer_of(result['directions'][n]['stored_choice'])} / {aer_of(result['directions'][n]['tuned'])}"
               for n in PRESETS),
             f"{aer_of(sym[sym['chosen_symmetrisation']])} ({sym['chosen_symmetrisation']})",
             f"{aer_of(peer['priors']['chosen'])} / {aer_of(peer['concat']['chosen'])}", *bleu_of("baseline")]]
    for name, system in result["guided"]["systems"].items():
        setting, aligner = name.split()
        chosen = system["variants"][system["chosen_variant"]]
        grid = f"λ {chosen['weight']:g}" + (f", {chosen['upsample']:g} copies" if chosen["upsample"] else "")
        run = SETTINGS[setting]
        rows.append([f"{setting}, guided by {aligner}", grid,
                     *(f"{aer_of(chosen['directions'][n]['guided_head'])} / {aer_of(chosen['directions'][n]['tuned'])}"
                       for n in PRESETS),
                     f"{aer_of(system['chosen'])} ({chosen['symmetrised']['chosen_symmetrisation']})",
                     f"{aer_of(peer[run]['chosen'])} ({run})", *bleu_of(name)])
    header = ["system", "grid point", "en→fr: head / tuned", "fr→en: head / tuned", "symmetrised",
              "eflomal, same data", "BLEU en→fr (Δ, p)", "BLEU fr→en (Δ, p)"]
    lines = markdown_table(header, rows)
    for setting, m in result["guided"]["moonshot"].items():
        lines.append(f"\n{setting}: {m['system']} (chosen on the first 100 pairs) {m['xattn_aer']:.1f} against "
                     f"eflomal {next(v for k, v in m.items() if k.startswith('eflomal')):.1f}: gap "
                     f"{m['gap_aer_points']:+.1f} AER points")
    for name, s in result["speed_guided"].items():
        lines.append(f"\ntranslate --alignment over translate, {name}: {s['alignment_over_plain']:.3f}x, paired "
                     f"{s.get('paired_ratio_median', float('nan')):.3f}x ({s['sentences']} sentences, beam 5)")
    return lines


if __name__ == "__main__":  # cli_speed's child: python alignment_guided.py --cli-speed MODEL REPEATS
    if sys.argv[1:2] != ["--cli-speed"] or len(sys.argv) != 4:
        raise SystemExit("usage: python alignment_guided.py --cli-speed MODEL REPEATS (alignment.py runs it)")
    multi30k_fr = [f for f, _ in load_pairs("multi30k", "fr", "en", "test", data_dir())]
    print(json.dumps(timed_cli(Path(sys.argv[2]), multi30k_fr, int(sys.argv[3]))))
