import math
import os
import warnings

import numpy as np
import pytest

from xattn.analysis import fonts
from xattn.analysis.maps import AttentionMaps, HeadChoice
from xattn.analysis.plots import MIN_FONT, figure, save
from xattn.errors import XattnError

MAGIC = {".png": b"\x89PNG\r\n\x1a\n", ".pdf": b"%PDF-", ".svg": b"<?xml"}


def rows_sum_to_one(w: np.ndarray) -> np.ndarray:
    return (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)


def cross_maps(**kw) -> AttentionMaps:
    """2 layers x 2 heads, 3 target rows x 4 source columns, every weight different."""
    w = rows_sum_to_one(np.arange(1, 2 * 2 * 3 * 4 + 1, dtype=np.float64).reshape(2, 2, 3, 4) ** 1.5)
    return AttentionMaps(w, rows=["the", "cat", "</s>"], cols=["le", "chat", "noir", "</s>"], **kw)


def decoder_self_maps() -> AttentionMaps:
    """1 layer x 2 heads over 3 target tokens; row 2 gives its first column weight 0 (not masked)."""
    masked = np.triu(np.ones((3, 3), dtype=bool), k=1)  # True = a future position
    w = np.array([[1, 0, 0], [0.25, 0.75, 0], [0.0, 0.4, 0.6]], dtype=np.float32)
    return AttentionMaps(np.stack([w, w])[None], rows=["a", "b", "c"], cols=["a", "b", "c"],
                         kind="decoder-self", masked=masked)


def heatmaps(fig):
    return [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]


def draw(fig):
    """Draw `fig` with Agg, as `save` does for a PNG; returns the canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas


def pixel(fig, ax, row: int, col: int) -> np.ndarray:
    """The RGB colour drawn at the centre of cell (row, col)."""
    image = np.asarray(draw(fig).buffer_rgba())
    x, y = ax.transData.transform((col, row))
    return image[image.shape[0] - int(round(y)), int(round(x)), :3].astype(int)


def test_default_view_is_the_last_layer_mean_of_heads():
    maps = cross_maps()
    fig = figure(maps)
    (ax,) = heatmaps(fig)
    np.testing.assert_allclose(ax.images[0].get_array(), maps.weights[-1].mean(axis=0), rtol=1e-6)
    assert fig.get_suptitle().replace("\n", " ") == "cross-attention, layer 1, mean of heads"
    assert [t.get_text() for t in ax.get_xticklabels()] == maps.cols
    assert [t.get_text() for t in ax.get_yticklabels()] == maps.rows
    assert len(fig.axes) == 2  # the heatmap and its colour bar


def test_one_head_of_one_layer():
    maps = cross_maps()
    fig = figure(maps, HeadChoice(0, (1,)), title="mine")
    (ax,) = heatmaps(fig)
    np.testing.assert_allclose(ax.images[0].get_array(), maps.weights[0, 1])
    assert fig.get_suptitle() == "mine"
    with pytest.raises(XattnError, match="layer 2 is not a layer of this model"):
        figure(maps, HeadChoice(2))


def test_decoder_self_masked_cells_differ_from_zero_weights():
    import matplotlib

    maps = decoder_self_maps()
    fig = figure(maps)
    (ax,) = heatmaps(fig)
    drawn = ax.images[0].get_array()
    np.testing.assert_array_equal(np.ma.getmaskarray(drawn), maps.masked)
    zero, future = pixel(fig, ax, 2, 0), pixel(fig, ax, 0, 2)
    expected_zero = np.array(matplotlib.colormaps["Blues"](0.0)[:3]) * 255
    assert np.abs(zero - expected_zero).max() <= 2
    assert np.abs(future - zero).max() > 30, "a masked cell looks like a zero weight"
    assert abs(future[0] - future[1]) < 10 and abs(future[1] - future[2]) < 10, "masked cells are grey"
    legend = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert any("masked" in text for text in legend)


def test_grid_every_layer_and_head_plus_the_mean():
    maps = cross_maps()
    fig = figure(maps, grid=True)
    panels = heatmaps(fig)
    assert len(panels) == 2 * (2 + 1) and len(fig.axes) == len(panels) + 1  # one shared colour bar
    grid = np.array(panels).reshape(2, 3)  # made row by row
    assert [ax.get_title() for ax in grid[0]] == ["head 0", "head 1", "mean of heads"]
    for layer in range(2):
        for head in range(2):
            np.testing.assert_allclose(grid[layer, head].images[0].get_array(), maps.weights[layer, head])
        np.testing.assert_allclose(grid[layer, 2].images[0].get_array(), maps.weights[layer].mean(axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match="not both"):
        figure(maps, HeadChoice(0), grid=True)


def shown(labels) -> list[str]:
    return [t.get_text() for t in labels if t.get_visible()]


def test_every_row_of_the_grid_is_labelled_with_its_layer_and_tokens():
    maps = cross_maps()
    fig = figure(maps, grid=True)
    draw(fig)
    grid = np.array(heatmaps(fig)).reshape(2, 3)
    for layer, row in enumerate(grid):
        assert row[0].get_ylabel() == f"layer {layer}" and shown(row[0].get_yticklabels()) == maps.rows
        assert all(shown(ax.get_yticklabels()) == [] for ax in row[1:])  # the inner panels share them
    assert all(shown(ax.get_xticklabels()) == maps.cols for ax in grid[-1])
    assert all(shown(ax.get_xticklabels()) == [] for ax in grid[0])
    assert {t.get_fontsize() for ax in grid[:, 0] for t in ax.get_yticklabels()} == {MIN_FONT}


def pruned_maps(heads: list[int], rows=("the", "cat", "</s>"), cols=("le", "chat", "noir", "</s>")) -> AttentionMaps:
    """Random weights with NaN for the heads each layer lacks (as model.stack_layers pads a pruned model)."""
    w = rows_sum_to_one(np.random.default_rng(1).random((len(heads), max(heads), len(rows), len(cols))))
    for layer, n in enumerate(heads):
        w[layer, n:] = np.nan
    return AttentionMaps(w, rows=list(rows), cols=list(cols))


def panels(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def test_a_pruned_grid_leaves_missing_heads_empty_and_says_so():
    maps = pruned_maps([0, 3, 2])
    axes = np.array(panels(figure(maps, grid=True))).reshape(3, 4)
    assert [[len(ax.images) for ax in row] for row in axes] == [[0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 1]]
    notes = [[" ".join(t.get_text() for t in ax.texts) for ax in row] for row in axes]
    assert notes[0] == ["pruned", "pruned", "pruned", "no heads (pruned)"] and notes[2][2] == "pruned"
    np.testing.assert_allclose(axes[2, 3].images[0].get_array(), maps.weights[2, :2].mean(axis=0), rtol=1e-6)


def test_a_pruned_model_defaults_to_its_last_layer_with_heads_and_refuses_one_without():
    maps = pruned_maps([2, 0])
    fig = figure(maps)
    np.testing.assert_allclose(heatmaps(fig)[0].images[0].get_array(), maps.weights[0].mean(axis=0), rtol=1e-6)
    assert "layer 0, mean of heads" in fig.get_suptitle().replace("\n", " ")
    with pytest.raises(XattnError, match=r"layer 1 has no cross-attention heads left \(pruned\); layers with heads: 0"):
        figure(maps, HeadChoice(1))
    with pytest.raises(XattnError, match=r"layer 0 has no head 2 \(its cross-attention heads: 0 to 1\)"):
        figure(maps, HeadChoice(0, (2,)))
    empty = AttentionMaps(np.zeros((2, 0, 3, 4), np.float32), rows=maps.rows, cols=maps.cols)
    for grid in (False, True):
        with pytest.raises(XattnError, match=r"this model has no cross-attention heads left \(all pruned\)"):
            figure(empty, grid=grid)


def outside(fig) -> list[str]:
    """The texts drawn, at least in part, outside the figure."""
    from matplotlib.text import Text

    renderer = draw(fig).get_renderer()
    page = fig.bbox
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert texts
    boxes = {t.get_text(): t.get_window_extent(renderer) for t in texts}
    return [text for text, b in boxes.items()
            if not (page.x0 - 0.5 <= b.x0 and b.x1 <= page.x1 + 0.5 and page.y0 - 0.5 <= b.y0 and b.y1 <= page.y1 + 0.5)]


LONG = "siebenhundertdreiundzwanzigtausendvierhundertneunundneunzig"


@pytest.mark.parametrize("maps, kw", [
    (cross_maps(), {}),
    (cross_maps(), {"grid": True}),
    (cross_maps(links=[(0, 0)], links_label="alignment link (naive, layer 0, mean of heads)"), {}),
    (AttentionMaps(cross_maps().weights[:, :, :2, :2], rows=["a", "b"], cols=["x", "y"], words=True),
     {"title": "cross-attention, layer 1, mean of heads\n" + " ".join(["ein langer Satz"] * 12)}),
    (AttentionMaps(cross_maps().weights[:, :, :2, :2], rows=["a", LONG], cols=[LONG, "y"]), {"title": LONG * 2}),
    (decoder_self_maps(), {"grid": True}),
    (pruned_maps([0, 4, 1], rows=["a"], cols=["b", "</s>"]), {"grid": True}),
], ids=["single", "grid", "legend", "words, long title", "long words", "decoder-self grid", "pruned grid"])
def test_no_text_is_cut_off(maps, kw):
    assert outside(figure(maps, **kw)) == []


def test_panel_headings_never_overlap_even_over_one_column():
    fig = figure(pruned_maps([3, 4, 0], rows=["a"], cols=["</s>"]), grid=True)
    renderer = draw(fig).get_renderer()
    boxes = [ax.title.get_window_extent(renderer) for ax in panels(fig)[:5]]  # the top row
    assert all(left.x1 < right.x0 for left, right in zip(boxes, boxes[1:])), [(b.x0, b.x1) for b in boxes]


def link_boxes(ax) -> list[tuple]:
    return sorted(tuple(round(v, 3) for v in (p.get_x(), p.get_y(), p.get_width(), p.get_height()))
                  for p in ax.patches if p.get_gid() == "link")


def test_links_are_outlined_one_rectangle_per_block_of_cells():
    from xattn.analysis.plots import LINK_INSET, _boxes

    # a word link at the piece level, source pieces 1-2 x target pieces 0-1, is one block; (3, 2) one cell
    cells = [(1, 0), (2, 0), (1, 1), (2, 1), (3, 2)]
    assert _boxes(cells, (3, 4)) == [(1, 0, 2, 2), (3, 2, 1, 1)]
    assert _boxes([(0, 0), (0, 2)], (3, 1)) == [(0, 0, 1, 1), (0, 2, 1, 1)]  # not adjacent: two
    assert _boxes([(0, 0), (1, 1)], (2, 2)) == [(0, 0, 1, 1), (1, 1, 1, 1)]
    (ax,) = heatmaps(figure(cross_maps(links=cells)))
    d = LINK_INSET
    expected = [(0.5 + d, -0.5 + d, 2 - 2 * d, 2 - 2 * d), (2.5 + d, 1.5 + d, 1 - 2 * d, 1 - 2 * d)]
    assert link_boxes(ax) == [tuple(round(v, 3) for v in box) for box in expected]
    assert not link_boxes(heatmaps(figure(cross_maps()))[0])


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_save_writes_the_format_its_extension_names(tmp_path, suffix):
    path = save(figure(cross_maps()), tmp_path / f"map{suffix}")
    assert path.read_bytes().startswith(MAGIC[suffix])
    if suffix == ".svg":
        assert b"<svg" in path.read_bytes()[:2000]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_save_refuses_other_extensions(tmp_path):
    for name in ("map.jpg", "map"):
        with pytest.raises(XattnError) as error:
            save(figure(cross_maps()), tmp_path / name)
        assert str(tmp_path / name) in str(error.value) and ".png, .svg, .pdf" in str(error.value)
    assert not list(tmp_path.iterdir())


def test_sixty_pieces_keep_legible_labels_that_do_not_overlap():
    n = 60
    labels = [f"\u2581piece{i}" for i in range(n)]
    w = rows_sum_to_one(np.random.default_rng(0).random((1, 1, n, n)))
    fig = figure(AttentionMaps(w, rows=labels, cols=labels, kind="encoder-self"))
    (ax,) = heatmaps(fig)
    renderer = draw(fig).get_renderer()
    ys, xs = ax.get_yticklabels(), ax.get_xticklabels()
    size = ys[0].get_fontsize()
    assert size >= MIN_FONT and xs[0].get_fontsize() >= MIN_FONT
    boxes = sorted((t.get_window_extent(renderer) for t in ys), key=lambda b: b.y0)
    assert all(low.y1 <= high.y0 + 0.5 for low, high in zip(boxes, boxes[1:])), "row labels overlap"
    points = 72 / fig.dpi
    pitch = ax.get_window_extent(renderer).width / n * points
    assert pitch * math.sin(math.radians(60)) >= size, "rotated column labels overlap"
    page = fig.bbox
    for t in [*ys, *xs]:
        box = t.get_window_extent(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, t.get_text()


def chinese_maps() -> AttentionMaps:
    w = rows_sum_to_one(np.arange(1, 1 + 4 * 3, dtype=np.float64).reshape(1, 1, 4, 3))
    return AttentionMaps(w, rows=["我", "爱", "猫", "</s>"], cols=["I", "love", "cats"])


def glyph_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "missing from font" in str(w.message)]


def test_chinese_labels_draw_as_glyphs(tmp_path, caplog):
    covering = [f for f in fonts._candidates() if ord("猫") in fonts._charmap(f.path, f.index)]
    if not covering:
        reason = "no installed font has Chinese glyphs (Debian: apt-get install fonts-wqy-microhei)"
        pytest.fail(reason) if os.environ.get("CI") == "true" else pytest.skip(reason)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for suffix in (".png", ".svg", ".pdf"):
            save(figure(chinese_maps()), tmp_path / f"zh{suffix}")
    assert not glyph_warnings(record)
    assert not [r for r in caplog.records if "missing from font" in r.getMessage()]


def test_without_a_font_one_line_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fonts, "_candidates", lambda: ())
    monkeypatch.setattr(fonts, "_warned", set())
    with pytest.warns(UserWarning, match="missing from font"):  # drawn all the same, as boxes
        save(figure(chinese_maps()), tmp_path / "zh.png")
    (line,) = capsys.readouterr().err.splitlines()
    assert "我" in line and "猫" in line and "fonts-noto-cjk" in line and "fonts-wqy-microhei" in line
    figure(chinese_maps())
    assert capsys.readouterr().err == ""  # once per run, not once per figure
    assert (tmp_path / "zh.png").read_bytes().startswith(MAGIC[".png"])


def test_font_choice_keeps_the_default_first_and_leaves_rc_params_alone():
    import matplotlib

    before = list(matplotlib.rcParams["font.family"])
    assert fonts.families(["chat", "</s>"]) == [fonts._default_font().family]
    with fonts.fonts_for(["chat"]) as fams:
        assert matplotlib.rcParams["font.family"] == fams
    assert matplotlib.rcParams["font.family"] == before
    assert "fonts-noto-cjk" in fonts.install_hint("한")
    assert fonts.install_hint("\u0d9a") == "fonts-noto"  # Sinhala


@pytest.mark.parametrize("grid", [False, True])
def test_dollar_signs_are_text_not_math(tmp_path, grid):
    """A line with two $ was read as math: `5 $ oder 10 $` came out garbled, and `$ } $` raised mathtext's
    ValueError when drawn (a traceback from `xattn attention`)."""
    maps = AttentionMaps(cross_maps().weights, rows=["$5-$10", "}", "</s>"], cols=["5", "$", "}", "$"])
    fig = figure(maps, grid=grid, title="Es kostet 5 $ } oder 6 $\nIt costs $5 } or $6")
    path = save(fig, tmp_path / "dollars.png")
    assert path.stat().st_size > 0
    from matplotlib.text import Text
    dollars = [text for text in fig.findobj(Text) if "$" in text.get_text()]
    assert len(dollars) >= 4 and not any(text.get_parse_math() for text in dollars)
