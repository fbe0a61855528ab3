"""How much memory an evaluation will allocate on the model's device, and the refusal when it is too much.

An upper bound for batches of ``batch_size × max_length`` tokens (of windows of W tokens under
``chunks:W`` and ``stride:W/S``). An evaluation first fits every variant, then runs them, so its peak is
what it keeps throughout plus the larger of those two phases:

- ``copy``: the working copy of the model in ``dtype`` (nothing when the model already is in ``dtype``:
  the copy then shares its weights); a copy in another dtype holds the deep copy in the model's own dtype
  while it is cast;
- ``fits``: the fitted attention weights every converted variant keeps (in ``dtype``, in the host's
  memory) for all its layers, in the variant's own shape (a merge to G KV heads keeps G heads' key and
  value rows where the family can hold them: :func:`conversion_sizes`);
- **fitting** (``fitting``): one variant's float64 fits of every layer, or, while its last layer is fitted,
  those of the other layers and the work of fitting one layer (its attention weights read in float64 on
  the host, its keys and values repeated per query head and their group means: :class:`ConversionSize`);
- **running** (the rest):

  - ``variant``: one converted copy at a time, whose converted layers' attention modules (and the modules
    holding their head projections) are its own, in the variant's shape;
  - ``forward``: one forward's working memory (:func:`~headwidget.capture.memory.forward_bytes`: one
    layer's activations; a quantizer adds its fake-quantized K/V of one layer), the original's and the
    variant's logits of its predicted rows (the head computes no others: :func:`predicted_rows` of
    ``vocab``; a second copy of the variant's while a model rescales its head's output:
    ``final_logit_softcapping``, ``logit_scale``, ``logits_scaling``) and the measures' work on one chunk
    of rows (:func:`~headwidget.evaluation.measures.measure_work_bytes`). The working memory and the
    measures are not alive at once (the measures run after the forward), but the token batches of the
    whole text are, which the estimate does not see (it is made before the text is read, and under
    ``stride:W/S`` they hold each token W/S times): the working memory stands in for them;
  - ``sweep`` (``per_layer``): one batch's recorded block outputs of every layer;
  - ``cache`` (``prefill:P``): the KV cache a prefill builds and the scored forward extends, every layer
    at ``max_length`` tokens (in the model's own KV heads, or its attention heads for an ``mha``
    variant), one layer's copy while the scored forward appends to it, and, for ``merge``/``xkv``
    parts, their work on one group of the prefill's tokens.

  ``parts`` names the larger phase's parts (``fitting``, or those of running), beside ``copy`` and
  ``fits``.

Fits are made and kept in the host's memory (float64 on the CPU, then cast to ``dtype``), and written
into a variant's modules on the model's device when it runs. For a model on the CPU both phases share
one memory, as above; for a model on another device (a GPU) ``parts`` are the device's (``copy`` and
running) and ``host`` holds ``fits`` and ``fitting``, refused over the host's own default budget (half
its free memory under the process's limit, every ``torchrun`` process on the host counted: each fits
for itself), so that a GPU's estimate does not count the float64 fits (11 GB for an 8B model's ``mqa``)
and the host is not run out of memory by them. ``max_memory`` is the device's budget; the host's cannot
be raised. The statistics the fits read are moved to the host first; ``+align`` rotations are fitted on
the statistics' device (head_dim² per pair of heads: not counted).

What adapts to the budget instead of being counted: the original's predicted-position logits are kept
between variants only while they fit in what the budget leaves (else recomputed per variant), and the
sweep records as many batches at once as the rest of the budget holds.

Measured against the CPU allocator's peak (``bench/scale.py``, Llama-family shapes from SmolLM2-135M to
Llama-3-8B): the fitting phase within a few percent (its float64 tensors are counted one by one), the
running phase above the peak by about the forward's working memory.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from headwidget.adapters import adapter_for
    >>> from headwidget.analysis.variants import parse_variant
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    >>> adapter = adapter_for(model)
    >>> args = check_evaluate_arguments(adapter, ["mqa"], None, None, True, torch.float32, 2, 16, None, False)
    >>> need = EvaluationMemory.of(model, adapter, [parse_variant("mqa")], args)
    >>> sorted(need.parts), need.total == sum(need.parts.values())
    (['copy', 'fits', 'forward', 'sweep', 'variant'], True)
    >>> wide = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=512, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8))  # fitting is the peak
    >>> sorted(EvaluationMemory.of(wide, adapter_for(wide), [parse_variant("mqa")], args).parts)
    ['copy', 'fits', 'fitting']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from headwidget.adapters import Adapter, adapter_for
from headwidget.analysis.variants import Variant, VariantSpec, parse_variant, uniform_parts
from headwidget.capture.memory import ForwardShape, forward_bytes, refuse_host_over_budget, refuse_over_budget
from headwidget.errors import ArgumentError
from headwidget.evaluation._arguments import EvaluateArguments, check_evaluate_arguments
from headwidget.evaluation._inputs import Protocol, parse_protocol
from headwidget.evaluation._model_facts import converted_modules, layer_kv_elements, output_vocab
from headwidget.evaluation.measures import measure_work_bytes

__all__ = [
    "ConversionSize",
    "EvaluationMemory",
    "check_evaluation_budget",
    "conversion_sizes",
    "estimate_evaluation",
    "estimated_part",
]

#: Config fields of a scale a model applies to its head's output (out of place: a second copy of the
#: logits), with the value that means none.
HEAD_RESCALES = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0}

DOCUMENTS = Protocol("documents")
#: What to change when the fits are over the host's budget.
HOST_ADVICE = (
    "The fits are made in float64 in the host's memory: convert fewer layers (layers=[...]) or give fewer "
    "variants (or candidates) per call."
)


def _tensor_bytes(module: nn.Module, dtype: torch.dtype | None = None) -> int:
    total = 0
    for t in (*module.parameters(), *module.buffers()):
        size = t.element_size() if dtype is None or not t.is_floating_point() else dtype.itemsize
        total += t.numel() * size
    return total


def _converted_bytes(model: nn.Module, adapter: Adapter, layers: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes in ``dtype`` of the parameters and buffers a variant converting ``layers`` holds as its own
    (:func:`~headwidget.evaluation._model_facts.converted_modules`), each tensor once."""
    tensors = {
        id(t): t
        for name in converted_modules(model, adapter, layers)
        for t in (*model.get_submodule(name).parameters(), *model.get_submodule(name).buffers())
    }
    return sum(
        t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size()) for t in tensors.values()
    )


#: Mechanisms whose fit merges the KV heads (each into as many as the family can hold).
MERGES = {"mha", "gqa", "mqa"}


def _fitted_kv_heads(adapter: Adapter, part: VariantSpec, layer: int) -> int:
    """The KV heads of the weights ``part`` fits for ``layer``: a merge's (``mha``: every query head,
    ``gqa:G``: G, ``mqa``: 1) where the family can change them, else the layer's own."""
    own = adapter.kv_heads_of(adapter.attention_at(layer))
    if not adapter.resizable_kv_heads or part.mechanism not in MERGES:
        return own
    heads = adapter.layout().num_heads
    return heads if part.mechanism == "mha" else 1 if part.mechanism == "mqa" else int(part.arg or own)


@dataclass(frozen=True)
class ConversionSize:
    """A converted variant's tensors (elements) per converted layer: ``fitted``, its fitted attention
    weights (the layer's attention modules' tensors, their key and value rows as many as the fit's KV
    heads), ``delta``, what that changes from the layer's own, and ``work``, the float64 work of fitting the
    layer: its attention weights read, its keys and values repeated to every query head (H·d_h·D each)
    with their group means (as large, and the means themselves while they are formed).

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    >>> size = conversion_sizes(adapter_for(model), [parse_variant("mqa")], [0, 1])[0]
    >>> size.fitted  # q and o 32 × 32, k and v 8 × 32 (1 KV head of 8): the model's 2 KV heads less one
    [2560, 2560]
    >>> size.delta, size.work  # 32·32·2 + 16·32·2 attention weights read; (4·4 + 1)·8·32 repeated and means
    ([-512, -512], [7424, 7424])
    """

    fitted: list[int]
    delta: list[int]
    work: list[int]

    def fitting_bytes(self, b: int) -> int:
        """Bytes beyond the variant's fits in ``b``-byte elements while it is fitted: all its float64 fits,
        or, while its last layer is fitted (its fits in ``b`` not yet made), the others' and the work."""
        f64 = 8 * sum(self.fitted)
        last = max(8 * (w - f) for w, f in zip(self.work, self.fitted, strict=True)) - b * sum(self.fitted)
        return f64 + max(0, last)


def conversion_sizes(
    adapter: Adapter, variants: Sequence[Variant], layers: Sequence[int]
) -> list[ConversionSize]:
    """The :class:`ConversionSize` of each variant that converts ``layers`` (a variant that only quantizes
    or leaves them as they are has none); a mixed spec's layer is counted under its largest part."""
    lay = adapter.layout()
    d, heads = lay.hidden_size, lay.num_heads
    kv_width = lay.head_dim + lay.value_head_dim
    own = {layer: sum(t.numel() for t in _attention_tensors(adapter, layer)) for layer in layers}
    out = []
    for variant in variants:
        parts = [p for p in uniform_parts(variant) if p.mechanism != "model" and not p.quantizer]
        if not parts:
            continue
        fitted, delta, work = [], [], []
        for layer in layers:
            kv = adapter.kv_heads_of(adapter.attention_at(layer))
            fit_kv = max(_fitted_kv_heads(adapter, p, layer) for p in parts)
            change = (fit_kv - kv) * kv_width * d
            fitted.append(own[layer] + change)
            delta.append(change)
            work.append(own[layer] + (4 * heads + fit_kv) * lay.head_dim * d)
        out.append(ConversionSize(fitted, delta, work))
    return out


def _attention_tensors(adapter: Adapter, layer: int) -> list[torch.Tensor]:
    """The parameters of ``layer``'s attention module, each once."""
    return list({id(t): t for t in adapter.attention_at(layer).parameters()}.values())


def _rescales_logits(model: nn.Module) -> bool:
    """Whether the model rescales its head's output (Gemma 2's soft-capping, Cohere's and Granite's
    scales), which holds two copies of the logits for a moment."""
    config = getattr(model, "config", None)
    return any(getattr(config, name, none) not in (none, None) for name, none in HEAD_RESCALES.items())


def predicted_rows(protocol: Protocol, batch_size: int, length: int) -> int:
    """The most predicted rows one batch of ``batch_size`` sequences of ``length`` tokens has under
    ``protocol``: every token but a sequence's first, under ``stride:W/S`` the first window's W − 1
    and S in each later one, under ``prefill:P`` those after the prefill's P.

    >>> predicted_rows(DOCUMENTS, 8, 512), predicted_rows(Protocol("stride", 1024, 256), 8, 1024)
    (4088, 2815)
    >>> predicted_rows(Protocol("prefill", prefill=256), 8, 512)
    2040
    """
    every = batch_size * max(length - 1, 1)
    if protocol.prefill is not None:  # the tokens after the prefill's
        return batch_size * max(length - protocol.prefill - 1, 1)
    if protocol.stride is None:
        return every
    return min(every, length - 1 + (batch_size - 1) * protocol.stride)


def _cache_bytes(
    adapter: Adapter, variants: Sequence[Variant], rows: int, length: int, prefill: int, b: int
) -> int:
    """The ``cache`` part of the module docstring: ``rows × length`` tokens in ``b`` bytes."""
    lay = adapter.layout()
    parts = [p for v in variants for p in uniform_parts(v)]
    widen = lay.num_heads / lay.num_kv_heads if any(p.mechanism == "mha" for p in parts) else 1.0
    per_layer = [math.ceil(widen * layer_kv_elements(adapter, i)) for i in range(lay.num_layers)]
    cache = rows * length * (sum(per_layer) + max(per_layer)) * b
    groups = [p.cross.group for p in parts if p.cross is not None and p.cross.cache_transform]
    work = 6 * max(groups) * rows * prefill * max(per_layer) * max(b, 4) if groups else 0
    return cache + work


@dataclass(frozen=True)
class EvaluationMemory:
    """The parts (bytes) of an evaluation's peak on the model's device, and on the host when that is
    another device (``host``: the fits); see the module docstring."""

    parts: dict[str, int]
    device: torch.device
    #: The arguments that size a batch, for a message.
    sizes: str = "batch_size or max_length"
    host: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @classmethod
    def of(
        cls,
        model: nn.Module,
        adapter: Adapter,
        variants: Sequence[Variant],
        args: EvaluateArguments,
        protocol: Protocol = DOCUMENTS,
    ) -> EvaluationMemory:
        layers, per_layer, dtype = args.layers, args.per_layer, args.dtype
        batch_size, max_length = args.batch_size, args.max_length
        b = dtype.itemsize
        length = protocol.window or max_length  # a window is as long as the protocol says
        own = next((p.dtype for p in model.parameters() if p.is_floating_point()), dtype)
        copy = 0 if own == dtype else _tensor_bytes(model) + _tensor_bytes(model, dtype)
        conversions = conversion_sizes(adapter, variants, layers)
        fits = sum(sum(c.fitted) for c in conversions) * b
        fitting = max((c.fitting_bytes(b) for c in conversions), default=0)
        lay = adapter.layout()
        tokens = batch_size * length
        vocab = output_vocab(model)
        rows = predicted_rows(protocol, batch_size, length)
        logits = rows * vocab * b  # one forward's predicted rows
        copies = 2 if _rescales_logits(model) else 1  # the variant's (twice while the model rescales them)
        measures = measure_work_bytes(rows, vocab, b) if vocab else 0
        shape = ForwardShape.of(model, lay, adapter.mlp_width())
        shape = ForwardShape(**{**shape.__dict__, "dtype_bytes": b})
        working = forward_bytes(shape, batch_size, length)
        if any(p.quantizer for v in variants for p in uniform_parts(v)):
            working += 4 * tokens * (lay.num_kv_heads * (lay.head_dim + lay.value_head_dim)) * max(b, 4)
        forward = working + (1 + copies) * logits + measures
        converted = _converted_bytes(model, adapter, layers, dtype)
        variant = max((converted + sum(c.delta) * b for c in conversions), default=0)
        running = {"variant": variant, "forward": forward}
        if per_layer:
            running["sweep"] = tokens * lay.hidden_size * lay.num_layers * b
        if protocol.prefill is not None:
            running["cache"] = _cache_bytes(adapter, variants, batch_size, length, protocol.prefill, b)
        device = next(model.parameters()).device
        window = f"the {protocol.text} window"
        sizes = f"batch_size or {'max_length' if protocol.window is None else window}"
        if device.type != "cpu":  # the fits are the host's (module docstring)
            return cls({"copy": copy, **running}, device, sizes, {"fits": fits, "fitting": fitting})
        phase = {"fitting": fitting} if fitting > sum(running.values()) else running
        return cls({"copy": copy, "fits": fits, **phase}, device, sizes)


def estimated_part(device: int, host: dict[str, int], where: str) -> int:
    """The bytes an estimate reports ``where``: ``"device"`` (the model's) or ``"host"`` (the fits of a
    model off the CPU, one process's; 0 for a model on the CPU, whose device total counts them).

    >>> estimated_part(5, {"fits": 2, "fitting": 1}, "host"), estimated_part(5, {}, "device")
    (3, 5)
    """
    if where == "device":
        return device
    if where == "host":
        return sum(host.values())
    raise ArgumentError(f"where must be 'device' or 'host' (the fits of a model off the CPU), got {where!r}")


def check_evaluation_budget(need: EvaluationMemory, max_memory: int | None) -> int:
    """Refuse ``need`` over the budget (:class:`MemoryBudgetError`); return what the budget leaves over.

    >>> need = EvaluationMemory({"forward": 3 * 2**30}, torch.device("cpu"))
    >>> check_evaluation_budget(need, 4 * 2**30) == 2**30
    True
    >>> check_evaluation_budget(need, 2**30)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.MemoryBudgetError: evaluate would allocate 3.00 GiB on cpu (forward 3.00 GiB), over ...
    """
    refuse_host_over_budget("evaluate", need.host, HOST_ADVICE)
    return refuse_over_budget(
        "evaluate",
        need.total,
        need.device,
        max_memory,
        f"Use a smaller {need.sizes} (the logits of one forward are its predicted tokens × vocabulary), "
        "fewer converted layers (layers=[...]) or variants per call, or raise max_memory= (bytes) if the "
        "memory is there.",
        need.parts,
    )


def estimate_evaluation(
    model: nn.Module,
    variants: Sequence[str],
    *,
    layers: Iterable[int] | None = None,
    per_layer: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    batch_size: int = 8,
    max_length: int = 512,
    protocol: str = "documents",
    where: str = "device",
) -> int:
    """Peak bytes :func:`~headwidget.evaluation.evaluate` with these arguments may allocate on the model's
    device (the bound it checks against ``max_memory``; see the module docstring: a model on a GPU keeps
    its fits in the host's memory, checked apart, and ``where="host"`` gives those). Under ``chunks:W`` and
    ``stride:W/S`` a sequence is a window of W tokens (``max_length`` is not read); ``prefill:P`` adds the
    KV cache.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_embd=32, n_layer=1, n_head=4))
    >>> small = estimate_evaluation(gpt2, ["model"], dtype=torch.float32, batch_size=1, max_length=128)
    >>> large = estimate_evaluation(gpt2, ["model"], dtype=torch.float32, batch_size=16, max_length=512)
    >>> large > 16 * 512 * 50257 * 4 > small  # the logits of one forward alone
    True
    """
    adapter = adapter_for(model)
    args = check_evaluate_arguments(
        adapter, variants, None, layers, per_layer, dtype, batch_size, max_length, None, False
    )
    parsed = [parse_variant(v) for v in args.variants]
    need = EvaluationMemory.of(model, adapter, parsed, args, parse_protocol(protocol))
    return estimated_part(need.total, need.host, where)
