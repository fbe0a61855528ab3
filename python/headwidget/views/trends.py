"""``TrendView``: the per-layer summary of a capture, as charts, one point per captured layer.

Lines (:func:`layer_trends`, one value per captured layer, each series with its role):

- mean |channel correlation| (off-diagonal) of K and of V;
- mean head similarity (off-diagonal) of K and V before alignment (dashed), and after alignment (the
  scores the alignment view shows: held-out when few tokens), under the alignment method and metric of
  the ``alignment`` and ``metric`` traits (the alignment view's traits of the same names: a dashboard
  links them, so the chart follows that tab); the subtitle names them;
- optionally, for a model, the effective rank of the heads' QK operator correlation under each mechanism
  spec, on a second chart (diversity per mechanism).

The means are those of :meth:`~headwidget.KVStats.summary`, the one function that the demo's table and
the timelines read too. Drawn by the front end's charts (in a notebook, in marimo, on a saved page,
where the two selects work offline) and by matplotlib in a saved figure; Jupyter's dashboard draws the
same series with bqplot (:class:`~headwidget.widget.LayerTrends`). The selected layer (``layer``) is
marked by a dashed vertical line in each chart; a click on a point selects its layer, which moves the
other views of a dashboard.

Example:
    >>> import torch, headwidget
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4)).eval()
    >>> view = TrendView(headwidget.capture(model, torch.randint(0, 64, (4, 24)), progress=False))
    >>> chart = view.grid.charts[0]
    >>> chart.subtitle, chart.x_ticks
    ('head similarity: per-token cosine, auto alignment', [0.0, 1.0, 2.0])
    >>> [s.name for s in chart.series][:3]
    ['K mean |channel corr|', 'K head similarity · before', 'K head similarity · after']
    >>> view.select_point("trend-means", 0, 2)
    >>> view.layer, view.alignments_available
    (2, ['auto', 'orthogonal', 'none'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import traitlets as t
from torch import nn

from headwidget.analysis.alignment import ALIGN_METRICS, align
from headwidget.analysis.conversions import convert
from headwidget.analysis.diversity import head_diversity
from headwidget.analysis.operator_space import operator_similarity
from headwidget.checks import optional_whole_number
from headwidget.core.charts import Chart, Series
from headwidget.core.panels import PanelGrid
from headwidget.errors import ArgumentError, UnknownMetricError
from headwidget.moments import off_diagonal_mean
from headwidget.stats import KVStats
from headwidget.views._base import View, check_view_layer, stats_model_name
from headwidget.views._controls import select
from headwidget.views._memo import Memo
from headwidget.views._registry import register_view
from headwidget.views._sources import ViewSources
from headwidget.views._state import ViewState, state
from headwidget.views.alignment import METRIC_LABELS, alignment_method

__all__ = [
    "ALIGNMENTS",
    "COLOURS",
    "MARKER_COLOR",
    "RANK_ROLES",
    "SIMILARITY_ROLES",
    "SeriesRole",
    "TrendSeries",
    "TrendState",
    "TrendView",
    "layer_marker",
    "layer_series",
    "layer_ticks",
    "layer_trends",
    "trend_charts",
    "trend_subtitle",
]


#: The i-th series' colour, in the notebook's bqplot chart and in the front end's charts alike.
COLOURS = ["#2166ac", "#b2182b", "#4393c3", "#d6604d", "#1b7837", "#762a83", "#e08214", "#35978f"]
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


def _check_choice(alignment: str, metric: str) -> None:
    if alignment not in ALIGNMENTS:
        raise ArgumentError(f"alignment must be one of {', '.join(ALIGNMENTS)}; got {alignment!r}")
    if metric not in ALIGN_METRICS:  # (before any layer is read)
        raise UnknownMetricError(
            f"the trends align heads: metric must be one of {', '.join(ALIGN_METRICS)}, got {metric!r} "
            "(CKA is rotation-invariant and needs no alignment)"
        )


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
    _check_choice(alignment, metric)
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
                raise ArgumentError("mechanism trends need the model's weights: pass model=")
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


def trend_subtitle(alignment: str, metric: str) -> str:
    """What the head-similarity lines are (short enough for bqplot's centred title in a narrow cell).

    >>> trend_subtitle("auto", "pearson")
    'head similarity: Pearson, auto alignment'
    """
    return f"head similarity: {METRIC_LABELS.get(metric, metric)}, {alignment} alignment"


def _series(trend: TrendSeries, layers: Sequence[int], colour: str) -> Series:
    name, values = trend.name, trend.values
    labels = [f"{name}\nlayer {layer}: {v:.4f}" for layer, v in zip(layers, values, strict=True)]
    xs = [float(x) for x in layers]
    return Series(name, xs, list(values), labels, style="points+line", dashed=trend.dashed, color=colour)


#: The marker of the selected layer (a dashed vertical line), in every chart of the layers.
MARKER_COLOR = "#5f5f5f"


def layer_marker(layer: int, lines: Sequence[Series]) -> Series:
    """A dashed vertical line at ``layer`` from the lowest to the highest finite value of ``lines``
    (0 to 1 when none is finite), named as the legend shows it.

    >>> layer_marker(3, [Series("s", [0.0, 3.0], [0.2, float("nan")], ["a", "b"])]).y
    [0.2, 0.2]
    """
    finite = [v for s in lines for v in s.y if np.isfinite(v)]
    span = [min(finite), max(finite)] if finite else [0.0, 1.0]
    label = f"layer {layer} (selected)"
    return Series(label, [layer, layer], span, [label] * 2, style="line", color=MARKER_COLOR, dashed=True)


def trend_charts(
    series: Sequence[TrendSeries],
    layers: Sequence[int],
    subtitle: str,
    note: str = "",
    *,
    layer: int | None = None,
    hint: str = "",
) -> list[Chart]:
    """The means chart and (if any series is an effective rank) the ranks chart of ``series``; the
    i-th series in the i-th colour of :data:`COLOURS`, as in the notebook's bqplot chart; ``note``
    under the means chart; ``layer``: marked in each chart by a dashed vertical line (the last
    series); ``hint``: what a click on a point does (:attr:`~headwidget.core.charts.Chart.hint`).

    Example:
        >>> series = [TrendSeries("K mean |channel corr|", "channel_corr", [0.2, 0.3]),
        ...           TrendSeries("eff. rank · mqa", "effective_rank", [3.0, 2.5])]
        >>> charts = trend_charts(series, [0, 1], "head similarity: per-token cosine, auto alignment")
        >>> [c.id for c in charts], charts[0].series[0].labels[1], charts[0].x_ticks
        (['trend-means', 'trend-ranks'], 'K mean |channel corr|\\nlayer 1: 0.3000', [0.0, 1.0])
    """
    colours = {s.name: COLOURS[i % len(COLOURS)] for i, s in enumerate(series)}
    ticks = layer_ticks(layers).tolist()  # at layers, as the notebook's chart: no "layer 0.5"
    ranks = [s for s in series if s.role in RANK_ROLES]
    means = [s for s in series if s.role not in RANK_ROLES]
    charts = []

    def lines(shown: Sequence[TrendSeries]) -> list[Series]:
        drawn = [_series(s, layers, colours[s.name]) for s in shown]
        return drawn if layer is None else [*drawn, layer_marker(layer, drawn)]

    if means:
        charts.append(
            Chart(
                "trend-means",
                "Per-layer summary",
                "layer",
                "mean |corr| / similarity",
                lines(means),
                subtitle=subtitle,
                note=note,
                x_ticks=ticks,
                label_points=False,  # the legend names the lines
                hint=hint,
            )
        )
    if ranks:
        charts.append(
            Chart(
                "trend-ranks",
                "Head diversity per mechanism",
                "layer",
                "effective rank (QK operators)",
                lines(ranks),
                subtitle="entropy effective rank of the heads",
                x_ticks=ticks,
                label_points=False,
                hint=hint,
            )
        )
    return charts


@dataclasses.dataclass(frozen=True)
class TrendState(ViewState):
    """The key alignment and the metric of the head-similarity lines, and the selected layer (a click
    on a point sets it); a dashboard shares all three with its other views."""

    alignment: str = state("auto", select("Alignment", options="alignments_available"), shared=True)
    metric: str = state(
        "token_cosine", select("Metric", options="metrics_available", labels=METRIC_LABELS), shared=True
    )
    layer: int = state(0, shared=True)


@register_view("trends", order=70)
class TrendView(View[TrendState]):
    """The per-layer trends of a capture: channel correlation, head similarity before and after
    alignment, and (with a model) head diversity per mechanism."""

    title = "Per-layer summary"
    sources = ViewSources("stats", ("model",), layers="layer")
    placement = "above"

    alignments_available = t.List(t.Unicode()).tag(sync=True)
    metrics_available = t.List(t.Unicode()).tag(sync=True)

    def __init__(
        self,
        stats: KVStats,
        *,
        model: nn.Module | None = None,
        mechanisms: Sequence[str] = (),
        alignment: str = "auto",
        metric: str = "token_cosine",
        layer: int | None = None,
    ) -> None:
        """``model`` and ``mechanisms``: the effective rank of the heads under each mechanism spec
        (a conversion per layer and spec); ``model`` must be the model ``stats`` come from."""
        stats = self._stats(stats, model)
        if (
            isinstance(mechanisms, (str, bytes))
            or not isinstance(mechanisms, Sequence)
            or not all(isinstance(s, str) for s in mechanisms)
        ):
            raise ArgumentError(f"mechanisms must be a list of specs such as ['mqa'], got {mechanisms!r}")
        if mechanisms and model is None:
            raise ArgumentError("mechanism trends need the model's weights: pass model=")
        layer = optional_whole_number("layer", layer)
        _check_choice(alignment, metric)
        self.stats, self.model, self.mechanisms = stats, model, list(mechanisms)
        #: Every series under the first alignment and metric, and then the head similarities under
        #: each other one: the series that do not depend on them are computed once.
        self._first = (alignment, metric)
        self._trends = Memo(self._layer_trends, size=16)
        super().__init__()
        rope = stats.meta.layout.rope.uses_rope
        self.set_up(
            TrendState(alignment=alignment, metric=metric, layer=stats.layers[0] if layer is None else layer),
            alignments_available=["auto", *(["rope"] if rope else []), "orthogonal", "none"],
            metrics_available=list(ALIGN_METRICS),
        )

    def describe(self, state: TrendState) -> str:
        """The model, and how many layers the points are."""
        return f"{stats_model_name(self.stats)} · {len(self.stats.layers)} layers"

    def _layer_trends(self, alignment: str, metric: str) -> list[TrendSeries]:
        everything = (alignment, metric) == self._first
        return layer_trends(
            self.stats,
            model=self.model if everything else None,
            mechanisms=self.mechanisms if everything else (),
            alignment=alignment,
            metric=metric,
            similarity_only=not everything,
        )

    def series(self, state: TrendState | None = None) -> list[TrendSeries]:
        """The series of ``state`` (default: the current one), in :func:`layer_trends`' order; those
        that do not depend on the alignment are computed once, the head similarities once per method
        and metric."""
        state = self.current_state() if state is None else state
        _check_choice(state.alignment, state.metric)
        found = self._trends(*self._first)
        similar = {
            s.name: s for s in self._trends(state.alignment, state.metric) if s.role in SIMILARITY_ROLES
        }
        return [similar.get(s.name, s) for s in found]

    def compute(self, state: TrendState, resolution: int | None = None) -> PanelGrid:
        """The means chart (and the ranks chart with mechanisms); no heatmap. The note gives the
        selected layer's means."""
        check_view_layer(state.layer, self.stats.meta.layout.num_layers, self.stats.layers)
        series = self.series(state)
        at = self.stats.layers.index(state.layer)
        values = ", ".join(f"{s.name} {s.values[at]:.3f}" for s in series if s.role not in RANK_ROLES)
        charts = trend_charts(
            series,
            self.stats.layers,
            trend_subtitle(state.alignment, state.metric),
            f"layer {state.layer}: {values}",
            layer=state.layer,
            hint="a click on a point selects its layer",
        )
        return PanelGrid([], 0.0, 1.0, "diverging", "", charts=charts)

    def select_point(self, chart: str, series: int, point: int) -> None:
        """A click on a point of a trend line selects its layer (the marker's ends do nothing)."""
        shown = next((c for c in self.grid.charts if c.id == chart), None)
        if shown is not None and not 0 <= series < len(shown.series) - 1:  # the last series: the marker
            return
        if 0 <= point < len(self.stats.layers):
            self.set_state(layer=self.stats.layers[point])
