"""A model's layer blocks (the ModuleList entries that hold each attention), recording and replaying them.

Every supported family keeps its layers in one ``nn.ModuleList`` (``model.layers``, ``transformer.h``,
``encoder.layer``...) and calls them in order, each taking the previous one's output. So the output of
layer ``ℓ − 1`` recorded on the original model can stand in for layers ``0..ℓ − 1`` of a model whose
layer ``ℓ`` was converted: :class:`Replay` modules put in their place return it without computing
anything, and the model's own forward does the rest (masks, positions, later layers, final norm, head).

Example:
    >>> import torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from headwidget.adapters import adapter_for
    >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4)).eval()
    >>> blocks = LayerBlocks.of(gpt2, adapter_for(gpt2))
    >>> blocks.container_name, len(blocks.modules(gpt2))
    ('transformer.h', 3)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headwidget.adapters import Adapter

__all__ = ["LayerBlocks", "Replay", "ReplayFeed", "first_tensor"]


def first_tensor(output: Any) -> torch.Tensor | None:
    """The hidden states in a block's output (a tensor, or the first entry of a tuple/ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


@dataclass(frozen=True)
class LayerBlocks:
    """Where a model keeps its layers: the ModuleList ``container_name`` and each layer's index in it."""

    container_name: str
    index: list[int]

    @classmethod
    def of(cls, model: nn.Module, adapter: Adapter) -> LayerBlocks:
        names = {id(m): n for n, m in model.named_modules()}
        containers, index = set(), []
        for attention in adapter.attention_modules():
            parts = names[id(attention)].split(".")
            cut = max(i for i, p in enumerate(parts) if p.isdigit())
            containers.add(".".join(parts[:cut]))
            index.append(int(parts[cut]))
        if len(containers) != 1:
            raise RuntimeError(
                f"the layers of {type(model).__name__} are not in one ModuleList: {containers}"
            )
        return cls(containers.pop(), index)

    def container(self, model: nn.Module) -> nn.ModuleList:
        found = model.get_submodule(self.container_name)
        if not isinstance(found, nn.ModuleList):
            raise RuntimeError(f"{self.container_name} of {type(model).__name__} is not a ModuleList")
        return found

    def modules(self, model: nn.Module) -> list[nn.Module]:
        """The block of every layer, in layer order."""
        container = self.container(model)
        return [container[i] for i in self.index]

    @contextmanager
    def recording(self, model: nn.Module, sink: list[Any]) -> Iterator[None]:
        """Append every block's output to ``sink`` during the forwards this thread runs inside (hooks
        removed after; other threads' forwards of ``model`` are not recorded)."""
        owner = threading.get_ident()

        def record(_m: nn.Module, _a: Any, out: Any) -> None:
            if threading.get_ident() == owner:
                sink.append(out)

        handles = [b.register_forward_hook(record) for b in self.modules(model)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


class ReplayFeed:
    """Recorded block outputs of several forwards of one batch (a prefill and a scored forward): a
    :class:`Replay` whose slot holds a feed returns the output of the forward in progress, which
    :meth:`next_forward` (a forward pre-hook of the model) moves on."""

    def __init__(self, outputs: list[Any]) -> None:
        self.outputs = outputs
        self.index = -1

    def next_forward(self) -> None:
        self.index += 1

    def current(self) -> Any:
        return self.outputs[self.index]


class Replay(nn.Module):
    """Stands in for a layer block: returns ``slot[0]`` (a recorded block output, or the current output
    of a :class:`ReplayFeed`) without computing.

    Attribute reads it does not have fall through to the block it replaces (some models read a
    block's attributes, such as its attention type, in their forward).
    """

    def __init__(self, replaced: nn.Module, slot: list[Any]) -> None:
        super().__init__()
        object.__setattr__(self, "_replaced", replaced)
        object.__setattr__(self, "_slot", slot)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        value = self._slot[0]
        return value.current() if isinstance(value, ReplayFeed) else value

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_replaced"), name)
