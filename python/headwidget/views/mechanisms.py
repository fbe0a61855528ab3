"""``MechanismView``: operator-space head correlation of one layer under several attention mechanisms.

Reference: the low-rank KV paper's figure (MHA, LRKV r=16, LRKV r=64, MQA, MLA side by side, colour
−1..1). Each panel is the (H × H) correlation of the heads' QK forms ``W_Q^h ᵀ W_K^{g(h)}`` (or OV
forms ``W_O^h W_V^{g(h)}``, ``circuit="ov"``) after converting the layer's K/V projections to that
mechanism, centred across heads. Under each title: the KV-cache bytes per token (over all layers as
if each were converted so, and this layer's own; in bf16, or with a ``report`` in the dtype it was
evaluated in, as its trade-off chart counts them, with bf16 beside),
the entropy effective rank of the heads, and the K/V reconstruction errors (``err K … V …``), labelled
as what they are: weight-space errors, or data-aware ones over the statistics' N tokens (when the
statistics hold the attention input). The figure's caption (its title when saved) and the layer
read-out name the model and the layer. Passing a dict of real models shows one panel per model instead.

The checklist offers exactly the specs asked for (and any set later, or typed into
``add_mechanism``); unchecking one keeps it offered. A spec the layer cannot take (``lrkv:64`` at
d_h 32, ``gqa:5`` over 4 heads) gets a panel of its own with no values and the reason in its subtitle
and note, beside the panels that can be drawn. Conversions and operator correlations are cached per
(layer, spec, circuit), and with ``prefetch`` the neighbouring layers and the other circuit are
computed in the background, so that moving through them is a cache hit.

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
    >>> view = MechanismView(model, mechanisms=["mha", "mqa", "lrkv:2", "lrkv:64"], prefetch=False)
    >>> [p.title for p in view.grid.panels], view.mechanisms_available
    (['mha', 'mqa', 'lrkv:2', 'lrkv:64'], ['mha', 'mqa', 'lrkv:2', 'lrkv:64'])
    >>> view.grid.panels[3].subtitle
    'cannot build: lrkv:64: r must lie in 0..8 (the head size)'
    >>> view.grid.panels[2].subtitle.endswith("(weight-space: no statistics)"), view.caption
    (True, 'GPT2LMHeadModel · layer 0')
    >>> view.circuit = "ov"
    >>> view.grid.colorbar_label, MechanismView.create(model=model, layers=[1]).layer
    ('OV operator correlation (centred across heads)', 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import traitlets as t
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.analysis.conversions import Conversion, convert
from headwidget.analysis.diversity import head_diversity
from headwidget.analysis.operator_space import operator_similarity
from headwidget.analysis.weights import head_weights
from headwidget.checks import flag, text_list, whole_number
from headwidget.core.kv_bytes import kv_bytes_text
from headwidget.core.panels import Panel, PanelGrid
from headwidget.errors import (
    DegenerateHeadsError,
    GroupCountError,
    MechanismSpecError,
    MissingStatisticsError,
    RankRangeError,
    StatsMismatchError,
    UnknownCircuitError,
    UnsupportedConversionError,
)
from headwidget.evaluation import EvaluationReport
from headwidget.stats import KVStats
from headwidget.views._base import LayerState, LayerView, ViewSourceError, check_sources
from headwidget.views._controls import checklist, entry, select
from headwidget.views._memo import Memo
from headwidget.views._models import check_same_models
from headwidget.views._registry import register_view
from headwidget.views._sources import ViewSources
from headwidget.views._state import state

__all__ = [
    "CIRCUITS",
    "KV_DTYPE",
    "SPEC_ERRORS",
    "MechanismState",
    "MechanismView",
    "default_mechanisms",
    "kv_dtype",
    "model_name",
]

CIRCUITS = ["qk", "ov"]
#: What a spec the layer cannot take raises: shown in that spec's panel, the others still drawn.
SPEC_ERRORS: tuple[type[Exception], ...] = (
    MechanismSpecError,
    GroupCountError,
    RankRangeError,
    UnsupportedConversionError,
    MissingStatisticsError,
    DegenerateHeadsError,
)


def default_mechanisms(model: nn.Module) -> list[str]:
    """The reference figure's line-up sized for this model: the model itself, LRKV at d_h/8 and d_h/2,
    MQA, and MLA with a latent of 4·d_h (DeepSeek-V2's ratio)."""
    d_h = adapter_for(model).layout().head_dim
    return ["model", f"lrkv:{max(1, d_h // 8)}", f"lrkv:{max(1, d_h // 2)}", "mqa", f"mla:{4 * d_h}"]


def model_name(model: object) -> str:
    """What a figure calls ``model``: its config's ``name_or_path``, else its class name.

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model_name(GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=4)))
        'GPT2LMHeadModel'
    """
    name = getattr(getattr(model, "config", None), "name_or_path", "")
    return str(name) if name else type(model).__name__


#: A cached panel body: the (H, H) correlation, its effective rank and the conversion, or the error.
Result = tuple[np.ndarray, float, Conversion] | Exception
#: The dtype KV bytes are counted in without a report: :func:`headwidget.evaluate`'s default.
KV_DTYPE = torch.bfloat16


def kv_dtype(name: str) -> torch.dtype:
    """A report's ``dtype`` (``"torch.float32"``) as a torch dtype.

    >>> kv_dtype("torch.float32"), kv_dtype("bfloat16")
    (torch.float32, torch.bfloat16)
    """
    found = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise ViewSourceError(f"the report's dtype {name!r} is not a floating-point torch dtype")
    return found


@dataclasses.dataclass(frozen=True)
class MechanismState(LayerState):
    """The selected layer, the circuit (``qk`` or ``ov``) and the mechanism specs shown."""

    circuit: str = state("qk", select("Circuit", options="circuits_available"))
    mechanisms: tuple[str, ...] = state((), checklist("Mechanisms", options="mechanisms_available"))


@register_view("mechanisms", order=30)
class MechanismView(LayerView[MechanismState]):
    """One head-correlation panel per mechanism spec (or per real model)."""

    title = "Mechanisms"
    sources = ViewSources("model", ("stats", "report"), layers="layer", prefetch=True)

    circuits_available = t.List(t.Unicode()).tag(sync=True)
    mechanisms_available = t.List(t.Unicode()).tag(sync=True)
    #: Set to a spec (``"gqa:2"``) to offer it and show it; read back as "" once it is added. The
    #: control bar's field sets it; it is input, not state: the spec joins ``mechanisms``.
    add_mechanism = t.Unicode("").tag(sync=True, control=entry("Add mechanism"))

    def __init__(
        self,
        model: nn.Module | Mapping[str, nn.Module],
        *,
        layer: int = 0,
        mechanisms: Sequence[str] | None = None,
        circuit: str = "qk",
        stats: KVStats | None = None,
        report: EvaluationReport | None = None,
        prefetch: bool = True,
    ) -> None:
        """``mechanisms=None``: :func:`default_mechanisms`; a dict of models shows each as it is.

        ``stats`` must come from the model (from each model of a dict): statistics of another model
        raise :class:`~headwidget.errors.StatsMismatchError`, as :func:`~headwidget.convert` does.
        ``report``: an evaluation of the model (:func:`headwidget.evaluate`): the KV bytes are counted
        in its dtype, as its trade-off chart counts them (without one: bf16, ``evaluate``'s default).
        ``prefetch``: compute the neighbouring layers and the other circuit in the background.
        """
        if report is not None and not isinstance(report, EvaluationReport):
            raise ViewSourceError(
                f"report must be an EvaluationReport (headwidget.evaluate), got {type(report).__name__}"
            )
        self.prefetch = flag("prefetch", prefetch)
        layer = whole_number("layer", layer)
        if mechanisms is not None:
            mechanisms = text_list("mechanisms", mechanisms, example="['mha', 'mqa']", what="mechanism specs")
        self.models = dict(model) if isinstance(model, Mapping) else None
        if self.models is not None and not self.models:
            raise ViewSourceError("the mechanism view needs at least one model; got an empty dict")
        #: The shown models by name (one model: ``""``).
        self._models: dict[str, nn.Module] = self.models or {"": model}  # type: ignore[dict-item]
        for name, each in self._models.items():
            what = f"mechanism view (model {name!r})" if name else "mechanism view"
            if each is None:
                raise ViewSourceError(f"the {what} needs a model (its weights), got None")
            try:
                check_sources(stats, each, what)
            except StatsMismatchError as err:
                if not name:
                    raise
                raise StatsMismatchError(f"model {name!r}: {err}") from err
        first = self.model = next(iter(self._models.values()))
        # (the statistics are the model's by the weights' fingerprint, checked above)
        for source in ({"model": first}, {"stats": stats}):
            check_same_models({**source, "report": report}, "mechanism view")
        self.stats = stats
        #: The dtype the KV bytes are counted in: the report's, else bf16.
        self.kv_dtype = KV_DTYPE if report is None else kv_dtype(report.dtype)
        # A layer's weights, its conversions, and a panel's correlation (or why there is none).
        self._weights = Memo(lambda name, layer: head_weights(self._models[name], layer), size=64)
        self._conversions = Memo(self._conversion, size=256)
        self._results = Memo(self._result, size=256)
        super().__init__()
        self.num_heads = adapter_for(first).layout().num_heads
        #: Each shown model's number of layers (its KV bytes are counted over all of them).
        self._model_layers = {name: adapter_for(m).layout().num_layers for name, m in self._models.items()}
        specs = (
            [] if self.models else list(mechanisms) if mechanisms is not None else default_mechanisms(first)
        )
        self.set_up(
            MechanismState(layer=layer, circuit=circuit, mechanisms=tuple(specs)),
            num_layers=min(self._model_layers.values()),
            circuits_available=CIRCUITS,
            mechanisms_available=list(dict.fromkeys(specs)),
        )

    # ------------------------------------------------------------------ offered specs
    @t.observe("mechanisms")
    def _offer_shown(self, change: dict[str, Any]) -> None:
        """Every spec shown stays offered (appended to the checklist when it is new)."""
        new = [s for s in change["new"] if s not in self.mechanisms_available]
        if new:
            self.mechanisms_available = [*self.mechanisms_available, *dict.fromkeys(new)]

    @t.observe("add_mechanism")
    def _add(self, change: dict[str, Any]) -> None:
        spec = change["new"].strip()
        if not spec:
            return
        shown = self.current_state().mechanisms
        if spec not in shown:
            self.set_state(mechanisms=[*shown, spec])
        self.add_mechanism = ""

    # ------------------------------------------------------------------ kept computation
    def _conversion(self, name: str, layer: int, spec: str) -> Conversion | Exception:
        try:
            return convert(self._weights(name, layer), layer, spec, self.stats)
        except SPEC_ERRORS as err:
            return err

    def _result(self, name: str, layer: int, spec: str, circuit: str) -> Result:
        """The correlation, effective rank and conversion of one panel (or why there is none)."""
        conversion = self._conversions(name, layer, spec)
        if isinstance(conversion, Exception):
            return conversion
        try:
            sim = operator_similarity(conversion, layer, circuit)
        except SPEC_ERRORS as err:
            return err
        sim.setflags(write=False)  # shared by every revisit (and its wire encoding kept)
        return sim, float(head_diversity(sim)["effective_rank"]), conversion

    def _bytes(self, name: str, conversion: Conversion) -> str:
        """The conversion's KV bytes as every view says them: over all layers (as if each were
        converted so), this layer's beside them, in :attr:`kv_dtype` (and in bf16 beside them when
        that is another)."""
        per_layer = conversion.kv_bytes_per_token(self.kv_dtype)
        layers = self._model_layers[name]
        text = kv_bytes_text(per_layer * layers, layers, self.kv_dtype, this_layer=per_layer)
        if self.kv_dtype == KV_DTYPE:
            return text
        return f"{text} · {conversion.kv_bytes_per_token(KV_DTYPE) * layers:,} B/token in bf16"

    def _errors_label(self, conversion: Conversion) -> str:
        if conversion.weighting == "data-aware" and self.stats is not None:
            return f"data-aware over {self.stats.tokens} tokens"
        return "weight-space: no statistics" if self.stats is None else "weight-space: no attention input"

    def _panel(self, state: MechanismState, panel_id: str, title: str, name: str, spec: str) -> Panel:
        result = self._results(name, state.layer, spec, state.circuit)
        if isinstance(result, Exception):
            heads = adapter_for(self._models[name]).layout().num_heads
            labels = [f"H{h}" for h in range(heads)]
            reason = f"cannot build: {result}" if spec in str(result) else f"cannot build {spec}: {result}"
            empty = np.full((heads, heads), np.nan)
            return Panel(
                panel_id, title, empty, subtitle=reason, row_labels=labels, col_labels=labels, note=reason
            )
        sim, rank, conversion = result
        err = conversion.reconstruction_error
        subtitle = (
            f"{self._bytes(name, conversion)} · eff. rank {rank:.2f} · "
            f"err K {err['key']:.3f} V {err['value']:.3f} ({self._errors_label(conversion)})"
        )
        labels = [f"H{h}" for h in range(sim.shape[0])]
        return Panel(
            panel_id,
            title,
            sim,
            subtitle=subtitle,
            row_labels=labels,
            col_labels=labels,
            row_axis="head",
            col_axis="head",
        )

    def _shown_specs(self, state: MechanismState) -> list[tuple[str, str, str, str]]:
        """(panel id, title, model name, spec) of every panel, in order."""
        if self.models is not None:
            return [(name, name, name, "model") for name in self.models]
        return [(spec, spec, "", spec) for spec in state.mechanisms]

    def neighbours(self, state: MechanismState) -> list[MechanismState]:
        """The next layer first (what a slider move asks for most), the previous one, then the other
        circuit of this layer."""
        other = next((c for c in CIRCUITS if c != state.circuit), state.circuit)
        return [*self.layer_neighbours(state), state.replace(circuit=other)]

    def _model_names(self) -> str:
        return model_name(self.model) if self.models is None else ", ".join(self.models)

    def describe(self, state: MechanismState) -> str:
        """What the figure shows: the model (or models) and the layer."""
        return f"{self._model_names()} · layer {state.layer}"

    def labels(self, state: MechanismState) -> dict[str, Any]:
        """The layer read-out, with the model (or models) shown."""
        return {"layer_label": f"{self.layer_text(state.layer)} · {self._model_names()}"}

    def compute(self, state: MechanismState, resolution: int | None = None) -> PanelGrid:
        """One panel per mechanism spec (or per real model), in order, colour −1..1."""
        if state.circuit not in CIRCUITS:
            raise UnknownCircuitError(f"unknown circuit {state.circuit!r}; choose 'qk' or 'ov'")
        self.check_layer(state.layer)
        panels = [self._panel(state, *each) for each in self._shown_specs(state)]
        label = f"{state.circuit.upper()} operator correlation (centred across heads)"
        return PanelGrid(panels, vmin=-1.0, vmax=1.0, colormap="diverging", colorbar_label=label)
