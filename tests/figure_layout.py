"""What a figure's rendered layout gets wrong: text off the figure, texts on top of each other, axes
collapsed. Read from the bounding boxes matplotlib draws, after a full draw at the figure's dpi
(:func:`layout_problems`: the PNG), and from the saved SVG and PDF files (:func:`svg_layout_problems`,
:func:`pdf_layout_problems`)."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties, findfont, get_font
from matplotlib.ft2font import LoadFlags
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


# ---------------------------------------------------------------------------------- the saved files
# A figure's SVG (text kept as <text>) and PDF are read back: every text of the SVG, its box from its
# position, anchor, rotation and font (measured as matplotlib measures it), stays inside the page and
# overlaps no other; the PDF's page has the SVG's size and each of its texts starts where the SVG's
# does (the same texts, in the order they are drawn), so what holds for one holds for the other.


SVG = "{http://www.w3.org/2000/svg}"
#: Points a text may reach past the page, and by which the PDF's start may differ from the SVG's.
TOUCH_PT, SAME_PT = 0.75, 0.5


def _extent(string: str, prop: FontProperties) -> tuple[float, float, float]:
    """Width, height and descent (points) of one line as a vector file draws it: the font's unhinted
    outlines (what the PDF writer places its texts by, and an SVG viewer draws)."""
    font = get_font(findfont(prop))
    font.set_size(prop.get_size_in_points(), 72)
    font.set_text(string, 0.0, flags=LoadFlags.NO_HINTING)
    width, height = font.get_width_height()
    return width / 64, height / 64, font.get_descent() / 64


def _style(text: ET.Element) -> dict[str, str]:
    return {
        k.strip(): v.strip()
        for k, v in (part.split(":", 1) for part in text.get("style", "").split(";") if ":" in part)
    }


def svg_texts(path: Path) -> tuple[tuple[float, float], list[tuple[str, float, Bbox, float]]]:
    """The SVG's page size (points) and each text: its string, font size, box (points, y down) and
    left end of its baseline (what the PDF's text starts at)."""
    root = ET.parse(path).getroot()
    _, _, width, height = (float(v) for v in root.get("viewBox", "0 0 0 0").split())
    found = []
    for text in root.iter(f"{SVG}text"):
        string = "".join(text.itertext())
        if not string.strip():
            continue
        style = _style(text)
        size = float(style["font-size"].removesuffix("px"))
        prop = FontProperties(
            size=size, weight=style.get("font-weight", "normal"), style=style.get("font-style", "normal")
        )
        w, h, d = _extent(string, prop)
        transform = text.get("transform", "")
        moved = re.search(r"translate\(([-\d.e]+)[ ,]+([-\d.e]+)\)", transform)
        x, y = (
            (float(moved[1]), float(moved[2]))
            if moved
            else (float(text.get("x", 0)), float(text.get("y", 0)))
        )
        turned = re.search(r"rotate\(([-\d.e]+)", transform)
        angle = float(turned[1]) if turned else 0.0
        start = {"middle": -w / 2, "end": -w}.get(style.get("text-anchor", "start"), 0.0)
        # The box before rotation, relative to (x, y): from the start of the run, ascent above and
        # descent below the baseline; then turned about (x, y) as the SVG turns it.
        corners = [(start, -(h - d)), (start + w, -(h - d)), (start, d), (start + w, d)]
        c, s = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        turned_corners = [(x + cx * c - cy * s, y + cx * s + cy * c) for cx, cy in corners]
        xs, ys = [p[0] for p in turned_corners], [p[1] for p in turned_corners]
        found.append((string, size, Bbox.from_extents(min(xs), min(ys), max(xs), max(ys)), x + start))
    return (width, height), found


def svg_layout_problems(path: Path) -> list[str]:
    """Every text of the saved SVG that leaves its page or overlaps another (as :func:`layout_problems`
    reads a figure, here from the file)."""
    (width, height), texts = svg_texts(path)
    problems = []
    for string, _, box, _ in texts:
        if (
            box.x0 < -TOUCH_PT
            or box.y0 < -TOUCH_PT
            or box.x1 > width + TOUCH_PT
            or box.y1 > height + TOUCH_PT
        ):
            where = (
                f"({box.x0:.1f}, {box.y0:.1f})–({box.x1:.1f}, {box.y1:.1f}) pt in {width:.0f}×{height:.0f}"
            )
            problems.append(f"SVG text {string[:40]!r} leaves the page: {where}")
    for i, (a, size_a, box_a, _) in enumerate(texts):
        for b, size_b, box_b, _ in texts[i + 1 :]:
            if _overlap(box_a, box_b, min(size_a, size_b)):
                problems.append(f"SVG texts {a[:30]!r} and {b[:30]!r} overlap")
    return problems


def pdf_texts(path: Path) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """The PDF's page size (points) and where each of its texts starts (points, y down), in order."""
    data = path.read_bytes()
    box = re.search(rb"/MediaBox \[\s*([-\d.]+) ([-\d.]+) ([-\d.]+) ([-\d.]+)\s*\]", data)
    assert box is not None, f"{path}: no /MediaBox"
    width, height = float(box[3]) - float(box[1]), float(box[4]) - float(box[2])
    starts = []
    for stream in re.findall(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S):
        try:
            content = zlib.decompress(stream).decode("latin-1")
        except zlib.error:
            continue  # (a font or an image)
        for e, f in re.findall(r"([-\d.]+) ([-\d.]+) cm\s*BT", content):
            starts.append((float(e), height - float(f)))
    return (width, height), starts


def pdf_layout_problems(pdf: Path, svg: Path) -> list[str]:
    """Where the PDF's page or a text of it differs from the SVG's (saved from the same figure)."""
    (width, height), starts = pdf_texts(pdf)
    (svg_w, svg_h), texts = svg_texts(svg)
    problems = []
    if abs(width - svg_w) > SAME_PT or abs(height - svg_h) > SAME_PT:
        problems.append(f"the PDF's page is {width:.1f}×{height:.1f} pt, the SVG's {svg_w:.1f}×{svg_h:.1f}")
    if len(starts) != len(texts):
        problems.append(f"the PDF has {len(starts)} texts, the SVG {len(texts)}")
    for (x, y), (string, _, box, left) in zip(starts, texts, strict=False):
        # (a turned text starts at its turned baseline: compare its box instead)
        inside = box.x0 - SAME_PT <= x <= box.x1 + SAME_PT and box.y0 - SAME_PT <= y <= box.y1 + SAME_PT
        if not inside or (box.width > box.height and abs(x - left) > SAME_PT):
            problems.append(f"PDF text at ({x:.1f}, {y:.1f}) pt is not where the SVG's {string[:30]!r} is")
    return problems
