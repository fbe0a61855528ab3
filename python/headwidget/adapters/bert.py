"""BERT-style encoders (BERT, MiniLM, RoBERTa...): separate ``key`` / ``value`` Linear layers, no RoPE.

The output projection of a layer is not inside the self-attention module: it is the sibling
``output.dense`` of the enclosing ``attention`` block.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headwidget.adapters._heads import HeadProjections, HeadSlices, head_index
from headwidget.adapters.base import Adapter, Tap
from headwidget.core.layout import AttentionLayout


class BertAdapter(Adapter):
    family = "bert"
    causal = False
    model_types = ("bert", "roberta", "xlm-roberta", "camembert", "electra")
    marker = "key"

    def attention_modules(self) -> list[nn.Module]:
        return [m for m in super().attention_modules() if hasattr(m, "value") and hasattr(m, "query")]

    def layout(self) -> AttentionLayout:
        c = self.config
        heads = c.num_attention_heads
        return self.heads_layout(heads, heads, c.hidden_size // heads, c.hidden_size)

    def taps(self, attention: Any) -> list[Tap]:
        return [Tap(attention.key, "key"), Tap(attention.value, "value")]

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"key": parts["key"], "value": parts["value"]}

    def head_projections(self, attention: Any) -> HeadProjections:
        heads = self.config.num_attention_heads
        d = self.config.hidden_size // heads
        return HeadProjections(
            q=HeadSlices(attention.query, head_index(heads, d)),
            k=HeadSlices(attention.key, head_index(heads, d)),
            v=HeadSlices(attention.value, head_index(heads, d)),
            o=HeadSlices(self._output_dense(attention), head_index(heads, d)),
        )

    def _output_dense(self, attention: nn.Module) -> nn.Module:
        """``<block>.output.dense`` for the self-attention module ``<block>.self``."""
        name = next(n for n, m in self.model.named_modules() if m is attention)
        block: Any = self.model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else self.model
        return block.output.dense
