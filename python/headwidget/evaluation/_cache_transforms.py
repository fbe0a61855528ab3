"""What a variant does to a prefilled KV cache: MiniCache's merge, xKV's shared SVD, a deployed quantizer.

A cache transform acts once, on the cache a prefill built, before any later token reads it (the
``prefill:P`` protocol of :mod:`headwidget.evaluation._prefill`, or the first forward of a
``generate`` call of a model built by :func:`~headwidget.evaluation.apply`); the prefill's own
attention is exact, and tokens that come later are cached exactly beside the transformed ones:

- :class:`MergedCache` (``merge:2``): each pair's cached keys (after RoPE, as the cache holds them)
  and values merged by :func:`~headwidget.analysis.cross_layer.minicache_merge`;
- :class:`SharedSVDCache` (``xkv:r/g``): each group's keys (turned back before RoPE, as xKV's authors
  compress them, and turned again after) and values replaced by
  :func:`~headwidget.analysis.cross_layer.shared_svd`;
- :class:`QuantizedCache` (a ``kv:int``/``kv:cq`` quantizer under ``prefill:P``): the cached keys
  and values quantized once, as a deployed KIVI or CQ cache holds them. ``kv:int`` keeps KIVI's
  full-precision residual of length ``R`` (``kv:int{b}/g{n}r{R}``; ``R = n`` when not given), as its
  authors' prefill does (jy-yuan/KIVI, ``models/llama_kivi.py``): the keys of the last ``P mod R``
  tokens and the values of the last ``min(P, R)`` exact, the others quantized (keys per channel in
  whole groups of ``n`` tokens, values per token); its bytes count those exact tokens at full precision
  (:meth:`~headwidget.evaluation._quantize.KVQuantizer.layer_bytes_per_token`).
  ``kv:cq`` quantizes every prefilled token (the CQ
  paper's runs keep a window of recent tokens in full precision; not here).

:func:`transforming_prefill` runs a model with its transforms: a forward that starts an empty cache
(``use_cache`` with no cached token) has its cache transformed before it returns; later forwards read
it. The rotary angles for un-rotating keys come from the attention modules' ``position_embeddings``
of that forward.

Example:
    >>> import torch
    >>> from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> cache = DynamicCache(config=model.config)
    >>> with transforming_prefill(model, [SharedSVDCache("xkv:2/2", [[0, 1]], 2)]):
    ...     _ = model(torch.tensor([[1, 2, 3, 4, 5]]), cache=cache, use_cache=True)
    >>> values = torch.cat([cache.layers[0].values, cache.layers[1].values], 1)  # (1, 4, 5, 8)
    >>> int(torch.linalg.matrix_rank(values.transpose(1, 2).reshape(5, -1)))  # one rank-2 SVD for both
    2
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.analysis.cross_layer import (
    merge_elements,
    minicache_merge,
    rotate,
    shared_svd,
    shared_svd_is_exact,
    xkv_elements,
)
from headwidget.core.layout import RopeLayout
from headwidget.errors import UnsupportedConversionError
from headwidget.evaluation._forwards import PartsForward
from headwidget.evaluation._quantize import KVQuantizer
from headwidget.evaluation._sharing import cross_layer_blocker

__all__ = [
    "CacheTransform",
    "CacheTransformForward",
    "GroupTransform",
    "MergedCache",
    "PrefilledCache",
    "QuantizedCache",
    "SharedSVDCache",
    "cache_argument",
    "install_cache_transforms",
    "installed_cache_transforms",
    "transforming_prefill",
]


#: The names a forward takes its KV cache by across transformers 5.x releases (``generate`` may pass
#: the older one, which a deprecation shim maps).
_CACHE_NAMES = ("cache", "past_key_values")


def cache_argument(model: nn.Module) -> str:
    """The name ``model.forward`` takes its KV cache by (``cache`` in transformers ≥ 5.x releases that
    renamed it, else ``past_key_values``)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@dataclass
class PrefilledCache:
    """The cache one prefill built, with what a transform needs to read and write it.

    ``cos``/``sin``: the prefill's rotary angles ((B, T, rotary dims), None for a model without RoPE);
    ``rope``: the model's rotary layout (post-RoPE pairing).
    """

    cache: Any
    rope: RopeLayout
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys (after RoPE) and values of ``layer``: (B, G, T, d)."""
        entry = self.cache.layers[layer]
        return entry.keys, entry.values

    def set(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        entry = self.cache.layers[layer]
        entry.keys, entry.values = keys, values

    def _planes(self) -> list[tuple[int, int]]:
        return self.rope.planes(post=True) if self.rope.uses_rope else []

    def keys_before_rope(self, keys: torch.Tensor) -> torch.Tensor:
        """Cached keys turned back by their RoPE angles."""
        planes = self._planes()
        if not planes:
            return keys
        cos, sin = self._angles(int(keys.shape[2]))
        return rotate(keys, cos, sin, planes, self.rope.offset, inverse=True)

    def keys_after_rope(self, keys: torch.Tensor) -> torch.Tensor:
        """Keys before RoPE turned by the prefill's angles, as the cache holds them."""
        planes = self._planes()
        if not planes:
            return keys
        cos, sin = self._angles(int(keys.shape[2]))
        return rotate(keys, cos, sin, planes, self.rope.offset)

    def _angles(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The angles of the last ``tokens`` positions of the prefill (a sliding-window layer's cache
        holds its last tokens only)."""
        if self.cos is None or self.sin is None:
            raise UnsupportedConversionError(
                "xkv compresses the keys before RoPE, as its authors do, but this model's attention was not "
                "given its rotary angles (position_embeddings) in the prefill, so its cached keys cannot be "
                "turned back; xkv is for models whose attention takes them (Llama, Qwen, Mistral, GPT-NeoX)"
            )
        return self.cos[:, -tokens:], self.sin[:, -tokens:]


class CacheTransform(Protocol):
    """What :func:`transforming_prefill` runs on a prefilled cache."""

    @property
    def spec(self) -> str: ...

    @property
    def layers(self) -> list[int]: ...

    def transform(self, prefilled: PrefilledCache) -> None: ...


#: Per layer: (KV heads, key channels, value channels) of the cache the layer's mechanism holds.
Shapes = dict[int, tuple[int, int, int]]


def _channels(shapes: Shapes, layer: int) -> tuple[int, dict[str, int]]:
    heads, keys, values = shapes[layer]
    return heads, {"key": keys, "value": values}


@dataclass
class MergedCache:
    """``merge:2``: MiniCache on each pair of ``groups`` (module docstring); ``shapes``: each layer's
    cache shape. The retained share of the (head, token) states it merged is counted per kind, so that
    its bytes count what it kept."""

    spec: str
    groups: list[list[int]]
    shapes: Shapes = field(default_factory=dict)
    retained: dict[str, list[int]] = field(default_factory=lambda: {"key": [0, 0], "value": [0, 0]})

    @property
    def acting(self) -> list[list[int]]:
        """The pairs it merges (a layer left alone keeps its cache)."""
        return [group for group in self.groups if len(group) > 1]

    @property
    def layers(self) -> list[int]:
        return sorted(layer for group in self.acting for layer in group)

    def transform(self, prefilled: PrefilledCache) -> None:
        for group in self.acting:
            first, second = group
            k1, v1 = prefilled.kv(first)
            k2, v2 = prefilled.kv(second)
            rk1, rk2, kept_k = minicache_merge(k1, k2)
            rv1, rv2, kept_v = minicache_merge(v1, v2)
            for kind, kept in (("key", kept_k), ("value", kept_v)):
                self.retained[kind][0] += int(kept.sum())
                self.retained[kind][1] += kept.numel()
            prefilled.set(first, rk1, rv1)
            prefilled.set(second, rk2, rv2)

    def only(self, groups: list[list[int]]) -> MergedCache:
        """The same merge on ``groups`` only (retention counted afresh)."""
        return MergedCache(self.spec, groups, self.shapes)

    def retained_share(self) -> dict[str, float]:
        """The share of merged (head, token) states kept unmerged so far, per kind (0 before any)."""
        return {kind: kept / total if total else 0.0 for kind, (kept, total) in self.retained.items()}

    def layer_elements(self, layer: int, prefill: int | None) -> float:
        """Cached elements per token of ``layer`` (its pair's share, with the retention seen so far; a
        layer left alone in a group of one keeps its own)."""
        del prefill
        heads, channels = _channels(self.shapes, layer)
        if any(layer in g and len(g) == 1 for g in self.groups):
            return float(sum(channels.values()))
        return merge_elements(channels, heads, self.retained_share())


@dataclass
class SharedSVDCache:
    """``xkv:r/g``: xKV's shared rank-``rank`` SVD of each group's keys (before RoPE) and values (of
    rank ``value_rank`` where given: ``xkv:k{r_k}v{r_v}/g``); ``shapes``: each layer's cache shape."""

    spec: str
    groups: list[list[int]]
    rank: int
    shapes: Shapes = field(default_factory=dict)
    value_rank: int | None = None

    @property
    def ranks(self) -> dict[str, int]:
        """The rank of each kind."""
        return {"key": self.rank, "value": self.rank if self.value_rank is None else self.value_rank}

    @property
    def acting(self) -> list[list[int]]:
        """Every group: a layer alone is compressed by its own SVD, as xKV's authors do."""
        return list(self.groups)

    @property
    def layers(self) -> list[int]:
        return sorted(layer for group in self.acting for layer in group)

    def transform(self, prefilled: PrefilledCache) -> None:
        for group in self.acting:
            pairs = [prefilled.kv(layer) for layer in group]
            tokens = int(pairs[0][0].shape[2])
            # a rank that keeps the whole of a kind's matrix leaves that kind's cache as it is (no
            # turning back and again by RoPE either)
            ranks = self.ranks
            exact = [
                shared_svd_is_exact(
                    tokens, sum(int(p[i].shape[1] * p[i].shape[3]) for p in pairs), ranks[kind]
                )
                for i, kind in enumerate(("key", "value"))
            ]
            keys = [k for k, _ in pairs]
            if not exact[0]:
                turned = shared_svd([prefilled.keys_before_rope(k) for k in keys], ranks["key"])
                keys = [prefilled.keys_after_rope(k) for k in turned]
            values = [v for _, v in pairs]
            if not exact[1]:
                values = shared_svd(values, ranks["value"])
            for layer, k, v in zip(group, keys, values, strict=True):
                prefilled.set(layer, k, v)

    def only(self, groups: list[list[int]]) -> SharedSVDCache:
        """The same shared SVD on ``groups`` only."""
        return SharedSVDCache(self.spec, groups, self.rank, self.shapes, self.value_rank)

    def layer_elements(self, layer: int, prefill: int | None) -> float:
        """Cached elements per token of ``layer``: its share of the group's token factor and, over a
        prefill of ``prefill`` tokens, of its basis (left out for None)."""
        _, channels = _channels(self.shapes, layer)
        size = next(len(group) for group in self.groups if layer in group)
        return xkv_elements(channels, self.ranks, size, prefill)


#: A cross-layer cache transform (over groups of layers).
GroupTransform = MergedCache | SharedSVDCache


@dataclass
class QuantizedCache:
    """A fitted ``kv:`` quantizer read as a deployed cache (module docstring): the prefilled K/V of its
    layers quantized once."""

    quantizer: KVQuantizer
    only: list[int] | None = None

    @property
    def spec(self) -> str:
        return self.quantizer.spec

    @property
    def layers(self) -> list[int]:
        return list(self.quantizer.layers if self.only is None else self.only)

    def transform(self, prefilled: PrefilledCache) -> None:
        q = self.quantizer
        for layer in self.layers:
            keys, values = prefilled.kv(layer)
            t = int(keys.shape[2])
            keep_k = keep_v = 0
            if q.method == "kv:int":  # KIVI's residual R: the keys' last P mod R, the values' last R exact
                r = q.residual or q.group
                keep_k, keep_v = t % r, min(t, r)
            if keep_k == keep_v == t:
                continue  # (a prefill within the residual: nothing quantized)
            qk, qv = q.quantize(layer, keys[:, :, : t - keep_k], values[:, :, : t - keep_v])
            prefilled.set(
                layer,
                torch.cat([qk, keys[:, :, t - keep_k :]], dim=2),
                torch.cat([qv, values[:, :, t - keep_v :]], dim=2),
            )


def _angles_hook(found: dict[str, torch.Tensor]) -> Any:
    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if "cos" in found:
            return
        angles = kwargs.get("position_embeddings")
        if angles is None:
            angles = next((a for a in args if isinstance(a, tuple) and len(a) == 2), None)
        if (
            isinstance(angles, tuple)
            and len(angles) == 2
            and all(isinstance(a, torch.Tensor) for a in angles)
        ):
            found["cos"], found["sin"] = angles

    return hook


def _refuse(model: nn.Module, transforms: Sequence[CacheTransform]) -> None:
    reason = cross_layer_blocker(model)  # a cache of the per-head K/V the attention receives
    if reason is not None and transforms:
        names = ", ".join(t.spec for t in transforms)
        raise UnsupportedConversionError(f"{names}: {reason}")


class _PrefillRun:
    """Transforms on one model: whether the forward in progress starts an empty cache, its rotary
    angles, and the transform of its cache when it returns."""

    def __init__(self, model: nn.Module, transforms: Sequence[CacheTransform]) -> None:
        _refuse(model, transforms)
        adapter = adapter_for(model)
        self.model = model
        self.transforms = list(transforms)
        self.attention = adapter.attention_modules()
        self.rope = adapter.layout().rope
        self.name = cache_argument(model)
        self.state: dict[str, Any] = {}

    def start(self, kwargs: dict[str, Any]) -> None:
        """A forward with ``kwargs`` begins: note whether it fills an empty (or new) cache."""
        self.state.clear()
        cache = next((kwargs[n] for n in (self.name, *_CACHE_NAMES) if kwargs.get(n) is not None), None)
        use = kwargs.get("use_cache")
        if cache is None:  # the model makes its own cache when it caches
            config = getattr(self.model, "config", None)
            self.state["fresh"] = use is True or (use is None and bool(getattr(config, "use_cache", False)))
        elif use is not False and cache.get_seq_length() == 0:
            self.state["cache"] = cache
        if self.state.get("fresh") or "cache" in self.state:
            self._refuse_padding(kwargs.get("attention_mask"))

    def _refuse_padding(self, mask: Any) -> None:
        """Refuse a prefill with pad positions: a transform acts on each sequence's whole prefilled
        cache, so they would enter its merge, SVD or quantization groups."""
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or bool(mask.bool().all()):
            return
        self.state.clear()
        padded, rows = int((~mask.bool().all(-1)).sum()), int(mask.shape[0])
        names = ", ".join(t.spec for t in self.transforms)
        raise UnsupportedConversionError(
            f"{names}: this prefill's attention_mask pads {padded} of its {rows} sequences, and "
            "the transform acts on each sequence's whole prefilled cache, whose pad positions would enter "
            "its merge, SVD or quantization groups; prefill sequences without padding (one at a time, or "
            "batches of one length)"
        )

    def finish(self, output: Any) -> None:
        """The forward returned ``output``: transform the cache it filled, if it was a prefill."""
        cache = self.state.get("cache")
        if cache is None and self.state.get("fresh"):
            cache = getattr(output, "cache", None) or getattr(output, "past_key_values", None)
        if cache is not None:
            prefilled = PrefilledCache(cache, self.rope, self.state.get("cos"), self.state.get("sin"))
            with torch.no_grad():
                for transform in self.transforms:
                    transform.transform(prefilled)
        self.state.clear()

    @contextmanager
    def watching_angles(self) -> Iterator[None]:
        """Inside, the first attention call's rotary angles are kept (for turning cached keys)."""
        hook = _angles_hook(self.state)
        handles = [a.register_forward_pre_hook(hook, with_kwargs=True) for a in self.attention]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


@contextmanager
def transforming_prefill(model: nn.Module, transforms: Sequence[CacheTransform]) -> Iterator[None]:
    """Inside, every forward of ``model`` in this thread that starts an empty KV cache (``use_cache``,
    nothing cached yet) has the cache transformed by ``transforms``, in order, before it returns
    (module docstring). Nothing is left installed on exit."""
    if not transforms:
        yield
        return
    run = _PrefillRun(model, transforms)
    handles = [
        model.register_forward_pre_hook(lambda _m, _a, kwargs: run.start(kwargs), with_kwargs=True),
        model.register_forward_hook(lambda _m, _a, _k, output: run.finish(output), with_kwargs=True),
    ]
    try:
        with run.watching_angles():
            yield
    finally:
        for handle in handles:
            handle.remove()


class CacheTransformForward(PartsForward):
    """The ``forward`` of a model built by :func:`~headwidget.evaluation.apply` with ``merge``/``xkv``
    parts (:mod:`~headwidget.evaluation._forwards`): each call runs inside :func:`transforming_prefill`,
    so a ``generate`` call's prefill is transformed before its first decoding step (a forward without a
    cache is exact: the prefill's own attention is)."""

    doing = "that transforms its prefilled cache"
    parts: list[CacheTransform]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = _PrefillRun(self.model, self.parts)  # called as the forward: the model's hooks have run
        run.start(kwargs)
        with run.watching_angles():
            output = self.wrapped_forward(*args, **kwargs)
        run.finish(output)
        return output


install_cache_transforms = CacheTransformForward.install
installed_cache_transforms = CacheTransformForward.installed
