"""``AlignmentView``: head × head similarity of keys and values, before and after alignment.

Reference: the head-alignment paper's figure (keys and values, each before and after orthogonal
alignment, colour 0..1). Heads are the real KV heads of the selected layer, or of a flattened list of
layers (needs ``capture(..., cross_layer=[...])``). ``alignment`` picks the key alignment: ``"auto"``
(RoPE-compatible plane rotations for RoPE models, else orthogonal), ``"rope"``, ``"orthogonal"`` or
``"none"``; values are aligned with orthogonal Procrustes (RoPE does not touch them). Each "after" panel
says whether it shows held-out scores (rotations fitted on one token split, scored on the other) or
in-sample ones. The ``cka`` metric (linear CKA, :meth:`~headwidget.stats.KVStats.head_similarity`) is
invariant under rotations of either head, so alignment cannot change it: its "after" panels show the
same matrix as "before" and say so. Scores are drawn on the paper's 0..1 scale (magma); a panel with
negative scores (possible for every metric before alignment) says so in its note and in the colour
bar's label.

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (4, 32)), progress=False)
    >>> view = AlignmentView(stats, layer=0)
    >>> [p.title for p in view.grid.panels]
    ['Keys · before', 'Keys · after (rope)', 'Values · before', 'Values · after (orthogonal)']
    >>> AlignmentView.create(stats, layers=[1]).layer_label
    'layer 1 of 0–1'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import traitlets as t

from headwidget.analysis.alignment import AlignmentResult, align
from headwidget.checks import optional_flag, optional_whole_number, whole_numbers
from headwidget.core.charts import Chart
from headwidget.core.kinds import KIND_LABELS, check_kind
from headwidget.core.panels import Panel, PanelGrid
from headwidget.stats import KVStats
from headwidget.views._base import LayerState, LayerView, stats_model_name
from headwidget.views._controls import select, toggles
from headwidget.views._memo import Memo
from headwidget.views._registry import register_view
from headwidget.views._sources import ViewSources
from headwidget.views._state import state
from headwidget.views.channels import check_key_kind

__all__ = [
    "METRIC_LABELS",
    "AlignmentState",
    "AlignmentView",
    "alignment_method",
    "head_panel",
    "similarity_grid",
]

#: ``cka`` (linear CKA) is invariant under rotations of either head: both panels show one matrix.
ROTATION_INVARIANT = ("cka",)
METRICS = ["token_cosine", "cosine", "pearson", *ROTATION_INVARIANT]
#: What the metric drop-down and the trend chart's title call each metric.
METRIC_LABELS = {
    "token_cosine": "per-token cosine",
    "cosine": "cosine",
    "pearson": "Pearson",
    "cka": "linear CKA",
}


def alignment_method(kind: str, alignment: str) -> str | None:
    """The :func:`~headwidget.analysis.alignment.align` method for ``kind`` under the view's
    ``alignment`` choice: values are aligned orthogonally unless ``"none"``; keys by the choice, with
    ``"auto"`` left to ``align`` (RoPE planes for a RoPE model, else orthogonal).

    Example:
        >>> [alignment_method("key", a) for a in ("auto", "rope", "none")]
        [None, 'rope', 'none']
        >>> [alignment_method("value", a) for a in ("auto", "rope", "none")]
        ['orthogonal', 'orthogonal', 'none']
    """
    if kind == "value":
        return "none" if alignment == "none" else "orthogonal"
    return None if alignment == "auto" else alignment


def head_panel(panel_id: str, title: str, matrix: np.ndarray, subtitle: str, labels: list[str]) -> Panel:
    """A head × head similarity panel."""
    return Panel(
        panel_id,
        title,
        matrix,
        subtitle=subtitle,
        row_labels=labels,
        col_labels=labels,
        row_axis="head",
        col_axis="head",
    )


def similarity_grid(panels: list[Panel], columns: int, charts: list[Chart] | None = None) -> PanelGrid:
    """Head similarity panels on the paper's 0..1 scale (magma); a panel with scores below 0, which
    the scale draws as 0, says so in its note and the colour bar's label."""
    label = "head similarity"
    for panel in panels:
        lowest = float(np.nanmin(panel.matrix)) if np.isfinite(panel.matrix).any() else 0.0
        if lowest < 0:  # say so rather than clip silently
            panel.note = f"lowest score {lowest:.3f}, drawn as 0"
            label = "head similarity (scores below 0 drawn as 0)"
    return PanelGrid(panels, 0.0, 1.0, "magma", label, columns=columns, charts=charts or [])


@dataclasses.dataclass(frozen=True)
class AlignmentState(LayerState):
    """The selected layer, the kind of keys, the similarity metric and the key alignment (the last two
    shared by a dashboard's views: the trends follow them)."""

    kind: str = state("key", toggles("Kind", options="kinds_available", labels=KIND_LABELS))
    metric: str = state(
        "token_cosine", select("Metric", options="metrics_available", labels=METRIC_LABELS), shared=True
    )
    alignment: str = state("auto", select("Alignment", options="alignments_available"), shared=True)


@register_view("alignment", order=20)
class AlignmentView(LayerView[AlignmentState]):
    """Keys/values × before/after head similarity over one layer or a flattened layer set."""

    title = "Head alignment"
    sources = ViewSources("stats", layers="layers")

    kinds_available = t.List(t.Unicode()).tag(sync=True)
    metrics_available = t.List(t.Unicode()).tag(sync=True)
    alignments_available = t.List(t.Unicode()).tag(sync=True)

    def __init__(
        self,
        stats: KVStats,
        *,
        layer: int | None = None,
        layers: Sequence[int] | None = None,
        kind: str = "key",
        metric: str = "token_cosine",
        alignment: str = "auto",
        heldout: bool | None = None,
    ) -> None:
        """``layers``: a flattened set of layers (no slider); ``heldout``: None lets ``align`` choose."""
        stats = self._stats(stats)
        self.stats = stats
        layer = optional_whole_number("layer", layer)
        self.fixed_layers = (
            whole_numbers("layers", layers, hint="one flattened set") if layers is not None else None
        )
        self.heldout = optional_flag("heldout", heldout)
        self._results = Memo(self._align, size=64)
        self._invariants = Memo(self._similarity, size=64)
        uses_rope = stats.meta.layout.rope.uses_rope
        key_kinds: list[str] = [k for k in ("key", "key_post") if k in stats.kinds]
        super().__init__()
        self.set_up(
            AlignmentState(
                layer=stats.layers[0] if layer is None else layer,
                kind=kind,
                metric=metric,
                alignment=alignment,
            ),
            num_layers=0 if self.fixed_layers else stats.meta.layout.num_layers,
            kinds_available=key_kinds if len(key_kinds) > 1 else [],
            metrics_available=METRICS,
            alignments_available=["auto", *(["rope"] if uses_rope else []), "orthogonal", "none"],
        )

    @classmethod
    def capture_options(cls, layers: Sequence[int]) -> dict[str, Any]:
        """Several layers are compared head to head: their joint (cross-layer) statistics."""
        return {"cross_layer": list(layers)} if len(layers) > 1 else {}

    def labels(self, state: AlignmentState) -> dict[str, Any]:
        """The layer read-out (the flattened layers, for a fixed set)."""
        if self.fixed_layers:
            return {"layer_label": f"layers {self.fixed_layers}"}
        return super().labels(state)

    def describe(self, state: AlignmentState) -> str:
        """The model and the layer (or the flattened layers) whose heads are compared."""
        if self.fixed_layers:
            return f"{stats_model_name(self.stats)} · layers {', '.join(map(str, self.fixed_layers))}"
        return f"{stats_model_name(self.stats)} · layer {state.layer}"

    def result(self, kind: str, state: AlignmentState | None = None) -> AlignmentResult:
        """The alignment result behind the panels of ``kind`` in ``state`` (default: the current
        one), kept per layer, kind, method and metric."""
        state = self.current_state() if state is None else state
        layers = tuple(self.fixed_layers or [state.layer])
        return self._results(layers, kind, alignment_method(kind, state.alignment), state.metric)

    def _align(self, layers: tuple[int, ...], kind: str, method: str | None, metric: str) -> AlignmentResult:
        return align(
            self.stats,
            list(layers),
            kind=check_kind(kind),
            method=method,
            metric=metric,
            heldout=self.heldout,
        )

    def _similarity(self, layers: tuple[int, ...], kind: str, metric: str) -> np.ndarray:
        return self.stats.head_similarity(layers if len(layers) > 1 else layers[0], check_kind(kind), metric)

    def _invariant(self, kind: str, state: AlignmentState) -> tuple[np.ndarray, list[str], int]:
        """A rotation-invariant metric's matrix (the same before and after alignment), its labels
        and token count."""
        layers = self.fixed_layers or [state.layer]
        groups = self.stats.meta.num_kv_heads
        labels = [f"L{layer}·H{g}" for layer in layers for g in range(groups)]
        return self._invariants(tuple(layers), kind, state.metric), labels, self.stats.tokens

    def compute(self, state: AlignmentState, resolution: int | None = None) -> PanelGrid:
        """Keys then values, each before and after alignment, on the 0..1 scale."""
        check_key_kind(state.kind, self.stats, "alignment view")
        if not self.fixed_layers:
            self.check_layer(state.layer)
        panels = []
        metric = METRIC_LABELS.get(state.metric, state.metric)  # in words, as the drop-down says it
        for kind in (state.kind, "value"):
            title = "Keys" if kind == "key" else ("Keys (post-RoPE)" if kind == "key_post" else "Values")
            if state.metric in ROTATION_INVARIANT:
                before, labels, tokens = self._invariant(kind, state)
                after, after_title = before, f"{title} · after (unchanged)"
                after_subtitle = (
                    f"{metric}, {tokens} tokens: rotation-invariant, alignment leaves it as before"
                )
            else:
                res = self.result(kind, state)
                labels, tokens, before = list(res.labels), res.token_count, res.before
                aligned = res.method != "none"
                after = res.shown if aligned else res.before
                after_title = f"{title} · after ({res.method})"
                after_subtitle = f"{metric}, {res.scoring if aligned else 'in-sample'} scores"
            panels.append(
                head_panel(
                    f"{kind}-before", f"{title} · before", before, f"{metric}, {tokens} tokens", labels
                )
            )
            panels.append(head_panel(f"{kind}-after", after_title, after, after_subtitle, labels))
        return similarity_grid(panels, columns=2)
