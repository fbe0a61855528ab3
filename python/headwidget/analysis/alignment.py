"""Head × head similarity before and after aligning every pair of heads with a rotation.

For KV heads i, j (of one layer, or of several layers flattened layer-major) the token-cosine score
is ``s_ij = (1/N) Σ_t cos(x_{i,t} Q_ij, x_{j,t}) = tr(Q_ij^T Â_ij)/N`` with ``Â_ij`` the cross block of
the Gram of per-head-normalised vectors. ``before`` uses ``Q = I``; ``after`` the best ``Q`` per pair:
``"orthogonal"`` (Procrustes, nuclear norm) or ``"rope"`` (proper 2×2 rotations per rotary plane,
which commute with RoPE, plus Procrustes on non-rotary dims). See :mod:`.procrustes`.

Fitting a rotation to the same tokens it is scored on is biased upwards: independent random unit
vectors in 32 dims score ≈ 0.49 after alignment at 95 tokens. ``after_heldout`` fits on token split 0
and scores on split 1, and is what the result ``shows`` by default when ``N < 10·d_h²``.

Every score is clamped to ``[−1, 1]``: the Grams are float32 sums, so a score of nearly identical heads
can round a few float32 steps past 1 (clamping is monotone, so ``after ≥ before`` still holds).

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 24)), progress=False, cross_layer=True)
    >>> res = align(stats, layers=[0, 1], kind="key")
    >>> res.after.shape, res.labels[2], res.method, bool((res.after >= res.before - 1e-12).all())
    ((4, 4), 'L1·H0', 'rope', True)
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from headwidget.analysis.pair_scores import pair_block, score_pairs
from headwidget.analysis.procrustes import HeadSplit, fit_rotations
from headwidget.checks import layer_index, optional_flag, whole_numbers
from headwidget.core.kinds import Kind
from headwidget.core.layout import AttentionLayout
from headwidget.errors import (
    ArgumentError,
    HeldOutSplitError,
    MemoryBudgetError,
    RopeAlignmentError,
    UnknownAlignmentMethodError,
    UnknownKindError,
    UnknownMetricError,
)
from headwidget.stats import KVStats

__all__ = ["ALIGN_METHODS", "ALIGN_METRICS", "AlignmentResult", "align"]

ALIGN_METHODS = ("rope", "orthogonal", "none")
ALIGN_METRICS = ("token_cosine", "cosine", "pearson")
ROTATIONS_BUDGET = 2 * 2**30


def _normaliser(trace: torch.Tensor, metric: str, tokens: int) -> torch.Tensor:
    if metric == "token_cosine":
        return torch.full((1, 1), float(tokens), dtype=trace.dtype, device=trace.device)
    tr = torch.diagonal(trace)
    return torch.sqrt(torch.outer(tr, tr).clamp_min(0))


def _divide(num: torch.Tensor, den: torch.Tensor) -> np.ndarray:
    den = den.expand_as(num)
    out = torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), float("nan"))
    return out.clamp(-1.0, 1.0).cpu().numpy()  # float32 Grams can put a score a few ulps past ±1


@dataclass
class AlignmentResult:
    """Head × head scores over the flattened (layer, KV head) set, layer-major (see the module doc).

    ``before``/``after``/``after_heldout`` are (P, P) float64 arrays; ``scoring`` says which of ``after``
    (``"in-sample"``) and ``after_heldout`` (``"held-out"``) a view should display, see :attr:`shown`.
    """

    before: np.ndarray
    after: np.ndarray
    after_heldout: np.ndarray | None
    labels: list[str]
    scoring: str  # "held-out" or "in-sample": which scores `shown` holds
    token_count: int
    split_counts: tuple[int, int]
    method: str
    kind: Kind
    metric: str
    _fit: tuple[torch.Tensor, ...] = field(repr=False)
    _split: HeadSplit = field(repr=False)

    @property
    def shown(self) -> np.ndarray:
        """The matrix a view should draw: ``after_heldout`` when ``scoring == "held-out"``."""
        if self.scoring == "held-out" and self.after_heldout is not None:
            return self.after_heldout
        return self.after

    def rotation(self, i: int, j: int) -> torch.Tensor:
        """The d_h×d_h rotation ``Q_ij`` (fitted on all tokens) that aligns head i onto head j.

        The score is ``mean_t cos(x_i Q_ij, x_j)`` with token vectors as rows; ``Q_ii = I``.
        """
        d = self._split.head_dim
        if i == j or self.method == "none":
            return torch.eye(d, dtype=torch.float64)
        device = self._fit[0].device
        block = pair_block(self._fit, d, torch.tensor([i], device=device), torch.tensor([j], device=device))
        return fit_rotations(block, self._split)[0].cpu()

    @cached_property
    def rotations(self) -> torch.Tensor:
        """All ``Q_ij`` as a (P, P, d_h, d_h) tensor; ``Q_ji = Q_ij^T`` and ``Q_ii = I``."""
        d = self._split.head_dim
        heads = len(self.labels)
        need = 8 * heads * heads * d * d
        if need > ROTATIONS_BUDGET:
            raise MemoryBudgetError(
                f"all {heads}×{heads} rotations of {d}×{d} need {need / 2**30:.1f} GiB; "
                "ask for single pairs with .rotation(i, j)"
            )
        out = torch.eye(d, dtype=torch.float64).repeat(heads, heads, 1, 1)
        if self.method != "none" and heads > 1:
            ii, jj = torch.triu_indices(heads, heads, 1)
            device = self._fit[0].device
            q = fit_rotations(pair_block(self._fit, d, ii.to(device), jj.to(device)), self._split).cpu()
            out[ii, jj] = q
            out[jj, ii] = q.transpose(-2, -1)
        return out


def _resolve_method(method: str | None, kind: Kind, layout: AttentionLayout) -> str:
    rope = layout.rope
    if method is None:
        return "rope" if kind in ("key", "key_post") and rope.uses_rope else "orthogonal"
    if method not in ALIGN_METHODS:
        raise UnknownAlignmentMethodError(
            f"unknown alignment method {method!r}; choose one of {', '.join(ALIGN_METHODS)}"
        )
    if method == "rope" and (kind not in ("key", "key_post") or not rope.uses_rope):
        what = "this model has no rotary position embedding" if not rope.uses_rope else f"{kind} heads"
        raise RopeAlignmentError(
            f"RoPE-compatible alignment needs rotary key heads, but {what} are not rotated; "
            "use method='orthogonal'"
        )
    return method


def align(
    stats: KVStats,
    layers: int | Sequence[int],
    kind: Kind = "key",
    method: str | None = None,
    metric: str = "token_cosine",
    heldout: bool | None = None,
) -> AlignmentResult:
    """Align every pair of KV heads of ``layers`` and score them before and after.

    Args:
        stats: :class:`~headwidget.stats.KVStats`; several layers need its cross-layer statistics.
        layers: a layer or a list of layers (flattened layer-major, labels ``"L3·H5"``).
        kind: ``"key"``, ``"key_post"`` or ``"value"``.
        method: ``"rope"`` (default for keys of RoPE models), ``"orthogonal"`` (default otherwise) or
            ``"none"``.
        metric: ``"token_cosine"`` (the paper's score, held-out capable), or ``"cosine"`` /
            ``"pearson"``: Frobenius cosine of the uncentred / centred Gram blocks, in-sample only.
        heldout: ``True`` to show held-out scores, ``False`` for in-sample, ``None`` for held-out
            exactly when ``N < 10·d_h²`` and both token splits are non-empty.

    Example:
        >>> import torch, headwidget
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4)).eval()
        >>> stats = headwidget.capture(gpt2, torch.randint(0, 64, (2, 32)), progress=False)
        >>> res = align(stats, 0, "value", heldout=True)
        >>> res.method, res.scoring, res.token_count, res.after_heldout.shape
        ('orthogonal', 'held-out', 64, (4, 4))

    Raises:
        ArgumentError: ``layers`` not an integer or a non-empty list of integers, ``heldout`` not a bool or
            None.
        CrossLayerMissingError: several layers but no cross-layer statistics for them.
        RopeAlignmentError: ``method="rope"`` for heads that RoPE does not rotate.
        HeldOutSplitError: ``heldout=True`` without two non-empty splits (or for a Gram metric).
    """
    if metric not in ALIGN_METRICS:
        raise UnknownMetricError(
            f"metric {metric!r} cannot be aligned; choose one of {', '.join(ALIGN_METRICS)} "
            "(CKA is rotation-invariant and needs no alignment: use head_similarity)"
        )
    heldout = optional_flag("heldout", heldout)
    if not isinstance(stats, KVStats):
        raise ArgumentError(
            f"stats must be a KVStats (from headwidget.capture or KVStats.load), got {type(stats).__name__}"
        )
    layout = stats.meta.layout
    method = _resolve_method(method, kind, layout)
    one = isinstance(layers, numbers.Integral) and not isinstance(layers, bool)
    given = whole_numbers("layers", [layers] if one else layers, maximum=2**63, hint="a layer or a list")
    layer_list = [layer_index("layers", layer, layout.num_layers) for layer in given]
    if not layer_list:
        raise ArgumentError("layers is empty; give a layer, or a list of layers to compare heads across")
    moments = stats.head_moments(layer_list if len(layer_list) > 1 else layer_list[0], kind)
    if moments.head_dim is None:
        raise UnknownKindError(f"kind {kind!r} is not split into heads; align 'key', 'key_post' or 'value'")
    d = moments.head_dim
    planes = layout.rope.planes(post=kind == "key_post") if method == "rope" else []
    split = HeadSplit.make(d, planes)
    n, n_split = moments.count, moments.split_count
    if metric == "token_cosine":  # the two token splits: their sum is the Gram of all tokens
        fit: tuple[torch.Tensor, ...] = (moments.token_gram(0), moments.token_gram(1))
    else:
        fit = (moments.gram() if metric == "cosine" else moments.m2,)
    can_hold_out = metric == "token_cosine" and min(n_split) > 0
    if heldout and not can_hold_out:
        raise HeldOutSplitError(
            f"held-out scores need the token_cosine metric and two non-empty token splits (got "
            f"metric {metric!r}, splits {n_split}); use heldout=False or capture more tokens"
        )
    want_held = can_hold_out and heldout is not False
    raw = score_pairs(fit, split, best=method != "none", heldout=want_held)
    norm = _normaliser(raw.trace, metric, n)
    before = _divide(raw.trace, norm)
    after = before if raw.best is None else _divide(raw.best, norm)
    held = None
    if want_held and raw.heldout_trace is not None:
        held_raw = raw.heldout_trace if raw.heldout is None else raw.heldout
        held = _divide(held_raw, _normaliser(raw.heldout_trace, metric, n_split[1]))
    show_held = held is not None and (heldout is True or (heldout is None and n < 10 * d * d))
    heads = moments.channels // d // len(layer_list)
    labels = [f"L{layer}·H{g}" for layer in layer_list for g in range(heads)]
    return AlignmentResult(
        before=before,
        after=after,
        after_heldout=held,
        labels=labels,
        scoring="held-out" if show_held else "in-sample",
        token_count=n,
        split_counts=n_split,
        method=method,
        kind=kind,
        metric=metric,
        _fit=fit,
        _split=split,
    )
