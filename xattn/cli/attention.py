"""`xattn attention MODEL "sentence"`: a heatmap of the attention of the model's translation or of a reference."""
from __future__ import annotations

from pathlib import Path

from xattn.registry import ATTENTION_KINDS
from xattn.cli.common import add_head_flags, add_verb, output_arg, path_arg
from xattn.cli.translate import add_decode_flags, decode_config, refuse_search_flags, refuse_unscored_penalty
from xattn.errors import XattnError
from xattn.words import split_words

STATIC = (".png", ".svg", ".pdf")


def register(sub) -> None:
    p = add_verb(sub, "attention", "Draw the attention of one sentence pair: the model's own translation (any "
                 "decoding flags), or a given --reference read teacher-forced. The file type follows the "
                 "extension: .png, .svg, .pdf, or .html (one self-contained interactive page, no network).",
                 "xattn attention runs/multi30k-de-en \"Ein Hund rennt über die Wiese.\" --words -o dog.png\n"
                 "  xattn attention runs/multi30k-de-en \"Ein Hund rennt.\" --reference \"A dog runs.\" -o dog.html",
                 run)
    p.add_argument("model", type=path_arg, help="model directory")
    p.add_argument("sentence", help="the source sentence")
    p.add_argument("--reference", help="a translation to read teacher-forced instead of the model's own")
    p.set_defaults(flags={"texts": "SENTENCE", "sources": "SENTENCE",  # (what the library's items come from:
                          "targets": "--reference"})      # translate's texts, or teacher_forced's sources and targets)
    p.add_argument("--output", "-o", type=output_arg, required=True, help="FILE.png, .svg, .pdf or .html")
    p.add_argument("--kind", choices=ATTENTION_KINDS, default="cross",
                   help="which attention (decoder-self: the masked future cells are hatched, unlike a zero weight)")
    add_head_flags(p, "draw, of the --kind's stack (default: the layer of the alignment links drawn, else the last; "
                      "the HTML page has a picker)")
    p.add_argument("--grid", action="store_true", help="every layer x head in one figure (static files)")
    p.add_argument("--words", action="store_true",
                   help="merge subword pieces into the words of the text: a source word's weight is the sum "
                        "over its pieces, a target word's row the average of its pieces' rows, so rows still "
                        "sum to 1")
    p.add_argument("--no-links", action="store_true", help="do not mark the word alignment links (cross; they are "
                   "never marked for a one-word source, whose every target word links to it)")
    add_decode_flags(p, one_per_input=True)


def run(args) -> int:
    from xattn.analysis import html, plots
    from xattn.analysis.alignment import attention_links
    from xattn.analysis.choice import settings_for
    from xattn.analysis.maps import heads_per_layer
    from xattn.cli.translate import load_translator

    out = Path(args.output)
    kind = out.suffix.lower()
    if kind not in (*STATIC, ".html"):
        raise XattnError(f"--output: {out}: the extension must be one of .png, .svg, .pdf, .html")
    if args.grid and (args.layer is not None or args.heads is not None):
        raise XattnError("--grid draws every layer and head; leave out --layer and --heads")
    if args.grid and kind == ".html":
        raise XattnError("--grid applies to .png, .svg and .pdf; the .html page has a layer/head picker")
    if not split_words(args.sentence):
        raise XattnError("the sentence is empty (it has no words)")
    if args.reference is not None and not split_words(args.reference):  # (it drew one row, for </s>)
        raise XattnError("--reference is empty (it has no words); leave it out to draw the model's own translation")
    if args.no_links and args.kind != "cross":
        raise XattnError(f"--no-links: only cross-attention is drawn with alignment links, not --kind {args.kind}")
    if args.reference is not None:
        refuse_search_flags(args, "not used with --reference, which is read teacher-forced (nothing is searched)")
    translator = load_translator(args)
    pair = attention_pair(args, translator)
    links, links_layer = [], None
    if args.kind == "cross" and not args.no_links and len(pair.src_words) > 1:  # one source word: every link is to it
        settings = settings_for(args.model, translator.model.cfg)
        links = sorted(attention_links(pair, settings))
        label, links_layer = f"alignment link ({settings.method}, {settings.choice})", settings.choice.layer
    maps = pair.maps(args.kind, words=args.words, links=links)
    if links:
        maps.links_label = label
    choice = view_choice(args, heads_per_layer(maps.weights), links_layer)
    if kind == ".html":
        from xattn.io import atomic_write_text
        atomic_write_text(out, html.render(maps, choice=choice, title=title(args, pair, None),
                                            links_layer=links_layer))
    else:
        view = None if args.grid else choice
        plots.save(plots.figure(maps, view, grid=args.grid, title=title(args, pair, choice)), out)
    print(out)
    return 0


def view_choice(args, heads: list[int], links_layer: int | None = None):
    """The layer and heads to draw: --layer and --heads; without --layer, the layer the alignment links drawn come
    from (`links_layer`), else the last layer with heads (a pruned model's last layer may have none): links drawn on
    another layer's map would mark cells they were not read from."""
    from xattn.analysis.maps import HeadChoice
    from xattn.analysis.plots import TITLES

    what = TITLES[args.kind]
    default = len(heads) - 1 if links_layer is None else links_layer
    layer = HeadChoice.nearest(heads, default, what).layer if args.layer is None else args.layer
    choice = HeadChoice.parse(layer, "mean" if args.heads is None else args.heads)
    choice.check_given(heads, what)
    return choice


def title(args, pair, choice) -> str:
    """What is drawn, and the pair: "cross-attention, layer 2, mean of heads" over "source -> target"; without
    the layer and heads when `choice` is None (the HTML view, whose pickers change them)."""
    from xattn.analysis.plots import TITLES

    view = "" if choice is None else ", every layer and head" if args.grid else f", {choice}"
    which = " (reference)" if args.reference is not None else ""
    return f"{TITLES[args.kind]}{view}\n{args.sentence} \u2192 {' '.join(pair.tgt_words)}{which}"


def attention_pair(args, translator):
    """PairAttention of the sentence with the reference (teacher-forced) or the model's own translation."""
    from xattn.analysis.maps import PairAttention, encoder_attention, teacher_forced

    kinds = ("cross", args.kind)
    if args.reference is not None:
        return teacher_forced(translator, [args.sentence], [args.reference], kinds)[0]
    cfg = decode_config(args, translator.decode_config)
    refuse_unscored_penalty(args, cfg, "attention does not show")
    result = translator.translate([args.sentence], cfg, return_attention=True, attention_from="rescore",
                                  return_self_attention=args.kind == "decoder-self")[0]
    pair = PairAttention.from_translation(result, args.sentence, tokenizer=translator.tokenizers.src)
    if args.kind == "encoder-self":
        pair.encoder_self = encoder_attention(translator, args.sentence)
    return pair
