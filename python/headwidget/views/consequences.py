"""``ConsequenceView``: what each variant saves in KV bytes and what it costs the model's predictions.

Drawn from an :class:`~headwidget.evaluation.EvaluationReport` (:func:`headwidget.evaluate`):

1. the trade-off chart: one point per variant, its KV-cache bytes per token (all layers, K and V, in
   the report's dtype; log axis) against its damage (``measure``: ΔNLL against the original model,
   KL(original ‖ variant), or top-1 disagreement; for encoders the hidden-state relative error or
   1 − embedding cosine), with the Pareto frontier (the variants no other beats on both bytes and
   damage). Hover shows the spec and every number. Mechanisms, quantizers (``kv:…``) and mixed specs
   (one spec per layer) are separate series; the mixed specs (:func:`headwidget.allocate_frontier`'s
   allocations at several budgets) are joined by a line in order of bytes.
2. with a per-layer sweep (``per_layer=True``), the damage map: one row per variant, one column per
   layer, colour the ΔNLL (encoders: hidden-state relative error) with only that layer converted, on a
   diverging scale centred on 0 (a layer whose conversion helps is blue). The selected layer's column
   is outlined; a click on a cell selects its layer (``layer``), which moves the other views of a
   dashboard; the note names the selected layer's values and the most fragile layer.

Example:
    >>> from headwidget.evaluation import EvaluationReport
    >>> report = EvaluationReport(
    ...     model="tiny", kind="causal-lm", variants=["model", "mqa", "mla:8"],
    ...     measures={"model": {"nll": 2.0, "perplexity": 7.389, "kl": 0.0, "top1": 1.0},
    ...               "mqa": {"nll": 2.5, "perplexity": 12.18, "kl": 0.4, "top1": 0.8},
    ...               "mla:8": {"nll": 2.1, "perplexity": 8.17, "kl": 0.1, "top1": 0.9}},
    ...     kv_bytes_per_token={"model": 512, "mqa": 128, "mla:8": 64}, tokens=100, sequences=4,
    ...     fingerprint="0123456789abcdef", dtype="torch.float32", layers=[0, 1],
    ...     per_layer={"mqa": [0.3, 0.1], "mla:8": [0.05, 0.02]}, per_layer_measure="delta_nll")
    >>> view = ConsequenceView(report)
    >>> chart = view.grid.charts[0]
    >>> [s.name for s in chart.series], chart.series[0].y
    (['mechanisms', 'Pareto frontier'], [0.0, 0.5, 0.10000000000000009])
    >>> view.grid.panels[0].row_labels, view.grid.panels[0].matrix[0].tolist()
    (['mqa', 'mla:8'], [0.3, 0.1])
    >>> view.select_cell("damage", 0, 1)
    >>> view.layer, view.grid.panels[0].note.split(" · ")[0]
    (1, 'layer 1: mqa +0.1000, mla:8 +0.0200')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import traitlets as t

from headwidget.analysis.variants import MixedSpec, parse_variant, variant_group
from headwidget.checks import optional_whole_number
from headwidget.core.charts import Chart, Series, pareto_front
from headwidget.core.kv_bytes import kv_bytes_text
from headwidget.core.panels import Panel, PanelGrid
from headwidget.errors import UnknownDamageMeasureError
from headwidget.evaluation import EvaluationReport
from headwidget.views._base import View, ViewSourceError
from headwidget.views._controls import toggles
from headwidget.views._registry import register_view
from headwidget.views._sources import ViewSources
from headwidget.views._state import ViewState, state

__all__ = [
    "DAMAGE_MEASURES",
    "ConsequenceState",
    "ConsequenceView",
    "UnknownDamageMeasureError",
    "short_names",
]


#: Damage measures by report kind: name → (axis label, value from a variant's measures).
DAMAGE_MEASURES: dict[str, dict[str, tuple[str, str]]] = {
    "causal-lm": {
        "nll": ("ΔNLL against the original (nats / token)", "delta_nll"),
        "kl": ("KL(original ‖ variant) (nats / token)", "kl"),
        "top1": ("top-1 disagreement with the original", "top1_miss"),
    },
    "encoder": {
        "hidden_rel_error": ("last hidden state, relative error", "hidden_rel_error"),
        "embedding_cosine": ("1 − cosine of mean-pooled embeddings", "cosine_miss"),
    },
}
#: What the damage toggles show each measure as.
MEASURE_LABELS = {
    "nll": "ΔNLL",
    "kl": "KL",
    "top1": "top-1",
    "hidden_rel_error": "hidden error",
    "embedding_cosine": "embedding cosine",
}
PER_LAYER_TITLES = {
    "delta_nll": ("ΔNLL, one layer converted", "ΔNLL with only that layer converted (nats / token)"),
    "hidden_rel_error": (
        "hidden error, one layer converted",
        "hidden-state relative error, one layer converted",
    ),
}


def _at(spec: str, layer: int) -> str:
    """`` (kv:int4 here)`` for a mixed spec: what it does to ``layer``; ``""`` for a uniform spec."""
    parsed = parse_variant(spec)
    return f" ({parsed.spec_at(layer).text} here)" if isinstance(parsed, MixedSpec) else ""


#: The longest mixed spec that is its own row label in the damage map.
LABEL_CHARS = 24


def short_names(specs: Sequence[str], kv_bytes: dict[str, float]) -> dict[str, str]:
    """A row label per spec: the spec itself, or for a mixed spec longer than :data:`LABEL_CHARS` (an
    allocation: one part per run of layers) ``mixed 7,674 B``, by its K/V bytes per token (numbered
    ``(1)``, ``(2)``... where such mixes share them).

    >>> long = "kv:int4@0,2-5;kv:int8@1,6;model@7"
    >>> short_names(["mqa", "mqa@0;kv:int4@1", long], {"mqa": 128, "mqa@0;kv:int4@1": 552, long: 3300})
    {'mqa': 'mqa', 'mqa@0;kv:int4@1': 'mqa@0;kv:int4@1', 'kv:int4@0,2-5;kv:int8@1,6;model@7': 'mixed 3,300 B'}
    """
    mixed = [s for s in specs if len(s) > LABEL_CHARS and isinstance(parse_variant(s), MixedSpec)]
    names = {s: s for s in specs}
    for s in mixed:
        same = [m for m in mixed if kv_bytes[m] == kv_bytes[s]]
        number = f" ({same.index(s) + 1})" if len(same) > 1 else ""
        names[s] = f"mixed {kv_bytes[s]:,g} B{number}"
    return names


@dataclasses.dataclass(frozen=True)
class ConsequenceState(ViewState):
    """The damage measure, and the selected layer (a click on the damage map sets it; a dashboard
    shares it with its other views)."""

    measure: str = state("nll", toggles("Damage", options="measures_available", labels=MEASURE_LABELS))
    layer: int = state(0, shared=True)


@register_view("consequences", order=40)
class ConsequenceView(View[ConsequenceState]):
    """Bytes saved against damage done, per variant, and the per-layer damage map."""

    title = "Consequences"
    sources = ViewSources("report", layers="layer")

    measures_available = t.List(t.Unicode()).tag(sync=True)

    def __init__(
        self, report: EvaluationReport, *, measure: str | None = None, layer: int | None = None
    ) -> None:
        """``report``: from :func:`headwidget.evaluate` (or ``EvaluationReport.load``)."""
        if not isinstance(report, EvaluationReport):
            raise ViewSourceError(
                "the consequences view needs an evaluation report (headwidget.evaluate(...) or "
                f"EvaluationReport.load(path)), got {type(report).__name__}"
            )
        layer = optional_whole_number("layer", layer)
        super().__init__()
        self.report = report
        measures = list(DAMAGE_MEASURES.get(report.kind, {}))
        if not measures:
            raise ViewSourceError(f"the report's kind {report.kind!r} is neither 'causal-lm' nor 'encoder'")
        first = ConsequenceState(
            measure=measures[0] if measure is None else measure,
            layer=(report.layers[0] if report.layers else 0) if layer is None else layer,
        )
        self.set_up(first, measures_available=measures)

    def describe(self, state: ConsequenceState) -> str:
        """The model and what the variants were measured on (the charts below have their own titles:
        the figure's title does not repeat one)."""
        report = self.report
        return f"{report.model} · {len(report.variants)} variants on {report.tokens} held-out tokens"

    # ------------------------------------------------------------------ numbers
    def damage(self, spec: str, measure: str | None = None) -> float:
        """One variant's ``measure`` (default: the one shown; 0 for the original model)."""
        m = self.report.measures[spec]
        key = DAMAGE_MEASURES[self.report.kind][measure or self.current_state().measure][1]
        if key == "delta_nll":
            return (
                m["nll"] - self.report.measures["model"]["nll"]
                if "model" in self.report.measures
                else math.nan
            )
        if key == "top1_miss":
            return 1.0 - m["top1"]
        if key == "cosine_miss":
            return 1.0 - m["embedding_cosine"]
        return m[key]

    def _hover(self, spec: str, name: str) -> str:
        """What a point's hover says (its first line, ``name``, is also drawn beside the point): a long
        mixed spec's short name and then the spec itself."""
        r = self.report
        m = r.measures[spec]
        nbytes = r.kv_bytes_per_token[spec]
        base = r.kv_bytes_per_token.get("model")
        share = f" · {nbytes / base:.1%} of the model's" if base else ""
        lines = [spec, f"{kv_bytes_text(nbytes, r.num_layers, r.dtype)}{share}"]
        if spec != "model" and not r.converts_every_layer:
            lines[1] += f" · {r.scope()} converted"
        if name != spec:
            lines.insert(0, name)
        if r.kind == "causal-lm":
            delta = m["nll"] - r.measures["model"]["nll"] if "model" in r.measures else math.nan
            lines.append(f"ΔNLL {delta:+.4f} · perplexity {m['perplexity']:.2f}")
            lines.append(f"KL {m['kl']:.4f} · top-1 agreement {m['top1']:.3f}")
        else:
            lines.append(f"hidden rel. error {m['hidden_rel_error']:.5f}")
            lines.append(f"embedding cosine {m['embedding_cosine']:.6f}")
        return "\n".join(lines)

    def _tradeoff(self, measure: str) -> Chart:
        r = self.report
        label, _ = DAMAGE_MEASURES[r.kind][measure]
        specs = list(r.variants)
        names = short_names(specs, r.kv_bytes_per_token)  # a long mixed spec by its bytes
        groups = [
            (name, [v for v in specs if variant_group(v) == name])
            for name in ("mechanisms", "quantizers", "mixed")
        ]
        # mixed specs (allocations at several budgets) joined in order of bytes: their frontier
        groups[2][1].sort(key=lambda v: (float(r.kv_bytes_per_token[v]), v))
        series = [
            Series(
                name,
                [r.kv_bytes_per_token[v] for v in vs],
                [self.damage(v, measure) for v in vs],
                [self._hover(v, names[v]) for v in vs],
                style="points+line" if name == "mixed" else "points",
            )
            for name, vs in groups
            if vs
        ]
        costs = [float(r.kv_bytes_per_token[v]) for v in specs]
        damages = [self.damage(v, measure) for v in specs]
        front = pareto_front(costs, damages)
        series.append(
            Series(
                "Pareto frontier",
                [costs[i] for i in front],
                [damages[i] for i in front],
                [f"on the frontier: {names[specs[i]]}" for i in front],
                style="line",
                dashed=True,
                color="#5f5f5f",
            )
        )
        return Chart(
            "tradeoff",
            "KV bytes against damage",
            f"KV cache bytes per token (all layers, K and V, {r.dtype.removeprefix('torch.')}; log)",
            label,
            series,
            subtitle=(
                f"{r.model} · {r.tokens:,} held-out tokens in {r.sequences} "
                f"sequence{'s' * (r.sequences != 1)} · "
                f"fingerprint {r.fingerprint[:8]} · {r.scope()} converted · lower left is better"
            ),
            x_log=True,
            y_reference=0.0,
            note="frontier: " + ", ".join(names[specs[i]] for i in front),
        )

    def _damage_map(self, layer: int) -> tuple[Panel, float] | None:
        r = self.report
        # The original model's row is 0 everywhere by definition: the map shows the variants.
        per_layer = r.per_layer or {}
        specs = [v for v in per_layer if v != "model"]
        if not specs or not r.layers:
            return None
        matrix = np.array([per_layer[v] for v in specs], dtype=np.float64)
        title, _ = PER_LAYER_TITLES.get(
            r.per_layer_measure or "", ("damage with only that layer converted", "")
        )
        contiguous = r.layers == list(range(r.layers[0], r.layers[0] + len(r.layers)))
        finite = matrix[np.isfinite(matrix)]
        peak = float(np.abs(finite).max()) if finite.size else 1.0
        names = short_names(specs, r.kv_bytes_per_token)
        notes = []
        if layer in r.layers:
            col = r.layers.index(layer)
            values = ", ".join(
                f"{names[v]}{_at(v, layer)} {matrix[i, col]:+.4f}" for i, v in enumerate(specs)
            )
            notes.append(f"layer {layer}: {values}")
        else:
            notes.append(f"layer {layer} was not swept")
        if finite.size:
            i, j = np.unravel_index(np.nanargmax(matrix), matrix.shape)
            notes.append(f"most fragile: layer {r.layers[j]} under {names[specs[i]]} ({matrix[i, j]:+.4f})")
        notes += [f"{names[v]} = {v}" for v in specs if names[v] != v]  # last: long
        panel = Panel(
            "damage",
            title,
            matrix,
            subtitle=f"{r.model} · variants × layers",
            row_labels=[names[v] for v in specs],
            col_labels=None if contiguous else [str(layer) for layer in r.layers],
            col_offset=r.layers[0] if contiguous else 0,
            note=" · ".join(notes),
            row_axis="variant",
            col_axis="layer",
            axis_titles=True,
            hint="a click on a cell selects its layer",
            mark_col=r.layers.index(layer) if layer in r.layers else -1,
        )
        return panel, peak if peak > 0 else 1.0

    def compute(self, state: ConsequenceState, resolution: int | None = None) -> PanelGrid:
        """The trade-off chart and, with a per-layer sweep, the damage map."""
        if state.measure not in DAMAGE_MEASURES[self.report.kind]:
            raise UnknownDamageMeasureError(
                f"unknown damage measure {state.measure!r} for a {self.report.kind} report; "
                f"choose one of {', '.join(DAMAGE_MEASURES[self.report.kind])}"
            )
        chart = self._tradeoff(state.measure)
        damage = self._damage_map(state.layer)
        if damage is None:
            return PanelGrid([], 0.0, 1.0, "diverging", "", charts=[chart])
        panel, peak = damage
        _, label = PER_LAYER_TITLES.get(self.report.per_layer_measure or "", ("", ""))
        return PanelGrid([panel], -peak, peak, "diverging", label, columns=1, charts=[chart])

    def select_cell(self, panel: str, row: int, col: int) -> None:
        """A click on a damage-map cell selects its layer."""
        if panel == "damage" and 0 <= col < len(self.report.layers):
            self.set_state(layer=self.report.layers[col])
