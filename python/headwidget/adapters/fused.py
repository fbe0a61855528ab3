"""Families whose Q, K and V come out of one fused projection (GPT-2, GPT-NeoX, Falcon, GPT-BigCode).

A subclass names the fused projection (``qkv_module``, also the marker that finds attention modules)
and the output projection (``out_module``), and states the fused layout once in :attr:`fused`; the
taps, the K/V split and where each head's weights sit all follow from it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from headwidget.adapters._heads import FusedLayout, HeadProjections, HeadSlices, head_index
from headwidget.adapters.base import Adapter, Tap

__all__ = ["FusedQKVAdapter"]


class FusedQKVAdapter(Adapter):
    """An adapter whose attention computes ``[q, k, v]`` with one projection laid out as :attr:`fused`."""

    #: Attribute of the attention module that is the fused Q/K/V projection.
    qkv_module: ClassVar[str] = ""
    #: Attribute of the attention module that is the output projection.
    out_module: ClassVar[str] = ""

    @property
    def fused(self) -> FusedLayout:
        """Where each head's q, k and v sit among the fused projection's output features."""
        raise NotImplementedError

    def taps(self, attention: Any) -> list[Tap]:
        """The fused projection's output, recorded as slot ``"qkv"``."""
        return [Tap(getattr(attention, self.qkv_module), "qkv")]

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The key and value features of the recorded fused output."""
        qkv = parts["qkv"]
        return {"key": self.fused.take(qkv, "k"), "value": self.fused.take(qkv, "v")}

    def query_taps(self, attention: Any) -> list[Tap] | None:
        """No taps beyond :meth:`taps`: the queries are part of the recorded fused output."""
        return []

    def split_queries(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The query features of the recorded fused output."""
        return self.fused.take(parts["qkv"], "q")

    def head_projections(self, attention: Any) -> HeadProjections:
        """Q/K/V rows from the fused layout; O columns are the query heads' blocks of the input."""
        f = self.fused
        qkv = getattr(attention, self.qkv_module)
        heads, head_dim = f.q.shape
        return HeadProjections(
            q=HeadSlices(qkv, f.q),
            k=HeadSlices(qkv, f.k),
            v=HeadSlices(qkv, f.v),
            o=HeadSlices(getattr(attention, self.out_module), head_index(heads, head_dim)),
        )
