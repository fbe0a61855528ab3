"""The arguments of :func:`~headwidget.capture` and :func:`~headwidget.estimate`, checked before any hook.

Counts go through :mod:`headwidget.checks`: a float (even ``2.0``), a bool, a string such as ``"10"``,
NaN or a huge value is an :class:`~headwidget.errors.ArgumentError` naming the argument, never rounded
or parsed; flags must be bools (``bool("no")`` is ``True``); ``layers`` and ``cross_layer`` are lists
of integer layer indices (one integer is one layer; a string is refused). ``rope`` and ``samples`` are
checked by :class:`~headwidget.capture.plan.CapturePlan`, ``sample_seed`` by :func:`capture` itself. A
model on the meta device (shapes, no weights) is refused for a capture; :func:`~headwidget.estimate`
takes it.

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from headwidget.adapters import adapter_for
    >>> adapter = adapter_for(GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=50)))
    >>> checked_layers(adapter, "layers", [2, -3]), checked_cross_layer(adapter, True)
    ([0, 2], True)
    >>> checked_layers(adapter, "layers", [0.5])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: layers must hold integers, got 0.5 (float) at position 0 (...)
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

from headwidget.adapters import Adapter
from headwidget.checks import flag, layer_indices, model_with_weights, optional_whole_number, whole_number

__all__ = [
    "CaptureArguments",
    "EstimateArguments",
    "check_capture_arguments",
    "check_estimate_arguments",
    "checked_cross_layer",
    "checked_layers",
]


class CaptureArguments(NamedTuple):
    """The checked arguments of :func:`~headwidget.capture` that it reads as they are."""

    layers: list[int] | None
    cross_layer: list[int] | bool | None
    batch_size: int
    max_length: int
    max_tokens: int | None
    max_memory: int | None
    skip_first_token: bool
    inputs: bool
    progress: bool


class EstimateArguments(NamedTuple):
    """The checked arguments of :func:`~headwidget.estimate`."""

    layers: list[int] | None
    cross_layer: list[int] | bool | None
    batch_size: int
    max_length: int
    inputs: bool


def checked_layers(adapter: Adapter, name: str, layers: Any) -> list[int] | None:
    """None (every layer), or the sorted distinct layer indices of ``layers`` (one integer: one layer)."""
    if layers is None:
        return None
    total = adapter.layout().num_layers
    if isinstance(layers, numbers.Integral) and not isinstance(layers, bool):
        layers = [layers]
    return layer_indices(name, layers, total)


def checked_cross_layer(adapter: Adapter, cross_layer: Any) -> list[int] | bool | None:
    """``True`` (every captured layer), None / ``False`` / an empty list (none), or layer indices."""
    if cross_layer is None or isinstance(cross_layer, bool):
        return cross_layer or None
    if isinstance(cross_layer, (list, tuple, range)) and len(cross_layer) == 0:
        return None
    return checked_layers(adapter, "cross_layer", cross_layer)


def _counts(batch_size: Any, max_length: Any) -> tuple[int, int]:
    return (
        whole_number("batch_size", batch_size, minimum=1, hint="sequences per forward pass"),
        whole_number("max_length", max_length, minimum=1, hint="tokens per sequence"),
    )


def check_capture_arguments(
    adapter: Adapter,
    *,
    layers: Any,
    cross_layer: Any,
    batch_size: Any,
    max_length: Any,
    max_tokens: Any,
    max_memory: Any,
    skip_first_token: Any,
    inputs: Any,
    progress: Any,
) -> CaptureArguments:
    """The arguments of :func:`~headwidget.capture` checked (see the module docstring).

    Raises:
        ArgumentError: an argument of the wrong type or outside its range (the message names it), a
            model without its weights (on the meta device).
        LayerIndexError: a layer outside the model.
    """
    model_with_weights("model", adapter.model)
    batch, length = _counts(batch_size, max_length)
    return CaptureArguments(
        layers=checked_layers(adapter, "layers", layers),
        cross_layer=checked_cross_layer(adapter, cross_layer),
        batch_size=batch,
        max_length=length,
        max_tokens=optional_whole_number("max_tokens", max_tokens, minimum=1, hint="real tokens to capture"),
        max_memory=optional_whole_number("max_memory", max_memory, minimum=1, hint="bytes per device"),
        skip_first_token=flag("skip_first_token", skip_first_token),
        inputs=flag("inputs", inputs),
        progress=flag("progress", progress),
    )


def check_estimate_arguments(
    adapter: Adapter, *, layers: Any, cross_layer: Any, batch_size: Any, max_length: Any, inputs: Any
) -> EstimateArguments:
    """The arguments of :func:`~headwidget.estimate` checked, as :func:`check_capture_arguments` does."""
    batch, length = _counts(batch_size, max_length)
    return EstimateArguments(
        layers=checked_layers(adapter, "layers", layers),
        cross_layer=checked_cross_layer(adapter, cross_layer),
        batch_size=batch,
        max_length=length,
        inputs=flag("inputs", inputs),
    )
