"""The adapter interface: everything headwidget knows about one model family.

Capture: where K/V and the attention input live (:meth:`Adapter.taps`, :meth:`Adapter.input_tap`) and
how recorded outputs split into heads (:meth:`Adapter.split`); where the queries the model rotates are
(:meth:`Adapter.query_taps`, :meth:`Adapter.split_queries`). Weights: where each head's Q/K/V rows and
O columns sit (:meth:`Adapter.head_projections`), read as :class:`~headwidget.core.weights.HeadWeights`
(:meth:`Adapter.head_weights`). Alignment: whether per-KV-head rotations can be folded back into the
weights exactly (:meth:`Adapter.alignment_blocker`) and folding them (:meth:`Adapter.fold_rotations`).
Conversions: writing converted per-head weights back (:meth:`Adapter.write_head_weights`), with another
number of KV heads where the family allows it (:attr:`Adapter.resizable_kv_heads`), and partial RoPE
(:meth:`Adapter.set_partial_rope`). Fingerprints: the few weight rows that identify a layer's weights
(:meth:`Adapter.fingerprint_rows`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from headwidget.adapters._heads import (
    HeadProjections,
    fold_into,
    plain_weight_problem,
    read_projections,
    weight_rows,
    write_projections,
)
from headwidget.adapters._partial_rope import PARTIAL_ROPE_MODEL_TYPES
from headwidget.core.layout import AttentionLayout, RopeLayout, mechanism_of
from headwidget.core.weights import HeadWeights
from headwidget.errors import (
    LayerIndexError,
    UnsupportedAlignmentError,
    UnsupportedConversionError,
    UnsupportedModelError,
)

__all__ = ["Adapter", "Tap", "calls_attention_interface", "config_get"]


@dataclass(frozen=True)
class Tap:
    """Record a submodule's output (or its first input, ``on_input=True``) under ``slot``."""

    module: nn.Module
    slot: str
    on_input: bool = False


def calls_attention_interface(attention: type[nn.Module]) -> bool:
    """Whether ``attention``'s forward looks its attention function up in transformers'
    ``ALL_ATTENTION_FUNCTIONS`` (``transformers.AttentionInterface``), where headwidget reaches the
    post-RoPE keys and the K/V the attention uses. Read from the forward's code, so it follows the
    installed transformers: a family that computes attention itself in one release and calls the
    interface in the next is refused, then served. A forward that reaches the interface only through
    a helper reads as False (refused: the safe side).

    >>> from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    >>> calls_attention_interface(LlamaAttention), calls_attention_interface(LlamaRotaryEmbedding)
    (True, False)
    """
    forward = inspect.unwrap(attention.forward)  # past transformers' decorators (functools.wraps)
    code = getattr(forward, "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


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
    implement :meth:`layout`, :meth:`taps`, :meth:`split` and :meth:`head_projections`; a family whose
    heads are not plain row blocks of Linear layers overrides :meth:`read_head_weights` and
    :meth:`fold_rotations` instead, and one with a reason its heads cannot be rotated exactly
    overrides :meth:`fold_blocker`.

    Example (GPT-2's adapter; 4 heads of 8 dims):
        >>> import torch
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> from headwidget.adapters import adapter_for
        >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4)).eval()
        >>> adapter = adapter_for(gpt2)
        >>> adapter.mlp_width(), adapter.shared_key_dims(), adapter.alignment_blocker()  # n_inner: 4 × 32
        (128, (), None)
        >>> w = adapter.head_weights(0)
        >>> tuple(w.q.shape), tuple(w.o.shape), tuple(w.k_bias.shape)
        ((4, 8, 32), (4, 32, 8), (4, 8))
        >>> rows = adapter.fingerprint_rows(0)
        >>> list(rows), tuple(rows["k.weight"].shape), tuple(rows["k.bias"].shape)
        (['q.weight', 'q.bias', 'k.weight', 'k.bias', 'v.weight', 'v.bias'], (2, 32), (2,))
        >>> adapter.write_head_weights(adapter.attention_at(0), w)  # the same weights, written back
        >>> bool(torch.equal(adapter.head_weights(0).k, w.k))
        True
        >>> ids = torch.randint(0, 64, (1, 8))
        >>> before = gpt2(ids).logits
        >>> flip = torch.eye(8, dtype=torch.float64).flip(0).repeat(4, 1, 1)  # orthogonal
        >>> adapter.fold_rotations(0, flip, flip)  # the keys and values rotated, the outputs the same
        >>> bool(torch.allclose(gpt2(ids).logits, before, atol=1e-5))
        True
    """

    family: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    #: Whether the attention receives its keys through ``transformers.AttentionInterface`` (a family
    #: whose answer depends on the transformers version sets it per model from
    #: :func:`calls_attention_interface`).
    routes_through_interface: bool = True
    #: Name of the attribute an attention module must have (used to find them).
    marker: ClassVar[str] = ""
    #: Whether each position attends only to earlier ones (a decoder); False for encoders, whose
    #: outputs are measured as hidden states, never as next-token predictions.
    causal: ClassVar[bool] = True
    #: The config field that holds the width of the MLP's hidden layer, and the multiple of the hidden
    #: size the family's own config uses when that field is None (0: the field must be set).
    mlp_width_field: ClassVar[str] = "intermediate_size"
    mlp_width_default: ClassVar[int] = 0

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.config: Any = model.config
        self._attentions: list[nn.Module] | None = None

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return getattr(getattr(model, "config", None), "model_type", None) in cls.model_types

    def attention_modules(self) -> list[nn.Module]:
        """The self-attention module of every layer, in layer order.

        The model's module tree is walked once per adapter (a walk costs milliseconds on a 30-layer
        model, and conversions ask for a layer's module many times); ask :func:`adapter_for` for a new
        adapter after replacing a model's attention modules.
        """
        if self._attentions is None:
            found = [
                m
                for name, m in self.model.named_modules()
                if hasattr(m, self.marker) and not _is_cross_attention(name, m)
            ]
            if not found:
                raise RuntimeError(f"no attention modules with a {self.marker!r} attribute were found")
            self._attentions = found
        return list(self._attentions)

    def mlp_width(self) -> int:
        """Width of the MLP's hidden layer, from the config field the family names."""
        config = getattr(self.model, "config", None)
        value = getattr(config, self.mlp_width_field, None)
        if value is None and self.mlp_width_default:
            return self.mlp_width_default * self.layout().hidden_size
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UnsupportedModelError(
                f"{type(self.model).__name__}'s config has no usable {self.mlp_width_field} (got {value!r}), "
                "the width of its MLP that headwidget's memory estimates need; set it in the config"
            )
        return value

    def layout(self) -> AttentionLayout:
        raise NotImplementedError

    def heads_layout(
        self, heads: int, kv: int, head_dim: int, hidden: int, rope: RopeLayout | None = None
    ) -> AttentionLayout:
        """The layout of ``heads`` query heads over ``kv`` K/V heads, keys and values both ``head_dim``
        wide (MHA, GQA or MQA by the counts), on every layer of the model."""
        return AttentionLayout(
            family=self.family,
            mechanism=mechanism_of(heads, kv),
            num_layers=len(self.attention_modules()),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            value_head_dim=head_dim,
            hidden_size=hidden,
            rope=rope or RopeLayout(),
        )

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

    def query_taps(self, attention: Any) -> list[Tap] | None:
        """The taps, beside :meth:`taps`, that :meth:`split_queries` reads (None: no queries for this family).

        The base adapter gives none; families with rotary embeddings whose queries are one module's
        output (or part of the fused projection that :meth:`taps` records) say where.

        >>> from transformers import BertConfig, BertModel
        >>> from headwidget.adapters import adapter_for
        >>> bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        ...                             intermediate_size=64))
        >>> adapter = adapter_for(bert)
        >>> adapter.query_taps(adapter.attention_at(0)) is None
        True
        """
        return None

    def split_queries(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The queries ``(B, T, H·d_h)`` (head-major) as the model rotates them: after any per-head query
        norm, before RoPE, from the slots of :meth:`taps` and :meth:`query_taps`."""
        raise NotImplementedError(f"the {self.family} adapter gives no queries")

    # ------------------------------------------------------------------ weights
    def attention_at(self, layer: int) -> nn.Module:
        """The self-attention module of ``layer`` (negative indices count from the end).

        Raises:
            LayerIndexError: ``layer`` is not a layer of the model.
        """
        attentions = self.attention_modules()
        if not -len(attentions) <= layer < len(attentions):
            raise LayerIndexError(f"layer {layer} is out of range: the model has {len(attentions)} layers")
        return attentions[layer]

    def head_projections(self, attention: Any) -> HeadProjections:
        """Where ``attention`` keeps each head's Q/K/V output rows and O input columns.

        Example:
            >>> from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
            >>> from headwidget.adapters import adapter_for
            >>> neox = GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
            ...                                         num_attention_heads=2, intermediate_size=32))
            >>> adapter = adapter_for(neox)
            >>> p = adapter.head_projections(adapter.attention_at(0))
            >>> p.k.index.tolist()  # per head [q | k | v] in the fused query_key_value
            [[8, 9, 10, 11, 12, 13, 14, 15], [32, 33, 34, 35, 36, 37, 38, 39]]
        """
        raise UnsupportedModelError(
            f"the {self.family} adapter does not say where its heads' weights are; per-head weights "
            "and rotations are not available for this family"
        )

    def read_head_weights(self, attention: Any) -> HeadWeights:
        """The per-head Q/K/V/O weights of one attention module (float64, CPU, copies)."""
        return read_projections(self.head_projections(attention), mechanism=self.layout().mechanism)

    def head_weights(self, layer: int) -> HeadWeights:
        """The per-head Q/K/V/O weights of ``layer`` in the :mod:`headwidget.core.weights` convention.

        Raises:
            LayerIndexError: ``layer`` is not a layer of the model.
        """
        return self.read_head_weights(self.attention_at(layer))

    def fingerprint_rows(self, layer: int) -> dict[str, torch.Tensor] | None:
        """The few weight rows of ``layer`` that identify its weights (what a weight fingerprint hashes).

        The first row of the first and of the last head of the query, key and value projections, and
        the matching bias entries: ``{"q.weight": (2, d), "q.bias": (2,), "k.weight": ..., ...}``, gathered
        on the weights' own devices (a model split across devices is read where it lies). None when they
        cannot be read: a projection that is not a plain floating-point Linear/Conv1D (a quantised
        model), weights on the meta device (offloaded), or a family that does not say where its heads'
        weights are. See :func:`~headwidget.adapters.fingerprint.weight_fingerprint`.
        """
        try:
            projections = self.head_projections(self.attention_at(layer))
        except UnsupportedModelError:
            return None
        out: dict[str, torch.Tensor] = {}
        for name, s in (("q", projections.q), ("k", projections.k), ("v", projections.v)):
            if plain_weight_problem(s.module) is not None:
                return None
            weight = weight_rows(s.module)
            if weight.device.type == "meta":
                return None
            rows = s.index[[0, -1], 0].to(weight.device)  # the first row of the first and last head
            out[f"{name}.weight"] = weight.detach()[rows]
            bias = getattr(s.module, "bias", None)
            if isinstance(bias, torch.Tensor):
                out[f"{name}.bias"] = bias.detach()[rows.to(bias.device)]
        return out

    # ------------------------------------------------------------------ rotations
    def shared_key_dims(self) -> tuple[int, ...]:
        """Dims of every key head that hold one vector shared by all heads (MLA's decoupled RoPE key).

        A per-head rotation must leave them fixed; :func:`~headwidget.analysis.align_model.align_model`
        rotates only the other dims.
        """
        return ()

    def fold_blocker(self, attention: Any) -> str | None:
        """Why per-KV-head rotations cannot be folded into ``attention`` exactly (None: they can).

        The base check: every projection is a plain floating-point Linear/Conv1D.
        """
        try:
            projections = self.head_projections(attention)
        except UnsupportedModelError as err:
            return str(err)
        for module in projections.modules():
            problem = plain_weight_problem(module)
            if problem is not None:
                return problem
        return None

    def alignment_blocker(self) -> str | None:
        """Why this model's heads cannot be rotated exactly, naming the cause (None: they can)."""
        for attention in self.attention_modules():
            reason = self.fold_blocker(attention)
            if reason is not None:
                return f"{type(self.model).__name__} ({self.family}): {reason}"
        return None

    def fold_rotations(self, layer: int, key_rotations: torch.Tensor, value_rotations: torch.Tensor) -> None:
        """Rotate the KV heads of ``layer`` in place without changing what the model computes.

        ``key_rotations`` (G, d_h, d_h) turn each KV head's keys ``k → k R`` (the matching query rows
        get the same ``R``, so ``q·k`` is unchanged; for RoPE models ``R`` must act on each rotary
        plane as a 2×2 rotation, so that it commutes with RoPE). ``value_rotations`` (G, d_v, d_v)
        turn values ``v → v S`` and the output projection's columns of the query heads reading them
        ``W_O[h] → W_O[h] S``. Both must be orthogonal.

        Raises:
            UnsupportedAlignmentError: :meth:`fold_blocker` names a reason for this layer.
            StatsMismatchError: the rotations do not have one ``d × d`` block per KV head.
        """
        attention = self.attention_at(layer)
        reason = self.fold_blocker(attention)
        if reason is not None:
            raise UnsupportedAlignmentError(f"{type(self.model).__name__} ({self.family}): {reason}")
        fold_into(self.head_projections(attention), key_rotations, value_rotations)

    # ------------------------------------------------------------------ conversions
    #: Whether a layer can be given another number of KV heads (a real GQA/MQA model).
    resizable_kv_heads: ClassVar[bool] = False

    def kv_heads_of(self, attention: Any) -> int:
        """The number of KV heads ``attention`` holds now (after a conversion it may differ per layer)."""
        return int(self.head_projections(attention).k.index.shape[0])

    def write_head_weights(self, attention: Any, weights: HeadWeights) -> None:
        """Overwrite ``attention``'s per-head Q/K/V/O weights and biases with ``weights`` (in place).

        ``weights`` must have as many KV heads as the layer unless :attr:`resizable_kv_heads`.

        Raises:
            UnsupportedConversionError: the family does not say where its heads' weights are (MLA),
                or the layer cannot hold that many KV heads.
        """
        reason = self.conversion_blocker()
        if reason is not None:
            raise UnsupportedConversionError(
                f"{type(self.model).__name__} ({self.family}): converted weights cannot be written back: "
                f"{reason}"
            )
        projections = self.head_projections(attention)
        have = int(projections.k.index.shape[0])
        if weights.num_kv_heads != have:
            raise UnsupportedConversionError(
                f"{type(self.model).__name__} ({self.family}) keeps {have} KV heads per layer; a conversion "
                f"to {weights.num_kv_heads} KV heads must be written as {have} heads"
            )
        for module in projections.modules():
            problem = plain_weight_problem(module)
            if problem is not None:
                raise UnsupportedConversionError(problem)
        write_projections(projections, weights)

    def set_config_kv_heads(self, num_kv_heads: int) -> None:
        """Record in the model's config that every layer now has ``num_kv_heads`` KV heads."""
        raise UnsupportedConversionError(f"the {self.family} config has no KV-head count to update")

    def conversion_blocker(self) -> str | None:
        """Why converted weights cannot be written into this model (None: they can)."""
        try:
            self.head_projections(self.attention_at(0))
        except UnsupportedModelError as err:
            return str(err)
        return None

    def kv_heads_blocker(self) -> str | None:
        """Why this model's layers cannot be given another number of KV heads (``mha``, ``gqa:G``,
        ``mqa``; None: they can)."""
        return None

    def partial_rope_blocker(self) -> str | None:
        """Why this model's attention cannot apply RoPE per KV head (None: it can)."""
        return (
            f"partial RoPE ('rope:r') is built for Llama-family models only (model types "
            f"{', '.join(PARTIAL_ROPE_MODEL_TYPES)}); {type(self.model).__name__} ({self.family}) is not one"
        )

    def set_partial_rope(self, attention: Any, keep: torch.Tensor) -> None:
        """Make ``attention`` rotate only the dims ``keep`` (G, d_h) marks per KV head (partial RoPE).

        Raises:
            UnsupportedConversionError: :meth:`partial_rope_blocker` names a reason.
        """
        raise UnsupportedConversionError(str(self.partial_rope_blocker()))


def _is_cross_attention(name: str, module: nn.Module) -> bool:
    last = name.rsplit(".", 1)[-1]
    return "cross" in last.lower() or "Cross" in type(module).__name__
