"""Capture post-RoPE keys by wrapping the attention function ``transformers.AttentionInterface`` returns.

While the context is active, the registered function for the model's ``attn_implementation`` is
replaced by a wrapper that hands the key states of the watched attention modules to a callback and then
calls the original function with the same arguments, so the model's outputs are bitwise unchanged.
Calls from any other module pass straight through. The original entry is restored on exit.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["watch_attention_keys"]

_REGISTRY_LOCK = threading.RLock()


def _eager_for(module: nn.Module) -> Callable[..., Any]:
    fn: Callable[..., Any] | None = getattr(
        sys.modules[type(module).__module__], "eager_attention_forward", None
    )
    if fn is None:
        raise RuntimeError(f"{type(module).__name__} has no eager attention function to delegate to")
    return fn


@contextmanager
def watch_attention_keys(
    model: nn.Module,
    layer_of: dict[int, int],
    on_key: Callable[[int, torch.Tensor], None],
) -> Iterator[None]:
    """Call ``on_key(layer, key_states)`` for every attention call of a module in ``layer_of``.

    ``layer_of`` maps ``id(attention_module)`` to its layer index; ``key_states`` is (B, G, T, d_h).
    """
    from transformers.modeling_utils import AttentionInterface

    with _REGISTRY_LOCK:  # one post-RoPE capture at a time swaps the process-wide registry entry
        impl = getattr(model.config, "_attn_implementation", None) or "eager"
        mapping: dict[str, Any] = AttentionInterface._global_mapping
        had_entry = impl in mapping
        original: Callable[..., Any] | None = mapping.get(impl)

        def watched(module: nn.Module, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
            layer = layer_of.get(id(module))
            if layer is not None:
                on_key(layer, key)
            fn = original if original is not None else _eager_for(module)
            return fn(module, query, key, value, *args, **kwargs)

        mapping[impl] = watched
        try:
            yield
        finally:
            if had_entry:
                mapping[impl] = original
            else:
                mapping.pop(impl, None)
