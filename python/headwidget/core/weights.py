"""Per-head attention weights of one layer, in one convention for every model family.

A :class:`HeadWeights` holds float64 tensors: ``q`` (H, d_h, d), ``k`` (G, d_h, d), ``v`` (G, d_v, d)
with ``k_head = W_K[g] x``, and ``o`` (H, d, d_v) with the layer output ``Σ_h W_O[h] v_h``; biases
``q_bias`` (H, d_h), ``k_bias`` (G, d_h), ``v_bias`` (G, d_v), ``o_bias`` (d,), or None. Query head h
reads KV head ``h // (H / G)``. The adapters (``headwidget.adapters``) read them out of a model; the
analysis (operator space, mechanism conversions) consumes them.

Example:
    >>> import torch
    >>> z = torch.zeros
    >>> w = HeadWeights(q=z(4, 2, 8), k=z(2, 2, 8), v=z(2, 3, 8), o=z(4, 8, 3), mechanism="gqa")
    >>> w.num_heads, w.num_kv_heads, w.kv_of.tolist(), w.kv_elements()
    (4, 2, [0, 0, 1, 1], 10)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["HeadWeights"]


@dataclass(frozen=True)
class HeadWeights:
    """Per-head projections of one attention layer (see the module docstring for the convention).

    ``mechanism`` is ``"mha"``, ``"gqa"``, ``"mqa"`` or ``"mla"``; for MLA, ``latent_dim`` is the
    cached latent width and ``rope_dim`` the width of the decoupled rotary key shared by all heads.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    mechanism: str = "mha"
    rope_dim: int = 0
    latent_dim: int | None = None

    @property
    def num_heads(self) -> int:
        """Query heads."""
        return int(self.q.shape[0])

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads."""
        return int(self.k.shape[0])

    @property
    def kv_of(self) -> torch.Tensor:
        """The KV head each query head reads, (H,).

        >>> z = torch.zeros
        >>> w = HeadWeights(q=z(4, 2, 8), k=z(2, 2, 8), v=z(2, 2, 8), o=z(4, 8, 2))
        >>> w.kv_of.tolist(), w.kv_elements()
        ([0, 0, 1, 1], 8)
        """
        return torch.arange(self.num_heads) // (self.num_heads // self.num_kv_heads)

    def kv_elements(self) -> int:
        """Cached K/V elements per token for this layer as the model stores them.

        >>> z = torch.zeros
        >>> HeadWeights(q=z(4, 6, 8), k=z(4, 6, 8), v=z(4, 4, 8), o=z(4, 8, 4), mechanism="mla",
        ...             rope_dim=2, latent_dim=5).kv_elements()
        7
        """
        if self.mechanism == "mla" and self.latent_dim is not None:
            return self.latent_dim + self.rope_dim
        return self.num_kv_heads * (int(self.k.shape[1]) + int(self.v.shape[1]))
