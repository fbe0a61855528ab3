"""Checks for public arguments: each refuses what would silently give a wrong number, and says what to pass.

Every public function reads its numeric and boolean arguments through these, so the same classes of bad
input get the same treatment everywhere:

- a count (``max_tokens``, ``batch_size``, a layer index…) must be a Python or numpy integer: a float,
  even ``2.0``, a bool, a string such as ``"10"`` or a NaN is refused, never rounded or parsed;
- a number with a range (``minimum`` / ``maximum``) is refused outside it, with the range in the message,
  so a huge value fails before it reaches torch;
- a flag must be a bool (``"yes"`` and ``1`` are refused: ``bool("no")`` is ``True``);
- a real number (a learning rate, a budget fraction) must be finite; numpy's integers and floats are
  numbers like Python's (``np.int64(4096)`` is a count, ``np.float32(0.5)`` a real);
- a model must hold its weights (:func:`model_with_weights`: none on PyTorch's meta device).

The error is :class:`~headwidget.errors.ArgumentError` (a ``ValueError`` and a ``TypeError``) naming the
argument, what was given and what to give.

Example:
    >>> whole_number("max_tokens", 4096, minimum=1)
    4096
    >>> whole_number("max_tokens", "10", minimum=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: max_tokens must be an integer, got the string '10'; pass 10 without ...
    >>> layer_indices("layers", [0, -1], num_layers=4)
    [0, 3]
    >>> flag("per_layer", "yes")
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: per_layer must be True or False, got the string 'yes'
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

from headwidget.errors import ArgumentError, LayerIndexError

__all__ = [
    "HUGE",
    "flag",
    "layer_index",
    "layer_indices",
    "model_with_weights",
    "number",
    "optional_flag",
    "optional_whole_number",
    "real_number",
    "text_list",
    "whole_number",
    "whole_numbers",
]

#: Counts beyond this are refused as typos (2**53: the largest integer every float64 holds exactly).
HUGE = 2**53


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {value!r}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _integral(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def whole_number(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None, hint: str = ""
) -> int:
    """``value`` as an ``int``, or :class:`ArgumentError` (see the module docstring).

    ``maximum`` defaults to :data:`HUGE`; ``hint`` is appended to every message (what the number is for).

    >>> whole_number("batch_size", 0, minimum=1, hint="the sequences per forward")
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: batch_size must be at least 1, got 0 (the sequences per forward)
    """
    tail = f" ({hint})" if hint else ""
    if not _integral(value):
        advice = ""
        if isinstance(value, str) and value.strip().lstrip("+-").isdecimal() and value.strip().isascii():
            advice = f"; pass {value.strip()} without quotes"
        elif _real(value) and math.isfinite(value) and float(value).is_integer():
            advice = f"; pass {int(value)}"
        raise ArgumentError(f"{name} must be an integer, got {_shown(value)}{advice}{tail}")
    number = int(value)
    top = HUGE if maximum is None else maximum
    if minimum is not None and number < minimum:
        raise ArgumentError(f"{name} must be at least {minimum}, got {number}{tail}")
    if number > top:
        raise ArgumentError(f"{name} must be at most {top}, got {number}{tail}")
    return number


def optional_whole_number(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None, hint: str = ""
) -> int | None:
    """``None`` stays ``None``; anything else as :func:`whole_number`.

    >>> optional_whole_number("max_tokens", None, minimum=1) is None
    True
    """
    return None if value is None else whole_number(name, value, minimum=minimum, maximum=maximum, hint=hint)


def real_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    hint: str = "",
) -> float:
    """A finite real ``value`` as a ``float`` (ints allowed; bools, strings, NaN and infinities refused).

    ``minimum``/``maximum`` are inclusive bounds, ``above`` an exclusive lower bound.

    >>> real_number("lr", 3e-4, above=0.0)
    0.0003
    >>> real_number("lr", float("nan"), above=0.0)
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: lr must be a finite number, got nan (float)
    """
    tail = f" ({hint})" if hint else ""
    if not _real(value):
        raise ArgumentError(f"{name} must be a number, got {_shown(value)}{tail}")
    number = float(value)
    if not math.isfinite(number):
        raise ArgumentError(f"{name} must be a finite number, got {_shown(value)}{tail}")
    if minimum is not None and number < minimum:
        raise ArgumentError(f"{name} must be at least {minimum}, got {number}{tail}")
    if maximum is not None and number > maximum:
        raise ArgumentError(f"{name} must be at most {maximum}, got {number}{tail}")
    if above is not None and number <= above:
        raise ArgumentError(f"{name} must be greater than {above}, got {number}{tail}")
    return number


def number(name: str, value: Any, *, hint: str = "") -> int | float:
    """An integer (Python's or numpy's) as an ``int``, any other finite real (numpy's too) as a ``float``:
    for arguments whose meaning depends on which (``allocate``'s budget: a fraction or bytes).

    >>> import numpy as np
    >>> number("budget", np.int64(300)), number("budget", np.float32(0.5)), number("budget", 2)
    (300, 0.5, 2)
    >>> number("budget", "0.5")
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: budget must be a number, got the string '0.5'
    """
    if _integral(value):
        return int(value)
    return real_number(name, value, hint=hint)


def flag(name: str, value: Any) -> bool:
    """``value`` if it is a bool (numpy's too), else :class:`ArgumentError`.

    >>> flag("progress", False)
    False
    """
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise ArgumentError(f"{name} must be True or False, got {_shown(value)}")


def optional_flag(name: str, value: Any) -> bool | None:
    """``None`` stays ``None`` (an automatic choice); anything else as :func:`flag`.

    >>> optional_flag("heldout", None) is None, optional_flag("heldout", True)
    (True, True)
    >>> optional_flag("heldout", 1)
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: heldout must be True, False or None, got 1 (int)
    """
    if value is None:
        return None
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise ArgumentError(f"{name} must be True, False or None, got {_shown(value)}")


def whole_numbers(
    name: str, values: Any, *, minimum: int | None = None, maximum: int | None = None, hint: str = ""
) -> list[int]:
    """A list of integers, each as :func:`whole_number` (a string or a non-iterable is refused).

    >>> whole_numbers("group_sizes", (1, 2), minimum=1)
    [1, 2]
    >>> whole_numbers("group_sizes", None, minimum=1)
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: group_sizes must be a list of integers, got None (NoneType)
    """
    tail = f" ({hint})" if hint else ""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ArgumentError(f"{name} must be a list of integers, got {_shown(values)}{tail}")
    return [
        whole_number(f"{name}[{position}]", value, minimum=minimum, maximum=maximum, hint=hint)
        for position, value in enumerate(values)
    ]


def text_list(name: str, values: Any, *, example: str, what: str = "specs") -> list[str]:
    """A list of strings; a bare string is refused with the list to pass instead.

    A bare string is iterable letter by letter, so ``"mqa"`` would silently be ``["m", "q", "a"]``.

    >>> text_list("variants", ("model", "mqa"), example="['mqa']")
    ['model', 'mqa']
    >>> text_list("variants", "mqa", example="['mqa']")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: variants must be a list of specs, got the string 'mqa'; pass a list: ...
    """
    if isinstance(values, str):
        raise ArgumentError(
            f"{name} must be a list of {what}, got {_shown(values)}; pass a list: {[values]!r}"
        )
    if isinstance(values, bytes) or not isinstance(values, Iterable):
        raise ArgumentError(f"{name} must be a list of {what} such as {example}, got {_shown(values)}")
    out = list(values)
    for position, value in enumerate(out):
        if not isinstance(value, str):
            raise ArgumentError(
                f"{name} must hold strings such as {example}, got {_shown(value)} at position {position}"
            )
    return out


def layer_index(name: str, layer: Any, num_layers: int) -> int:
    """One layer index of a model with ``num_layers`` layers, non-negative (negative counts from the end).

    A float, bool or string is an :class:`ArgumentError`; an index outside the model a
    :class:`~headwidget.errors.LayerIndexError`.

    >>> layer_index("layer", -1, num_layers=4)
    3
    >>> layer_index("layer", 1.0, num_layers=4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: layer must be an integer, got 1.0 (float); pass 1 (a layer index ...)
    """
    if not _integral(layer):
        where = f"a layer index of a model with {num_layers} layers, 0..{num_layers - 1}"
        whole_number(name, layer, hint=where)
    index = int(layer)
    if not -num_layers <= index < num_layers:
        raise LayerIndexError(
            f"layer {index} is out of range: the model has {num_layers} layers (0..{num_layers - 1})"
        )
    return index % num_layers


def layer_indices(name: str, layers: Any, num_layers: int) -> list[int]:
    """Sorted, distinct, non-negative layer indices of a model with ``num_layers`` layers.

    ``layers`` is an iterable of integers (negative ones count from the end); a single integer, a
    string, floats, bools and out-of-range indices are refused (:class:`ArgumentError`, or
    :class:`~headwidget.errors.LayerIndexError` for an index outside the model).

    >>> layer_indices("layers", range(2), num_layers=3)
    [0, 1]
    >>> layer_indices("layers", [0.5], num_layers=3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: layers must hold integers, got 0.5 (float) at position 0 (layer ...)
    """
    where = f"layer indices of a model with {num_layers} layers, 0..{num_layers - 1}"
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise ArgumentError(f"{name} must be a list of integers, got {_shown(layers)} ({where})")
    out: set[int] = set()
    for position, layer in enumerate(layers):
        if not _integral(layer):
            raise ArgumentError(
                f"{name} must hold integers, got {_shown(layer)} at position {position} ({where})"
            )
        index = int(layer)
        if not -num_layers <= index < num_layers:
            raise LayerIndexError(
                f"layer {index} is out of range: the model has {num_layers} layers (0..{num_layers - 1})"
            )
        out.add(index % num_layers)
    if not out:
        raise ArgumentError(f"{name} is empty; give at least one layer, or None for every layer ({where})")
    return sorted(out)


def model_with_weights(name: str, model: Any) -> None:
    """Refuse a model whose weights are on PyTorch's meta device (shapes without values: a model made
    under ``torch.device("meta")`` or accelerate's ``init_empty_weights``), naming the first such tensor.
    A model dispatched by accelerate (its hooks bring offloaded weights in for each forward) is left to
    its hooks.

    >>> import torch
    >>> model_with_weights("model", torch.nn.Linear(2, 2))
    >>> with torch.device("meta"):
    ...     empty = torch.nn.Linear(2, 2)
    >>> model_with_weights("model", empty)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: model has no weights to compute with: its parameter weight is on ...
    """
    modules = getattr(model, "modules", None)
    if not callable(modules) or any(hasattr(m, "_hf_hook") for m in modules()):
        return
    for kind in ("parameter", "buffer"):
        for where, tensor in getattr(model, f"named_{kind}s")():
            if getattr(tensor, "is_meta", False):
                raise ArgumentError(
                    f"{name} has no weights to compute with: its {kind} {where} is on the meta device "
                    "(a model made under torch.device('meta') or accelerate's init_empty_weights holds "
                    "shapes only). Load its weights first: from_pretrained without a meta device, or "
                    "model.to_empty(device='cpu') then load_state_dict"
                )
