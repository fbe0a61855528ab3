"""``LayerTrends``: the Jupyter drawing of a :class:`~headwidget.views.TrendView`'s series, in bqplot.

The view computes the series (:func:`headwidget.views.trends.layer_trends`, one point per captured
layer) and holds the state; this chart draws them, and follows and sets the view's state: its
alignment method and metric pick the head-similarity lines (the title names them), its layer is
marked by a vertical rule, and a click on a point selects that layer in the view. The same series
are drawn by the front end's charts (the view's own widget: in marimo, on a saved page, in a figure).
The title and what the head-similarity lines are sit above the chart, left-aligned (bqplot's own title
is centred where its toolbar covers the end of it).

Lines:

- mean |channel correlation| (off-diagonal) of K and of V;
- mean head similarity (off-diagonal) of K and V before alignment, and after alignment (the scores the
  alignment view shows: held-out when few tokens);
- optionally, for a model, the effective rank of the heads' QK operator correlation under each mechanism
  spec (on a second axis; diversity per mechanism).

The y-axes span the data (with a margin), the legend sits beside the plot rather than over it, and
hovering a point shows its series, layer and value. ``layer``, ``alignment`` and ``metric`` mirror the
view's.

Example:
    >>> import torch, headwidget
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (4, 24)), progress=False)
    >>> trends = LayerTrends(headwidget.TrendView(stats))
    >>> sorted(trends.series)[:2], trends.layer
    (['K head similarity · after', 'K head similarity · before'], 0)
    >>> trends.subtitle, trends.subtitle in trends.title.value
    ('head similarity: per-token cosine, auto alignment', True)
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import bqplot as bq
import ipywidgets
import numpy as np
import traitlets as t

from headwidget.views.trends import (
    COLOURS,
    RANK_ROLES,
    SIMILARITY_ROLES,
    SeriesRole,
    TrendSeries,
    TrendView,
    layer_ticks,
    trend_subtitle,
)

__all__ = ["LayerTrends", "padded_range"]

#: What the chart mirrors of the view it draws.
MIRRORED = ("alignment", "metric", "layer")


#: Fraction of the data's span added below and above it on each y-axis.
MARGIN = 0.08


def padded_range(values: Sequence[float] | np.ndarray, margin: float = MARGIN) -> tuple[float, float]:
    """The finite values' range widened by ``margin`` of its span on each side (±0.5 around a single
    value; 0..1 without any finite value).

    Example:
        >>> padded_range([-0.177, 0.5, float("nan"), 0.9], margin=0.1)
        (-0.2847, 1.0077)
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return 0.0, 1.0
    lo, hi = float(v.min()), float(v.max())
    pad = (hi - lo) * margin if hi > lo else 0.5
    return round(lo - pad, 10), round(hi + pad, 10)


def _legend_html(entries: Sequence[tuple[str, str, bool]]) -> str:
    """One line per series: a short line in its colour (dashed for "before") and the escaped name."""
    rows = []
    for name, colour, dashed in entries:
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        swatch = (
            f'<svg width="26" height="10" aria-hidden="true"><line x1="1" y1="5" x2="25" y2="5" '
            f'stroke="{colour}" stroke-width="2"{dash}/><circle cx="13" cy="5" r="3" fill="{colour}"/></svg>'
        )
        rows.append(
            f'<div class="hw-trend-key" style="display:flex;align-items:center;gap:6px;white-space:nowrap">'
            f"{swatch}<span>{html.escape(name)}</span></div>"
        )
    return '<div class="hw-trend-legend" style="font-size:12px;line-height:1.6">' + "".join(rows) + "</div>"


class LayerTrends(ipywidgets.VBox):  # type: ignore[misc]  # (ipywidgets has no types)
    """A bqplot line chart of a :class:`~headwidget.views.TrendView`'s series; ``layer`` follows
    clicks and moves the marker; ``alignment`` and ``metric`` choose the head-similarity series."""

    layer = t.Int(0)
    alignment = t.Unicode("auto")
    metric = t.Unicode("token_cosine")

    def __init__(self, view: TrendView) -> None:
        """Draw ``view``'s series."""
        #: The view whose series this chart draws (the numbers are computed there, once).
        self.view = view
        self.stats = stats = view.stats
        found = view.series()
        #: Each series' values by name, and what it measures (:data:`SeriesRole`).
        self.series = {s.name: s.values for s in found}
        self.roles: dict[str, SeriesRole] = {s.name: s.role for s in found}
        x = np.asarray(stats.layers, dtype=float)
        xs = bq.LinearScale()
        self.y_scale = bq.LinearScale()
        self.rank_scale = bq.LinearScale()
        marks: list[Any] = []
        self.lines: dict[str, bq.Lines] = {}
        self.dots: dict[str, bq.Scatter] = {}
        self.points: list[bq.Scatter] = []
        legend: list[tuple[str, str, bool]] = []
        for i, (name, values) in enumerate(self.series.items()):
            scale = self.rank_scale if self.roles[name] in RANK_ROLES else self.y_scale
            colour = COLOURS[i % len(COLOURS)]
            y = np.asarray(values, dtype=float)
            dashed = self.roles[name] == "similarity_before"
            line = bq.Lines(
                x=x,
                y=y,
                scales={"x": xs, "y": scale},
                colors=[colour],
                labels=[name],
                display_legend=False,
                line_style="dashed" if dashed else "solid",
            )
            self.lines[name] = line
            dots = bq.Scatter(
                x=x,
                y=y,
                scales={"x": xs, "y": scale},
                colors=[colour],
                default_size=24,
                interactions={"click": "select", "hover": "tooltip"},
                tooltip=bq.Tooltip(fields=["x", "y"], labels=["layer", name], formats=["d", ".3f"]),
            )
            dots.observe(self._on_select, names=["selected"])
            self.dots[name] = dots
            self.points.append(dots)
            marks += [line, dots]
            legend.append((name, colour, dashed))
        self.rule = bq.Lines(
            x=[0.0, 0.0],
            y=[0.0, 1.0],
            scales={"x": xs, "y": self.y_scale},
            colors=["#444"],
            line_style="dotted",
        )
        marks.append(self.rule)
        axes = [
            # Ticks at layers only: d3's own ticks over 2 layers (0, 0.1, … 1) all read "0" or "1".
            bq.Axis(scale=xs, label="layer", tick_format="d", tick_values=layer_ticks(stats.layers)),
            bq.Axis(scale=self.y_scale, side="left", label="mean |corr| / similarity"),
        ]
        if any(role in RANK_ROLES for role in self.roles.values()):
            axes.append(bq.Axis(scale=self.rank_scale, side="right", label="effective rank"))
        # The title sits above the figure, left-aligned, in the page's own text: bqplot centres its
        # title where its toolbar (top right, on hover) covers the end of a long one.
        self.figure = bq.Figure(
            marks=marks,
            axes=axes,
            title="",
            fig_margin={"top": 64, "bottom": 50, "left": 60, "right": 60},  # (the toolbar: over no point)
            layout=ipywidgets.Layout(flex="1 1 auto", min_width="360px"),
        )
        #: The chart's title and what its head-similarity lines are (:attr:`subtitle`), above it.
        self.title = ipywidgets.HTML(layout=ipywidgets.Layout(margin="0 0 0 60px"))
        #: The legend, beside the plot so that it never covers a point.
        self.legend = ipywidgets.HTML(_legend_html(legend), layout=ipywidgets.Layout(flex="0 0 auto"))
        self._fit_scales()
        super().__init__(
            children=[
                self.title,
                ipywidgets.HBox(
                    [self.figure, self.legend], layout=ipywidgets.Layout(align_items="center", width="100%")
                ),
            ]
        )
        self._links = [t.link((view, name), (self, name)) for name in MIRRORED]
        self.observe(self._move_rule, names=["layer"])
        self.observe(self._on_alignment, names=["alignment", "metric"])
        self._name_figure()
        self._move_rule()

    @property
    def trend_series(self) -> list[TrendSeries]:
        """The series drawn now, with their roles (what the offline page and marimo draw again)."""
        return [TrendSeries(name, self.roles[name], values) for name, values in self.series.items()]

    def _fit_scales(self) -> None:
        """Both y-scales span their series (with a margin); the layer rule spans the left one."""
        left = [v for n, vs in self.series.items() if self.roles[n] not in RANK_ROLES for v in vs]
        lo, hi = padded_range(left)
        with self.y_scale.hold_trait_notifications():
            self.y_scale.min, self.y_scale.max = lo, hi
        self.rule.y = [lo, hi]
        ranks = [v for n, vs in self.series.items() if self.roles[n] in RANK_ROLES for v in vs]
        if ranks:
            rlo, rhi = padded_range(ranks)
            with self.rank_scale.hold_trait_notifications():
                self.rank_scale.min, self.rank_scale.max = rlo, rhi

    @property
    def subtitle(self) -> str:
        """What the head-similarity lines are now (the alignment method and metric)."""
        return trend_subtitle(self.alignment, self.metric)

    def _name_figure(self) -> None:
        self.title.value = (
            '<div class="hw-trend-title" style="line-height:1.35">'
            '<span style="font-weight:600;font-size:13px">Per-layer summary</span><br>'
            f'<span style="font-size:12px;color:#5f5f5f">{html.escape(self.subtitle)}</span></div>'
        )

    def _on_alignment(self, change: dict[str, Any]) -> None:
        """Draw the head-similarity series of the view's new alignment method or metric."""
        state = self.view.current_state().replace(alignment=self.alignment, metric=self.metric)
        for found in self.view.series(state):
            if found.role not in SIMILARITY_ROLES:
                continue
            name, values = found.name, found.values
            self.series[name] = list(values)
            y = np.asarray(values, dtype=float)
            self.lines[name].y = y
            self.dots[name].y = y
        self._fit_scales()
        self._name_figure()

    def _on_select(self, change: dict[str, Any]) -> None:
        selected = change["new"]
        if selected is not None and len(selected):
            self.layer = int(self.stats.layers[int(selected[0])])
            change["owner"].selected = None  # so that clicking the same point again selects again

    def _move_rule(self, change: dict[str, Any] | None = None) -> None:
        self.rule.x = [float(self.layer), float(self.layer)]
