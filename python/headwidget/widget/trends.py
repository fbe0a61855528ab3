"""``LayerTrends``: per-layer summaries in a bqplot figure, linked to the heatmap views' layer.

Lines, one point per captured layer:

- mean |channel correlation| (off-diagonal) of K and of V;
- mean head similarity (token cosine, off-diagonal) of K and V before alignment, and after alignment
  (the scores the alignment view shows: held-out when few tokens);
- optionally, for a model, the effective rank of the heads' QK operator correlation under each mechanism
  spec (on a second axis; diversity per mechanism).

The current layer is marked by a vertical rule. Clicking a point selects that layer; ``layer`` is a
trait, so ``traitlets.link`` ties it to any view (``explore`` does this).

Example:
    >>> import torch, headwidget
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4)).eval()
    >>> trends = LayerTrends(headwidget.capture(model, torch.randint(0, 64, (4, 24)), progress=False))
    >>> sorted(trends.series)[:2], trends.layer
    (['K head similarity · after', 'K head similarity · before'], 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import bqplot as bq
import ipywidgets
import numpy as np
import traitlets as t
from torch import nn

from headwidget.analysis.alignment import align
from headwidget.analysis.conversions import convert
from headwidget.analysis.diversity import head_diversity
from headwidget.analysis.operator_space import operator_similarity
from headwidget.stats import KVStats

__all__ = ["LayerTrends", "layer_series"]

COLOURS = ["#2166ac", "#b2182b", "#4393c3", "#d6604d", "#1b7837", "#762a83", "#e08214", "#35978f"]


def _off_diagonal_mean(matrix: np.ndarray, absolute: bool = False) -> float:
    off = matrix[~np.eye(len(matrix), dtype=bool)]
    off = np.abs(off) if absolute else off
    return float(np.nanmean(off)) if off.size and np.isfinite(off).any() else float("nan")


def layer_series(
    stats: KVStats, *, model: nn.Module | None = None, mechanisms: Sequence[str] = ()
) -> dict[str, list[float]]:
    """The per-layer numbers the trends plot (one value per ``stats.layers``), by series name."""
    series: dict[str, list[float]] = {}
    for layer in stats.layers:
        for kind, short in (("key", "K"), ("value", "V")):
            if kind not in stats.kinds:
                continue
            series.setdefault(f"{short} mean |channel corr|", []).append(
                _off_diagonal_mean(stats.channel_corr(layer, kind), absolute=True)
            )
            method = "orthogonal" if kind == "value" else None
            res = align(stats, [layer], kind=kind, method=method)
            series.setdefault(f"{short} head similarity · before", []).append(_off_diagonal_mean(res.before))
            series.setdefault(f"{short} head similarity · after", []).append(_off_diagonal_mean(res.shown))
        for spec in mechanisms:
            if model is None:
                raise ValueError("mechanism trends need the model's weights: pass model=")
            sim = operator_similarity(convert(model, layer, spec, stats), layer, "qk")
            rank = head_diversity(sim)["effective_rank"]
            series.setdefault(f"eff. rank · {spec}", []).append(float(rank))
    return series


class LayerTrends(ipywidgets.VBox):
    """A bqplot line chart of per-layer summaries; ``layer`` follows clicks and moves the marker."""

    layer = t.Int(0)

    def __init__(
        self,
        stats: KVStats,
        *,
        model: nn.Module | None = None,
        mechanisms: Sequence[str] = (),
        layer: int | None = None,
    ) -> None:
        """``mechanisms``: specs whose effective rank is drawn (needs ``model``); ``layer``: the marked
        layer (default: the first captured)."""
        self.stats = stats
        self.series = layer_series(stats, model=model, mechanisms=mechanisms)
        x = np.asarray(stats.layers, dtype=float)
        xs = bq.LinearScale()
        ys = bq.LinearScale(min=0.0, max=1.0)
        rank_scale = bq.LinearScale(min=0.0)
        marks: list[Any] = []
        self.points: list[bq.Scatter] = []
        for i, (name, values) in enumerate(self.series.items()):
            scale = rank_scale if name.startswith("eff. rank") else ys
            colour = COLOURS[i % len(COLOURS)]
            y = np.asarray(values, dtype=float)
            dashed = "dashed" if "before" in name else "solid"
            marks.append(
                bq.Lines(
                    x=x,
                    y=y,
                    scales={"x": xs, "y": scale},
                    colors=[colour],
                    labels=[name],
                    display_legend=True,
                    line_style=dashed,
                )
            )
            dots = bq.Scatter(
                x=x,
                y=y,
                scales={"x": xs, "y": scale},
                colors=[colour],
                default_size=24,
                interactions={"click": "select"},
                tooltip=bq.Tooltip(fields=["x", "y"]),
            )
            dots.observe(self._on_select, names=["selected"])
            self.points.append(dots)
            marks.append(dots)
        self.rule = bq.Lines(
            x=[0.0, 0.0], y=[0.0, 1.0], scales={"x": xs, "y": ys}, colors=["#444"], line_style="dotted"
        )
        marks.append(self.rule)
        axes = [
            bq.Axis(scale=xs, label="layer", tick_format="d"),
            bq.Axis(scale=ys, side="left", label="mean |corr| / similarity"),
        ]
        if any(n.startswith("eff. rank") for n in self.series):
            axes.append(bq.Axis(scale=rank_scale, side="right", label="effective rank"))
        self.figure = bq.Figure(
            marks=marks,
            axes=axes,
            title="Per-layer summary",
            legend_location="top-right",
            fig_margin={"top": 50, "bottom": 50, "left": 60, "right": 60},
        )
        super().__init__(children=[self.figure])
        self.observe(self._move_rule, names=["layer"])
        self.layer = stats.layers[0] if layer is None else layer
        self._move_rule()

    def _on_select(self, change: dict[str, Any]) -> None:
        selected = change["new"]
        if selected is not None and len(selected):
            self.layer = int(self.stats.layers[int(selected[0])])
            change["owner"].selected = None  # so that clicking the same point again selects again

    def _move_rule(self, change: dict[str, Any] | None = None) -> None:
        self.rule.x = [float(self.layer), float(self.layer)]
