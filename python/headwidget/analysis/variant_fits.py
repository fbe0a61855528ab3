"""Fit one layer to a variant spec: the per-head weights it becomes, its RoPE mask and its KV cost.

:func:`fit_layer` turns a layer's :class:`~headwidget.core.weights.HeadWeights` (float64) into a
:class:`LayerFit` for a :class:`~headwidget.analysis.variants.VariantSpec`:

- ``model``: nothing changes; the cost is the layer's own.
- ``mha``, ``gqa:G``, ``mqa``, ``lrkv:r``, ``mla:d_c``: exactly
  :func:`~headwidget.analysis.conversions.convert` (data-aware when ``stats`` hold kind ``"input"``).
  Merged heads (``mha``/``gqa``/``mqa``) get the group means of their K/V biases too; LRKV and MLA keep
  every head's bias (a per-head constant, nothing to cache).
- ``gqa:G+align``, ``mqa+align``: the KV heads are grouped by :func:`~headwidget.analysis.grouping.
  group_heads` on the sum of the aligned key and value token-cosine scores of :func:`~headwidget.
  analysis.alignment.align` (in-sample; RoPE-compatible for keys of RoPE models, orthogonal
  otherwise); each group's rotations are fitted jointly by :func:`~headwidget.analysis.align_model.
  fit_group_rotations` (keys RoPE-compatible, values orthogonal), applied by :func:`~headwidget.analysis.
  merging.rotate_heads`, the groups made contiguous and merged by their means (:mod:`.merging`).
- ``rope:r``: the weights are unchanged and each KV head keeps rotating the ``r`` planes that
  :func:`~headwidget.analysis.partial_rope.plane_scores` ranks highest (MHA2MLA's 2-norm criterion:
  ``mean_t ‖k_{g,m}‖ · Σ_h mean_t ‖q_{h,m}‖``, from the rotary-pair norms of a capture with
  ``inputs=True``); the cost is unchanged.
- ``mla:d_c+rope:r``: those planes, plus :func:`~headwidget.analysis.partial_rope.partial_rope_latent`
  for the rest; cost ``d_c + G·2r``.

Example:
    >>> import torch
    >>> from headwidget.analysis.variants import parse_variant
    >>> r = lambda *s: torch.randn(*s, dtype=torch.float64)
    >>> w = HeadWeights(q=r(4, 8, 16), k=r(4, 8, 16), v=r(4, 8, 16), o=r(4, 16, 8))
    >>> fit = fit_layer(w, 0, parse_variant("gqa:2"), None, rope_planes=[], kv_target=2)
    >>> fit.weights.num_kv_heads, fit.kv_elements, bool(torch.allclose(fit.weights.k[0], w.k[:2].mean(0)))
    (2, 32, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from headwidget.analysis.align_model import fit_group_rotations_many
from headwidget.analysis.alignment import align
from headwidget.analysis.conversions import convert, input_sqrt
from headwidget.analysis.grouping import group_heads
from headwidget.analysis.merging import merge_groups, per_kv_head, regroup_heads, rotate_heads
from headwidget.analysis.partial_rope import keep_mask, kept_planes, partial_rope_latent, plane_scores
from headwidget.analysis.procrustes import HeadSplit
from headwidget.analysis.variants import VariantSpec
from headwidget.core.weights import HeadWeights
from headwidget.errors import (
    GroupCountError,
    MissingStatisticsError,
    StatsMismatchError,
    UnsupportedConversionError,
)
from headwidget.stats import KVStats

__all__ = [
    "Alignment",
    "LayerFit",
    "align_groups",
    "align_inputs",
    "aligned_heads",
    "alignments",
    "fit_layer",
    "rope_keep",
]

F64 = torch.float64


@dataclass(frozen=True)
class LayerFit:
    """What one layer becomes.

    ``weights``: the per-head weights to write (None: unchanged); ``rope_keep``: (G, d_h) dims that keep
    rotating (None: RoPE as it is); ``kv_elements``: the mechanism's cached elements per token;
    ``factors``: the mechanism's factors (LRKV, MLA); ``groups``: the KV heads merged together
    (``+align``); ``kept_planes``: (G, r) rotary plane indices kept per KV head (partial RoPE).
    """

    layer: int
    weights: HeadWeights | None
    rope_keep: torch.Tensor | None
    kv_elements: int
    weighting: str = "weight-space"
    factors: dict[str, torch.Tensor] = field(default_factory=dict)
    groups: list[list[int]] | None = None
    kept_planes: torch.Tensor | None = None


def _need(stats: KVStats | None, layer: int, kinds: Sequence[str], what: str, how: str) -> KVStats:
    """``stats`` when they hold ``kinds`` for ``layer``; else a :class:`MissingStatisticsError`."""
    if stats is None:
        problem = "no statistics were given"
    elif any(k not in stats.kinds for k in kinds):
        problem = f"kinds {[k for k in kinds if k not in stats.kinds]} were not captured"
    elif layer not in stats.layers:
        problem = f"layer {layer} was not captured (captured: {stats.layers})"
    else:
        return stats
    raise MissingStatisticsError(
        f"{what} needs statistics of layer {layer} ({', '.join(kinds)}): {problem}; {how}"
    )


def align_groups(stats: KVStats, layer: int, groups: int) -> list[list[int]]:
    """KV heads of ``layer`` grouped by their aligned key + value similarity (see the module doc).

    Raises:
        GroupCountError: ``groups`` does not divide the number of KV heads (the message names those
            that do).
    """
    kv = stats.meta.layout.num_kv_heads
    if groups < 1 or kv % groups:
        divisors = ", ".join(str(g) for g in range(1, kv + 1) if kv % g == 0)
        raise GroupCountError(
            f"gqa:{groups}+align merges the model's {kv} KV heads into equal groups: G must divide {kv} "
            f"(possible: {divisors})"
        )
    if groups == 1:
        return [list(range(kv))]
    keys = align(stats, layer, "key", heldout=False).after
    values = align(stats, layer, "value", heldout=False).after
    return group_heads(keys + values, groups)


@dataclass(frozen=True)
class Alignment:
    """One layer's ``+align`` fit before merging: the KV-head ``groups`` and the rotations (KV heads, d, d)
    of its keys and values that make each group's heads agree."""

    groups: list[list[int]]
    keys: torch.Tensor
    values: torch.Tensor


def align_inputs(spec: VariantSpec, stats: KVStats | None, layer: int) -> tuple[KVStats, list[list[int]]]:
    """The statistics an ``+align`` spec needs for ``layer`` (checked) and the layer's KV-head groups."""
    stats = _need(
        stats,
        layer,
        ["key", "value"],
        f"{spec.text} (aligning heads before merging them)",
        "capture them from this model (keys and values are captured by default)",
    )
    return stats, align_groups(stats, layer, 1 if spec.mechanism == "mqa" else int(spec.arg or 0))


def alignments(
    spec: VariantSpec,
    stats: KVStats | None,
    dims: dict[int, tuple[int, int]],
    rope_planes: Sequence[tuple[int, int]],
) -> dict[int, Alignment]:
    """The :class:`Alignment` of each layer of ``dims`` (layer → key and value head dims) for an
    ``+align`` spec, the layers with the same groups and dims fitted together
    (:func:`~headwidget.analysis.align_model.fit_group_rotations_many`)."""
    batches: dict[tuple[tuple[int, int], tuple[tuple[int, ...], ...]], list[tuple[int, KVStats]]] = {}
    groups_of: dict[int, list[list[int]]] = {}
    for layer, shape in dims.items():
        checked, groups_of[layer] = align_inputs(spec, stats, layer)
        key = (shape, tuple(tuple(g) for g in groups_of[layer]))
        batches.setdefault(key, []).append((layer, checked))
    out: dict[int, Alignment] = {}
    for ((d_h, d_v), _), members in batches.items():
        fitted = _fit_alignments(members, groups_of[members[0][0]], d_h, d_v, rope_planes)
        out.update(zip((layer for layer, _ in members), fitted, strict=True))
    return out


def _fit_alignments(
    members: Sequence[tuple[int, KVStats]],
    groups: list[list[int]],
    d_h: int,
    d_v: int,
    rope_planes: Sequence[tuple[int, int]],
) -> list[Alignment]:
    """The :class:`Alignment` of each (layer, statistics) of ``members``, all with ``groups``, fitted
    together."""
    keys = fit_group_rotations_many(
        [st.moments(layer, "key").token_gram() for layer, st in members],
        HeadSplit.make(d_h, rope_planes),
        groups,
    )
    values = fit_group_rotations_many(
        [st.moments(layer, "value").token_gram() for layer, st in members], HeadSplit.make(d_v, []), groups
    )
    return [
        Alignment(groups, rk.to("cpu", F64), rv.to("cpu", F64)) for rk, rv in zip(keys, values, strict=True)
    ]


def aligned_heads(
    w: HeadWeights,
    stats: KVStats,
    layer: int,
    groups: Sequence[Sequence[int]],
    rope_planes: Sequence[tuple[int, int]],
    alignment: Alignment | None = None,
) -> HeadWeights:
    """``w`` rotated so that the KV heads of each group agree, with the groups made contiguous.

    The layer's function is unchanged (rotations and a permutation of heads); merging the result with
    :func:`~headwidget.analysis.merging.merge_groups` is the ``+align`` conversion. ``alignment``: the
    rotations already fitted (by :func:`alignments`), else they are fitted here.
    """
    if alignment is None:
        d_h, d_v = int(w.k.shape[1]), int(w.v.shape[1])
        alignment = _fit_alignments([(layer, stats)], [list(g) for g in groups], d_h, d_v, rope_planes)[0]
    return regroup_heads(rotate_heads(w, alignment.keys, alignment.values), groups)


def rope_keep(
    w: HeadWeights, stats: KVStats | None, layer: int, pairs: int, rope_planes: Sequence[tuple[int, int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep (G, d_h) bool, kept planes (G, r))`` of partial RoPE with ``pairs`` planes per KV head.

    The planes are ranked by :func:`~headwidget.analysis.partial_rope.plane_scores` of the token-mean
    rotary-pair norms in ``stats`` (:meth:`KVStats.plane_norms <headwidget.stats.KVStats.plane_norms>`).

    Raises:
        MissingStatisticsError: no statistics of ``layer``, or statistics without the pair norms
            (captured without ``inputs=True``, or by a headwidget that did not record them).
    """
    if not rope_planes:
        raise UnsupportedConversionError("partial RoPE needs a model with rotary position embeddings")
    what = f"rope:{pairs} (MHA2MLA's ranking of rotary pairs by query and key 2-norms)"
    if stats is None or layer not in stats.layers:
        problem = "no statistics were given" if stats is None else f"layer {layer} was not captured"
        raise MissingStatisticsError(
            f"{what} needs the per-pair query/key norms of layer {layer}: {problem}; capture them from "
            "this model with inputs=True"
        )
    try:
        norms = stats.plane_norms(layer)
    except MissingStatisticsError as err:
        raise MissingStatisticsError(f"{what}: {err}") from err
    have = (int(norms.query.shape[0]), int(norms.key.shape[0]), norms.planes)
    if have != (w.num_heads, w.num_kv_heads, len(rope_planes)):
        raise StatsMismatchError(
            f"{what}: the statistics hold norms of {have[0]} query heads, {have[1]} KV heads and "
            f"{have[2]} rotary planes, but layer {layer} has {w.num_heads}, {w.num_kv_heads} and "
            f"{len(rope_planes)}; capture them from this model"
        )
    scores = plane_scores(norms.query_mean().to("cpu", F64), norms.key_mean().to("cpu", F64), w.kv_of)
    kept = kept_planes(scores, pairs)
    return keep_mask(kept, rope_planes, int(w.k.shape[1])), kept


def _group_bias(b: torch.Tensor | None, w: HeadWeights, groups: int) -> torch.Tensor | None:
    if b is None:
        return None
    per_query = b[w.kv_of]
    return per_query.reshape(groups, w.num_heads // groups, -1).mean(1)


def _to_kv(new: HeadWeights, kv_target: int) -> HeadWeights:
    """``new`` laid out with ``kv_target`` KV heads (copies of merged heads, or groups of equal ones)."""
    if new.num_kv_heads == kv_target:
        return new
    kv_of = new.kv_of

    def lay(t: torch.Tensor | None, what: str) -> torch.Tensor | None:
        return None if t is None else per_kv_head(t[kv_of], kv_target, what=what)

    try:
        k, v = lay(new.k, "keys"), lay(new.v, "values")
        assert k is not None and v is not None
        return replace(
            new, k=k, v=v, k_bias=lay(new.k_bias, "key biases"), v_bias=lay(new.v_bias, "value biases")
        )
    except GroupCountError as err:
        raise UnsupportedConversionError(
            f"this model family keeps {kv_target} KV heads per layer and cannot hold {new.num_kv_heads}: "
            f"{err}; choose G dividing {kv_target} or a multiple of it"
        ) from err


def fit_layer(
    w: HeadWeights,
    layer: int,
    spec: VariantSpec,
    stats: KVStats | None,
    *,
    rope_planes: Sequence[tuple[int, int]],
    kv_target: int | None,
    alignment: Alignment | None = None,
) -> LayerFit:
    """Fit ``layer`` (its weights ``w``) to ``spec`` (see the module docstring).

    ``rope_planes`` are the model's rotary planes (pre-RoPE key layout); ``kv_target`` the number of KV
    heads the written weights must have (None: whatever the mechanism has, for families that can
    change it); ``alignment``: an ``+align`` spec's rotations of this layer, fitted beforehand with
    the other layers' (:func:`alignments`), else fitted here.

    Raises:
        MissingStatisticsError: ``+align`` without key/value statistics, partial RoPE without the
            rotary-pair norms of ``inputs=True`` (statistics of an older capture lack them too), or a
            data-aware fit (``stats`` given) whose layer has no input statistics.
        GroupCountError, RankRangeError: a G, r or d_c the layer does not allow.
        UnsupportedConversionError: a result the family cannot hold.
    """
    heads, kv = w.num_heads, w.num_kv_heads
    d_h, d_v = int(w.k.shape[1]), int(w.v.shape[1])
    data_aware = stats is not None
    weighting = "data-aware" if data_aware else "weight-space"
    if spec.mechanism == "model":
        return LayerFit(layer, None, None, w.kv_elements())
    if spec.mechanism == "rope":
        keep, kept = rope_keep(w, stats, layer, int(spec.arg or 0), rope_planes)
        return LayerFit(layer, None, keep, w.kv_elements(), "data-aware", kept_planes=kept)
    if spec.align:
        groups_wanted = 1 if spec.mechanism == "mqa" else int(spec.arg or 0)
        if alignment is None:
            stats, groups = align_inputs(spec, stats, layer)
        else:
            groups = alignment.groups
        assert stats is not None
        merged = merge_groups(aligned_heads(w, stats, layer, groups, rope_planes, alignment), groups_wanted)
        target = merged.num_kv_heads if kv_target is None else kv_target
        return LayerFit(
            layer,
            _to_kv(merged, target),
            None,
            groups_wanted * (d_h + d_v),
            "data-aware",
            groups=[list(g) for g in groups],
        )
    if spec.mechanism in ("lrkv", "mla") and data_aware:
        _need(
            stats,
            layer,
            ["input"],
            f"the data-aware {spec.text} fit",
            "capture them with inputs=True, or pass stats=None for the weight-space fit",
        )
    if spec.rope is not None:
        keep, kept = rope_keep(w, stats, layer, spec.rope, rope_planes)
        fit = partial_rope_latent(w, keep, int(spec.arg or 0), input_sqrt(stats, layer))
        factors = {"down": fit.down, "k_up": fit.k_up, "v_up": fit.v_up, "rope_keep": keep}
        new = replace(w, k=fit.k, v=fit.v, mechanism="mla")
        return LayerFit(layer, new, keep, fit.elements, "data-aware", factors, kept_planes=kept)
    base = str(spec.base)
    c = convert(w, layer, base, stats if spec.mechanism in ("lrkv", "mla") else None)
    if spec.mechanism in ("mha", "gqa", "mqa"):
        groups_n = heads if spec.mechanism == "mha" else 1 if spec.mechanism == "mqa" else int(spec.arg or 0)
        k = per_kv_head(c.k_weight, groups_n)
        v = per_kv_head(c.v_weight, groups_n)
        new = replace(
            w,
            k=k,
            v=v,
            k_bias=_group_bias(w.k_bias, w, groups_n),
            v_bias=_group_bias(w.v_bias, w, groups_n),
            mechanism=c.mechanism,
        )
        target = groups_n if kv_target is None else kv_target
        return LayerFit(layer, _to_kv(new, target), None, c.kv_elements, "weight-space")
    # LRKV and MLA give every query head of a KV head the same K/V up to rounding; MLA factorises K and V
    # together, so its rounding errors are relative to the larger of the two (keys that are all zero
    # come back as rounding noise of the values' size, which is no reason to refuse them)
    scale = float(max(c.k_weight.abs().max(), c.v_weight.abs().max())) if c.k_weight.numel() else None
    k, v = per_kv_head(c.k_weight, kv, scale=scale), per_kv_head(c.v_weight, kv, scale=scale)
    new = replace(w, k=k, v=v, mechanism=c.mechanism)
    target = kv if kv_target is None else kv_target
    return LayerFit(layer, _to_kv(new, target), None, c.kv_elements, weighting, dict(c.factors))
