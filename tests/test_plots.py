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
    assert ax.get_title().replace("\n", " ") == "cross-attention, layer 1, mean of heads"
    assert [t.get_text() for t in ax.get_xticklabels()] == maps.cols
    assert [t.get_text() for t in ax.get_yticklabels()] == maps.rows
    assert len(fig.axes) == 2  # the heatmap and its colour bar


def test_one_head_of_one_layer():
    maps = cross_maps()
    (ax,) = heatmaps(figure(maps, HeadChoice(0, (1,)), title="mine"))
    np.testing.assert_allclose(ax.images[0].get_array(), maps.weights[0, 1])
    assert ax.get_title() == "mine"
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
    by_title = {ax.get_title(): ax.images[0].get_array() for ax in panels}
    for layer in range(2):
        for head in range(2):
            np.testing.assert_allclose(by_title[f"layer {layer}, head {head}"], maps.weights[layer, head])
        np.testing.assert_allclose(by_title[f"layer {layer}, mean"], maps.weights[layer].mean(axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match="not both"):
        figure(maps, HeadChoice(0), grid=True)


def test_links_are_marked_on_top():
    maps = cross_maps(links=[(0, 0), (1, 1), (3, 2)])
    (ax,) = heatmaps(figure(maps))
    (marks,) = ax.collections
    np.testing.assert_array_equal(marks.get_offsets(), [[0, 0], [1, 1], [3, 2]])
    assert not heatmaps(figure(cross_maps()))[0].collections


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
