"""``TimelineView``: K/V redundancy at one training step of a :class:`~headwidget.Timeline`, beside its
trend over every step.

The panels are those of one snapshot (``timeline[step]``), as the frozen-checkpoint views show them:
``show="channels"``, the channel × channel correlation of K and V at the layer (the matrices of
:class:`~headwidget.views.ChannelView`, every channel, block means above ``max_cells``);
``show="heads"``, head × head similarity of K and V before and after alignment (those of
:class:`~headwidget.views.AlignmentView` with its defaults: per-token cosine, keys aligned as
``"auto"`` chooses, values by orthogonal Procrustes). The step slider (with play/pause) moves through
the snapshots, the layer slider through the layers.

Above the panels, the trend chart of the selected layer: per step, the numbers of
:meth:`Timeline.summary <headwidget.Timeline.summary>` (mean |channel correlation| of K and V, mean head
similarity of K and V before and after alignment; :meth:`Timeline.layer_series
<headwidget.Timeline.layer_series>`), with the step
shown marked; when the trainer logged a loss, a second chart draws it over the same steps, on the
same step axis (the step shown is marked at the same place in both). A click on a point of a chart
moves the step slider to that step.

Two timelines side by side (``TimelineView({"MHA": t1, "GQA": t2})``) share the step slider, so they
must hold the same steps; each has its own panels, and its lines in the charts (the second dashed).

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> probe = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    >>> timeline = headwidget.Timeline.from_checkpoints([model, model], [0, 50], probe)
    >>> view = TimelineView(timeline, layer=1, show="channels")
    >>> [p.title for p in view.grid.panels], view.step_label
    (['Keys · step 0', 'Values · step 0'], 'step 0 (1 of 2: steps 0–50)')
    >>> view.step = 1  # what the step slider does
    >>> view.grid.panels[0].title, [s.name for s in view.grid.charts[0].series][:2]
    ('Keys · step 50', ['K mean |ρ|', 'V mean |ρ|'])
    >>> view.matrices = "heads"
    >>> [p.title for p in view.grid.panels][:2]
    ['Keys · before', 'Keys · after']
    >>> view.grid.panels[1].subtitle
    'step 50 · layer 1 · per-token cosine, rope alignment, held-out scores'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import traitlets as t

from headwidget.analysis.alignment import AlignmentResult, align
from headwidget.analysis.downsample import downsampled_corr
from headwidget.checks import flag, optional_whole_number, whole_number
from headwidget.core.charts import Chart, Series
from headwidget.core.kinds import KIND_LABELS, check_kind
from headwidget.core.panels import Panel, PanelGrid
from headwidget.errors import (
    StepIndexError,
    TimelineStepsError,
    UnknownOptionError,
)
from headwidget.stats import KVStats
from headwidget.tracking import SUMMARY_METRICS, Timeline
from headwidget.views._base import View, ViewSourceError, check_view_layer, stats_model_name
from headwidget.views._controls import slider, toggles
from headwidget.views._memo import Memo
from headwidget.views._registry import register_view
from headwidget.views._sources import ViewSources
from headwidget.views._state import ViewState, state
from headwidget.views.alignment import head_panel, similarity_grid
from headwidget.views.channels import KIND_TITLES, channel_panel, check_key_kind

__all__ = ["SHOW_LABELS", "StepIndexError", "TimelineState", "TimelineStepsError", "TimelineView"]

#: What the view can show at a step, and what its toggles call each.
SHOW_LABELS = {"channels": "channel correlation", "heads": "head similarity"}
#: The colour of each trend line (the same metric has the same colour in every timeline).
METRIC_COLORS = {
    "key_abs_corr": "#1f77b4",
    "value_abs_corr": "#ff7f0e",
    "key_head_cos": "#2ca02c",
    "value_head_cos": "#d62728",
    "key_aligned_sim": "#9467bd",
    "value_aligned_sim": "#8c564b",
}
#: The marker of the step shown, in every chart.
MARKER_COLOR = "#5f5f5f"
#: Alignment results kept (each a few small matrices): a played timeline revisits its steps.
KEEP_RESULTS = 128


def checked_timelines(source: Any) -> dict[str, Timeline]:
    """``source`` (a :class:`~headwidget.Timeline`, or a mapping of names to timelines) as names →
    timelines, each checked to hold a snapshot and all to hold the same steps.

    Raises:
        ViewSourceError: not a timeline (or a mapping of them), an empty mapping or timeline, or a
            name that is not a non-empty string.
        TimelineStepsError: timelines whose steps differ.

    Example:
        >>> checked_timelines(Timeline({}))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        headwidget.errors.ViewSourceError: the timeline view needs snapshots: this timeline holds none...
    """
    if isinstance(source, Timeline):
        timelines = {"": source}
    elif isinstance(source, Mapping) and source:
        timelines = dict(source)
        for name, timeline in timelines.items():
            if not isinstance(name, str) or not name.strip():
                raise ViewSourceError(f"timelines are named by non-empty strings, got {name!r}")
            if not isinstance(timeline, Timeline):
                raise ViewSourceError(
                    f"timeline {name!r} must be a headwidget.Timeline (tracker.timeline, Timeline.load or "
                    f"Timeline.from_checkpoints), got {type(timeline).__name__}"
                )
    else:
        raise ViewSourceError(
            "the timeline view needs a headwidget.Timeline (tracker.timeline, Timeline.load(path) or "
            "Timeline.from_checkpoints), or a mapping of names to timelines, got "
            + (f"an empty {type(source).__name__}" if isinstance(source, Mapping) else type(source).__name__)
        )
    for name, timeline in timelines.items():
        if not timeline.steps:
            which = f"timeline {name!r}" if name else "this timeline"
            raise ViewSourceError(
                f"the timeline view needs snapshots: {which} holds none (take one with "
                "tracker.snapshot(model, step), or train with the tracker as a callback)"
            )
    (first, steps), *others = ((n, tl.steps) for n, tl in timelines.items())
    for name, other in others:
        if other != steps:
            raise TimelineStepsError(
                f"timelines side by side share the step slider, so they must hold the same steps: "
                f"{first!r} has {_span(steps)}, {name!r} has {_span(other)}"
            )
    return timelines


def _hover(words: str, steps: Sequence[int], values: Sequence[float]) -> list[str]:
    """What hovering each point of a trend line says: the line, the step and the value. The first
    line, which a chart prints beside a point, is empty: trend points are read from their lines."""
    return [f"\n{words} · step {s}: {v:.4f}" for s, v in zip(steps, values, strict=True)]


def _span(steps: Sequence[int]) -> str:
    shown = ", ".join(map(str, steps[:6])) + (", ..." if len(steps) > 6 else "")
    return f"{len(steps)} steps ({shown})"


@dataclasses.dataclass(frozen=True)
class TimelineState(ViewState):
    """The step shown (an index among the timeline's steps), the layer (shared by a dashboard's views),
    what the panels show (``channels`` or ``heads``) and the kind of keys."""

    step: int = state(0, slider("Step", count="num_steps", text="step_label", play=True))
    layer: int = state(0, slider("Layer", count="num_layers", text="layer_label"), shared=True)
    matrices: str = state("channels", toggles("Show", options="shows_available", labels=SHOW_LABELS))
    kind: str = state("key", toggles("Kind", options="kinds_available", labels=KIND_LABELS))


@register_view("timeline", order=60)
class TimelineView(View[TimelineState]):
    """One training step's K and V panels (channel correlation or head similarity) of one or two
    timelines, beside the selected layer's trend over every step (see the module docstring)."""

    title = "Over training"
    sources = ViewSources("timeline", layers="layer", prefetch=True)

    num_steps = t.Int(0).tag(sync=True)
    step_label = t.Unicode("").tag(sync=True)
    num_layers = t.Int(0).tag(sync=True)
    layer_label = t.Unicode("").tag(sync=True)
    shows_available = t.List(t.Unicode()).tag(sync=True)
    kinds_available = t.List(t.Unicode()).tag(sync=True)

    def __init__(
        self,
        timeline: Timeline | Mapping[str, Timeline],
        *,
        layer: int | None = None,
        step: int = 0,
        show: str = "channels",
        kind: str = "key",
        max_cells: int = 1024,
        prefetch: bool = True,
    ) -> None:
        """``timeline``: one :class:`~headwidget.Timeline`, or ``{"name": timeline, ...}`` side by side.
        ``step``: the index of the step shown among ``timeline.steps`` (0: the first snapshot);
        ``layer``: None, the first captured layer; ``show``: ``"channels"`` or ``"heads"``;
        ``max_cells``: the most cells a channel panel side shows (block means above it);
        ``prefetch``: compute the next step and the next layer ahead."""
        self.timelines = checked_timelines(timeline)
        layer = optional_whole_number("layer", layer)
        step = whole_number(
            "step", step, minimum=0, hint="the index of a snapshot among the timeline's steps"
        )
        self._max_cells = whole_number(
            "max_cells", max_cells, minimum=1, hint="the most cells a panel side shows"
        )
        self.prefetch = flag("prefetch", prefetch)
        self.steps: list[int] = next(iter(self.timelines.values())).steps
        firsts = [tl[self.steps[0]] for tl in self.timelines.values()]
        # Parts of the panels and charts (a played timeline revisits them): alignments, channel
        # matrices (at most max_cells² floats each) and a layer's trend lines.
        self._results = Memo(self._align, size=KEEP_RESULTS)
        self._channel_matrix = Memo(self._correlation, size=64)
        self._series = Memo(lambda name, layer: self.timelines[name].layer_series(layer), size=64)
        self._lines = Memo(self._trend_lines, size=64)
        self._losses = Memo(self._loss_lines, size=1)
        super().__init__()
        both = all("key_post" in s.kinds for s in firsts)
        self.set_up(
            TimelineState(
                step=step, layer=firsts[0].layers[0] if layer is None else layer, matrices=show, kind=kind
            ),
            num_steps=len(self.steps),
            num_layers=min(s.meta.layout.num_layers for s in firsts),
            shows_available=list(SHOW_LABELS),
            kinds_available=["key", "key_post"] if both else [],
        )

    @classmethod
    def shows(cls, stats: KVStats | None) -> bool:
        """Never from one capture's statistics alone: the view needs a timeline of snapshots."""
        return False

    # ------------------------------------------------------------------ what the state says
    def stats_at(self, name: str, index: int) -> KVStats:
        """The snapshot of timeline ``name`` (``""``: the only one) at step index ``index``."""
        return self.timelines[name][self.steps[index]]

    def check_step(self, index: int) -> int:
        """The training step at slider position ``index``, or :class:`StepIndexError`."""
        if not 0 <= index < len(self.steps):
            raise StepIndexError(
                f"step index {index} is out of range: the timeline holds {len(self.steps)} snapshots "
                f"(indices 0..{len(self.steps) - 1}, steps {self.steps[0]}..{self.steps[-1]})"
            )
        return self.steps[index]

    def check_layer(self, layer: int) -> None:
        """Refuse a layer outside the model, or one a snapshot did not capture
        (:class:`~headwidget.errors.LayerIndexError`)."""
        check_view_layer(layer, self.num_layers)
        for name, timeline in self.timelines.items():
            where = f"timeline {name!r}" if name else "the timeline"
            check_view_layer(layer, self.num_layers, timeline[self.steps[0]].layers, where)

    def step_text(self, index: int) -> str:
        """The step slider's read-out: ``"step 500 (3 of 9: steps 0–2000)"``."""
        steps = self.steps
        return f"step {steps[index]} ({index + 1} of {len(steps)}: steps {steps[0]}–{steps[-1]})"

    def labels(self, state: TimelineState) -> dict[str, Any]:
        """The step and layer read-outs."""
        return {
            "step_label": self.step_text(state.step),
            "layer_label": f"layer {state.layer} of 0–{self.num_layers - 1}",
        }

    def neighbours(self, state: TimelineState) -> list[TimelineState]:
        """The next step (what play shows next) and the next layer."""
        ahead = []
        if state.step + 1 < len(self.steps):
            ahead.append(state.replace(step=state.step + 1))
        if state.layer + 1 < self.num_layers:
            ahead.append(state.replace(layer=state.layer + 1))
        return ahead

    @property
    def max_cells(self) -> int:
        """The most cells a channel panel side shows (fixed when the view is built)."""
        return self._max_cells

    def describe(self, state: TimelineState) -> str:
        """The model(s), the layer and the step shown."""
        models = [
            f"{name}: {stats_model_name(self.stats_at(name, 0))}"
            if name
            else stats_model_name(self.stats_at(name, 0))
            for name in self.timelines
        ]
        step = self.steps[state.step] if 0 <= state.step < len(self.steps) else state.step
        return f"{' vs '.join(models)} · layer {state.layer} · step {step}"

    # ------------------------------------------------------------------ panels
    def _correlation(
        self, name: str, index: int, layer: int, kind: str, cells: int
    ) -> tuple[np.ndarray, int]:
        """A snapshot's whole channel correlation at ``cells`` a side at most, and its block size."""
        stats = self.stats_at(name, index)
        channels = stats.moments(layer, check_kind(kind)).channels
        matrix, block = downsampled_corr(stats, layer, check_kind(kind), 0, channels, cells)
        matrix.setflags(write=False)  # cached and shared by panels: never changed in place
        return matrix, block

    def result(self, name: str, index: int, layer: int, kind: str) -> AlignmentResult:
        """The alignment behind a head panel, as :class:`~headwidget.views.AlignmentView` computes it
        with its defaults (cached, the most recent :data:`KEEP_RESULTS`)."""
        return self._results(name, index, layer, kind)

    def _align(self, name: str, index: int, layer: int, kind: str) -> AlignmentResult:
        method = "orthogonal" if kind == "value" else None
        return align(self.stats_at(name, index), [layer], kind=check_kind(kind), method=method)

    @staticmethod
    def _title(name: str, *parts: str) -> str:
        return " · ".join(p for p in (name, *parts) if p)

    def _channel_panels(self, state: TimelineState, step: int, cells: int) -> list[Panel]:
        panels = []
        for kind in (state.kind, "value"):
            for name in self.timelines:
                stats = self.stats_at(name, state.step)
                shown = self._channel_matrix(name, state.step, state.layer, kind, cells)
                channels = stats.moments(state.layer, check_kind(kind)).channels
                subtitle = (
                    f"layer {state.layer} · channels 0–{channels - 1} · Pearson over {stats.tokens} tokens"
                )
                title = self._title(name, KIND_TITLES[kind], f"step {step}")
                panel_id = f"{name}:{kind}" if name else kind
                panels.append(
                    channel_panel(
                        stats, kind, (0, channels), shown, id=panel_id, title=title, subtitle=subtitle
                    )
                )
        return panels

    def _head_panels(self, state: TimelineState, step: int) -> list[Panel]:
        panels = []
        for kind in (state.kind, "value"):
            for name in self.timelines:
                res = self.result(name, state.step, state.layer, kind)
                aligned = res.method != "none"
                labels, title = list(res.labels), self._title(name, KIND_TITLES[kind])
                subtitle = f"step {step} · layer {state.layer} · per-token cosine"
                scoring = f"{res.method} alignment, {res.scoring} scores" if aligned else "in-sample scores"
                for suffix, matrix, scores in (
                    ("before", res.before, f"{res.token_count} tokens"),
                    ("after", res.shown if aligned else res.before, scoring),
                ):
                    panel_id = f"{name}:{kind}-{suffix}" if name else f"{kind}-{suffix}"
                    panels.append(
                        head_panel(panel_id, f"{title} · {suffix}", matrix, f"{subtitle}, {scores}", labels)
                    )
        return panels

    def compute(self, state: TimelineState, resolution: int | None = None) -> PanelGrid:
        """The panels of the step and layer of ``state`` under the trend chart(s) of the layer: K beside
        V for one timeline; for several, a K row over a V row, a column per timeline (two for heads:
        before and after)."""
        step = self.check_step(state.step)
        self.check_layer(state.layer)
        if state.matrices not in SHOW_LABELS:
            choices = " or ".join(map(repr, SHOW_LABELS))
            raise UnknownOptionError(f"unknown show {state.matrices!r}: the timeline view shows {choices}")
        for name in self.timelines:
            check_key_kind(state.kind, self.stats_at(name, state.step), "timeline view")
        charts = self.trend_charts(state)
        count = len(self.timelines)
        if state.matrices == "channels":
            cells = self.max_cells if resolution is None else max(1, min(self.max_cells, resolution))
            panels = self._channel_panels(state, step, cells)
            columns = 2 if count == 1 else count  # one timeline: K beside V; several: K row over V row
            return PanelGrid(
                panels, -1.0, 1.0, "diverging", "Pearson correlation", columns=columns, charts=charts
            )
        return similarity_grid(self._head_panels(state, step), columns=2 * count, charts=charts)

    # ------------------------------------------------------------------ trends
    def series(self, name: str, layer: int) -> dict[str, list[float]]:
        """The trend lines of ``layer`` in timeline ``name``
        (:meth:`Timeline.layer_series <headwidget.Timeline.layer_series>`, kept once read)."""
        return self._series(name, layer)

    @staticmethod
    def _marker(step: int, span: list[float]) -> Series:
        """A dashed vertical line at ``step`` from the lowest to the highest value of ``span``."""
        label = f"step {step} (shown)"
        return Series(
            f"step {step}", [step, step], span, [label] * 2, style="line", color=MARKER_COLOR, dashed=True
        )

    @staticmethod
    def _span(lines: list[Series]) -> list[float]:
        """The lowest and highest finite value of ``lines`` (0 and 1 when none is finite)."""
        finite = [v for s in lines for v in s.y if math.isfinite(v)]
        return [min(finite), max(finite)] if finite else [0.0, 1.0]

    def _trend_lines(self, layer: int) -> tuple[list[Series], list[float]]:
        """The trend lines of ``layer`` (one per metric and timeline) and their span: the same at
        every step (kept: a played timeline draws them at every step)."""
        lines: list[Series] = []
        for i, name in enumerate(self.timelines):
            for metric, values in self.series(name, layer).items():
                words = self._title(name, SUMMARY_METRICS[metric])
                hover = _hover(words, self.steps, values)
                colour = METRIC_COLORS[metric]
                lines.append(Series(words, list(self.steps), values, hover, "points+line", colour, i > 0))
        return lines, self._span(lines)

    def _loss_lines(self) -> tuple[list[Series], list[float]]:
        """The trainer's logged loss of each timeline (none logged: no line) and its span."""
        lines: list[Series] = []
        for i, (name, timeline) in enumerate(self.timelines.items()):
            steps, values = timeline.log_series("loss")
            if steps:
                words = self._title(name, "loss")
                xs = [float(s) for s in steps]
                lines.append(
                    Series(words, xs, values, _hover(words, steps, values), style="line", dashed=i > 0)
                )
        return lines, self._span(lines)

    def trend_charts(self, state: TimelineState) -> list[Chart]:
        """The trend chart of the layer of ``state`` (one line per metric and timeline, the step shown
        marked) and, when a trainer logged a loss, the loss chart."""
        step = self.steps[state.step]
        lines, span = self._lines(state.layer)
        loss, loss_span = self._losses()
        # One step axis for both charts: a step (and the marker of the one shown) is at the same
        # place in each, whichever starts later (a loss first logged at step 5, snapshots from 0).
        steps = [*self.steps, *(x for line in loss for x in line.x)]
        axis = [float(min(steps)), float(max(steps))]
        charts = [
            Chart(
                "trends",
                f"Layer {state.layer} over training",
                "training step",
                "mean over pairs",
                [*lines, self._marker(step, span)],
                subtitle="mean |channel correlation|; mean head similarity before and after alignment",
                hint="a click on a point shows its step",
                x_range=axis,
            )
        ]
        if loss:
            charts.append(
                Chart(
                    "loss",
                    "Trainer's loss",
                    "training step",
                    "loss",
                    [*loss, self._marker(step, loss_span)],
                    subtitle="as the trainer logged it",
                    hint="a click on a point shows the nearest snapshot",
                    x_range=axis,
                )
            )
        return charts

    def select_point(self, chart: str, series: int, point: int) -> None:
        """A click on point ``point`` of series ``series`` of chart ``chart``: show the snapshot nearest
        to its step (a point of the step marker, or one that is not there, does nothing)."""
        shown = next((c for c in self.grid.charts if c.id == chart), None)
        if shown is None or not 0 <= series < len(shown.series) - 1:  # the last series is the marker
            return
        xs = shown.series[series].x
        if not 0 <= point < len(xs):
            return
        self.set_state(step=int(np.argmin([abs(s - xs[point]) for s in self.steps])))
