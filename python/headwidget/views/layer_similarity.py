"""``LayerSimilarityView``: layer × layer similarity of keys and values, and the heads of a layer pair.

Built from statistics captured with ``capture(..., cross_layer=True)`` (or a list of layers): a row
of panels for the keys (before RoPE, or after it when captured with ``rope="post"`` or ``"both"``: the
``kind`` toggles), and one for the values:

1. the L × L matrix of :func:`~headwidget.layer_similarity` over the cross layers, under the chosen
   ``metric``: ``"cka"`` (linear CKA of the two layers' token matrices), ``"aligned"`` (the mean, over
   the G × G pairs of one head of each layer, of their token cosine after the best rotation) or
   ``"subspace:r"`` (xKV's overlap of the two layers' top-r singular subspaces, ``‖U_aᵀU_b‖²_F / r``);
2. the heads of the selected pair (``layer`` × ``paired``; a click on a cell of a matrix selects its
   pair, as do the two sliders, which stop at the matrices' layers alone, numbered as the model's;
   a layer without joint statistics is refused, naming those it has): the G × G per-token cosine
   of each head of ``layer`` (rows) with each head of ``paired`` (columns) before alignment,
3. and after it, as the alignment view aligns them (:func:`~headwidget.analysis.alignment.align` of
   the two layers: RoPE-compatible rotations for the keys of a RoPE model, orthogonal Procrustes
   otherwise; held-out scores where ``align`` shows them). Under ``aligned`` the mean of this panel is
   the pair's cell of the matrix; a pair of one layer with itself shows that layer's heads. (RoPE
   turns the two heads of a token by the same angles, so their cosines, and the rotations that align
   them, are the same before and after RoPE: only the keys' matrix changes with ``kind``.)

Every panel is on a 0..1 scale (magma); a panel with scores below 0 says so. The matrices are kept
per kind and metric, the pairs' heads per pair: ``cka`` reads half of each kind's joint co-moment
once (its blocks on and above the diagonal: 15–30 ms a kind for SmolLM2's 30 layers), a pair aligns
2·G heads (10–40 ms), ``subspace`` takes an eigendecomposition per layer (about 0.5 s a kind), and
``aligned`` aligns every head of every cross layer with every other (for SmolLM2's 90 KV heads:
about 10 ms for the keys, whose RoPE-compatible rotations are closed-form per plane, and 1.3 s for
the values, an SVD per pair of heads).

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (4, 32)), cross_layer=True, progress=False)
    >>> view = LayerSimilarityView(stats)
    >>> [p.title for p in view.grid.panels[:3]]
    ['Keys · linear CKA', 'Key heads · L0 × L1 · before', 'Key heads · L0 × L1 · after']
    >>> view.kinds_available  # (the post-RoPE keys were not captured)
    []
    >>> view.select_cell("value-layers", 2, 0)
    >>> (view.layer, view.paired), view.grid.panels[3].matrix.shape, view.grid.panels[4].matrix.shape
    ((2, 0), (3, 3), (2, 2))
    >>> view.metrics_available
    ['cka', 'aligned', 'subspace:4', 'subspace:8']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import traitlets as t

from headwidget.analysis.alignment import align
from headwidget.analysis.layer_similarity import layer_similarity
from headwidget.checks import layer_indices, optional_flag, optional_whole_number, whole_number
from headwidget.core.kinds import HEAD_KINDS, KEY_KINDS, KIND_LABELS, Kind
from headwidget.core.panels import Panel, PanelGrid
from headwidget.errors import ArgumentError, CrossLayerMissingError, UnknownKindError, UnknownMetricError
from headwidget.stats import KVStats
from headwidget.views._base import LayerState, LayerView, stats_model_name
from headwidget.views._controls import select, slider, toggles
from headwidget.views._memo import Memo
from headwidget.views._registry import register_view
from headwidget.views._sources import ViewSources
from headwidget.views._state import state

__all__ = [
    "LayerPairHeads",
    "LayerSimilarityState",
    "LayerSimilarityView",
    "cross_layer_kinds",
    "metric_label",
    "subspace_ranks",
]

#: What a row of panels calls each kind: its matrix, and its heads (the same before and after RoPE).
KIND_TITLES = {"key": "Keys", "key_post": "Keys (post-RoPE)", "value": "Values"}
HEAD_TITLES = {"key": "Key heads", "key_post": "Key heads", "value": "Value heads"}
#: What the metric drop-down shows each metric as (``subspace:r`` for the ranks a view can offer).
METRIC_LABELS: dict[str, str] = {
    "cka": "linear CKA",
    "aligned": "aligned heads (mean token cosine)",
    **{f"subspace:{2**i}": f"subspace overlap, r = {2**i}" for i in range(14)},
}
#: How the matrices' titles name each metric (short: a panel's width; the subtitle says it whole).
METRIC_TITLES = {"cka": "linear CKA", "aligned": "aligned heads", "subspace": "subspace"}
#: The statistics a view needs, and how to get them (said when they lack them).
NEEDS_CROSS_LAYER = (
    "the layer similarity view needs cross-layer statistics: capture with "
    "headwidget.capture(model, texts, cross_layer=True) (or a list of the layers to compare; "
    "headwidget.estimate(model, cross_layer=...) gives its memory)"
)


def cross_layer_kinds(stats: KVStats) -> list[Kind]:
    """The kinds split into heads that ``stats`` hold cross-layer moments of, in the rows' order.

    Example:
        >>> import torch, headwidget
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
        >>> tokens = torch.randint(0, 64, (2, 16))
        >>> cross_layer_kinds(headwidget.capture(model, tokens, progress=False))
        []
        >>> cross_layer_kinds(headwidget.capture(model, tokens, cross_layer=[0, 1], progress=False))
        ['key', 'value']
    """
    found: list[Kind] = []
    for kind in ("key", "key_post", "value"):
        if kind not in HEAD_KINDS or kind not in stats.kinds:
            continue
        try:
            stats.cross_moments(kind)
        except CrossLayerMissingError:
            continue
        found.append(kind)
    return found


def subspace_ranks(channels: int, chosen: int | None = None) -> list[int]:
    """The subspace ranks the metric drop-down offers for layers of ``channels`` channels a kind: the
    powers of two from 4 below ``channels`` (at most six, the largest), and ``chosen``.

    >>> subspace_ranks(192), subspace_ranks(32, chosen=24), subspace_ranks(2)
    ([4, 8, 16, 32, 64, 128], [4, 8, 16, 24], [2])
    """
    ranks = [2**i for i in range(2, 14) if 2**i < channels][-6:]
    if chosen is not None:
        ranks = sorted({*ranks, chosen})
    return ranks or [channels]


def default_rank(channels: int) -> int:
    """The subspace rank shown first: 32, or a quarter of the channels when that is less.

    >>> default_rank(192), default_rank(32), default_rank(2)
    (32, 8, 1)
    """
    return max(1, min(32, channels // 4))


def metric_label(metric: str) -> str:
    """A metric of the drop-down in words.

    >>> metric_label("cka"), metric_label("subspace:24")
    ('linear CKA', 'subspace overlap, r = 24')
    """
    if metric.startswith("subspace:"):
        return f"subspace overlap, r = {metric.split(':', 1)[1]}"
    return METRIC_LABELS.get(metric, metric)


class LayerPairHeads(NamedTuple):
    """The heads of one layer (rows) against those of another (columns): per-token cosine before and
    after alignment, their labels and how the "after" scores were fitted and scored."""

    before: np.ndarray
    after: np.ndarray
    row_labels: list[str]
    col_labels: list[str]
    method: str
    scoring: str
    tokens: int

    def transposed(self) -> LayerPairHeads:
        """The same pair seen from the other layer (rows and columns swapped)."""
        return self._replace(
            before=self.before.T, after=self.after.T, row_labels=self.col_labels, col_labels=self.row_labels
        )


@dataclasses.dataclass(frozen=True)
class LayerSimilarityState(LayerState):
    """The selected pair of layers (``layer``, shared by a dashboard's views, and ``paired``: both
    among the matrices' layers, which their sliders stop at), the layer × layer metric (``cka``,
    ``aligned`` or ``subspace:r``) and the kind of keys."""

    layer: int = state(
        0, slider("Layer", count="num_layers", text="layer_label", positions="layer_positions"), shared=True
    )
    paired: int = state(
        0, slider("Paired with", count="num_layers", text="paired_label", positions="layer_positions")
    )
    metric: str = state("cka", select("Metric", options="metrics_available", labels=METRIC_LABELS))
    kind: str = state("key", toggles("Kind", options="kinds_available", labels=KIND_LABELS))


@register_view("layer_similarity", order=55)
class LayerSimilarityView(LayerView[LayerSimilarityState]):
    """Layer × layer similarity per kind, with the heads of the selected layer pair beside it."""

    title = "Layer similarity"
    sources = ViewSources("stats", layers="layers")

    paired_label = t.Unicode("").tag(sync=True)
    #: The layers the two sliders stop at: the matrices' (:attr:`layers`).
    layer_positions = t.List(t.Int()).tag(sync=True)
    metrics_available = t.List(t.Unicode()).tag(sync=True)
    kinds_available = t.List(t.Unicode()).tag(sync=True)

    def __init__(
        self,
        stats: KVStats,
        *,
        layer: int | None = None,
        paired: int | None = None,
        layers: Sequence[int] | None = None,
        metric: str = "cka",
        r: int | None = None,
        kind: str | None = None,
        heldout: bool | None = None,
    ) -> None:
        """``layers``: the cross layers the matrices are over (default: every one); ``layer`` and
        ``paired``: the pair whose heads are shown (default: the first of ``layers`` and the next);
        ``metric``: ``"cka"``, ``"aligned"``, ``"subspace"`` (rank ``r``, default 32 or a quarter of
        the channels) or ``"subspace:r"``; ``kind``: ``"key"`` or ``"key_post"`` (default: the first
        captured across layers); ``heldout``: for the aligned scores, as
        :func:`~headwidget.analysis.alignment.align` takes it (None: it chooses).

        Raises :class:`~headwidget.errors.CrossLayerMissingError` for statistics without cross-layer
        moments, or ``layers``, ``layer`` or ``paired`` that have none.
        """
        stats = self._stats(stats)
        self.stats = stats
        self.kinds = cross_layer_kinds(stats)
        if not self.kinds:
            raise CrossLayerMissingError(f"{NEEDS_CROSS_LAYER}; these have none (cross_layer=None)")
        cross = list(stats.meta.cross_layers or [])
        num_layers = stats.meta.layout.num_layers
        chosen = cross if layers is None else layer_indices("layers", layers, num_layers)
        missing = [each for each in chosen if each not in cross]
        if missing:
            raise CrossLayerMissingError(
                f"layers {missing} have no cross-layer statistics (captured cross_layer={cross}): choose "
                f"layers among them, or capture with cross_layer={sorted({*chosen, *cross})}"
            )
        #: The layers of the matrices' rows and columns, in order.
        self.layers: list[int] = chosen
        self.heldout = optional_flag("heldout", heldout)
        channels = min(stats.meta.layout.channels_of(kind) for kind in self.kinds)
        first = self._metric(metric, r, channels)
        rank = int(first.split(":")[1]) if first.startswith("subspace:") else None
        layer = optional_whole_number("layer", layer)
        paired = optional_whole_number("paired", paired)
        layer = chosen[0] if layer is None else layer
        if paired is None:
            paired = self._next(layer)
        self._matrices = Memo(self._matrix, size=4 * len(HEAD_KINDS))
        self._pairs = Memo(self._pair, size=256)
        keys = [each for each in self.kinds if each in KEY_KINDS]
        super().__init__()
        self.set_up(
            LayerSimilarityState(
                layer=layer, paired=paired, metric=first, kind=(keys or ["key"])[0] if kind is None else kind
            ),
            num_layers=num_layers,
            layer_positions=chosen,
            metrics_available=["cka", "aligned", *(f"subspace:{k}" for k in subspace_ranks(channels, rank))],
            kinds_available=keys if len(keys) > 1 else [],
        )

    @staticmethod
    def _metric(metric: str, r: int | None, channels: int) -> str:
        """The drop-down's value for the constructor's ``metric`` and ``r``."""
        if not isinstance(metric, str):
            raise ArgumentError(f"metric must be a string such as 'cka', got {metric!r}")
        if metric == "subspace":
            rank = default_rank(channels) if r is None else r
            return (
                f"subspace:{whole_number('r', rank, minimum=1, maximum=channels, hint='the subspace rank')}"
            )
        if r is not None:
            raise ArgumentError(f"r is the rank of metric='subspace'; {metric!r} takes none")
        return metric

    def _next(self, layer: int) -> int:
        """The layer paired with ``layer`` first: the next of the matrices' layers (else the one
        before, else itself; the first when ``layer`` is not among them: refused then)."""
        if layer not in self.layers:
            return self.layers[0]
        at = self.layers.index(layer)
        return self.layers[at + 1] if at + 1 < len(self.layers) else self.layers[max(at - 1, 0)]

    @classmethod
    def shows(cls, stats: KVStats | None) -> bool:
        """Whether the view can be built from ``stats``: they hold cross-layer moments."""
        return stats is not None and bool(cross_layer_kinds(stats))

    @classmethod
    def layers_offered(cls, stats: KVStats) -> list[int] | None:
        """The layers with cross-layer moments: those the sliders can stop at."""
        return list(stats.meta.cross_layers or [])

    @classmethod
    def capture_options(cls, layers: Sequence[int]) -> dict[str, Any]:
        """The joint statistics of the layers named (every layer when fewer than two are)."""
        return {"cross_layer": list(layers) if len(layers) > 1 else True}

    # ------------------------------------------------------------------ numbers
    def _matrix(self, kind: Kind, metric: str) -> np.ndarray:
        name, _, rank = metric.partition(":")
        if metric not in ("cka", "aligned") and not (name == "subspace" and rank.isdecimal()):
            raise UnknownMetricError(
                f"unknown metric {metric!r}; choose cka, aligned or subspace:r (r a rank, e.g. subspace:32)"
            )
        r = int(rank) if name == "subspace" else None
        heldout = self.heldout if name == "aligned" else None
        matrix = layer_similarity(self.stats, kind, name, layers=self.layers, r=r, heldout=heldout)
        matrix.setflags(write=False)  # kept and sent again on revisits
        return matrix

    def matrix(self, kind: Kind, metric: str) -> np.ndarray:
        """The L × L matrix of ``kind`` under ``metric`` (kept)."""
        return self._matrices(kind, metric)

    def _pair(self, kind: Kind, first: int, second: int) -> LayerPairHeads:
        """The heads of layer ``first`` against those of ``second`` (``first ≤ second``)."""
        res = align(self.stats, first if first == second else [first, second], kind, heldout=self.heldout)
        heads = len(res.labels) if first == second else len(res.labels) // 2
        rows, cols = slice(0, heads), slice(len(res.labels) - heads, len(res.labels))
        before, after = (np.array(m[rows, cols], dtype=np.float64) for m in (res.before, res.shown))
        for m in (before, after):
            m.setflags(write=False)
        scoring = res.scoring if res.method != "none" else "in-sample"
        return LayerPairHeads(
            before, after, res.labels[rows], res.labels[cols], res.method, scoring, res.token_count
        )

    def pair(self, kind: Kind, layer: int, paired: int) -> LayerPairHeads:
        """The heads of ``layer`` (rows) against those of ``paired`` (columns), kept per pair."""
        heads = self._pairs(kind, min(layer, paired), max(layer, paired))
        return heads if layer <= paired else heads.transposed()

    # ------------------------------------------------------------------ panels
    def check_layer(self, layer: int) -> None:
        """Refuse a layer outside the model (:class:`~headwidget.errors.LayerIndexError`), or one that
        is not among the matrices' layers (:class:`~headwidget.errors.CrossLayerMissingError`, naming
        them)."""
        super().check_layer(layer)
        if layer in self.layers:
            return
        cross = list(self.stats.meta.cross_layers or [])
        among = f"the matrices are over {_layer_list(self.layers)}"
        if layer in cross:
            raise CrossLayerMissingError(
                f"layer {layer} is not among this view's layers: {among}: build the view with "
                f"layers=[...] naming it, or choose one of them"
            )
        raise CrossLayerMissingError(
            f"layer {layer} has no cross-layer statistics here: {among} (captured with cross_layer={cross}): "
            "choose one of them, or capture with cross_layer=[...] naming it"
        )

    def layer_text(self, layer: int) -> str:
        """``layer`` among the matrices' layers, as the sliders say it: ``"layer 9 of 8–15"``."""
        return f"layer {layer} of {_layer_span(self.layers)}"

    def _layer_panel(self, kind: Kind, state: LayerSimilarityState) -> Panel:
        matrix = self.matrix(kind, state.metric)
        a, b = self.layers.index(state.layer), self.layers.index(state.paired)
        note = f"layer {state.layer} × layer {state.paired}: {_score(matrix[a, b])}"
        contiguous = self.layers == list(range(self.layers[0], self.layers[0] + len(self.layers)))
        labels = None if contiguous else [str(each) for each in self.layers]
        title = METRIC_TITLES.get(state.metric.split(":")[0], state.metric)
        return Panel(
            f"{kind}-layers",
            f"{KIND_TITLES[kind]} · {title}",
            matrix,
            subtitle=f"layer × layer: {metric_label(state.metric)} · {self.stats.tokens} tokens",
            row_labels=labels,
            col_labels=labels,
            row_offset=self.layers[0] if contiguous else 0,
            col_offset=self.layers[0] if contiguous else 0,
            note=note,
            row_axis="layer",
            col_axis="paired with",  # (what a click selects: the row's layer, paired with the column's)
            hint="a click on a cell shows its pair's heads",
            mark_row=a,  # the selected pair: its row and its column outlined
            mark_col=b,
        )

    def _pair_panels(self, kind: Kind, layer: int, paired: int) -> list[Panel]:
        heads = self.pair(kind, layer, paired)
        head = f"{HEAD_TITLES[kind]} · L{layer} × L{paired}"
        before = f"per-token cosine, {heads.tokens} tokens · mean {_score(float(np.mean(heads.before)))}"
        after = (
            f"aligned ({heads.method}), {heads.scoring} scores · mean {_score(float(np.mean(heads.after)))}"
        )
        panels = [
            _head_panel(f"{kind}-before", f"{head} · before", heads.before, before, heads),
            _head_panel(f"{kind}-after", f"{head} · after", heads.after, after, heads),
        ]
        if kind == "key_post":
            panels[0].note = "as before RoPE: it turns a token's heads alike"
        return panels

    def rows(self, state: LayerSimilarityState) -> list[Kind]:
        """The kinds of ``state``'s rows of panels: its kind of keys, then the values."""
        keys = [each for each in self.kinds if each in KEY_KINDS]
        if keys and state.kind not in keys:
            raise UnknownKindError(
                f"kind must be one of {', '.join(map(repr, keys))} (the keys captured across layers), "
                f"got {state.kind!r}"
            )
        return [each for each in self.kinds if each == state.kind or each not in KEY_KINDS]

    def compute(self, state: LayerSimilarityState, resolution: int | None = None) -> PanelGrid:
        """A row for the keys and one for the values: the L × L matrix, then the selected pair's heads
        before and after alignment."""
        self.check_layer(state.layer)
        self.check_layer(state.paired)
        panels: list[Panel] = []
        for kind in self.rows(state):
            panels.append(self._layer_panel(kind, state))
            panels += self._pair_panels(kind, state.layer, state.paired)
        label = "similarity"
        for panel in panels:
            finite = panel.matrix[np.isfinite(panel.matrix)]
            lowest = float(finite.min()) if finite.size else 0.0
            if lowest < 0:  # the scale starts at 0: say so rather than clip silently
                panel.note = " · ".join(filter(None, (panel.note, f"lowest score {lowest:.3f}, drawn as 0")))
                label = "similarity (scores below 0 drawn as 0)"
        return PanelGrid(panels, 0.0, 1.0, "magma", label, columns=3)

    def labels(self, state: LayerSimilarityState) -> dict[str, Any]:
        """The two layers' read-outs beside their sliders."""
        return {"layer_label": self.layer_text(state.layer), "paired_label": self.layer_text(state.paired)}

    def describe(self, state: LayerSimilarityState) -> str:
        """What the panels of ``state`` show: the model, the metric and the pair of layers."""
        return (
            f"{stats_model_name(self.stats)} · {metric_label(state.metric)} · "
            f"layer {state.layer} × layer {state.paired}"
        )

    def select_cell(self, panel: str, row: int, col: int) -> None:
        """A click on a cell of a layer × layer matrix shows the heads of its pair of layers."""
        if panel.endswith("-layers") and 0 <= row < len(self.layers) and 0 <= col < len(self.layers):
            self.set_state(layer=self.layers[row], paired=self.layers[col])


def _head_panel(panel_id: str, title: str, matrix: np.ndarray, subtitle: str, heads: LayerPairHeads) -> Panel:
    """A panel of a pair's heads: one layer's heads down, the other's across."""
    return Panel(
        panel_id,
        title,
        matrix,
        subtitle=subtitle,
        row_labels=heads.row_labels,
        col_labels=heads.col_labels,
        row_axis="head",
        col_axis="head",
    )


def _score(value: float) -> str:
    """A score as the notes print it (NaN: a layer with no variance)."""
    return "undefined (no variance)" if math.isnan(value) else f"{value:.3f}"


def _layer_span(layers: Sequence[int]) -> str:
    """Layers as numbers, short enough for a slider's read-out: ``8–15`` for a run of more than two,
    ``0–28 every 2`` for more than four evenly spaced, else the list with its runs joined, and past
    six pieces its count and ends.

    >>> _layer_span([8, 9, 10, 11]), _layer_span([0, 2, 4]), _layer_span([3]), _layer_span(range(0, 30, 2))
    ('8–11', '0, 2, 4', '3', '0–28 every 2')
    >>> _layer_span([0, 1, 2, 3, 8, 10, 11, 12]), _layer_span([0, 3, 4, 9, 12, 17, 20, 27, 29])
    ('0–3, 8, 10–12', '9 layers, 0 … 29')
    """
    layers = list(layers)
    step = layers[1] - layers[0] if len(layers) > 1 else 0
    if len(layers) > 4 and step > 1 and layers == list(range(layers[0], layers[-1] + 1, step)):
        return f"{layers[0]}–{layers[-1]} every {step}"
    pieces, start = [], 0
    for end in range(1, len(layers) + 1):
        if end == len(layers) or layers[end] != layers[end - 1] + 1:
            run = layers[start:end]
            pieces += [f"{run[0]}–{run[-1]}"] if len(run) > 2 else [str(x) for x in run]
            start = end
    if len(pieces) > 6:
        return f"{len(layers)} layers, {layers[0]} … {layers[-1]}"
    return ", ".join(pieces)


def _layer_list(layers: Sequence[int]) -> str:
    """Layers in words: ``layers 0–29`` for a run, else the list.

    >>> _layer_list([0, 1, 2, 3]), _layer_list([0, 2, 4])
    ('layers 0–3', 'layers 0, 2, 4')
    """
    return f"layers {_layer_span(layers)}"
