"""Text widths of the exported figures: remembered, but never across font settings."""

from __future__ import annotations

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties

from headwidget.export._figure import export_style
from headwidget.export._labels import text_width


def measured(text: str, size: float, **font: str) -> float:
    """The width in inches from a fresh renderer (nothing remembered)."""
    width, _, _ = RendererAgg(8, 8, 72).get_text_width_height_descent(
        text, FontProperties(size=size, **font), ismath=False
    )
    return width / 72.0


@pytest.mark.parametrize("text", ["0", "29", "Keys · layer 12", "mla:96+rope:8"])
def test_a_width_is_what_a_fresh_renderer_measures_every_time(text):
    with export_style():
        first = text_width(text, 7.5)
        assert first == measured(text, 7.5) and text_width(text, 7.5) == first
        bold = text_width(text, 7.5, weight="bold")
        assert bold == measured(text, 7.5, weight="bold")


def test_a_width_matches_the_text_a_figure_draws():
    fig = Figure(dpi=72)
    FigureCanvasAgg(fig)
    label = fig.text(0, 0, "ΔNLL mla:128", fontsize=9.0)
    drawn = label.get_window_extent(fig.canvas.get_renderer()).width / 72.0
    assert text_width("ΔNLL mla:128", 9.0) == pytest.approx(drawn, abs=1 / 72)


def test_other_font_settings_are_measured_anew():
    sans = text_width("iiii", 10.0)
    with matplotlib.rc_context({"font.family": "monospace"}):
        narrow, wide = text_width("iiii", 10.0), text_width("MMMM", 10.0)
        assert narrow == measured("iiii", 10.0) and narrow == wide  # a monospaced font
    assert narrow > sans  # "i" is narrow in the sans-serif font: the cached width was not reused
    assert text_width("iiii", 10.0) == sans == measured("iiii", 10.0)
    with matplotlib.rc_context({"text.hinting_factor": 1}):
        assert text_width("AVAV", 10.0) == measured("AVAV", 10.0)
