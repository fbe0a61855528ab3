"""Cross-layer K/V mechanisms as pure maths: layer groups, MiniCache's merge, xKV's shared SVD, RoPE.

- :func:`layer_groups`: the groups of ``g`` adjacent layers a cross-layer spec (``share:g``,
  ``merge:g``, ``xkv:r/g``) acts on, within the layers it applies to; :func:`within_layer`: what such a
  spec does to a layer left alone in its group.
- :func:`minicache_merge`: MiniCache (Liu et al., arXiv 2405.14366) for one pair of adjacent layers'
  cached states: each (head, token) state vector ``x`` is split into its magnitude ``‖x‖`` and its
  direction; the two layers' directions are merged by SLERP,
  ``e = sin((1−t)Ω)/sin Ω · x^{l−1}/‖x^{l−1}‖ + sin(tΩ)/sin Ω · x^l/‖x^l‖`` with
  ``Ω = arccos(cos(x^{l−1}, x^l))`` and ``t = 0.6``, and each layer's state is restored as
  ``e · ‖x‖``. **Retention.** The authors published no code (their repository, AkideLiu/MiniCache,
  holds the project page only, whose text says "highly distinct state pairs" are kept unmerged but
  gives no rule). The rule here is the one public code executes: xKV's reimplementation
  (abdelfattah-lab/xKV, ``xKV/customized_cache/fake_layer_merge_dynamic_cache.py``,
  ``slerp_merge_rows_batch`` and ``fake_minicache_merge``) marks a state pair "divergent" when
  ``Ω > Ω_min + (Ω_max − Ω_min)·γ`` (``γ = 0.05``), merges the divergent pairs and restores every other
  pair exactly. So the states **retained** (exact in both layers) are those at the low end of the
  angular distances, ``d ≤ d_min + (d_max − d_min)·γ`` with ``d = Ω/π``: the most similar pairs, not the
  most distinct ones the prose speaks of (whose complement, with this γ, would keep almost every state).
  Deviations from that code: ``d_min``/``d_max`` are taken over one sequence's states of one kind (all
  its KV heads and tokens; xKV takes them over the whole batch, which it runs one sequence at a time),
  so that a sequence is merged the same whatever it is batched with; ``t = 0.6`` where xKV's default
  is 0.5; near-parallel pairs (``Ω < 1e-7``) that are merged (only possible with γ = 0) take SLERP's
  limit, the linear interpolation of the two directions; a zero vector has direction 0. **Layers.**
  MiniCache merges from the middle of the model on (its start layer S = L/2); ``merge:2`` pairs the
  layers its spec names, every layer when bare: its setting on SmolLM2's 30 layers is
  ``merge:2@15-29``.
- :func:`shared_svd`: xKV (Chang et al., arXiv 2503.18893; abdelfattah-lab/xKV,
  ``fake_layer_merge_dynamic_cache.py``): per sequence, the group's caches side by side — a
  (T, g·G·d) matrix, the layers' KV heads in order — are replaced by their rank-``r`` truncated SVD
  ``U_r S_r V_rᵀ`` (uncentred; computed in float64 from the smaller Gram). The authors compress the
  keys before RoPE and rotate the reconstruction again; :func:`rotate` un-rotates and re-rotates cached
  keys.
- :func:`merge_elements`, :func:`xkv_elements`: the cached elements per token of one layer.

Example:
    >>> layer_groups([0, 1, 2, 3, 4, 7, 8], 2)
    [[0, 1], [2, 3], [4], [7, 8]]
    >>> a, b = torch.randn(1, 1, 4, 8, dtype=torch.float64), torch.randn(1, 1, 4, 8, dtype=torch.float64)
    >>> ra, rb, kept = minicache_merge(a, a.clone())  # identical layers merge exactly
    >>> bool(torch.allclose(ra, a)), bool(torch.allclose(rb, a))
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from headwidget.analysis.variants import VariantSpec

__all__ = [
    "MERGE_GAMMA",
    "MERGE_T",
    "layer_groups",
    "merge_elements",
    "minicache_merge",
    "rotate",
    "shared_svd",
    "shared_svd_is_exact",
    "within_layer",
    "xkv_elements",
]

#: MiniCache's SLERP interpolation parameter ``t`` (xKV's reimplementation defaults to 0.5).
MERGE_T = 0.6
#: MiniCache's retention threshold ``γ`` (xKV's reimplementation's default too).
MERGE_GAMMA = 0.05


def layer_groups(layers: Sequence[int], group: int) -> list[list[int]]:
    """``layers`` sorted, cut into runs of adjacent layers, each run into groups of ``group`` (a last
    shorter group of a run keeps what is left).

    >>> layer_groups([5, 4, 10, 11, 12], 2)
    [[4, 5], [10, 11], [12]]
    """
    ordered = sorted(set(layers))
    runs: list[list[int]] = []
    for layer in ordered:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return [run[i : i + group] for run in runs for i in range(0, len(run), group)]


def within_layer(spec: VariantSpec) -> str:
    """The canonical spec of what ``spec`` does within one layer: the conversion before its cross-layer
    part (``model`` for a cross-layer part alone), which a layer alone in its group keeps (under
    ``share`` and ``merge``; ``xkv`` compresses it alone).

    >>> from headwidget.analysis.variants import parse_variant
    >>> [within_layer(parse_variant(s)) for s in ("share:2", "mqa+align+share:2", "gqa:2+xkv:8/2", "mqa")]
    ['model', 'mqa+align', 'gqa:2', 'mqa']
    """
    if spec.cross is None:
        return spec.text
    return spec.text[: -len(spec.cross.text)].rstrip("+") or "model"


def _work(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def minicache_merge(
    first: torch.Tensor, second: torch.Tensor, *, t: float = MERGE_T, gamma: float = MERGE_GAMMA
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MiniCache's merge of two adjacent layers' cached states (module docstring).

    ``first`` (layer l−1) and ``second`` (layer l) are (B, G, T, d) of one kind; returns each layer's
    restored states (in their dtype) and the (B, G, T) mask of retained (unmerged) states.

    >>> x = torch.tensor([[[[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]]], dtype=torch.float64)
    >>> y = torch.tensor([[[[0.0, 2.0], [1.0, 1.0], [1.0, 0.0]]]], dtype=torch.float64)
    >>> rx, ry, kept = minicache_merge(x, y)
    >>> kept.tolist()  # the pair at the smallest distance (identical directions) is retained
    [[[False, False, True]]]
    >>> same = torch.ones(1, 1, 3, 2, dtype=torch.float64)
    >>> minicache_merge(same, 2 * same)[2].tolist()  # all at one distance: d ≤ d_min holds for all
    [[[True, True, True]]]
    >>> [round(v, 4) for v in ry[0, 0, 0].tolist()]  # SLERP at t = 0.6 of 0° and 90°, length 2
    [1.1756, 1.618]
    """
    work = _work(first)
    a, b = first.to(work), second.to(work)
    na, nb = a.norm(dim=-1, keepdim=True), b.norm(dim=-1, keepdim=True)
    ua = a / torch.where(na > 0, na, torch.ones_like(na))
    ub = b / torch.where(nb > 0, nb, torch.ones_like(nb))
    omega = torch.acos((ua * ub).sum(-1, keepdim=True).clamp(-1.0, 1.0))
    sin = torch.sin(omega)
    parallel = omega < 1e-7
    safe = torch.where(parallel, torch.ones_like(sin), sin)
    wa = torch.where(parallel, torch.full_like(omega, 1.0 - t), torch.sin((1.0 - t) * omega) / safe)
    wb = torch.where(parallel, torch.full_like(omega, t), torch.sin(t * omega) / safe)
    direction = wa * ua + wb * ub
    distance = omega[..., 0] / math.pi  # (B, G, T)
    rows = distance.reshape(distance.shape[0], -1)
    low = rows.amin(1).reshape(-1, 1, 1)
    high = rows.amax(1).reshape(-1, 1, 1)
    kept = distance <= low + (high - low) * gamma  # xKV: merged where Ω > threshold
    ra = torch.where(kept[..., None], a, direction * na)
    rb = torch.where(kept[..., None], b, direction * nb)
    return ra.to(first.dtype), rb.to(second.dtype), kept


def shared_svd(caches: Sequence[torch.Tensor], rank: int) -> list[torch.Tensor]:
    """xKV's rank-``rank`` SVD shared by a group of layers' caches (module docstring).

    ``caches`` are (B, G_l, T, d) per layer of the group, one kind; returns each layer's
    reconstruction, in its dtype. A rank at or above ``min(T, Σ G_l·d)`` (:func:`shared_svd_is_exact`)
    reconstructs exactly: the caches come back as they are (copies).

    The truncated SVD ``U_r S_r V_rᵀ`` of a sequence's side-by-side matrix ``X`` (T × W) is the
    projection ``U_r U_rᵀ X`` onto its top-``r`` left singular vectors (``X V_r V_rᵀ`` onto the right
    ones), and those are the top eigenvectors of the Gram ``X Xᵀ`` (``Xᵀ X``, the smaller of the two),
    formed and decomposed in float64, all sequences in one batched call. The Gram squares the
    condition, which float64 holds for float32 caches: the reconstruction agrees with a float64 SVD's
    to float32 rounding (a float32 SVD's is further from it).

    >>> x = torch.randn(2, 1, 5, 3, dtype=torch.float64)
    >>> y = 2 * x  # the same token subspace: rank 3 holds both
    >>> rx, ry = shared_svd([x, y], 3)
    >>> bool(torch.allclose(rx, x)), bool(torch.allclose(ry, y))
    (True, True)
    """
    b, _, t, _ = caches[0].shape
    widths = [int(c.shape[1] * c.shape[3]) for c in caches]
    if shared_svd_is_exact(t, sum(widths), rank):
        return [c.clone() for c in caches]
    joint = torch.cat([c.to(torch.float64).transpose(1, 2).reshape(b, t, -1) for c in caches], dim=-1)
    if t <= joint.shape[-1]:
        top = torch.linalg.eigh(joint @ joint.mT).eigenvectors[..., -rank:]  # U_r (ascending order)
        approx = top @ (top.mT @ joint)
    else:
        top = torch.linalg.eigh(joint.mT @ joint).eigenvectors[..., -rank:]  # V_r
        approx = (joint @ top) @ top.mT
    out = []
    for piece, cache in zip(torch.split(approx, widths, dim=-1), caches, strict=True):
        g, d = int(cache.shape[1]), int(cache.shape[3])
        out.append(piece.reshape(b, t, g, d).transpose(1, 2).to(cache.dtype))
    return out


def shared_svd_is_exact(tokens: int, width: int, rank: int) -> bool:
    """Whether a rank-``rank`` SVD of a ``tokens`` × ``width`` matrix keeps all of it (the rank is at
    least the matrix's): :func:`shared_svd` then changes nothing.

    >>> shared_svd_is_exact(32, 384, 64), shared_svd_is_exact(128, 384, 64)
    (True, False)
    """
    return rank >= min(tokens, width)


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    planes: Sequence[tuple[int, int]],
    offset: int = 0,
    *,
    inverse: bool = False,
) -> torch.Tensor:
    """RoPE on (B, G, T, d) keys: each rotary plane ``(i, j)`` turned by the angle whose cosine and sine
    are ``cos[..., i − offset]``, ``sin[..., i − offset]`` ((B, T, rotary dims) as a rotary embedding
    returns them; ``offset``: the first rotated dim of a head); ``inverse`` turns back: the exact inverse
    of that 2×2 map, whose ``c² + s²`` is 1 only up to the rounding of the angles (transformers forms
    them in float32), so that turning back and again gives the keys the model's own RoPE gives. Dims in
    no plane pass through.

    >>> x = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)
    >>> ang = torch.tensor([[[math.pi / 2, math.pi / 2]]], dtype=torch.float64)
    >>> y = rotate(x, ang.cos(), ang.sin(), [(0, 1)])
    >>> back = rotate(y, ang.cos(), ang.sin(), [(0, 1)], inverse=True)
    >>> [round(v, 6) for v in y.flatten().tolist()], bool(torch.allclose(back, x))
    ([0.0, 1.0], True)
    """
    if not planes:
        return x
    first = torch.tensor([i for i, _ in planes], device=x.device)
    second = torch.tensor([j for _, j in planes], device=x.device)
    c = cos.to(x.dtype)[:, None, :, first - offset]
    s = sin.to(x.dtype)[:, None, :, first - offset]
    if inverse:
        norm = c * c + s * s
        c, s = c / norm, -s / norm
    xi, xj = x[..., first], x[..., second]
    out = x.clone()
    out[..., first] = xi * c - xj * s
    out[..., second] = xj * c + xi * s
    return out


def merge_elements(channels: dict[str, int], heads: int, retained: dict[str, float]) -> float:
    """Cached elements per token of one layer of a MiniCache pair: per kind, half of the merged
    direction (C/2, held once for the pair), one magnitude per KV head (G), and the layer's own exact
    states at the retained share of (head, token) states (``retained[kind]·C``); the retained states'
    indices are not counted.

    >>> merge_elements({"key": 64, "value": 64}, 2, {"key": 0.0, "value": 0.5})
    100.0
    """
    return float(sum(c / 2 + heads + retained.get(kind, 0.0) * c for kind, c in channels.items()))


def xkv_elements(channels: dict[str, int], ranks: dict[str, int], group: int, prefill: int | None) -> float:
    """Cached elements per token of one layer of an xKV group of ``group`` layers: per kind, with its
    rank ``r`` (``ranks``), its share of the shared token factor ``U_r S_r`` (r/g) and, over a prefill
    of ``prefill`` tokens, its block of the basis ``V_rᵀ`` (r·C per sequence, r·C/P per token; left out
    when ``prefill`` is None): the authors' count, or, over a prefill, the kind's C where that is less
    (a rank that keeps the whole P × g·C matrix, :func:`shared_svd_is_exact`, leaves the cache as it
    is; one just below it would store more as factors than as the matrix).

    >>> xkv_elements({"key": 64, "value": 64}, {"key": 8, "value": 8}, 2, 128)  # 2·(8/2 + 8·64/128)
    16.0
    >>> xkv_elements({"key": 64, "value": 64}, {"key": 8, "value": 16}, 2, None)  # 8/2 + 16/2
    12.0
    >>> xkv_elements({"key": 64, "value": 64}, {"key": 8, "value": 40}, 2, 32)  # 8/2 + 8·64/32, and 64
    84.0
    """
    per_token = 0.0
    for kind, c in channels.items():
        r = ranks[kind]
        per_token += min(r / group + r * c / prefill, c) if prefill else r / group
    return float(per_token)
