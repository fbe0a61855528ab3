"""Partial RoPE for Llama-family attention: each KV head rotates only the dims its mask keeps.

:func:`install_partial_rope` switches one attention module to a subclass of its own class whose forward
is the Llama forward with one change: RoPE's ``cos``/``sin`` become ``1``/``0`` on the dims a KV head
does not keep (the query heads reading that KV head follow its mask), so those dims pass unrotated.
The mask is a non-persistent buffer ``rope_keep`` (G, d_h): neither a transformers config nor its
Llama code can hold it, so a checkpoint of the weights alone would load back rotating every dim.
:func:`partial_rope_mask` tells such an attention apart (``headwidget.apply`` makes ``save_pretrained``
of a model with one refuse); ``torch.save(model.state_dict())`` leaves the mask out as well.

Only the model types whose attention forward is Llama's (:data:`PARTIAL_ROPE_MODEL_TYPES`) get it:
Llama, Mistral and Qwen2 (the last two pass their sliding window to the attention function).

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).eval()
    >>> ids = torch.tensor([[1, 2, 3, 4]])
    >>> before = model(ids).logits
    >>> install_partial_rope(model.model.layers[0].self_attn, torch.ones(1, 8, dtype=torch.bool))
    >>> bool(torch.equal(model(ids).logits, before)), type(model.model.layers[0].self_attn).__name__
    (True, 'PartialRopeLlamaAttention')
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import torch
from torch import nn

__all__ = ["PARTIAL_ROPE_MODEL_TYPES", "install_partial_rope", "masked_rope", "partial_rope_mask"]

#: Model types whose attention forward is reproduced here (with how each passes its sliding window).
PARTIAL_ROPE_MODEL_TYPES = ("llama", "mistral", "qwen2")

_CLASSES: dict[type, type] = {}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def masked_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """HF half-split RoPE on (B, heads, T, d_h) with per-head masks ``keep`` (heads, d_h).

    ``cos``/``sin`` are (B, T, d_h) as the rotary embedding returns them; dims outside ``keep`` are
    left as they are.

    >>> x = torch.randn(1, 2, 3, 4)
    >>> ang = torch.rand(1, 3, 4)
    >>> out = masked_rope(x, ang.cos(), ang.sin(), torch.tensor([[True] * 4, [False] * 4]))
    >>> bool(torch.equal(out[:, 1], x[:, 1])), bool(torch.equal(out[:, 0], x[:, 0]))
    (True, False)
    """
    mask = keep.to(x.device)[None, :, None, :]
    c = torch.where(mask, cos[:, None], torch.ones((), dtype=cos.dtype, device=cos.device))
    s = torch.where(mask, sin[:, None], torch.zeros((), dtype=sin.dtype, device=sin.device))
    return x * c + _rotate_half(x) * s


def _forward(
    self: Any,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    cache: Any = None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The Llama attention forward with per-KV-head partial RoPE (see the module docstring)."""
    cache = cache if cache is not None else past_key_values
    module = sys.modules[type(self).__mro__[1].__module__]
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    keep: torch.Tensor = self.rope_keep
    query = masked_rope(query, cos, sin, keep.repeat_interleave(self.num_key_value_groups, dim=0))
    key = masked_rope(key, cos, sin, keep)
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
    interface = module.ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, module.eager_attention_forward
    )
    model_type = getattr(self.config, "model_type", "llama")
    if model_type == "qwen2":
        kwargs["sliding_window"] = self.sliding_window
    elif model_type == "mistral":
        kwargs["sliding_window"] = getattr(self.config, "sliding_window", None)
    out, weights = interface(
        self,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **kwargs,
    )
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), weights


def _partial_rope_class(cls: type) -> type:
    """A subclass of the attention class ``cls`` with the partial-RoPE forward (one per class)."""
    if cls in _CLASSES.values():
        return cls
    made = _CLASSES.get(cls)
    if made is None:
        name = f"PartialRope{cls.__name__}"
        made = type(name, (cls,), {"forward": _forward, "__module__": __name__, "__qualname__": name})
        globals()[name] = made  # so that pickle finds it (and :func:`__getattr__` in a fresh process)
        _CLASSES[cls] = made
    return made


def __getattr__(name: str) -> type:
    """``PartialRope<Attention>`` for a pickle loaded in a process that has not made that class yet."""
    base = name.removeprefix("PartialRope")
    if base != name:
        for model_type in PARTIAL_ROPE_MODEL_TYPES:
            module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
            cls = getattr(module, base, None)
            if isinstance(cls, type):
                return _partial_rope_class(cls)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install_partial_rope(attention: nn.Module, keep: torch.Tensor) -> None:
    """Make ``attention`` rotate only the dims ``keep`` (G, d_h) marks, per KV head (in place)."""
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or keep.dim() != 2:
        raise TypeError("keep must be a (KV heads, head_dim) bool tensor")
    attention.__class__ = _partial_rope_class(type(attention))
    device = next(attention.parameters()).device
    if "rope_keep" in dict(attention.named_buffers(recurse=False)):
        attention.rope_keep = keep.to(device)
    else:
        attention.register_buffer("rope_keep", keep.to(device), persistent=False)


def partial_rope_mask(attention: nn.Module) -> torch.Tensor | None:
    """The mask (G, d_h) :func:`install_partial_rope` gave ``attention``; None for an attention that
    applies RoPE as its own class does.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    >>> attention = model.model.layers[0].self_attn
    >>> partial_rope_mask(attention) is None
    True
    >>> install_partial_rope(attention, torch.tensor([[True, False] * 4]))
    >>> partial_rope_mask(attention).sum().item()
    4
    """
    if type(attention) not in _CLASSES.values():
        return None
    return attention.get_buffer("rope_keep")
