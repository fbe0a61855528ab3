"""Choosing how a test's captures form their Grams on the CPU: oneDNN's chunked products for every
width (the route of the joint Gram of many cross layers, ``headwidget.moments.folding``), so that tiny
models exercise it against their float64 references."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from headwidget.moments import folding


@contextmanager
def onednn_route(on: bool = True) -> Iterator[None]:
    """Within it, every float32 Gram on the CPU goes through oneDNN (``on``; skips the test where this
    PyTorch lacks it), or the batched BLAS products as usual (not ``on``)."""
    if not on:
        yield
        return
    if folding.onednn_linear() is None:
        pytest.skip("this PyTorch has no oneDNN matmul")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(folding, "ONEDNN_CHANNELS", 1)
        yield
