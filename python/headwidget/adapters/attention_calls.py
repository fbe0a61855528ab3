"""Reach the K/V the attention uses by wrapping the function ``transformers.AttentionInterface`` returns
(the attention calls of every family whose attention goes through it).

Capture and evaluation share this one wrapper: :func:`watch_attention_keys` hands post-RoPE keys to a
capture, and :func:`transform_attention_kv` replaces the ``key_states`` / ``value_states`` a watched
module passes to its attention function (evaluation's fake quantizers) before the original function is
called.

While at least one watcher is active, the registered function for an ``attn_implementation`` is
replaced by a wrapper. For a call made in a thread that has an active watcher, during that watcher's
own forward pass, the wrapper hands the key states of the watched attention modules to a callback
and sets the attention dropout to 0 (what eval mode passes), then calls the original function with
the same arguments, so the model's outputs are bitwise those of eval mode. Every other call (other
modules, other threads, the capturing thread outside its capture's forward) passes straight through.
The original entry is restored when the last watcher of that implementation exits.

Several watchers may be active at once, in different threads (concurrent captures of one model or of
different models): each sees only its own thread's calls. A transforming watcher leaves the dropout
as the caller gave it and hands the original function its own key and value states; watchers of one
thread act in the order they were entered (a key watcher entered first sees the untransformed keys).

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).eval()
    >>> attn, ids, seen = model.model.layers[0].self_attn, torch.tensor([[1, 2, 3]]), []
    >>> with watch_attention_keys(model, {id(attn): 0}, lambda layer, k: seen.append(k.shape)):
    ...     _ = model(ids)
    >>> seen
    [torch.Size([1, 1, 3, 8])]
    >>> with transform_attention_kv(model, {id(attn): 0}, lambda layer, k, v: (k, torch.zeros_like(v))):
    ...     zeroed = model(ids).logits
    >>> bool(torch.allclose(zeroed, model(ids).logits))
    False
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["transform_attention_kv", "watch_attention_keys"]

#: ``transform(layer, key_states, value_states) -> (key_states, value_states)``.
KVTransform = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

_REGISTRY_LOCK = threading.Lock()
_LOCAL = threading.local()


@dataclass
class _Watcher:
    layer_of: dict[int, int]
    on_key: Callable[[int, torch.Tensor], None] | None
    active: Callable[[], bool]
    transform: KVTransform | None = None


@dataclass
class _Installed:
    wrapper: Callable[..., Any]
    original: Callable[..., Any] | None
    had_entry: bool
    users: int


_INSTALLED: dict[str, _Installed] = {}


def _eager_for(module: nn.Module) -> Callable[..., Any]:
    fn: Callable[..., Any] | None = getattr(
        sys.modules[type(module).__module__], "eager_attention_forward", None
    )
    if fn is None:
        raise RuntimeError(f"{type(module).__name__} has no eager attention function to delegate to")
    return fn


def _thread_watchers() -> list[_Watcher]:
    watchers: list[_Watcher] | None = getattr(_LOCAL, "watchers", None)
    if watchers is None:
        watchers = []
        _LOCAL.watchers = watchers
    return watchers


def _make_wrapper(original: Callable[..., Any] | None) -> Callable[..., Any]:
    def watched(module: nn.Module, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        for watcher in tuple(getattr(_LOCAL, "watchers", ())):
            if not watcher.active():
                continue
            layer = watcher.layer_of.get(id(module))
            if watcher.transform is not None:
                if layer is not None:
                    key, value = watcher.transform(layer, key, value)
                continue
            if layer is not None and watcher.on_key is not None:
                watcher.on_key(layer, key)
            if kwargs.get("dropout"):
                kwargs["dropout"] = 0.0
        fn = original if original is not None else _eager_for(module)
        return fn(module, query, key, value, *args, **kwargs)

    return watched


@contextmanager
def watch_attention_keys(
    model: nn.Module,
    layer_of: dict[int, int],
    on_key: Callable[[int, torch.Tensor], None],
    active: Callable[[], bool] = lambda: True,
) -> Iterator[None]:
    """Call ``on_key(layer, key_states)`` for every attention call of a module in ``layer_of``.

    Only calls made in the calling thread while ``active()`` is true are seen (and have their
    attention dropout set to 0). ``layer_of`` maps ``id(attention_module)`` to its layer index;
    ``key_states`` is (B, G, T, d_h).
    """
    with _watching(model, _Watcher(layer_of, on_key, active)):
        yield


@contextmanager
def transform_attention_kv(
    model: nn.Module,
    layer_of: dict[int, int],
    transform: KVTransform,
    active: Callable[[], bool] = lambda: True,
) -> Iterator[None]:
    """Replace the K/V of every attention call of a module in ``layer_of`` by ``transform``'s.

    For a call made in the calling thread while ``active()`` is true, by a module whose id is in
    ``layer_of`` (``id(attention_module) → layer``), the attention function receives
    ``transform(layer, key_states, value_states)`` in place of its key and value states (the post-RoPE
    keys and the values, each (B, G, T, d), before any repetition over query heads); every other
    argument, and every other call, is passed through unchanged. The registry entry is restored on
    exit, also when the forward raised.
    """
    with _watching(model, _Watcher(layer_of, None, active, transform)):
        yield


@contextmanager
def _watching(model: nn.Module, watcher: _Watcher) -> Iterator[None]:
    """Install the wrapper for ``model``'s attention implementation; activate ``watcher`` in this thread."""
    from transformers.modeling_utils import AttentionInterface

    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    mapping: dict[str, Any] = AttentionInterface._global_mapping
    with _REGISTRY_LOCK:
        installed = _INSTALLED.get(impl)
        if installed is None or mapping.get(impl) is not installed.wrapper:
            original: Callable[..., Any] | None = mapping.get(impl)
            installed = _Installed(_make_wrapper(original), original, impl in mapping, 0)
            _INSTALLED[impl] = installed
            mapping[impl] = installed.wrapper
        installed.users += 1
    watchers = _thread_watchers()
    watchers.append(watcher)
    try:
        yield
    finally:
        watchers.remove(watcher)
        with _REGISTRY_LOCK:
            installed.users -= 1
            if installed.users == 0:
                if _INSTALLED.get(impl) is installed:
                    del _INSTALLED[impl]
                if mapping.get(impl) is installed.wrapper:  # never undo someone else's registration
                    if installed.had_entry:
                        mapping[impl] = installed.original
                    else:
                        mapping.pop(impl, None)
