"""``share:g``: cross-layer K/V sharing (CLA, arXiv 2405.12981) on a live model.

In each group of adjacent layers (:func:`~headwidget.analysis.cross_layer.layer_groups`) the first
layer's keys and values are read by the others: while a model runs inside :meth:`SharedKV.active`,
the function ``transformers.AttentionInterface`` returns is wrapped
(:func:`headwidget.adapters.attention_calls.transform_attention_kv`); the first layer of a group hands
on the post-RoPE keys and the values its attention receives — with a KV cache, those of every cached
token and the new ones — and each other layer's attention receives them in place of its own. So
a reader's own K/V projections are computed but never used (its cache is never read: 0 bytes), and
the result is exact in any protocol: a reader sees what a cache shared with the first layer holds.
Gradients flow to the first layer's projections (what ``heal(trainable="kv")`` trains).

A family whose attention does not go through the interface (Falcon before transformers 5.25), or
whose cache is a latent (DeepSeek), is refused, as the K/V quantizers are.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> shared = SharedKV("share:2", [[0, 1]])
    >>> shared.readers
    {1: 0}
    >>> ids = torch.tensor([[3, 4, 5, 6]])
    >>> with shared.active(model):
    ...     logits = model(ids).logits
    >>> bool((logits - model(ids).logits).abs().max() > 0)
    True
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.adapters.attention_calls import transform_attention_kv
from headwidget.analysis.variants import layer_ranges
from headwidget.errors import UnsupportedConversionError
from headwidget.evaluation._forwards import PartsForward

__all__ = [
    "SharedForward",
    "SharedKV",
    "cross_layer_blocker",
    "install_sharing",
    "installed_sharing",
    "teacher_forced_sharing",
]


def cross_layer_blocker(model: nn.Module) -> str | None:
    """Why the K/V a model's attention uses cannot be shared or transformed across layers here (None:
    they can): its attention must go through ``transformers.AttentionInterface``, and its cache must
    hold per-head keys and values (not an MLA latent)."""
    adapter = adapter_for(model)
    name = type(model).__name__
    if not adapter.routes_through_interface:
        return (
            f"{name} ({adapter.family}) does not pass its keys and values through "
            "transformers.AttentionInterface in this transformers release, where headwidget reaches the K/V "
            "a layer's attention uses; install a transformers release whose attention for it calls the "
            "interface (Falcon's does in 5.25)"
        )
    if adapter.layout().mechanism == "mla":
        return (
            f"{name} ({adapter.family}) caches a compressed latent, not per-head keys and values; the "
            "cross-layer variants here share or transform per-head K/V caches (MHA/GQA/MQA models)"
        )
    return None


def mixed_attention_blocker(model: nn.Module, groups: Sequence[Sequence[int]]) -> str | None:
    """Why ``groups`` of ``model``'s layers cannot share or transform their K/V together (None: they
    can): a group whose layers attend differently (the config's ``layer_types``, e.g. Gemma 2's
    sliding-window and full layers), whose caches then hold different tokens.

    >>> from transformers import Gemma2Config, Gemma2ForCausalLM
    >>> gemma = Gemma2ForCausalLM(Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4))
    >>> print(mixed_attention_blocker(gemma, [[0, 1]]))  # doctest: +ELLIPSIS
    layers 0 and 1 attend differently (sliding_attention, full_attention): ...
    >>> mixed_attention_blocker(gemma, [[0], [1]]) is None
    True
    """
    kinds = getattr(getattr(model, "config", None), "layer_types", None)
    if not kinds:
        return None
    for group in groups:
        inside = {layer: kinds[layer] for layer in group if layer < len(kinds)}
        differ = [layer for layer, kind in inside.items() if kind != inside[group[0]]]
        if differ:
            alike: dict[str, list[int]] = {}
            for layer, kind in enumerate(kinds):
                alike.setdefault(kind, []).append(layer)
            where = "; ".join(f"{kind}: {layer_ranges(layers)}" for kind, layers in alike.items())
            first, other = group[0], differ[0]
            said = (
                f"layers {first} and {other} attend differently ({inside[first]}, {inside[other]}): a "
                "sliding-window layer caches only its last tokens, so the group's caches would hold "
                "different tokens; "
            )
            if all(a != b for a, b in pairwise(kinds)):
                return said + (
                    f"here no two adjacent layers attend alike ({where}), so no group of two or more can "
                    "be formed (xkv:r/1 compresses each layer's cache alone)"
                )
            return said + (
                f"group only adjacent layers that attend alike, with a mixed spec naming them ({where})"
            )
    return None


@dataclass(frozen=True)
class SharedKV:
    """The groups of one ``share:g`` part: in each, the first layer's K/V serve the others."""

    spec: str
    groups: list[list[int]]

    @property
    def readers(self) -> dict[int, int]:
        """Each layer that reads another's K/V, and the layer it reads."""
        return {layer: group[0] for group in self.groups for layer in group[1:]}

    @property
    def acting(self) -> list[list[int]]:
        """The groups it shares K/V in: those of two or more layers (a layer alone keeps its own)."""
        return [group for group in self.groups if len(group) > 1]

    @property
    def layers(self) -> list[int]:
        """Every layer of a group of two or more, sorted."""
        return sorted(layer for group in self.acting for layer in group)

    def blocker(self, model: nn.Module) -> str | None:
        """Why ``model``'s attention cannot share K/V here (None: it can)."""
        return cross_layer_blocker(model)

    @contextmanager
    def active(self, model: nn.Module) -> Iterator[None]:
        """Run ``model``'s forwards (in this thread) inside with every reader given its group's first
        layer's K/V. ``model`` is the model the groups were fitted for, or a copy of it."""
        run = _SharedRun(self, model)
        handles = [
            model.register_forward_pre_hook(lambda _m, _a, _k: run.start(), with_kwargs=True),
            model.register_forward_hook(lambda _m, _a, _k, _o: run.check(), with_kwargs=True),
        ]
        try:
            with run.transforming():
                yield
        finally:
            for handle in handles:
                handle.remove()


class _SharedRun:
    """One :class:`SharedKV` on one model: which attention module is which layer, and the K/V held."""

    def __init__(self, shared: SharedKV, model: nn.Module) -> None:
        reason = shared.blocker(model)
        if reason is not None:
            raise UnsupportedConversionError(f"{shared.spec}: {reason}")
        modules = adapter_for(model).attention_modules()
        self.shared = shared
        self.model = model
        self.layer_of = {id(modules[layer]): layer for layer in shared.layers}
        self.readers = shared.readers
        self.held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.seen: set[int] = set()

    def start(self) -> None:
        self.held = {}
        self.seen = set()

    def transform(
        self, layer: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.add(layer)
        source = self.readers.get(layer)
        if source is None:
            self.held[layer] = (key, value)
            return key, value
        if source not in self.held:
            raise UnsupportedConversionError(
                f"{self.shared.spec}: layer {layer} reads the K/V of layer {source}, whose attention did "
                f"not run before it in this forward of {type(self.model).__name__}"
            )
        return self.held[source]

    def transforming(self) -> Any:
        return transform_attention_kv(self.model, self.layer_of, self.transform)

    def check(self) -> None:
        missing = [layer for layer in self.shared.layers if layer not in self.seen]
        self.held = {}
        if missing:
            raise UnsupportedConversionError(
                f"{self.shared.spec}: the attention of layer(s) {missing} of {type(self.model).__name__} "
                "did not go through transformers.AttentionInterface, so their K/V could not be shared; "
                "keep the model's attn_implementation an AttentionInterface one (sdpa or eager)"
            )


class SharedForward(PartsForward):
    """The ``forward`` of a model built by :func:`~headwidget.evaluation.apply` with ``share:g`` parts
    (:mod:`~headwidget.evaluation._forwards`): every call runs with each part's readers reading their
    group's first layer (as :meth:`SharedKV.active`), in the thread that makes the call; nothing stays
    installed between calls."""

    doing = "with shared K/V"
    parts: list[SharedKV]

    def described(self) -> str:
        return "; ".join(f"{p.spec} on groups {p.groups}" for p in self.parts)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        runs = [_SharedRun(part, self.model) for part in self.parts]
        with ExitStack() as stack:
            for run in runs:
                run.start()
                stack.enter_context(run.transforming())
            output = self.wrapped_forward(*args, **kwargs)
        for run in runs:
            run.check()
        return output


install_sharing = SharedForward.install
installed_sharing = SharedForward.installed


@contextmanager
def teacher_forced_sharing(model: nn.Module) -> Iterator[None]:
    """Inside, the ``share`` parts installed on ``model`` (:func:`installed_sharing`) also act on calls of
    its attention modules made outside its own forward, in layer order: the per-layer attention errors of
    :mod:`headwidget.healing._layers` (each layer fed the original's hidden states), a heal step's body
    run without the head, and a checkpointed layer computed again in the backward pass (which reads what
    its first layer computed in the forward). A reader receives the K/V its first layer's attention
    computed in the last such call."""
    with ExitStack() as stack:
        for part in installed_sharing(model):
            stack.enter_context(_SharedRun(part, model).transforming())
        yield
