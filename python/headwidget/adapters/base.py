"""The adapter interface: where one model family keeps its keys, values and attention input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from headwidget.core.layout import AttentionLayout

__all__ = ["Adapter", "Tap", "config_get"]


@dataclass(frozen=True)
class Tap:
    """Record a submodule's output (or its first input, ``on_input=True``) under ``slot``."""

    module: nn.Module
    slot: str
    on_input: bool = False


def config_get(config: Any, *names: str, default: Any = None) -> Any:
    """The first attribute of ``config`` among ``names`` that is set (not None)."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


class Adapter:
    """Knows one family's attention modules; subclasses fill in the family specifics.

    Subclasses set ``family`` and ``model_types`` (the ``config.model_type`` values they accept) and
    implement :meth:`attention_modules`, :meth:`layout`, :meth:`taps` and :meth:`split`.
    """

    family: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    #: Whether the attention receives its keys through ``transformers.AttentionInterface``.
    routes_through_interface: ClassVar[bool] = True
    #: Name of the attribute an attention module must have (used to find them).
    marker: ClassVar[str] = ""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.config: Any = model.config

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return getattr(getattr(model, "config", None), "model_type", None) in cls.model_types

    def attention_modules(self) -> list[nn.Module]:
        """The self-attention module of every layer, in layer order."""
        found = [
            m
            for name, m in self.model.named_modules()
            if hasattr(m, self.marker) and not _is_cross_attention(name, m)
        ]
        if not found:
            raise RuntimeError(f"no attention modules with a {self.marker!r} attribute were found")
        return found

    def layout(self) -> AttentionLayout:
        raise NotImplementedError

    def taps(self, attention: Any) -> list[Tap]:
        """The submodules to record for one layer: slots are read back by :meth:`split`."""
        raise NotImplementedError

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Turn recorded K/V slots into ``{kind: (B, T, C)}`` tensors (key, value, and latent for MLA).

        The ``"input"`` slot never reaches this method: the capture session handles it for every family.
        """
        raise NotImplementedError

    def input_tap(self, attention: Any) -> Tap:
        """The tap whose input is the attention layer's input (what enters the K/V projections)."""
        first = self.taps(attention)[0]
        return Tap(first.module, "input", on_input=True)


def _is_cross_attention(name: str, module: nn.Module) -> bool:
    last = name.rsplit(".", 1)[-1]
    return "cross" in last.lower() or "Cross" in type(module).__name__


def fused_width_check(tensor: torch.Tensor, width: int, what: str) -> None:
    if tensor.shape[-1] != width:
        raise RuntimeError(f"{what}: expected {width} output features, got {tensor.shape[-1]}")
