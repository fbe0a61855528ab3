"""Convert one layer's key/value projections to another KV-cache mechanism, and price the result.

Specs (per layer, cache elements per token with K and V together, ``d_v`` the value head size):

============  ==============================================  ================================
spec          effective per-head K (and V alike)               cached elements per token
============  ==============================================  ================================
``model``     the layer as the model has it                    as the model stores it
``mha``       every query head keeps its own K/V               ``H·(d_h + d_v)``
``gqa:G``     mean over contiguous groups of ``H/G`` heads    ``G·(d_h + d_v)``
``mqa``       mean over all heads (``gqa:1``)                  ``d_h + d_v``
``lrkv:r``    shared mean + rank-r truncation of each          ``d_h + d_v + 2·G·r``
              head's residual ``W_h − mean``
``mla:d_c``   rank-``d_c`` factorisation of the stacked        ``d_c`` (+ ``d_h^R``: 0 here)
              ``[W_K^1; …; W_K^H; W_V^1; …; W_V^H]``
============  ==============================================  ================================

``H`` counts the query heads, ``G`` the KV heads the layer has (``G = H`` for MHA). LRKV caches the
shared head's K and V and each KV head's rank-r coordinates ``D_g x`` of K and of V: the query heads of
one group read the same KV head, so its residual factors exist once per KV head (the LRKV paper's ``H``
is the KV heads of an MHA model). ``r`` above a head size caches that head size.

Fidelity is ``‖(W − Ŵ) Σ_x^{1/2}‖_F / ‖W Σ_x^{1/2}‖_F`` over the stacked per-query-head weights.
With ``stats`` holding kind ``"input"`` for the layer, ``Σ_x = E[x xᵀ]`` is the uncentred second moment
of the attention input (so the error is the relative RMS error of the projected keys/values over the
captured tokens) and the low-rank fits minimise that weighted error: the best rank-r ``Ŵ`` is
``U_r U_rᵀ W`` with ``U_r`` the top left singular vectors of ``W Σ_x^{1/2}`` (no inverse needed).
Otherwise ``Σ_x = I`` (weight space). Group means are optimal under any weighting. Biases are left out.

MLA conversions put every key dim through the latent (``d_h^R = 0``). A deployable MLA keeps RoPE dims
outside the latent as a shared decoupled key (cost ``d_c + d_h^R``); the ``model`` spec of a DeepSeek
model reports exactly that.

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))
    >>> c = convert(model, 0, "gqa:2")
    >>> tuple(c.k_weight.shape), c.kv_bytes_per_token(), c.reconstruction_error["key"] > 0
    ((4, 8, 32), 64, True)
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.adapters.fingerprint import weight_fingerprint
from headwidget.analysis.variants import VariantSpec, parse_variant, short, spec_text, unreadable_digits
from headwidget.analysis.weights import HeadWeights, head_weights
from headwidget.checks import flag, text_list, whole_number
from headwidget.errors import (
    ArgumentError,
    GroupCountError,
    MechanismSpecError,
    RankRangeError,
    StatsMismatchError,
)
from headwidget.stats import KVStats, config_matches

__all__ = [
    "Conversion",
    "check_stats_source",
    "convert",
    "input_sqrt",
    "mechanism_sweep",
    "parse_spec",
    "top_projection_factors",
]

F64 = torch.float64
SPEC_FORMS = "model, mha, gqa:G, mqa, lrkv:r, mla:d_c"
_CONVERTIBLE = ("model", "mha", "mqa", "gqa", "lrkv", "mla")


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``"gqa:4"`` → ``("gqa", 4)``; ``"mqa"`` → ``("mqa", None)``.

    >>> parse_spec(" LRKV:16 ")
    ('lrkv', 16)
    """
    spec_text(spec, "mechanism spec")
    try:
        parsed = parse_variant(spec)
    except MechanismSpecError as err:
        if not str(err).startswith("cannot read"):
            raise  # a number out of range, a combination that does not exist: the message says which
        raise MechanismSpecError(
            f"cannot read mechanism spec {short(str(spec))}{unreadable_digits(str(spec))}; write one of "
            f"{SPEC_FORMS} with whole numbers, e.g. 'gqa:4', 'lrkv:16', 'mla:512'"
        ) from None
    if (
        not isinstance(parsed, VariantSpec)
        or parsed.mechanism not in _CONVERTIBLE
        or parsed.align
        or parsed.rope
    ):
        raise MechanismSpecError(
            f"{short(str(spec))} is a variant spec, not one mechanism: convert takes one of {SPEC_FORMS} for "
            "one layer; alignment, partial RoPE, quantizers and mixed specs are for headwidget.apply and "
            "headwidget.evaluate"
        )
    return parsed.mechanism, parsed.arg


@dataclass(frozen=True)
class Conversion:
    """One layer converted to a mechanism: effective per-query-head K/V weights, cost and fidelity."""

    spec: str
    mechanism: str
    source: HeadWeights
    k_weight: torch.Tensor
    v_weight: torch.Tensor
    kv_elements: int
    weighting: str
    #: The mechanism's own factors, per query head: LRKV ``k_shared`` (d_h, d), ``k_up`` (H, d_h, r),
    #: ``k_down`` (H, r, d) with ``k_weight[h] = k_shared + k_up[h] @ k_down[h]`` (``v_…`` alike; the
    #: query heads of one KV head hold the same factors, fitted once per KV head); MLA
    #: ``down`` (d_c, d), ``k_up`` (H, d_h, d_c), ``v_up`` (H, d_v, d_c) with ``k_weight[h] =
    #: k_up[h] @ down``. Empty for the other specs.
    factors: dict[str, torch.Tensor] = field(default_factory=dict)
    #: ``E[x xᵀ]^{1/2}`` of the layer's input for a data-aware fit (None: weight-space), which weights
    #: the reconstruction error.
    input_sqrt: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def reconstruction_error(self) -> dict[str, float]:
        """The relative error of the converted K and V weights of the query heads, ``‖(W − Ŵ) Σ^{1/2}‖_F
        / ‖W Σ^{1/2}‖_F`` with Σ the input's second moment (data-aware) or ``Σ = I`` (weight-space).
        Computed on first use: applying and evaluating a variant never needs it."""
        kv_of = self.source.kv_of
        return {
            "key": _error(self.source.k[kv_of], self.k_weight, self.input_sqrt),
            "value": _error(self.source.v[kv_of], self.v_weight, self.input_sqrt),
        }

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes of K/V cache per token for this layer in ``dtype``.

        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))
        >>> convert(gpt2, 0, "mla:12").kv_bytes_per_token(torch.float32)
        48
        """
        return self.kv_elements * dtype.itemsize

    @property
    def q_weight(self) -> torch.Tensor:
        """The (unchanged) query weights (H, d_h, d)."""
        return self.source.q

    @property
    def o_weight(self) -> torch.Tensor:
        """The (unchanged) output weights (H, d, d_v)."""
        return self.source.o


def check_stats_type(stats: Any) -> None:
    """Refuse ``stats`` that are neither a :class:`~headwidget.stats.KVStats` nor None (ArgumentError).

    >>> check_stats_type(None)
    """
    if stats is not None and not isinstance(stats, KVStats):
        raise ArgumentError(
            "stats must be a KVStats (from headwidget.capture or KVStats.load) or None, "
            f"got {type(stats).__name__}"
        )


def _source_weights(model: nn.Module | HeadWeights, layer: Any) -> tuple[HeadWeights, int]:
    """The weights of ``layer`` (of a model, or ``model`` itself) and the layer as an int."""
    if isinstance(model, HeadWeights):
        return model, whole_number("layer", layer, minimum=-(2**31), hint="the layer the weights are of")
    w = head_weights(model, layer)
    return w, int(layer)


def check_stats_source(
    model: nn.Module | HeadWeights,
    stats: KVStats | None,
    *,
    allow_other_weights: bool = False,
    opt_out: bool = True,
) -> None:
    """Refuse statistics captured from another model (a data-aware fit would silently be wrong): another
    class or config, or, unless ``allow_other_weights``, other weights (:func:`_check_stats_weights`;
    ``opt_out``: whether the caller takes ``allow_other_weights``, which the message then offers)."""
    check_stats_type(stats)
    allow = flag("allow_other_weights", allow_other_weights)
    if stats is None or isinstance(model, HeadWeights):
        return
    same = stats.meta.model_class == type(model).__name__ and config_matches(
        stats.meta.config_fingerprint, model.config
    )
    if not same:
        raise StatsMismatchError(
            f"these statistics were captured from {stats.meta.model_class} with another config, not from "
            f"this {type(model).__name__}; capture them from this model (inputs=True) or pass stats=None"
        )
    if not allow:
        _check_stats_weights(model, stats, opt_out)


def _check_stats_weights(model: nn.Module, stats: KVStats, opt_out: bool = True) -> None:
    """Refuse statistics whose weight fingerprint is not ``model``'s (over the captured layers).

    Statistics without one (files of older versions) are accepted with a warning, since nothing tells
    their weights apart; a model whose weights cannot be read (quantised, offloaded) is not checked.
    """
    recorded = stats.meta.weights_fingerprint
    actual = weight_fingerprint(adapter_for(model), stats.meta.layers)
    if actual is None or recorded == actual:
        return
    name = type(model).__name__
    if recorded is None:
        warnings.warn(
            "these statistics carry no weight fingerprint (saved by a headwidget from before it recorded "
            "one, or merged with such statistics), so nothing tells whether they come from this "
            f"{name}'s weights or from another model of its architecture (its base model, a fine-tune); "
            "capture them again from this model to have them checked",
            UserWarning,
            stacklevel=3,
        )
        return
    allow = (
        "or, if you mean to use statistics of other weights, pass allow_other_weights=True "
        "(--allow-other-weights on the command line)"
        if opt_out
        else "or show them without the model (a view shows statistics beside the weights they come from "
        "only; apply, evaluate, fit_quantizer, align_model, convert and mechanism_sweep take "
        "allow_other_weights=True)"
    )
    raise StatsMismatchError(
        f"these statistics were captured from other weights than this {name}'s (weight fingerprint "
        f"{recorded} of layers {stats.meta.layers}; this model's is {actual}): the same architecture and "
        "config with other values, such as a base model's statistics given with its fine-tune, so what "
        "is fitted on them (alignments, data-aware LRKV/MLA, codebooks) would not fit this model. Capture "
        "them again from this model (headwidget.capture(model, texts, ...) with the options you need), "
        + allow
    )


def input_sqrt(stats: KVStats | None, layer: int) -> torch.Tensor | None:
    """``E[x xᵀ]^{1/2}`` (float64, CPU) of the attention input of ``layer``, or None when it was not
    captured (no statistics, no kind ``"input"``, or not that layer).

    >>> input_sqrt(None, 0) is None
    True
    """
    if stats is None or "input" not in stats.kinds:
        return None
    if layer < 0:
        layer += stats.meta.layout.num_layers
    if layer not in stats.layers:
        return None
    m = stats.moments(layer, "input")
    cached = _SQRT_CACHE.setdefault(stats, {}).get(layer)
    if cached is not None and cached[0] == m.count:
        return cached[1]
    # on the host, where fits are made: a device holding the statistics keeps no hidden² temporaries
    second = m.to("cpu").gram().to(F64) / max(m.count, 1)
    vals, vecs = torch.linalg.eigh((second + second.T) / 2)
    vals = vals.clamp_min(1e-12 * float(vals.max().clamp_min(0)))
    root = (vecs * vals.sqrt()) @ vecs.T
    _SQRT_CACHE[stats][layer] = (m.count, root)
    return root


#: ``E[x xᵀ]^{1/2}`` per statistics object and layer (with the token count it was computed at), so
#: several fits of one layer factor its input moment once.
_SQRT_CACHE: weakref.WeakKeyDictionary[KVStats, dict[int, tuple[int, torch.Tensor]]]
_SQRT_CACHE = weakref.WeakKeyDictionary()


def top_projection_factors(
    w: torch.Tensor, sqrt: torch.Tensor | None, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(U_r, U_rᵀ w)`` for w (…, m, d): U_r the top-``rank`` left singular vectors of ``w Σ^{1/2}``.

    Their product ``U_r U_rᵀ w`` is the best rank-``rank`` approximation of ``w`` in the weighted
    norm ``‖(w − ŵ) Σ^{1/2}‖_F``. At ``rank ≥ m`` it is ``(I, w)``: exact.

    >>> up, down = top_projection_factors(torch.eye(3, dtype=torch.float64), None, 2)
    >>> tuple(up.shape), tuple(down.shape)
    ((3, 2), (2, 3))
    """
    m = w.shape[-2]
    if rank >= m:
        eye = torch.eye(m, dtype=w.dtype, device=w.device).expand(*w.shape[:-2], m, m)
        return eye.clone(), w.clone()
    weighted = w if sqrt is None else w @ sqrt
    u = torch.linalg.svd(weighted, full_matrices=False)[0][..., :rank]
    return u, u.transpose(-2, -1) @ w


def _error(w: torch.Tensor, approx: torch.Tensor, sqrt: torch.Tensor | None) -> float:
    diff = (w - approx).reshape(-1, w.shape[-1])
    ref = w.reshape(-1, w.shape[-1])
    if sqrt is not None:
        diff, ref = diff @ sqrt, ref @ sqrt
    den = float(torch.linalg.matrix_norm(ref))
    return float(torch.linalg.matrix_norm(diff)) / den if den > 0 else 0.0


def _shared_plus_low_rank(
    w: torch.Tensor, sqrt: torch.Tensor | None, rank: int, kv_of: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """LRKV of the KV heads ``w`` (G, d_h, d) as the query heads read them (``w[kv_of]``, H heads).

    The query heads of one group hold the same weights, and each group has H/G of them, so the mean
    over query heads is the mean over KV heads and each head's residual factors are its KV head's:
    they are fitted once per KV head and repeated.
    """
    shared = w.mean(0)
    up, down = top_projection_factors(w - shared, sqrt, rank)
    up, down = up[kv_of], down[kv_of]
    return shared + up @ down, {"shared": shared, "up": up, "down": down}


def _latent_factors(
    w: HeadWeights, sqrt: torch.Tensor | None, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA's ``(up, down)`` of the query heads' stacked K/V rows, H·(d_h + d_v) of them.

    Each KV head's rows appear once per query head of its group, H/G times: the stack is ``E W``
    with ``W`` the KV heads' own rows and ``E/√(H/G)`` orthonormal, so its best rank-r factors are
    ``(E U_r, U_rᵀ W)`` from those of ``W`` — G/H of the rows to factor (a rank beyond the own rows'
    count takes the whole stack, where the factorisation is exact either way).
    """
    d, heads, d_h = int(w.k.shape[2]), w.num_heads, int(w.k.shape[1])
    own = torch.cat([w.k.reshape(-1, d), w.v.reshape(-1, d)])
    kv_of = w.kv_of
    if rank > own.shape[0] or heads == w.num_kv_heads:
        stacked = torch.cat([w.k[kv_of].reshape(-1, d), w.v[kv_of].reshape(-1, d)])
        return top_projection_factors(stacked, sqrt, rank)
    up, down = top_projection_factors(own, sqrt, rank)
    d_v, keys = int(w.v.shape[1]), w.num_kv_heads * d_h
    key_rows = (kv_of[:, None] * d_h + torch.arange(d_h)).reshape(-1)
    value_rows = keys + (kv_of[:, None] * d_v + torch.arange(d_v)).reshape(-1)
    return up[torch.cat([key_rows, value_rows]).to(up.device)], down


def _group_mean(w: torch.Tensor, groups: int) -> torch.Tensor:
    h = w.shape[0]
    means = w.reshape(groups, h // groups, *w.shape[1:]).mean(1)
    return means.repeat_interleave(h // groups, dim=0)


def convert(
    model: nn.Module | HeadWeights,
    layer: int,
    spec: str,
    stats: KVStats | None = None,
    *,
    allow_other_weights: bool = False,
) -> Conversion:
    """Convert the K/V projections of ``layer`` to the mechanism ``spec`` (see the module docstring).

    Args:
        model: a supported Hugging Face model, or :class:`~headwidget.analysis.weights.HeadWeights`.
        layer: the layer index.
        spec: ``"model"``, ``"mha"``, ``"gqa:G"``, ``"mqa"``, ``"lrkv:r"`` or ``"mla:d_c"``.
        stats: :class:`~headwidget.stats.KVStats` with kind ``"input"`` for data-aware fits and errors,
            captured from ``model`` (statistics of another model are refused).
        allow_other_weights: accept statistics of other weights of the same architecture and config
            (a base model's statistics for its fine-tune), which are otherwise refused.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4))
        >>> full = convert(model, 0, "lrkv:8")
        >>> full.reconstruction_error["key"] < 1e-12, full.weighting
        (True, 'weight-space')

    Raises:
        MechanismSpecError: an unreadable spec. GroupCountError: G does not divide H.
        RankRangeError: r or d_c outside what the layer allows. StatsMismatchError: statistics of
        another model, or of other weights (unless ``allow_other_weights``).
        ArgumentError: ``layer`` is not an integer, or ``stats`` are not a KVStats.
        LayerIndexError: ``layer`` is not a layer of the model.
    """
    name, arg = parse_spec(spec)
    check_stats_source(model, stats, allow_other_weights=allow_other_weights)
    factors: dict[str, torch.Tensor] = {}
    w, layer = _source_weights(model, layer)
    heads, d_h, d_v, d = w.num_heads, int(w.k.shape[1]), int(w.v.shape[1]), int(w.k.shape[2])
    sqrt = input_sqrt(stats, layer)
    k, v = w.k[w.kv_of], w.v[w.kv_of]
    if name in ("gqa", "mqa"):
        groups = 1 if name == "mqa" else int(arg or 0)
        if groups < 1 or heads % groups:
            divisors = ", ".join(str(g) for g in range(1, heads + 1) if heads % g == 0)
            raise GroupCountError(f"gqa:{groups} needs a divisor of the {heads} query heads: {divisors}")
        k_hat, v_hat, elements = _group_mean(k, groups), _group_mean(v, groups), groups * (d_h + d_v)
    elif name == "lrkv":
        rank = int(arg or 0)
        if rank > max(d_h, d_v):
            raise RankRangeError(f"lrkv:{rank}: r must lie in 0..{max(d_h, d_v)} (the head size)")
        (k_hat, kf), (v_hat, vf) = (_shared_plus_low_rank(t, sqrt, rank, w.kv_of) for t in (w.k, w.v))
        factors = {f"{kind}_{name}": t for kind, f in (("k", kf), ("v", vf)) for name, t in f.items()}
        # per token: the shared K and V, and each KV head's coordinates down @ x of K and of V
        elements = d_h + d_v + w.num_kv_heads * (int(kf["down"].shape[-2]) + int(vf["down"].shape[-2]))
    elif name == "mla":
        rank, top = int(arg or 0), heads * (d_h + d_v)
        if not 1 <= rank <= top:
            raise RankRangeError(
                f"mla:{rank}: d_c must lie in 1..{top} (rows of the stacked K/V weights; beyond "
                f"min(rows, d) = {min(top, d)} the factorisation is already exact)"
            )
        up, down = _latent_factors(w, sqrt, rank)
        approx = up @ down
        k_hat, v_hat = approx[: heads * d_h].reshape(k.shape), approx[heads * d_h :].reshape(v.shape)
        factors = {
            "down": down,
            "k_up": up[: heads * d_h].reshape(heads, d_h, -1),
            "v_up": up[heads * d_h :].reshape(heads, d_v, -1),
        }
        elements = rank
    else:
        k_hat, v_hat = k.clone(), v.clone()
        elements = w.kv_elements() if name == "model" else heads * (d_h + d_v)
    mechanism = w.mechanism if name == "model" else name
    canonical = name if arg is None else f"{name}:{arg}"
    weighting = "weight-space" if sqrt is None else "data-aware"
    return Conversion(canonical, mechanism, w, k_hat, v_hat, elements, weighting, factors, sqrt)


def mechanism_sweep(
    model: nn.Module | HeadWeights,
    layer: int,
    specs: Sequence[str],
    stats: KVStats | None = None,
    *,
    allow_other_weights: bool = False,
) -> list[dict[str, Any]]:
    """One row per spec: ``spec``, ``mechanism``, ``kv_bytes_per_token`` (bf16), ``key_error``,
    ``value_error``, ``weighting``. ``stats`` and ``allow_other_weights``: as :func:`convert` takes them.

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))
    >>> [row["kv_bytes_per_token"] for row in mechanism_sweep(model, 0, ["mha", "mqa", "lrkv:2"])]
    [128, 32, 64]
    """
    specs = text_list("specs", specs, example="['mha', 'mqa', 'lrkv:16']", what="mechanism specs")
    check_stats_source(model, stats, allow_other_weights=allow_other_weights)
    w, layer = _source_weights(model, layer)
    rows = []
    for spec in specs:
        c = convert(w, layer, spec, stats)
        rows.append(
            {
                "spec": c.spec,
                "mechanism": c.mechanism,
                "kv_bytes_per_token": c.kv_bytes_per_token(),
                "key_error": c.reconstruction_error["key"],
                "value_error": c.reconstruction_error["value"],
                "weighting": c.weighting,
            }
        )
    return rows
