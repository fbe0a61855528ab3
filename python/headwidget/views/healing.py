"""``HealingView``: how fast each healed variant recovers, and which layers recover last.

Drawn from :class:`~headwidget.healing.HealingRun` objects (:func:`headwidget.heal`), by name:

1. the recovery curves: healing tokens seen (log axis; the untrained point drawn left of the first
   evaluation, at half its tokens, under a tick that says 0, and named so on hover) against the
   damage ``measure`` (KL to the original, ΔNLL, or top-1 disagreement; an encoder: the hidden-state
   relative error), one line per run, the original model's 0 drawn as a reference;
2. the per-layer recovery map of the run ``run`` (a toggle among the runs): its evaluation points ×
   its converted layers (a strip, as the damage map's variants × layers), colour the teacher-forced
   relative attention-output error of the layer (:mod:`headwidget.healing._layers`); the note names
   the layer that recovers last (the largest share of its untrained error left at the end). The
   selected layer's column is outlined; a click on a column selects that layer (``layer``), which
   moves the other tabs of a dashboard.

Example:
    >>> from headwidget.healing import HealingRun
    >>> def run(spec, kl):
    ...     return HealingRun(model_name="tiny", spec=spec, kind="causal-lm", method="kd", loss="kd",
    ...         trainable="kv", lr=1e-3, batch_size=2, max_length=8, tokens=32, seed=0,
    ...         dtype="torch.float32", steps=2, tokens_seen=32, reference_nll=2.0, kv_bytes_per_token=64.0,
    ...         layers=[0, 1], curve=[{"tokens": 0, "step": 0, "nll": 2.5, "kl": kl, "top1": 0.7,
    ...         "delta_nll": 0.5}, {"tokens": 32, "step": 2, "nll": 2.2, "kl": kl / 2, "top1": 0.8,
    ...         "delta_nll": 0.2}], per_layer=[[0.3, 0.2], [0.1, 0.15]], losses=[0.5, 0.3],
    ...         healing_fingerprint="ab", evaluation_fingerprint="cd", evaluation_tokens=40)
    >>> view = HealingView({"mqa": run("mqa", 0.4), "mqa+align": run("mqa+align", 0.2)})
    >>> chart = view.grid.charts[0]
    >>> [s.name for s in chart.series], chart.series[0].x, chart.series[0].y
    (['mqa', 'mqa+align'], [16.0, 32.0], [0.4, 0.2])
    >>> view.grid.panels[0].matrix.tolist(), view.grid.panels[0].note.split(" · ")[0]
    ([[0.3, 0.2], [0.1, 0.15]], 'recovers last: layer 1 (75% of its untrained error left)')
    >>> chart.x_ticks, chart.x_tick_labels
    ([16.0, 32.0], ['0', '32'])
    >>> view.select_cell("layers", 0, 1)
    >>> view.layer, view.grid.panels[0].mark_col
    (1, 1)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import traitlets as t

from headwidget.core.charts import Chart, Series
from headwidget.core.panels import Panel, PanelGrid
from headwidget.errors import LayerIndexError
from headwidget.healing import HealingRun
from headwidget.stats import KVStats
from headwidget.views._base import View, ViewSourceError
from headwidget.views._controls import toggles
from headwidget.views._registry import register_view
from headwidget.views._sources import ViewSources
from headwidget.views._state import ViewState, state

__all__ = ["RECOVERY_MEASURES", "HealingState", "HealingView", "checked_runs"]


#: Recovery measures by kind of model: name → (toggle label, axis label).
RECOVERY_MEASURES: dict[str, dict[str, tuple[str, str]]] = {
    "causal-lm": {
        "kl": ("KL", "KL(original ‖ variant) (nats / token)"),
        "delta_nll": ("ΔNLL", "ΔNLL against the original (nats / token)"),
        "top1": ("top-1", "top-1 disagreement with the original"),
    },
    "encoder": {
        "hidden_rel_error": ("hidden error", "last hidden state, relative error"),
        "embedding_cosine": ("embedding cosine", "1 − cosine of mean-pooled embeddings"),
    },
}


def _tokens(n: float) -> str:
    """``16384`` → ``16k``; ``1536`` → ``1.5k``; ``500`` → ``500``."""
    if n >= 1024 and n % 1024 == 0:
        return f"{int(n) // 1024:,}k"
    return f"{n / 1024:.1f}k" if n >= 1024 else f"{int(n)}"


def _hover(name: str, row: dict[str, float], value: str) -> str:
    """A curve point's hover: the run, how far it had healed, the value drawn and the ΔNLL."""
    seen = "untrained (0 tokens)" if row["tokens"] == 0 else f"{int(row['tokens']):,} tokens"
    extra = f" · ΔNLL {row['delta_nll']:+.4f}" if "delta_nll" in row and not value.startswith("ΔNLL") else ""
    return f"{name} · {seen} · step {int(row['step'])}\n{value}{extra}"


def checked_runs(runs: Any) -> dict[str, HealingRun]:
    """``runs`` as names → runs: one :class:`HealingRun` (named by its spec) or a mapping of names to
    runs; every run of the same kind of model. A list is refused: two runs of one spec (another
    learning rate, say) would be named alike, and the toggles and the saved page tell runs by name.

    Raises:
        ViewSourceError: anything else, no run, or runs of an LM and of an encoder together.
    """
    if isinstance(runs, HealingRun):
        runs = {runs.spec: runs}
    if not isinstance(runs, Mapping) or not runs:
        listed = isinstance(runs, list | tuple) and runs
        raise ViewSourceError(
            "the healing view needs healing runs: one headwidget.heal(...) result, or names → runs "
            "({'mqa': run_a, 'mqa+align': run_b}), got "
            + ("a list: name each run, {run.spec: run for run in runs}" if listed else type(runs).__name__)
        )
    out: dict[str, HealingRun] = {}
    for name, run in runs.items():
        if not isinstance(run, HealingRun):
            raise ViewSourceError(
                f"the healing view's run {name!r} is a {type(run).__name__}, not a HealingRun "
                "(headwidget.heal "
                "or HealingRun.load)"
            )
        out[str(name)] = run
    kinds = {r.kind for r in out.values()}
    if len(kinds) > 1:
        raise ViewSourceError(
            f"the healing runs mix kinds of model ({', '.join(sorted(kinds))}): their measures differ; "
            "show a language model's runs and an encoder's apart"
        )
    return out


@dataclasses.dataclass(frozen=True)
class HealingState(ViewState):
    """The damage measure, the run whose layers the map shows, and the selected layer (a click on the
    map sets it; a dashboard shares it with its other views)."""

    measure: str = state(
        "kl",
        toggles(
            "Damage",
            options="measures_available",
            labels={name: label for kind in RECOVERY_MEASURES.values() for name, (label, _) in kind.items()},
        ),
    )
    run: str = state("", toggles("Layers of", options="runs_available"))
    layer: int = state(0, shared=True)


@register_view("healing", order=45)
class HealingView(View[HealingState]):
    """Recovery curves of healed variants, and the per-layer recovery map of one run."""

    title = "Healing"
    sources = ViewSources("healing", layers="layer")

    measures_available = t.List(t.Unicode()).tag(sync=True)
    runs_available = t.List(t.Unicode()).tag(sync=True)

    def __init__(
        self,
        healing: HealingRun | Mapping[str, HealingRun],
        *,
        measure: str | None = None,
        run: str | None = None,
        layer: int | None = None,
    ) -> None:
        """``healing``: :func:`headwidget.heal` results by name (or one run, named by its spec);
        ``layer``: the selected layer, one of the layers up to the last a run converts (default: the
        first run's first)."""
        self.runs = checked_runs(healing)
        super().__init__()
        first = next(iter(self.runs.values()))
        measures = list(RECOVERY_MEASURES[first.kind])
        #: The layers a layer can be selected among: 0 up to the last that a run converts.
        self.num_layers = 1 + max((i for r in self.runs.values() for i in r.layers), default=0)
        chosen = HealingState(
            measure=measures[0] if measure is None else measure,
            run=next(iter(self.runs)) if run is None else run,
            layer=(first.layers[0] if first.layers else 0) if layer is None else layer,
        )
        self.set_up(chosen, measures_available=measures, runs_available=list(self.runs))

    @classmethod
    def shows(cls, stats: KVStats | None) -> bool:
        """Never from one capture's statistics alone: the view needs healing runs."""
        return False

    def describe(self, state: HealingState) -> str:
        """The model, the runs and what they were measured on."""
        first = next(iter(self.runs.values()))
        count = f"{len(self.runs)} healed variant{'s' if len(self.runs) > 1 else ''}"
        return f"{first.model_name} · {count} · {first.evaluation_tokens:,} held-out tokens"

    # ------------------------------------------------------------------ numbers
    def damage(self, row: dict[str, float], measure: str) -> float:
        """A curve row's value of ``measure`` as the chart draws it (disagreements as 1 − agreement)."""
        if measure == "top1":
            return 1.0 - row["top1"]
        if measure == "embedding_cosine":
            return 1.0 - row["embedding_cosine"]
        return row[measure]

    def _left_edge(self) -> float:
        """Where the untrained points go on the log axis: half the smallest evaluated token count."""
        seen = [row["tokens"] for r in self.runs.values() for row in r.curve if row["tokens"] > 0]
        return min(seen) / 2 if seen else 1.0

    def _curves(self, measure: str) -> Chart:
        first = next(iter(self.runs.values()))
        label, axis = RECOVERY_MEASURES[first.kind][measure]
        edge = self._left_edge()
        series = []
        for name, r in self.runs.items():
            xs = [row["tokens"] if row["tokens"] > 0 else edge for row in r.curve]
            ys = [self.damage(row, measure) for row in r.curve]
            hovers = [_hover(name, row, f"{label} {y:.4f}") for row, y in zip(r.curve, ys, strict=True)]
            series.append(Series(name, xs, ys, hovers, style="points+line"))
        evaluated = sorted(
            {row["tokens"] for r in self.runs.values() for row in r.curve if row["tokens"] > 0}
        )
        closed = ", ".join(  # of what is drawn: 1 − last / untrained
            f"{line.name} {1 - line.y[-1] / line.y[0]:.0%}" if line.y[0] else f"{line.name} n/a"
            for line in series
        )
        method = first.method if first.loss == first.method else f"{first.method} ({first.loss})"
        return Chart(
            "recovery",
            "Recovery while healing",
            "healing tokens (log; 0: untrained)",
            axis,
            series,
            subtitle=(
                f"{first.model_name} · {method}, trainable {first.trainable} · "
                f"{first.evaluation_tokens:,} held-out tokens · lower is better, 0 is the original"
            ),
            x_log=True,
            y_reference=0.0,
            # The untrained point sits left of the first evaluation, where a log axis has room for
            # it: its tick says 0, the others the tokens seen.
            x_ticks=[edge, *evaluated],
            x_tick_labels=["0", *(f"{int(n):,}" for n in evaluated)],
            label_points=False,  # the legend names the runs; hover names each point
            note=f"share of the untrained {label} closed at the end: {closed}",
        )

    def _layer_map(self, name: str, layer: int) -> tuple[Panel, float] | None:
        r = self.runs[name]
        if not r.per_layer or not r.layers:
            return None
        matrix = np.array(r.per_layer, dtype=np.float64)  # points × layers
        left = matrix[-1] / np.where(matrix[0] > 0, matrix[0], np.nan)
        notes = []
        if np.isfinite(left).any():
            worst = int(np.nanargmax(left))
            notes.append(
                f"recovers last: layer {r.layers[worst]} ({left[worst]:.0%} of its untrained error left)"
            )
        if layer in r.layers:
            i = r.layers.index(layer)
            notes.append(f"layer {layer}: {matrix[0, i]:.3f} untrained → {matrix[-1, i]:.3f}")
        contiguous = r.layers == list(range(r.layers[0], r.layers[0] + len(r.layers)))
        panel = Panel(
            "layers",
            f"Per-layer error · {name}",
            matrix,
            subtitle=f"{r.model_name} · attention output, teacher-forced, at each evaluation",
            row_labels=[_tokens(row["tokens"]) for row in r.curve],
            col_labels=None if contiguous else [str(layer) for layer in r.layers],
            col_offset=r.layers[0] if contiguous else 0,
            note=" · ".join(notes),
            row_axis="healing tokens",
            col_axis="layer",
            axis_titles=True,
            hint="a click on a column selects its layer",
            mark_col=r.layers.index(layer) if layer in r.layers else -1,
        )
        finite = matrix[np.isfinite(matrix)]
        return panel, float(finite.max()) if finite.size else 1.0

    def compute(self, state: HealingState, resolution: int | None = None) -> PanelGrid:
        """The recovery chart and the per-layer map of ``state.run``."""
        if not 0 <= state.layer < self.num_layers:
            raise LayerIndexError(
                f"layer {state.layer} is out of range: the runs convert layers up to {self.num_layers - 1}"
            )
        first = next(iter(self.runs.values()))
        if state.measure not in RECOVERY_MEASURES[first.kind]:
            raise ViewSourceError(
                f"unknown recovery measure {state.measure!r}; choose one of "
                f"{', '.join(RECOVERY_MEASURES[first.kind])}"
            )
        if state.run not in self.runs:
            raise ViewSourceError(f"no run named {state.run!r}; the runs are {', '.join(self.runs)}")
        chart = self._curves(state.measure)
        found = self._layer_map(state.run, state.layer)
        if found is None:
            return PanelGrid([], 0.0, 1.0, "magma", "", charts=[chart])
        panel, peak = found
        peak = max(peak, *(self._peak(n) for n in self.runs))
        return PanelGrid(
            [panel],
            0.0,
            peak if peak > 0 else 1.0,
            "magma",
            "relative attention-output error",
            columns=1,
            charts=[chart],
        )

    def _peak(self, name: str) -> float:
        values = [v for row in self.runs[name].per_layer or [] for v in row if math.isfinite(v)]
        return max(values, default=0.0)

    def select_cell(self, panel: str, row: int, col: int) -> None:
        """A click on a column of the map selects its layer."""
        layers = self.runs[self.shown_state().run].layers
        if panel == "layers" and 0 <= col < len(layers):
            self.set_state(layer=layers[col])
