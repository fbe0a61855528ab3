"""``LayerTrends``: per-layer summaries in a bqplot figure, linked to the heatmap views' layer.

Lines, one point per captured layer:

- mean |channel correlation| (off-diagonal) of K and of V;
- mean head similarity (off-diagonal) of K and V before alignment, and after alignment (the scores the
  alignment view shows: held-out when few tokens), under the alignment method and metric of the
  ``alignment`` and ``metric`` traits (the alignment view's traits of the same names, so that
  ``traitlets.link`` makes the chart follow that tab); the title names them;
- optionally, for a model, the effective rank of the heads' QK operator correlation under each mechanism
  spec (on a second axis; diversity per mechanism).

The y-axes span the data (with a margin), the legend sits beside the plot rather than over it, and
hovering a point shows its series, layer and value. The current layer is marked by a vertical rule.
Clicking a point selects that layer; ``layer`` is a trait, so ``traitlets.link`` ties it to any view
(``explore`` does this).

Example:
    >>> import torch, headwidget
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4)).eval()
    >>> trends = LayerTrends(headwidget.capture(model, torch.randint(0, 64, (4, 24)), progress=False))
    >>> sorted(trends.series)[:2], trends.layer
    (['K head similarity · after', 'K head similarity · before'], 0)
    >>> trends.figure.title
    'head similarity: per-token cosine, auto alignment'
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import bqplot as bq
import ipywidgets
import numpy as np
import traitlets as t
from torch import nn

from headwidget.analysis.alignment import ALIGN_METRICS, align
from headwidget.analysis.conversions import convert
from headwidget.analysis.diversity import head_diversity
from headwidget.analysis.operator_space import operator_similarity
from headwidget.errors import UnknownMetricError
from headwidget.moments import off_diagonal_mean
from headwidget.stats import KVStats
from headwidget.views.alignment import METRIC_LABELS, alignment_method

__all__ = [
    "COLOURS",
    "RANK_ROLES",
    "SIMILARITY_ROLES",
    "LayerTrends",
    "SeriesRole",
    "TrendSeries",
    "layer_series",
    "layer_ticks",
    "layer_trends",
    "padded_range",
]

COLOURS = ["#2166ac", "#b2182b", "#4393c3", "#d6604d", "#1b7837", "#762a83", "#e08214", "#35978f"]
#: Fraction of the data's span added below and above it on each y-axis.
MARGIN = 0.08
#: The alignment view's choices (its ``alignment`` trait) and what they mean for keys and values.
ALIGNMENTS = ("auto", "rope", "orthogonal", "none")


def layer_ticks(layers: Sequence[int], most: int = 12) -> np.ndarray:
    """Where the layer axis has ticks: at layers, every k-th so that there are at most ``most``.

    Example:
        >>> layer_ticks([0, 1]).tolist(), layer_ticks(range(30)).tolist()
        ([0.0, 1.0], [0.0, 3.0, 6.0, 9.0, 12.0, 15.0, 18.0, 21.0, 24.0, 27.0])
    """
    layers = sorted(layers)
    step = max(1, -(-len(layers) // most))
    return np.asarray(layers[::step], dtype=float)


#: What a trend series measures: it decides the chart, the axis and the line style it is drawn with.
SeriesRole = Literal["channel_corr", "similarity_before", "similarity_after", "effective_rank"]
#: The roles drawn against the effective-rank axis (the others share the mean |corr| / similarity axis).
RANK_ROLES: frozenset[str] = frozenset({"effective_rank"})
#: The roles that change with the alignment method and metric.
SIMILARITY_ROLES: frozenset[str] = frozenset({"similarity_before", "similarity_after"})


@dataclass(frozen=True)
class TrendSeries:
    """One line of the trend chart: its name (the legend's words), what it measures, one value per
    captured layer.

    Example:
        >>> TrendSeries("K head similarity · before", "similarity_before", [0.1, 0.2]).dashed
        True
    """

    name: str
    role: SeriesRole
    values: list[float]

    @property
    def dashed(self) -> bool:
        """Drawn dashed: the before-alignment similarity, beside its solid after-alignment line."""
        return self.role == "similarity_before"


def layer_trends(
    stats: KVStats,
    *,
    model: nn.Module | None = None,
    mechanisms: Sequence[str] = (),
    alignment: str = "auto",
    metric: str = "token_cosine",
    similarity_only: bool = False,
) -> list[TrendSeries]:
    """The per-layer series the trends plot (one value per ``stats.layers``), each with its role.

    ``alignment`` and ``metric``: as the alignment view's traits (``"auto"``, ``"rope"``,
    ``"orthogonal"``, ``"none"``; ``"token_cosine"``, ``"cosine"``, ``"pearson"``...);
    ``similarity_only``: only the head-similarity series (what changes with them).
    """
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment must be one of {', '.join(ALIGNMENTS)}; got {alignment!r}")
    if metric not in ALIGN_METRICS:  # (before any layer is read)
        raise UnknownMetricError(
            f"the trends align heads: metric must be one of {', '.join(ALIGN_METRICS)}, got {metric!r} "
            "(CKA is rotation-invariant and needs no alignment)"
        )
    series: dict[str, TrendSeries] = {}

    def add(name: str, role: SeriesRole, value: float) -> None:
        series.setdefault(name, TrendSeries(name, role, [])).values.append(value)

    # The unaligned means come from the one function that the demo's table and timelines read too.
    rows = stats.summary(metric, channels=not similarity_only)
    for layer, row in zip(stats.layers, rows, strict=True):
        for kind, short in (("key", "K"), ("value", "V")):
            if kind not in stats.kinds:
                continue
            if not similarity_only:
                add(f"{short} mean |channel corr|", "channel_corr", row[f"{kind}_abs_corr"])
            before = row[f"{kind}_head_cos"]
            add(f"{short} head similarity · before", "similarity_before", before)
            res = align(stats, [layer], kind=kind, method=alignment_method(kind, alignment), metric=metric)
            after = off_diagonal_mean(res.shown) if res.method != "none" else before
            add(f"{short} head similarity · after", "similarity_after", after)
        for spec in () if similarity_only else mechanisms:
            if model is None:
                raise ValueError("mechanism trends need the model's weights: pass model=")
            sim = operator_similarity(convert(model, layer, spec, stats), layer, "qk")
            add(f"eff. rank · {spec}", "effective_rank", float(head_diversity(sim)["effective_rank"]))
    return list(series.values())


def layer_series(
    stats: KVStats,
    *,
    model: nn.Module | None = None,
    mechanisms: Sequence[str] = (),
    alignment: str = "auto",
    metric: str = "token_cosine",
    similarity_only: bool = False,
) -> dict[str, list[float]]:
    """The values of :func:`layer_trends`, by series name."""
    found = layer_trends(
        stats,
        model=model,
        mechanisms=mechanisms,
        alignment=alignment,
        metric=metric,
        similarity_only=similarity_only,
    )
    return {s.name: s.values for s in found}


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


class LayerTrends(ipywidgets.VBox):
    """A bqplot line chart of per-layer summaries; ``layer`` follows clicks and moves the marker;
    ``alignment`` and ``metric`` choose the head-similarity series."""

    layer = t.Int(0)
    alignment = t.Unicode("auto")
    metric = t.Unicode("token_cosine")

    def __init__(
        self,
        stats: KVStats,
        *,
        model: nn.Module | None = None,
        mechanisms: Sequence[str] = (),
        layer: int | None = None,
        alignment: str = "auto",
        metric: str = "token_cosine",
    ) -> None:
        """``mechanisms``: specs whose effective rank is drawn (needs ``model``); ``layer``: the marked
        layer (default: the first captured); ``alignment``, ``metric``: as the alignment view's."""
        self.stats = stats
        found = layer_trends(stats, model=model, mechanisms=mechanisms, alignment=alignment, metric=metric)
        #: Each series' values by name, and what it measures (:data:`SeriesRole`).
        self.series = {s.name: s.values for s in found}
        self.roles: dict[str, SeriesRole] = {s.name: s.role for s in found}
        self._similarity: dict[tuple[str, str], dict[str, list[float]]] = {}
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
        self.figure = bq.Figure(
            marks=marks,
            axes=axes,
            title="Per-layer summary",
            fig_margin={"top": 50, "bottom": 50, "left": 60, "right": 60},
            layout=ipywidgets.Layout(flex="1 1 auto", min_width="360px"),
        )
        #: The legend, beside the plot so that it never covers a point.
        self.legend = ipywidgets.HTML(_legend_html(legend), layout=ipywidgets.Layout(flex="0 0 auto"))
        self._fit_scales()
        super().__init__(
            children=[
                ipywidgets.HBox(
                    [self.figure, self.legend], layout=ipywidgets.Layout(align_items="center", width="100%")
                )
            ]
        )
        self._similarity[(alignment, metric)] = {
            k: v for k, v in self.series.items() if self.roles[k] in SIMILARITY_ROLES
        }
        self.alignment, self.metric = alignment, metric
        self.observe(self._move_rule, names=["layer"])
        self.observe(self._on_alignment, names=["alignment", "metric"])
        self._name_figure()
        self.layer = stats.layers[0] if layer is None else layer
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

    def _name_figure(self) -> None:
        # Short enough to fit a narrow cell: bqplot centres the title and cuts what overflows.
        metric = METRIC_LABELS.get(self.metric, self.metric)
        self.figure.title = f"head similarity: {metric}, {self.alignment} alignment"

    def _on_alignment(self, change: dict[str, Any]) -> None:
        """Recompute the head-similarity series for the new alignment method or metric."""
        key = (self.alignment, self.metric)
        if key not in self._similarity:
            self._similarity[key] = layer_series(
                self.stats, alignment=self.alignment, metric=self.metric, similarity_only=True
            )
        for name, values in self._similarity[key].items():
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
