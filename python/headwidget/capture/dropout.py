"""Eval-mode arithmetic for one thread's forward passes, without touching any module's training flag.

A capture must not see dropout, but switching a model to eval mode would also switch it for every
other thread using the model (a training loop would silently lose its dropout). Instead, the capture
runs its own forward passes inside :class:`NoDropout`, a ``torch`` function mode, which is local to
the thread that enters it: there every dropout function returns its input unchanged and
``scaled_dot_product_attention`` runs with ``dropout_p=0`` — exactly what eval mode computes. In the
supported families dropout is the only thing a module's ``training`` flag changes in a forward pass
without gradients (gradient checkpointing only acts when gradients are enabled). Attention
implementations outside ``torch`` (flash attention) receive their dropout through
``transformers.AttentionInterface``, where :mod:`headwidget.adapters.attention_calls` sets it to 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.overrides import TorchFunctionMode

__all__ = ["NoDropout", "any_training"]

_IDENTITY_IN_EVAL: frozenset[Callable[..., Any]] = frozenset(
    {
        functional.dropout,
        functional.dropout1d,
        functional.dropout2d,
        functional.dropout3d,
        functional.alpha_dropout,
        functional.feature_alpha_dropout,
        torch.dropout,
        torch.dropout_,
        torch.alpha_dropout,
        torch.alpha_dropout_,
        torch.feature_dropout,
        torch.feature_dropout_,
        torch.feature_alpha_dropout,
        torch.feature_alpha_dropout_,
    }
)
_SDPA = functional.scaled_dot_product_attention
_SDPA_DROPOUT_POSITION = 4  # query, key, value, attn_mask, dropout_p, ...


class NoDropout(TorchFunctionMode):
    """Inside this context (in this thread only), dropout is off as in eval mode.

    Example:
        >>> x = torch.ones(4)
        >>> layer = torch.nn.Dropout(0.5).train()
        >>> with NoDropout():
        ...     print(layer(x))
        tensor([1., 1., 1., 1.])
        >>> layer.training
        True
    """

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func in _IDENTITY_IN_EVAL:
            return args[0] if args else kwargs["input"]
        if func is _SDPA:
            if len(args) > _SDPA_DROPOUT_POSITION:
                args = (*args[:_SDPA_DROPOUT_POSITION], 0.0, *args[_SDPA_DROPOUT_POSITION + 1 :])
            elif kwargs.get("dropout_p"):
                kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)


def any_training(modules: list[nn.Module]) -> bool:
    """Whether any of ``modules`` is in training mode.

    >>> any_training([torch.nn.Linear(2, 2).eval()]), any_training([torch.nn.Dropout().train()])
    (False, True)
    """
    return any(m.training for m in modules)
