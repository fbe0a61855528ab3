"""Head × head similarity in operator space: how alike the heads' bilinear forms are, no data needed.

Each query head h defines a query-key form ``M_h = W_Q^{hT} W_K^{g(h)}`` (d×d: the logit of query
token x and key token y is ``x M_h yᵀ`` before RoPE) and a value-output form ``M_h = W_O^h W_V^{g(h)}``
(d×d). Their Frobenius inner products need only d_h×d_h products, never the d×d forms:

    <M_i, M_j>_F = Σ_ab [W_Q^i W_Q^{jT}]_ab [W_K^{g(i)} W_K^{g(j)T}]_ab      (QK)
    <M_i, M_j>_F = Σ_ab [W_O^{iT} W_O^j]_ab [W_V^{g(i)} W_V^{g(j)T}]_ab      (OV)

All pairs come from two Gram matrices of the stacked head rows (upper block triangle only). The
Gram is centred across heads (``J G J``, ``J = I − 11ᵀ/H``) and normalised to a correlation in [-1, 1].
The forms are invariant to any invertible re-mixing inside a head (``W_Q → A^{-T} W_Q``,
``W_K → A W_K``; ``W_V → A W_V``, ``W_O → W_O A^{-1}``), so no alignment is needed. Unrelated random
heads give off-diagonal correlations ≈ −1/(H−1) (the centring's own signature).

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))
    >>> s = operator_similarity(model, 0, "ov")
    >>> s.shape, bool(abs(s.diagonal() - 1).max() < 1e-12)
    ((4, 4), True)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from headwidget.analysis.conversions import Conversion
from headwidget.analysis.weights import HeadWeights, head_weights
from headwidget.checks import flag
from headwidget.errors import DegenerateHeadsError, UnknownCircuitError

__all__ = ["CIRCUITS", "operator_gram", "operator_similarity"]

CIRCUITS = ("qk", "ov")
BLOCK_BYTES = 256 * 2**20
F64 = torch.float64


def operator_gram(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``G_ij = Σ_ab [L_i L_jᵀ]_ab [R_i R_jᵀ]_ab`` for head stacks L (H, m, d) and R (H, n, d').

    With ``L = W_Q``, ``R = W_K`` (per query head) this is the Frobenius Gram of the QK forms.

    >>> q, k = torch.randn(3, 2, 5, dtype=torch.float64), torch.randn(3, 2, 5, dtype=torch.float64)
    >>> m = torch.einsum("hmd,hme->hde", q, k).reshape(3, -1)
    >>> bool(torch.allclose(operator_gram(q, k), m @ m.T))
    True
    """
    heads = left.shape[0]
    lf, rf = left.reshape(heads, -1, left.shape[-1]), right.reshape(heads, -1, right.shape[-1])
    m, n = lf.shape[1], rf.shape[1]
    if m != n:
        raise ValueError(f"left and right stacks need the same rows per head, got {m} and {n}")
    gram = torch.zeros(heads, heads, dtype=F64, device=left.device)
    # ≥ 8 row blocks, so only about 9/16 of the full Gram's products are formed
    step = max(1, min(BLOCK_BYTES // (16 * m * m * heads), -(-heads // 8)))
    for r0 in range(0, heads, step):
        r1 = min(heads, r0 + step)
        ll = lf[r0:r1].reshape(-1, lf.shape[-1]) @ lf[r0:].reshape(-1, lf.shape[-1]).T
        rr = rf[r0:r1].reshape(-1, rf.shape[-1]) @ rf[r0:].reshape(-1, rf.shape[-1]).T
        gram[r0:r1, r0:] = (ll * rr).reshape(r1 - r0, m, heads - r0, m).sum((1, 3))
    upper = torch.triu(gram)
    return upper + torch.triu(gram, 1).T


def _stacks(source: Any, layer: int, circuit: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(source, Conversion):
        q, k, o, v = source.q_weight, source.k_weight, source.o_weight, source.v_weight
    else:
        w = source if isinstance(source, HeadWeights) else head_weights(source, layer)
        q, k, o, v = w.q, w.k[w.kv_of], w.o, w.v[w.kv_of]
    if circuit == "qk":
        return q.to(F64), k.to(F64)
    return o.transpose(-2, -1).to(F64), v.to(F64)


def operator_similarity(
    source: nn.Module | HeadWeights | Conversion,
    layer: int = 0,
    circuit: str = "qk",
    *,
    centre: bool = True,
) -> np.ndarray:
    """(H, H) correlation of the heads' QK or OV forms (see the module docstring), float64.

    Args:
        source: a supported model (``layer`` picks the layer), its
            :class:`~headwidget.analysis.weights.HeadWeights`, or a
            :class:`~headwidget.analysis.conversions.Conversion` (its converted K/V, original Q/O).
        circuit: ``"qk"`` or ``"ov"``.
        centre: centre the Gram across heads first (the default); ``False`` gives plain cosines.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1))
        >>> s = operator_similarity(model, 0, "qk")  # MQA: the heads share one key projection
        >>> s.shape, bool(((s >= -1) & (s <= 1)).all())
        ((4, 4), True)

    Raises:
        DegenerateHeadsError: a head whose (centred) form is zero, e.g. all heads identical.
    """
    if not isinstance(circuit, str) or circuit not in CIRCUITS:
        raise UnknownCircuitError(f"unknown circuit {circuit!r}; choose 'qk' or 'ov'")
    centre = flag("centre", centre)
    gram = operator_gram(*_stacks(source, layer, circuit))
    heads = gram.shape[0]
    scale = float(torch.diagonal(gram).abs().max())
    if centre:
        j = torch.eye(heads, dtype=F64, device=gram.device) - 1.0 / heads
        gram = j @ gram @ j
    diag = torch.diagonal(gram).clone()
    bad = (diag <= 1e-10 * scale).nonzero().flatten().tolist()
    if bad or scale <= 0:
        what = "centred " if centre else ""
        raise DegenerateHeadsError(
            f"heads {bad} have a zero {what}{circuit.upper()} form (e.g. all heads are identical), so "
            "their correlation is undefined"
            + ("; pass centre=False for plain cosines between the heads' forms" if centre else "")
        )
    std = torch.sqrt(diag)
    corr = (gram / torch.outer(std, std)).clamp(-1.0, 1.0)
    corr.fill_diagonal_(1.0)
    return corr.cpu().numpy()
