"""The arguments of :func:`~headwidget.evaluation.evaluate` and :func:`~headwidget.evaluation.apply`,
checked and normalised before any work (nothing is fitted, copied or run for a call that is refused).

Counts go through :mod:`headwidget.checks` (a float, a bool, a string such as ``"10"``, NaN or a huge
value is an :class:`~headwidget.errors.ArgumentError`); ``variants`` must be a list of specs (a bare
string would be read letter by letter); ``stats`` a :class:`~headwidget.stats.KVStats` or None;
``dtype`` a floating torch dtype, or the name of one of :data:`DTYPE_NAMES` (mapped to it, as the
command line's ``--dtype`` does). Token ids outside the model's vocabulary are refused by capture's own
check (:func:`check_token_ids`).

Example:
    >>> import torch
    >>> checked_dtype("bfloat16"), checked_dtype(torch.float16)
    (torch.bfloat16, torch.float16)
    >>> checked_dtype("fp16")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: dtype must be a floating torch dtype ... 'float64'; got the string 'fp16'
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from headwidget.adapters import Adapter
from headwidget.capture.feed import check_batch_ids, vocab_size
from headwidget.capture.inputs import Batch
from headwidget.checks import (
    flag,
    model_with_weights,
    optional_whole_number,
    text_list,
    whole_number,
)
from headwidget.errors import ArgumentError
from headwidget.evaluation._model_facts import resolve_layers
from headwidget.stats import KVStats

__all__ = [
    "DTYPE_NAMES",
    "EvaluateArguments",
    "check_apply_arguments",
    "check_evaluate_arguments",
    "check_token_ids",
    "checked_dtype",
    "checked_stats",
]

#: The dtype names ``dtype=`` also takes (those a model is sensibly run and priced in).
DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


class EvaluateArguments(NamedTuple):
    """The checked arguments of :func:`~headwidget.evaluation.evaluate`, in its signature's order."""

    variants: list[str]
    stats: KVStats | None
    layers: list[int]
    per_layer: bool
    dtype: torch.dtype
    batch_size: int
    max_length: int
    max_tokens: int | None
    progress: bool


def checked_dtype(dtype: Any, name: str = "dtype") -> torch.dtype:
    """A floating torch dtype (see the module docstring); anything else is an :class:`ArgumentError`."""
    names = ", ".join(repr(n) for n in DTYPE_NAMES)
    if isinstance(dtype, str):
        key = dtype.strip().removeprefix("torch.")
        if key in DTYPE_NAMES:
            return DTYPE_NAMES[key]
        raise ArgumentError(
            f"{name} must be a floating torch dtype such as torch.bfloat16, or one of the names {names}; "
            f"got the string {dtype!r}"
        )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ArgumentError(
            f"{name} must be a floating torch dtype such as torch.bfloat16 (or one of the names {names}), "
            f"got {dtype!r} ({type(dtype).__name__})"
        )
    return dtype


def checked_stats(stats: Any) -> KVStats | None:
    """``stats`` when it is a :class:`~headwidget.stats.KVStats` or None, else an :class:`ArgumentError`.

    >>> checked_stats(None) is None
    True
    """
    if stats is None or isinstance(stats, KVStats):
        return stats
    raise ArgumentError(
        "stats must be a KVStats (from headwidget.capture or KVStats.load) or None, "
        f"got {type(stats).__name__}"
    )


def check_evaluate_arguments(
    adapter: Adapter,
    variants: Any,
    stats: Any,
    layers: Any,
    per_layer: Any,
    dtype: Any,
    batch_size: Any,
    max_length: Any,
    max_tokens: Any,
    progress: Any,
) -> EvaluateArguments:
    """The arguments of :func:`~headwidget.evaluation.evaluate` checked (see the module docstring).

    Raises:
        ArgumentError: an argument of the wrong type or outside its range (the message names it).
        LayerIndexError: a layer outside the model.
    """
    specs = text_list("variants", variants, example="['model', 'mqa']", what="variant specs")
    if not specs:
        raise ArgumentError("variants is empty; give at least one variant, e.g. ['model', 'mqa']")
    return EvaluateArguments(
        variants=specs,
        stats=checked_stats(stats),
        layers=resolve_layers(adapter, layers),
        per_layer=flag("per_layer", per_layer),
        dtype=checked_dtype(dtype),
        batch_size=whole_number("batch_size", batch_size, minimum=1, hint="sequences per forward pass"),
        max_length=whole_number("max_length", max_length, minimum=1, hint="tokens per sequence"),
        max_tokens=optional_whole_number("max_tokens", max_tokens, minimum=1, hint="real tokens measured"),
        progress=flag("progress", progress),
    )


def check_apply_arguments(adapter: Adapter, stats: Any, layers: Any) -> tuple[KVStats | None, list[int]]:
    """``(stats, layers)`` of :func:`~headwidget.evaluation.apply` checked (the spec is parsed there).

    Raises:
        ArgumentError: ``stats`` is not statistics, ``layers`` is not a list of layer indices, or the
            model has no weights (on the meta device).
        LayerIndexError: a layer outside the model.
    """
    model_with_weights("model", adapter.model)
    return checked_stats(stats), resolve_layers(adapter, layers)


def check_token_ids(model: nn.Module, batches: list[Batch]) -> None:
    """Refuse token ids outside ``model``'s vocabulary (or negative), with :func:`~headwidget.capture`'s
    own check, before any forward (an embedding would raise a bare ``IndexError``).

    Raises:
        CaptureInputError: the message names the batch, the id and the vocabulary size.
    """
    vocab = vocab_size(model)
    for number, batch in enumerate(batches):
        check_batch_ids(batch, number, vocab, model)
