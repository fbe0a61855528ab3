"""Layer × layer similarity of K (before or after RoPE) or V, from the cross-layer statistics.

``layer_similarity(stats, kind, metric)`` is an (L, L) matrix over the layers captured with
``capture(..., cross_layer=...)`` (or a subset of them, ``layers=``), in float64:

- ``"cka"``: linear CKA of the two layers' token matrices ``X_a``, ``X_b`` (N × C, the captured tokens
  pooled), ``‖X̃_aᵀX̃_b‖²_F / (‖X̃_aᵀX̃_a‖_F ‖X̃_bᵀX̃_b‖_F)`` with ``X̃`` centred on the channel means
  (Kornblith et al. 2019; the formula of xKV's ``scripts/cka_similarity_analysis.ipynb``, which takes
  one sequence's tokens where this pools every captured token), from the blocks of the joint centred
  co-moment. A layer with no variance gives NaN.
- ``"aligned"``: the mean over the G × G head pairs (head of layer a, head of layer b) of their token
  cosine after the best rotation (:func:`~headwidget.analysis.alignment.align` over the flattened layers:
  RoPE-compatible for keys of RoPE models, orthogonal otherwise; held-out or in-sample as ``align``
  shows by default, or as ``heldout`` says). The diagonal is the mean over a layer's own head pairs
  (1 only when its heads agree), as any other entry.
- ``"subspace"``: the subspace overlap of xKV's analysis notebook (its
  ``principal_angle_subspace_similarity_torch``, defined there beside the CKA its figures and the paper
  report): with ``U_a`` the top-``r`` left singular vectors of ``X_a`` (token space, uncentred), the
  overlap ``‖U_aᵀU_b‖²_F / r`` in [0, 1] — the mean squared cosine of the principal angles between the
  two layers' top-r token subspaces: the alignment of dominant singular vectors that xKV's shared
  basis (``xkv:r/g``) exploits, there per sequence, here over the pooled tokens.
  Computed exactly from the uncentred C × C Grams: ``U_a = X_a V_a Σ_a⁻¹``, so
  ``U_aᵀU_b = Σ_a⁻¹ V_aᵀ (X_aᵀX_b) V_b Σ_b⁻¹``. Deviations from the notebook: the tokens are every
  captured token pooled (the notebook takes one sequence), and the SVD is exact (it uses the randomized
  ``torch.svd_lowrank``). A singular vector of a zero singular value counts as no overlap, and so does
  one whose eigenvalue in the layer's Gram is below ``λ_max·ε`` (ε float32's unit roundoff for a
  float32, bfloat16 or float16 capture, whose Grams are summed in float32; ``C`` times float64's for a
  float64 one), where rounding leaves the zero eigenvalues: a layer whose tokens span fewer than ``r``
  dimensions (more channels than the hidden size feeding them, or fewer tokens than channels) scores its
  rank over ``r`` against itself. (SmolLM2's values over 120 tokens, float32: the 72 zero eigenvalues
  at most 9e-9·λ_max, the least of the 120 others 6e-5·λ_max; its keys over 1,024 tokens: the least
  1.5e-7·λ_max, as a float64 capture has it to 1e-4.)

**Memory.** The joint statistics of ``n`` cross layers of C channels hold three (n·C)² float64
matrices per kind (:func:`cross_layer_bytes`), and folding one batch into them forms its (n·C)² Gram
in float32 and float64 besides. ``capture`` estimates that peak before any work
(``headwidget.estimate(model, cross_layer=...)``) and refuses above ``max_memory`` (by default half the
device's free memory), naming what to shrink. For an 8B Llama (Llama-3.1-8B: 32 layers, 8 KV heads of
128, C = 1024 per kind; K and V, batches of 8 × 512) the estimate is 79 GiB for all 32 layers — the
accumulators alone 48 GiB — so no 80 GB GPU holds them; 37 GiB for 21 layers, 23 GiB for 16. With
the bf16 model on an 80 GB GPU (about 64 GiB free, a default budget of 32 GiB) that is up to 19 layers
per capture: pass ``cross_layer=`` a subset (e.g. every other layer, or the 19 middle ones), or raise
``max_memory`` on a larger device. ``layer_similarity`` then reads the matrices block by block (no
(n·C)² copy for ``"cka"`` and ``"subspace"``); ``layers=`` takes a subset of the captured cross layers.

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (4, 32)), cross_layer=True, progress=False)
    >>> s = layer_similarity(stats, "value")
    >>> s.shape, bool(abs(s[1, 1] - 1) < 1e-12), bool((s == s.T).all())
    ((3, 3), True, True)
    >>> layer_similarity(stats, "key", "subspace", r=4, layers=[0, 2]).shape
    (2, 2)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from headwidget.analysis.alignment import align
from headwidget.checks import layer_indices, optional_flag, whole_number
from headwidget.core.kinds import Kind, check_kind
from headwidget.errors import ArgumentError, CrossLayerMissingError, UnknownKindError, UnknownMetricError
from headwidget.moments import Moments
from headwidget.stats import KVStats

__all__ = ["LAYER_METRICS", "cross_layer_bytes", "layer_similarity"]

F64 = torch.float64
#: The metrics of :func:`layer_similarity`.
LAYER_METRICS = ("cka", "aligned", "subspace")


def cross_layer_bytes(layers: int, channels: int, head_dim: int | None, kinds: int = 1) -> int:
    """Bytes of the float64 joint statistics of ``layers`` cross layers of ``channels`` channels each,
    for ``kinds`` kinds (channel means, the centred co-moment and, for heads of ``head_dim``, the two
    token splits' normalised Grams).

    >>> cross_layer_bytes(32, 1024, 128, kinds=2) / 2**30  # Llama-3.1-8B, K and V: 48 GiB
    48.00048828125
    """
    return kinds * Moments.nbytes(layers * channels, head_dim)


def _chosen(stats: KVStats, kind: Kind, layers: Iterable[int] | None) -> tuple[Moments, list[int], list[int]]:
    """The joint moments of ``kind``, the chosen layers and their positions among the cross layers."""
    moments, cross = stats.cross_moments(kind)
    if layers is None:
        chosen = list(cross)
    else:
        chosen = layer_indices("layers", layers, stats.meta.layout.num_layers)
        missing = [layer for layer in chosen if layer not in cross]
        if missing:
            raise CrossLayerMissingError(
                f"layers {missing} have no cross-layer statistics (captured cross_layer={cross}); capture "
                f"with cross_layer={sorted(set(chosen) | set(cross))}, or choose layers among {cross}"
            )
        if not chosen:
            raise ArgumentError("layers is empty; give the layers to compare, or None for every cross layer")
    return moments, chosen, [cross.index(layer) for layer in chosen]


def _blocks(
    moments: Moments, width: int, positions: list[int], *, upper: bool = False
) -> Iterator[torch.Tensor]:
    """The co-moment rows of each chosen layer (width × every chosen layer's channels; ``upper``: the
    channels of that layer and the chosen layers after it alone), one at a time (views of the stored
    rows when the chosen layers are consecutive cross layers in order)."""
    first = positions[0]
    if positions == list(range(first, first + len(positions))):
        stop = (first + len(positions)) * width
        for p in positions:
            yield moments.m2[p * width : (p + 1) * width, (p if upper else first) * width : stop].to(F64)
        return
    columns = torch.cat([torch.arange(p * width, (p + 1) * width) for p in positions]).to(moments.m2.device)
    for a, p in enumerate(positions):
        yield (
            moments.m2[p * width : (p + 1) * width]
            .index_select(1, columns[a * width if upper else 0 :])
            .to(F64)
        )


def _cka(moments: Moments, width: int, positions: list[int]) -> np.ndarray:
    n = len(positions)
    frob = torch.zeros(n, n, dtype=F64)
    # ‖X̃_aᵀX̃_b‖_F = ‖X̃_bᵀX̃_a‖_F: the blocks on and above the diagonal are read (half the co-moment)
    for a, rows in enumerate(_blocks(moments, width, positions, upper=True)):
        frob[a, a:] = (rows * rows).sum(0).reshape(n - a, width).sum(1).cpu()  # (rows first: contiguous)
    frob = frob + torch.triu(frob, 1).T
    diag = torch.sqrt(torch.diagonal(frob))
    den = torch.outer(diag, diag)
    out = torch.where(den > 0, frob / torch.where(den > 0, den, torch.ones_like(den)), float("nan"))
    return out.numpy()


def _subspace(moments: Moments, width: int, positions: list[int], rank: int, eps: float) -> np.ndarray:
    n = len(positions)
    mean = moments.mean.to(F64)
    count = moments.count
    device = moments.m2.device
    bases = []  # Σ_a⁻¹ V_aᵀ: (r, C) per layer
    for p in positions:
        block = slice(p * width, (p + 1) * width)
        gram = moments.m2[block, block].to(F64) + count * torch.outer(mean[block], mean[block])
        values, vectors = torch.linalg.eigh(gram)
        top = values.flip(0)[:rank]
        floor = values[-1].clamp_min(0) * max(eps, width * torch.finfo(F64).eps)  # (rounding: zero)
        sigma = torch.sqrt(torch.where(top > floor, top, 0.0))
        inverse = torch.where(sigma > 0, 1 / torch.where(sigma > 0, sigma, torch.ones_like(sigma)), 0.0)
        bases.append(inverse[:, None] * vectors.flip(1)[:, :rank].T)
    stacked = torch.stack(bases)  # (n, r, C)
    columns = torch.cat([torch.arange(p * width, (p + 1) * width) for p in positions]).to(device)
    chosen_mean = mean.index_select(0, columns)
    out = torch.zeros(n, n, dtype=F64)
    for a, rows in enumerate(_blocks(moments, width, positions)):
        p = positions[a]
        gram = rows + count * torch.outer(mean[p * width : (p + 1) * width], chosen_mean)
        left = (stacked[a] @ gram).reshape(rank, n, width)  # Σ_a⁻¹ V_aᵀ X_aᵀX_b, every b
        cross = torch.einsum("rnc,nsc->nrs", left, stacked)  # U_aᵀ U_b
        out[a] = (cross * cross).sum((1, 2)).cpu() / rank
    return ((out + out.T) / 2).numpy()  # ‖U_aᵀU_b‖ = ‖U_bᵀU_a‖: equal up to rounding


def _gram_eps(stats: KVStats) -> float:
    """The unit roundoff of the captured Grams: float64's for a float64 capture, else float32's (the
    products of float32, bfloat16 and float16 runs are summed in float32)."""
    return float(torch.finfo(F64 if stats.meta.dtype == "float64" else torch.float32).eps)


def _aligned(stats: KVStats, kind: Kind, layers: list[int], heldout: bool | None) -> np.ndarray:
    result = align(stats, layers if len(layers) > 1 else layers[0], kind, heldout=heldout)
    n = len(layers)
    heads = len(result.labels) // n
    shown = np.asarray(result.shown, dtype=np.float64)
    means = shown.reshape(n, heads, n, heads).mean(axis=(1, 3))
    return (means + means.T) / 2


def layer_similarity(
    stats: KVStats,
    kind: Kind = "key",
    metric: str = "cka",
    *,
    layers: Iterable[int] | None = None,
    r: int | None = None,
    heldout: bool | None = None,
) -> np.ndarray:
    """The (L, L) similarity of the cross layers' ``kind`` under ``metric`` (see the module docstring).

    Args:
        stats: statistics captured with ``cross_layer=True`` (or a list of layers).
        kind: ``"key"`` (before RoPE), ``"key_post"`` (after RoPE, ``rope="post"``/``"both"``) or
            ``"value"``.
        metric: ``"cka"``, ``"aligned"`` or ``"subspace"``.
        layers: a subset of the cross layers (default: all); the matrix follows layer order, whatever
            the order they are given in.
        r: the subspace rank of ``"subspace"`` (1 ≤ r ≤ C); only for that metric.
        heldout: for ``"aligned"``: held-out (True) or in-sample (False) scores; None: as
            :func:`~headwidget.analysis.alignment.align` shows by default.

    Raises:
        UnknownMetricError: a metric not in :data:`LAYER_METRICS`.
        UnknownKindError: a kind the statistics lack, or one not split into heads.
        CrossLayerMissingError: statistics without cross-layer moments of ``kind`` or of ``layers``.
        ArgumentError: ``r`` missing for ``"subspace"``, given for another metric, or out of range.
    """
    if not isinstance(stats, KVStats):
        raise ArgumentError(
            f"stats must be a KVStats (from headwidget.capture or KVStats.load), got {type(stats).__name__}"
        )
    if metric not in LAYER_METRICS:
        raise UnknownMetricError(f"unknown metric {metric!r}; choose one of {', '.join(LAYER_METRICS)}")
    kind = check_kind(kind)
    if stats.meta.layout.head_dim_of(kind) is None:
        raise UnknownKindError(f"kind {kind!r} is not split into heads; use 'key', 'key_post' or 'value'")
    heldout = optional_flag("heldout", heldout)
    if heldout is not None and metric != "aligned":
        raise ArgumentError(f"heldout is for metric='aligned' only, not {metric!r}")
    moments, chosen, positions = _chosen(stats, kind, layers)
    width = stats.meta.layout.channels_of(kind)
    if metric == "subspace":
        if r is None:
            raise ArgumentError(
                "metric='subspace' compares the layers' top-r singular subspaces: give r (e.g. r=32)"
            )
        rank = whole_number("r", r, minimum=1, maximum=width, hint="the subspace rank")
        return _subspace(moments, width, positions, rank, _gram_eps(stats))
    if r is not None:
        raise ArgumentError(f"r is the rank of metric='subspace'; {metric!r} takes none")
    if metric == "cka":
        return _cka(moments, width, positions)
    return _aligned(stats, kind, chosen, heldout)
