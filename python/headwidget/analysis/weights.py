"""Per-head attention weights of one layer of a real model, split the way its forward pass splits them.

``head_weights(model, layer)`` returns float64 CPU tensors in the convention of
:mod:`headwidget.core.weights` (``q`` (H, d_h, d), ``k`` (G, d_h, d), ``v`` (G, d_v, d), ``o`` (H, d, d_v)
and their biases) for every supported family. The model's adapter knows where its heads are: fused
projections are split exactly as the capture splits their outputs. MLA (DeepSeek) is linearised: the
latent RMSNorm is taken as its per-channel weight only. Per-head query/key norms (Qwen3, OLMo2) are
ignored likewise.

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))
    >>> w = head_weights(model, 0)
    >>> tuple(w.q.shape), tuple(w.k.shape), tuple(w.o.shape), w.mechanism
    ((4, 8, 32), (4, 8, 32), (4, 32, 8), 'mha')
"""

from __future__ import annotations

from torch import nn

from headwidget.adapters import adapter_for
from headwidget.checks import layer_index
from headwidget.core.weights import HeadWeights

__all__ = ["HeadWeights", "head_weights"]


def head_weights(model: nn.Module, layer: int) -> HeadWeights:
    """The per-head Q/K/V/O weights of ``layer`` of ``model`` (float64, CPU; see the module doc).

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> bert = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
        ...                             num_attention_heads=4, intermediate_size=64))
        >>> w = head_weights(bert, -1)
        >>> tuple(w.v.shape), tuple(w.v_bias.shape), tuple(w.o_bias.shape)
        ((4, 8, 32), (4, 8), (32,))

    Raises:
        ArgumentError: ``layer`` is not an integer (a float, a bool, a string).
        LayerIndexError: ``layer`` is not a layer of the model.
        UnsupportedModelError: the model's family has no adapter, or its projections are quantised.
    """
    adapter = adapter_for(model)
    return adapter.head_weights(layer_index("layer", layer, adapter.layout().num_layers))
