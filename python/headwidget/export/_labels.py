"""The text of a panel: widths measured with matplotlib's font metrics, wrapping, and axis ticks.

Widths are in inches; measuring needs no figure (a 72-dpi Agg renderer, one point per pixel). Call
inside :func:`headwidget.export.export_style` so that the export's fonts are the ones measured.

Ticks are chosen like the widget's (``js/lib/ticks.ts``). Positions are in cell units from the start
of the plot (cell ``i`` spans ``[i, i + 1)``), the data coordinates the figure draws matrices in. With
explicit labels every k-th cell is labelled (k = 1, 2, 5, 10, …); without them, round original
indices ``offset + i * step`` are, at least a label's width apart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Literal

import matplotlib
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import Formatter, Locator

if TYPE_CHECKING:  # the rcParams keys as a type, for the checker only (not every matplotlib >= 3.8 has it)
    from matplotlib.typing import RcKeyType

__all__ = [
    "PanelAxisFormatter",
    "PanelAxisLocator",
    "fit_label",
    "nice_step",
    "panel_axis",
    "printable",
    "text_width",
    "wrap",
]

REPLACEMENT = "\ufffd"
# Drawn as the widget's canvas draws them: ASCII whitespace (tab, newline, form feed, carriage return)
# as a space, and every other control character (C0, DEL, C1), a lone surrogate or one of the two
# non-characters XML forbids as the replacement character. In an SVG or a PDF they would make the
# file invalid or the export fail.
_UNPRINTABLE = {
    **dict.fromkeys([*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)], REPLACEMENT),
    **dict.fromkeys(range(0xD800, 0xE000), REPLACEMENT),
    0xFFFE: REPLACEMENT,
    0xFFFF: REPLACEMENT,
    **dict.fromkeys(map(ord, "\t\n\x0c\r"), " "),
}


@cache
def _renderer() -> RendererAgg:
    return RendererAgg(8, 8, 72)


FontStyle = Literal["normal", "italic", "oblique"]


def text_width(text: str, size: float, *, weight: str = "normal", style: FontStyle = "normal") -> float:
    """Width in inches of one line of ``text`` at ``size`` points.

    Widths are remembered per text, size and font settings (the rcParams that choose and shape the
    font): a figure's locators and layout passes measure the same tick labels many times.

    Example:
        >>> 0.2 < text_width("Keys · layer 0", 9.0) < 1.5
        True
    """
    if not text:
        return 0.0
    return _width(text, float(size), weight, style, _font_settings())


#: The rcParams that decide which font a text is drawn in, and how its glyphs are spaced.
_FONT_PARAMS: tuple[RcKeyType, ...] = (
    "font.family",
    "font.sans-serif",
    "font.serif",
    "font.monospace",
    "font.cursive",
    "font.fantasy",
    "font.stretch",
    "font.variant",
    "text.hinting",
    "text.hinting_factor",
)


def _font_settings() -> tuple[object, ...]:
    """The current values of :data:`_FONT_PARAMS`, hashable."""
    values = (matplotlib.rcParams.get(name) for name in _FONT_PARAMS)  # None once a version drops one
    return tuple(tuple(v) if isinstance(v, list) else v for v in values)


@lru_cache(maxsize=8192)
def _width(text: str, size: float, weight: str, style: FontStyle, settings: tuple[object, ...]) -> float:
    """:func:`text_width` measured (``settings``: the :func:`_font_settings` it is measured under)."""
    prop = FontProperties(size=size, weight=weight, style=style)
    width, _, _ = _renderer().get_text_width_height_descent(text, prop, ismath=False)
    return float(width) / 72.0


def _greedy(pieces: list[str], sep: str, fits: Callable[[str], bool]) -> list[str]:
    lines: list[str] = []
    for piece in pieces:
        candidate = f"{lines[-1]}{sep}{piece}" if lines else piece
        if lines and fits(candidate):
            lines[-1] = candidate
        else:
            lines.append(piece)
    return lines


def wrap(
    text: str, width: float, size: float, *, weight: str = "normal", style: FontStyle = "normal"
) -> list[str]:
    """``text`` in lines at most ``width`` inches wide, broken at " · " first, then at spaces, then
    (a word longer than ``width``: a long spec) after its commas and semicolons, else between
    characters: no line runs past ``width`` unless one character does.

    Example:
        >>> wrap("64 B/token · eff. rank 4.99 · err K 0.000 V 0.704", 1.8, 7.5)
        ['64 B/token · eff. rank 4.99', 'err K 0.000 V 0.704']
    """
    if not text.strip():
        return []

    def fits(line: str) -> bool:
        return text_width(line, size, weight=weight, style=style) <= width

    lines: list[str] = []
    for line in _greedy(text.split(" · "), " · ", fits):
        if fits(line):
            lines.append(line)
            continue
        for piece in _greedy(line.split(), " ", fits):
            lines.extend([piece] if fits(piece) else _greedy(_parts(piece), "", fits))
    return lines


def _parts(word: str) -> list[str]:
    """``word`` cut after each ``,`` and ``;`` (where a long spec such as ``kv:int4@0,2-5;mqa@1`` may
    break across lines), or into its characters when it has neither."""
    parts = re.findall(r"[^,;]*[,;]|[^,;]+", word)
    return parts if len(parts) > 1 else list(word)


#: Longest tick label, in characters, before it is cut with an ellipsis (rows, columns).
MAX_LABEL_CHARS = {"row": 24, "col": 9}
COL_LABEL_GAP_PT = 6.0


def nice_step(x: float) -> float:
    """Smallest 1, 2 or 5 × 10^k that is ≥ ``x`` (1 for non-positive or non-finite ``x``).

    Example:
        >>> nice_step(3.2), nice_step(0.04), nice_step(7)
        (5.0, 0.05, 10.0)
    """
    if not (x > 0) or not math.isfinite(x):
        return 1.0
    p = 10.0 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * p >= x * (1 - 1e-12):
            return float(m * p)
    return 10.0 * p


def fit_label(label: str, max_chars: int) -> str:
    """``label`` cut to ``max_chars`` characters with an ellipsis.

    Example:
        >>> fit_label("Keys · layer 12", 9)
        'Keys · l…'
    """
    return label if len(label) <= max_chars else label[: max_chars - 1] + "…"


def printable(text: object) -> str:
    """``text`` as a figure can draw it, and as the widget's canvas does: tab, newline, form feed and
    carriage return as spaces; every other control character, a lone surrogate or an XML
    non-character as the replacement character ``"\ufffd"``. The SVG stays valid XML, and the PDF
    and PNG have a glyph for every character.

    Example:
        >>> printable("Keys\\x00 · layer\\n0\\x1b[31m")
        'Keys\ufffd · layer 0\ufffd[31m'
    """
    return str(text).translate(_UNPRINTABLE)


class _PanelAxis:
    def __init__(
        self, n: int, labels: Sequence[str] | None, offset: int, step: int, orient: str, fontsize: float
    ) -> None:
        self.n, self.offset, self.step, self.orient = n, offset, max(1, step), orient
        self.fontsize = fontsize
        self.labels = None if labels is None else [fit_label(str(s), MAX_LABEL_CHARS[orient]) for s in labels]

    def _min_spacing_pt(self, texts: Sequence[str]) -> float:
        """Distance between tick centres at which their labels do not touch."""
        if self.orient == "row":
            return self.fontsize * 1.3
        return max(text_width(t, self.fontsize) for t in texts) * 72 + COL_LABEL_GAP_PT

    def positions(self, length_pt: float) -> list[float]:
        if self.n < 1 or length_pt <= 0:
            return []
        if self.labels is not None:
            k = max(1, int(nice_step(self._min_spacing_pt(self.labels) / (length_pt / self.n))))
            return [i + 0.5 for i in range(0, self.n, k)]
        first, last = self.offset, self.offset + self.n * self.step - 1
        spacing = self._min_spacing_pt([str(first), str(last)])
        d = max(1, int(nice_step(max(spacing / (length_pt / (self.n * self.step)), self.step))))
        ticks = [(idx - first + 0.5) / self.step for idx in range(math.ceil(first / d) * d, last + 1, d)]
        return ticks or [0.5]

    def label(self, pos: float) -> str:
        if self.labels is not None:
            i = math.floor(pos)
            return self.labels[i] if 0 <= i < len(self.labels) else ""
        return str(round(pos * self.step - 0.5) + self.offset)


class PanelAxisLocator(Locator):
    """Tick positions of one panel axis for its current length on the figure."""

    def __init__(self, axis_spec: _PanelAxis) -> None:
        self.spec = axis_spec

    def __call__(self) -> Sequence[float]:
        axis = self.axis
        if not isinstance(axis, Axis) or axis.axes is None:
            return self.spec.positions(2 * 72.0)
        bbox = axis.axes.bbox
        dpi = axis.axes.figure.dpi if axis.axes.figure is not None else 72.0
        length_px = bbox.height if self.spec.orient == "row" else bbox.width
        return self.spec.positions(float(length_px) * 72.0 / dpi)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        return self.spec.positions(2 * 72.0)


class PanelAxisFormatter(Formatter):
    """Tick labels of one panel axis: its explicit labels, else original indices."""

    def __init__(self, axis_spec: _PanelAxis) -> None:
        self.spec = axis_spec

    def __call__(self, x: float, pos: int | None = None) -> str:
        return self.spec.label(float(x))


def panel_axis(
    n: int, labels: Sequence[str] | None, offset: int, step: int, orient: str, fontsize: float
) -> tuple[PanelAxisLocator, PanelAxisFormatter]:
    """Locator and formatter for a panel's rows (``orient="row"``) or columns (``"col"``).

    Example:
        >>> loc, fmt = panel_axis(16, None, 0, 1, "col", 7.0)  # on a 2-inch axis
        >>> [fmt(p) for p in loc.tick_values(0, 16)]
        ['0', '2', '4', '6', '8', '10', '12', '14']
    """
    spec = _PanelAxis(n, labels, offset, step, orient, fontsize)
    return PanelAxisLocator(spec), PanelAxisFormatter(spec)
