"""What a figure's rendered layout gets wrong: text off the figure, texts on top of each other, axes
collapsed. Read from the bounding boxes matplotlib draws, after a full draw at the figure's dpi."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

#: Texts may touch: boxes reaching this many pixels past the figure's edge are not counted.
TOUCH_PX = 1.0
#: Two texts overlap when their boxes share more than this fraction of the smaller font size, across
#: and along (a text's box includes its descent and line spacing: a title over its subtitle share a
#: sliver without a glyph touching).
OVERLAP_EM = 0.3
#: The smallest side, in inches, of a chart's axes and of a heatmap panel's axes.
MIN_AXES_IN = {"chart": 1.2, "panel": 0.25}


def _undrawn_tick_labels(fig: Figure) -> set[int]:
    """Tick labels matplotlib keeps but does not draw (ticks outside the axis' view interval)."""
    kept, drawn = set(), set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in (*axis.majorTicks, *axis.minorTicks):
                kept |= {id(tick.label1), id(tick.label2)}
            # the ticks Axis.draw draws: those inside the view interval (matplotlib's own selection)
            drawn |= {id(label) for tick in axis._update_ticks() for label in (tick.label1, tick.label2)}
    return kept - drawn


def _texts(fig: Figure) -> list[tuple[Text, Bbox]]:
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    undrawn = _undrawn_tick_labels(fig)
    out = []
    for text in fig.findobj(Text):
        if not text.get_visible() or not text.get_text().strip() or id(text) in undrawn:
            continue
        if text.axes is not None and not text.get_in_layout() and text.get_clip_on():
            continue
        box = text.get_window_extent(renderer)
        if box.width <= 0 or box.height <= 0:
            continue
        out.append((text, box))
    return out


def _overlap(a: Bbox, b: Bbox, em_px: float) -> bool:
    dx = min(a.x1, b.x1) - max(a.x0, b.x0)
    dy = min(a.y1, b.y1) - max(a.y0, b.y0)
    return dx > OVERLAP_EM * em_px and dy > OVERLAP_EM * em_px


def layout_problems(fig: Figure) -> list[str]:
    """Every text that leaves the figure or overlaps another, and every axes smaller than
    :data:`MIN_AXES_IN` (charts: axes with lines or points; panels: axes with an image)."""
    fig.canvas.draw()
    width, height = fig.bbox.width, fig.bbox.height
    problems = []
    texts = _texts(fig)
    for text, box in texts:
        inside = box.x0 >= -TOUCH_PX and box.x1 <= width + TOUCH_PX
        inside = inside and box.y0 >= -TOUCH_PX and box.y1 <= height + TOUCH_PX
        if not inside:
            corners = f"({box.x0:.1f}, {box.y0:.1f})–({box.x1:.1f}, {box.y1:.1f})"
            where = f"{corners} px in {width:.0f}×{height:.0f}"
            problems.append(f"text {text.get_text()[:40]!r} leaves the figure: {where}")
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1 :]:
            em_px = min(a.get_fontsize(), b.get_fontsize()) * fig.dpi / 72
            if _overlap(box_a, box_b, em_px):
                problems.append(f"texts {a.get_text()[:30]!r} and {b.get_text()[:30]!r} overlap")
    dpi = fig.dpi
    for ax in fig.axes:
        kind = "panel" if ax.images else "chart" if (ax.lines or ax.collections) else None
        if kind is None or ax.get_label() == "<colorbar>":
            continue
        w, h = ax.bbox.width / dpi, ax.bbox.height / dpi
        if min(w, h) < MIN_AXES_IN[kind]:
            problems.append(f"{kind} axes {ax.get_title(loc='left')[:30]!r} is {w:.2f}×{h:.2f} in")
    return problems
