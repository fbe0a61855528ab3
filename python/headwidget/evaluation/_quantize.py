"""K/V quantizers as evaluation variants: fake quantization of the K/V the attention actually uses.

``kv:int{b}`` (KIVI-style) and ``kv:cq{c}c{b}b`` (coupled quantization) change no weight. While a model
runs inside :meth:`KVQuantizer.active`, the function ``transformers.AttentionInterface`` returns for its
``attn_implementation`` is wrapped
(:func:`headwidget.adapters.attention_calls.transform_attention_kv`): at every call of a quantized
layer the post-RoPE ``key_states`` and the ``value_states`` — (B, G, T, d), what a KV cache would
hold — are quantized and dequantized, and the original attention function is called with them.
Queries, weights, RoPE and every other layer are untouched; each forward's ``attention_mask`` says
which tokens are real. An attention that does not go through that interface
(Falcon before the transformers release that routes it there), or whose cache is a latent (MLA:
DeepSeek), is refused. The schemes themselves
(what ``kv:int`` and ``kv:cq`` do to a tensor, and the bytes they cost) are pure maths, in
:mod:`headwidget.analysis.quantizers`.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> q = fit_quantizer(model, "kv:int4")  # C = 2·16 = 32 channels per kind and layer
    >>> q.layer_bytes_per_token(0), q.kv_bytes_per_token(), q.constant_bytes  # 2·(32·4/8 + 4·32/32)
    (40, 80, 0)
    >>> ids = torch.tensor([[5, 6, 7, 8, 9]])
    >>> with q.active(model):
    ...     quantized = model(ids).logits
    >>> bool((quantized - model(ids).logits).abs().max() > 0)
    True
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn
from transformers import Cache

from headwidget.adapters import Adapter, adapter_for
from headwidget.adapters.attention_calls import transform_attention_kv
from headwidget.analysis.quantizers import (
    MAX_ITERS,
    Codebooks,
    check_enough_samples,
    fit_codebooks_many,
    flat_rows,
    quantize_int_keys,
    quantize_int_values,
    unflat_rows,
    work_dtype,
)
from headwidget.analysis.variants import VariantSpec, parse_uniform
from headwidget.checks import whole_number
from headwidget.core.kinds import Kind
from headwidget.errors import (
    ArgumentError,
    HeadwidgetError,
    MechanismSpecError,
    MissingStatisticsError,
    StatsMismatchError,
    UnsupportedConversionError,
)
from headwidget.evaluation._forwards import PartsForward
from headwidget.evaluation._model_facts import check_stats, layer_kv_elements, resolve_layers
from headwidget.stats import KVStats

__all__ = [
    "KVQuantizer",
    "QuantizedForward",
    "fit_quantizer",
    "install_quantizers",
    "installed_quantizers",
    "quantizer_blocker",
    "quantizer_for",
]


# ---------------------------------------------------------------------------------------------- quantizer
def quantizer_blocker(adapter: Adapter) -> str | None:
    """Why the K/V the attention of this family uses cannot be fake-quantized here (None: they can).

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> quantizer_blocker(adapter_for(GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=4)))) is None
    True
    """
    name = type(adapter.model).__name__
    if not adapter.routes_through_interface:
        return (
            f"{name} ({adapter.family}) does not pass its keys and values through "
            "transformers.AttentionInterface in this transformers release, where headwidget fake-quantizes "
            "the K/V the attention uses: evaluate only the mechanism conversions for this model, or install "
            "a transformers release whose attention for it calls the interface (Falcon's does in 5.25)"
        )
    if adapter.layout().mechanism == "mla":
        return (
            f"{name} ({adapter.family}) caches a compressed latent, not the per-head K/V its attention "
            "function receives, so quantizing those would not measure its cache; K/V quantizers are for "
            "MHA/GQA/MQA models"
        )
    return None


@dataclass
class KVQuantizer:
    """A fitted ``kv:int`` / ``kv:cq`` quantizer of a model's K/V (see the module docstring).

    ``layers`` are the quantized layers; ``channels`` maps ``"key"``/``"value"`` to C of that kind;
    ``layer_elements`` the K/V elements per token of every layer as the model holds them (what an
    unquantized layer costs); ``codebooks[layer][kind]`` the CQ codebooks (empty for kv:int).

    Example:
        >>> import torch
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=64, n_layer=2, n_head=4)).eval()
        >>> q = fit_quantizer(gpt2, "kv:int2/g16", layers=[1])  # C = 64: 2·(64·2/8 + 4·64/16)
        >>> q.layer_bytes_per_token(1), q.kv_bytes_per_token(torch.bfloat16)  # + layer 0: 128 bf16
        (64, 320)
    """

    spec: str
    method: str
    bits: int
    group: int
    layers: list[int]
    channels: dict[str, int]
    layer_elements: dict[int, int]
    codebooks: dict[int, dict[str, Codebooks]] = field(default_factory=dict, repr=False)
    #: ``kv:int``: KIVI's residual length R, the newest prefilled tokens a deployed cache keeps exact
    #: (None: ``group``).
    residual: int | None = None
    _stored: dict[tuple[int, str, str, str], torch.Tensor] = field(default_factory=dict, repr=False)

    # -------------------------------------------------------------------------------------- bytes
    def layer_bytes_per_token(self, layer: int, prefill: int | None = None, exact: int = 2) -> float:
        """K/V bytes per token of a quantized ``layer`` (module docstring); an int when whole.

        With ``prefill``, what a cache of that many prefilled tokens holds, per token: ``kv:int`` keeps
        KIVI's residual exact (:class:`~headwidget.evaluation._cache_transforms.QuantizedCache`: the keys
        of the last P mod R tokens, the values of the last min(P, R)), ``exact`` bytes a value.

        >>> q = KVQuantizer("kv:int2/g4r8", "kv:int", 2, 4, [0], {"key": 8, "value": 8}, {0: 16}, residual=8)
        >>> # whole forwards: 10 + 10; 12 prefilled: 8 keys and 4 values at 10/12 each, the rest 2 × 8
        >>> q.layer_bytes_per_token(0), q.layer_bytes_per_token(0, prefill=12)
        (20, 26)
        """
        del layer  # every layer of a supported model has the same C
        ck, cv = self.channels["key"], self.channels["value"]
        if self.method != "kv:int":
            return _number((ck // self.group + cv // self.group) * self.bits / 8)
        n = self.group
        keys, values = ck * self.bits / 8 + 4 * ck / n, cv * self.bits / 8 + 4 * math.ceil(cv / n)
        if not prefill:
            return _number(keys + values)
        r = self.residual or n
        kept_k, kept_v = (prefill % r) / prefill, min(prefill, r) / prefill  # shares kept exact
        return _number(
            (1 - kept_k) * keys + kept_k * exact * ck + (1 - kept_v) * values + kept_v * exact * cv
        )

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.bfloat16) -> float:
        """K/V bytes per token of the whole model: quantized layers as above, the others in ``dtype``."""
        size = dtype.itemsize
        return _number(
            sum(
                self.layer_bytes_per_token(layer) if layer in self.layers else size * elements
                for layer, elements in self.layer_elements.items()
            )
        )

    @property
    def constant_bytes(self) -> int:
        """Bytes stored once, not per token: the fp16 CQ codebooks of every quantized layer (0 for kv:int)."""
        return sum(book.nbytes for books in self.codebooks.values() for book in books.values())

    # -------------------------------------------------------------------------------------- running
    def _centroids(self, layer: int, kind: str, like: torch.Tensor) -> torch.Tensor:
        work = work_dtype(like)
        slot = (layer, kind, str(like.device), str(work))
        found = self._stored.get(slot)
        if found is None:
            found = self.codebooks[layer][kind].stored(like.device, work)
            self._stored[slot] = found
        return found

    def quantize(
        self, layer: int, key: torch.Tensor, value: torch.Tensor, real: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fake-quantized ``key``, ``value`` (B, G, T, d) of ``layer``; ``real`` (B, T) marks real tokens."""
        if self.method == "kv:int":
            return (
                quantize_int_keys(key, self.bits, self.group, real),
                quantize_int_values(value, self.bits, self.group),
            )
        out = []
        for kind, x in (("key", key), ("value", value)):
            rows = flat_rows(x.to(work_dtype(x)))
            books = self.codebooks[layer][kind]
            out.append(unflat_rows(books.quantize(rows, self._centroids(layer, kind, x)), x))
        return out[0], out[1]

    @contextmanager
    def active(self, model: nn.Module, layers: Sequence[int] | None = None) -> Iterator[None]:
        """Run ``model``'s forwards inside with fake-quantized K/V in ``layers`` (default: :attr:`layers`).

        ``model`` is the model this quantizer was fitted for, or a copy of it (the attention modules are
        found in ``model`` itself). Each forward's ``attention_mask`` says which tokens are real; a
        quantized layer whose attention did not go through the wrapped function makes the forward raise
        :class:`~headwidget.errors.UnsupportedConversionError`. Nothing is left installed on exit.
        """
        run = _QuantizedRun(self, model, layers)
        state = run.new_state()

        def before(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            state.start(args, kwargs)

        def after(_module: nn.Module, _args: Any, _kwargs: Any, _output: Any) -> None:
            run.check_all_seen(state)

        handles = [
            model.register_forward_pre_hook(before, with_kwargs=True),
            model.register_forward_hook(after, with_kwargs=True),
        ]
        try:
            with run.transforming(state):
                yield
        finally:
            for handle in handles:
                handle.remove()


class _QuantizedRun:
    """One quantizer's layers on one model, checked, ready to quantize forwards of it in this thread."""

    def __init__(self, quantizer: KVQuantizer, model: nn.Module, layers: Sequence[int] | None) -> None:
        adapter = adapter_for(model)
        reason = quantizer_blocker(adapter)
        if reason is not None:
            raise UnsupportedConversionError(f"{quantizer.spec}: {reason}")
        chosen = list(quantizer.layers if layers is None else layers)
        outside = [layer for layer in chosen if layer not in quantizer.layers]
        if outside:
            raise ValueError(f"{quantizer.spec} was fitted for layers {quantizer.layers}, not {outside}")
        modules = adapter.attention_modules()
        self.quantizer = quantizer
        self.model = model
        self.chosen = chosen
        self.layer_of = {id(modules[layer]): layer for layer in chosen}
        self.signature = inspect.signature(model.forward)

    def new_state(self) -> _ForwardState:
        return _ForwardState(self.signature, self.quantizer.method)

    def transforming(self, state: _ForwardState) -> AbstractContextManager[None]:
        """Inside, this thread's attention calls of the chosen layers get ``state``'s quantized K/V."""
        quantizer = self.quantizer

        def transform(
            layer: int, key: torch.Tensor, value: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            state.seen.add(layer)
            return quantizer.quantize(layer, key, value, state.real_for(key, quantizer.spec))

        return transform_attention_kv(self.model, self.layer_of, transform)

    def check_all_seen(self, state: _ForwardState) -> None:
        missing = [layer for layer in self.chosen if layer not in state.seen]
        if missing:
            raise UnsupportedConversionError(
                f"{self.quantizer.spec}: the attention of layer(s) {missing} of {type(self.model).__name__} "
                "did not go through transformers.AttentionInterface, so their K/V could not be quantized; "
                "keep the model's attn_implementation an AttentionInterface one (sdpa or eager) and run it "
                "without output_attentions"
            )


class QuantizedForward(PartsForward):
    """The ``forward`` of a model built by :func:`~headwidget.evaluation.apply` with ``kv:`` parts
    (:mod:`~headwidget.evaluation._forwards`): every call runs the class's forward with each quantizer's
    layers fake-quantized, as :meth:`KVQuantizer.active` does, in the thread that makes the call (so the
    model quantizes wherever it runs, two threads running it at once each quantize their own forward, and
    the original model, or any other, runs untouched meanwhile). Nothing stays installed between calls.
    """

    doing = "with fake-quantized K/V"
    parts: list[KVQuantizer]
    _runs: tuple[int, list[_QuantizedRun]] | None = None

    def _prepared(self) -> list[_QuantizedRun]:
        """Each quantizer's run on this model, prepared once (a deep copy, whose model is another,
        prepares its own: the runs name attention modules by identity)."""
        if self._runs is None or self._runs[0] != id(self.model):
            self._runs = (id(self.model), [_QuantizedRun(q, self.model, None) for q in self.parts])
        return self._runs[1]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        runs = self._prepared()
        states = [run.new_state() for run in runs]
        with ExitStack() as stack:
            for run, state in zip(runs, states, strict=True):
                state.start(args, kwargs)
                stack.enter_context(run.transforming(state))
            output = self.wrapped_forward(*args, **kwargs)
        for run, state in zip(runs, states, strict=True):
            run.check_all_seen(state)
        return output


installed_quantizers = QuantizedForward.installed
install_quantizers = QuantizedForward.install


class _ForwardState:
    """What the current forward of a quantized model said about its tokens, and which layers it quantized."""

    def __init__(self, signature: inspect.Signature, method: str) -> None:
        self.signature = signature
        self.method = method
        self.mask: torch.Tensor | None = None
        self.cached = False
        self.seen: set[int] = set()

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.seen = set()
        arguments = dict(kwargs)
        if args:
            with suppress(TypeError):
                arguments = dict(self.signature.bind_partial(*args, **kwargs).arguments)
        mask = arguments.get("attention_mask")
        self.mask = mask if isinstance(mask, torch.Tensor) else None
        # ``generate`` passes its cache to every forward and drops an attention_mask of all ones (a
        # padded row keeps it): a forward given a cache and no mask has no padding
        self.cached = any(isinstance(arguments.get(name), Cache) for name in ("cache", "past_key_values"))

    def real_for(self, key: torch.Tensor, spec: str) -> torch.Tensor | None:
        b, _, t, _ = key.shape
        if self.mask is None:
            if b > 1 and self.method == "kv:int" and not self.cached:
                raise UnsupportedConversionError(
                    f"{spec}: a forward of {b} rows came without an attention_mask, so the keys' token "
                    "groups cannot tell padding from text (a padded row would quantize its real keys "
                    "with its padding's range). Pass the attention_mask (all ones when no row is padded), "
                    "or run one row at a time (lm-eval: batch_size=1)"
                )
            return None
        if self.mask.ndim != 2 or tuple(self.mask.shape) != (b, t):
            raise UnsupportedConversionError(
                f"{spec}: fake-quantized keys need the forward's (batch, tokens) attention_mask to match the "
                f"keys the attention receives ({b} × {t}); got a mask of shape {tuple(self.mask.shape)}. "
                "Run the model without a KV cache (use_cache=False) and with a 2-D attention_mask"
            )
        return self.mask.to(key.device) != 0


def _number(x: float) -> float:
    """``x`` as an int when it is whole (byte counts), else the float."""
    return int(x) if float(x).is_integer() else float(x)


def _kind_channels(adapter: Adapter) -> dict[str, int]:
    lay = adapter.layout()
    heads = {adapter.kv_heads_of(a) for a in adapter.attention_modules()}
    if len(heads) != 1:
        raise UnsupportedConversionError(
            f"{type(adapter.model).__name__}: its layers have different KV-head counts {sorted(heads)}; "
            "quantize the original model"
        )
    g = heads.pop()
    return {"key": g * lay.head_dim, "value": g * lay.value_head_dim}


def _samples(stats: KVStats | None, layer: int, kind: str, spec: str, channels: int) -> torch.Tensor:
    how = (
        f"{spec} fits its codebooks on calibration samples of the keys the attention uses and of the "
        "values: capture statistics with rope='post' and samples=R on calibration text (e.g. "
        "headwidget.capture(model, english_sample(split='calibration'), rope='post', samples=16384)) "
        "and pass them as stats="
    )
    if stats is None:
        raise MissingStatisticsError(f"no statistics were given. {how}")
    if kind not in stats.kinds:
        raise MissingStatisticsError(f"these statistics hold no {kind!r} rows. {how}")
    try:
        rows = stats.samples(layer, cast(Kind, kind))
    except HeadwidgetError as err:
        raise MissingStatisticsError(f"layer {layer}, {kind}: {err}. {how}") from err
    if not isinstance(rows, torch.Tensor) or rows.ndim != 2 or rows.shape[0] == 0:
        raise MissingStatisticsError(f"layer {layer}, {kind}: these statistics hold no token samples. {how}")
    if rows.shape[1] != channels:
        raise StatsMismatchError(
            f"layer {layer}, {kind}: the samples have {rows.shape[1]} channels, the model {channels}; "
            "capture them from this model"
        )
    return rows


def _refuse_blocked(adapter: Adapter, parsed: VariantSpec) -> None:
    reason = quantizer_blocker(adapter)
    if reason is not None:
        raise UnsupportedConversionError(f"{parsed.text}: {reason}")


def fit_quantizer(
    model: nn.Module,
    spec: str | VariantSpec,
    stats: KVStats | None = None,
    layers: Sequence[int] | None = None,
    *,
    iters: int = 25,
    seed: int = 0,
    allow_other_weights: bool = False,
) -> KVQuantizer:
    """The K/V quantizer ``spec`` (``kv:int{b}``, ``kv:int{b}/g{n}``, ``kv:cq{c}c{b}b``) for ``model``.

    ``kv:int`` needs nothing fitted (its ranges are each group's own). ``kv:cq`` fits, per quantized
    layer, key and value codebooks (:func:`fit_codebooks` with ``iters`` and ``seed``) on the layer's
    calibration samples in ``stats`` (``stats.samples(layer, "key_post")``, ``"key"`` for a model
    without RoPE, and ``stats.samples(layer, "value")``), on the samples' device. ``stats`` must come
    from ``model`` (its class, config and layout), and from its weights too unless
    ``allow_other_weights`` (a base model's statistics for its fine-tune).

    Raises:
        MechanismSpecError: not a quantizer spec, or a ``c`` that does not divide the model's C.
        UnsupportedConversionError: a family whose attention does not go through
            ``transformers.AttentionInterface``, or an MLA model (:func:`quantizer_blocker`).
        MissingStatisticsError: ``kv:cq`` without statistics holding samples, or with fewer samples
            per layer than its ``2**b`` centroids (the message says how many it needs).
        StatsMismatchError: statistics of another model, or of other weights.
        ArgumentError: ``stats``, ``layers``, ``iters`` or ``seed`` of the wrong type or out of range.

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
        >>> fit_quantizer(gpt2, "kv:int8").layers
        [0, 1]
        >>> fit_quantizer(gpt2, "kv:cq3c8b")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        headwidget.errors.MechanismSpecError: kv:cq3c8b groups c = 3 ... allowed c: 1, 2, 4, 8, 16, 32
    """
    parsed = spec if isinstance(spec, VariantSpec) else parse_uniform(spec, "fit_quantizer")
    iters = whole_number("iters", iters, minimum=0, maximum=MAX_ITERS, hint="Lloyd iterations")
    seed = whole_number("seed", seed, minimum=0, maximum=2**63 - 1, hint="the seed of the k-means++ start")
    if stats is not None and not isinstance(stats, KVStats):
        raise ArgumentError(
            "stats must be a KVStats (from headwidget.capture or KVStats.load) or None, "
            f"got {type(stats).__name__}"
        )
    if not parsed.quantizer or parsed.bits is None or parsed.group is None:
        raise MechanismSpecError(f"{parsed.text!r} is not a K/V quantizer (kv:int{{b}}, kv:cq{{c}}c{{b}}b)")
    adapter = adapter_for(model)
    _refuse_blocked(adapter, parsed)
    check_stats(model, adapter, stats, allow_other_weights=allow_other_weights)
    return quantizer_for(adapter, parsed, stats, resolve_layers(adapter, layers), iters=iters, seed=seed)


def quantizer_for(
    adapter: Adapter,
    parsed: VariantSpec,
    stats: KVStats | None,
    chosen: Sequence[int],
    *,
    iters: int = 25,
    seed: int = 0,
) -> KVQuantizer:
    """:func:`fit_quantizer` of ``adapter.model`` with its arguments already checked: ``parsed`` a
    quantizer spec, ``chosen`` resolved layers, ``stats`` checked against the model by the caller
    (:func:`~headwidget.evaluation._model_facts.check_stats`)."""
    assert parsed.bits is not None and parsed.group is not None
    _refuse_blocked(adapter, parsed)
    channels = _kind_channels(adapter)
    total = adapter.layout().num_layers
    elements = {layer: layer_kv_elements(adapter, layer) for layer in range(total)}
    layers = list(chosen)
    out = KVQuantizer(
        parsed.text,
        parsed.mechanism,
        parsed.bits,
        parsed.group,
        layers,
        channels,
        elements,
        residual=parsed.residual,
    )
    if parsed.mechanism == "kv:cq":
        c = parsed.group
        for size in channels.values():
            if size % c:
                divisors = [d for d in range(1, size + 1) if size % d == 0]
                raise MechanismSpecError(
                    f"{parsed.text} groups c = {c} contiguous channels, which must divide the C = {size} "
                    f"channels; allowed c: {', '.join(map(str, divisors))}"
                )
        key_kind = "key_post" if adapter.layout().rope.uses_rope else "key"
        slots, rows = [], []
        for layer in chosen:  # every layer's samples checked before any fit
            for kind, source in (("key", key_kind), ("value", "value")):
                rows.append(_samples(stats, layer, source, parsed.text, channels[kind]))
                where = f" (layer {layer}, {source})"
                check_enough_samples(rows[-1].shape[0], parsed.bits, parsed.text, where)
                slots.append((layer, kind))
        # every layer's K and V in one k-means loop: the codebooks of one fit each, far fewer steps
        books = fit_codebooks_many(rows, c, parsed.bits, iters=iters, seed=seed)
        for (layer, kind), fitted in zip(slots, books, strict=True):
            out.codebooks.setdefault(layer, {})[kind] = fitted
    return out
