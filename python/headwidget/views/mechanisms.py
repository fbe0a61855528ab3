"""``MechanismView``: operator-space head correlation of one layer under several attention mechanisms.

Reference: the low-rank KV paper's figure (MHA, LRKV r=16, LRKV r=64, MQA, MLA side by side, colour
−1..1). Each panel is the (H × H) correlation of the heads' QK forms ``W_Q^h ᵀ W_K^{g(h)}`` (or OV
forms ``W_O^h W_V^{g(h)}``, ``circuit="ov"``) after converting the layer's K/V projections to that
mechanism, centred across heads. Under each title: KV-cache bytes per token (bf16, this layer), the
entropy effective rank of the heads, and the K/V reconstruction errors (data-aware when the statistics
hold the attention input). Passing a dict of real models shows one panel per model instead.

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
    >>> view = MechanismView(model, mechanisms=["mha", "mqa", "lrkv:2"])
    >>> [p.title for p in view.grid.panels]
    ['mha', 'mqa', 'lrkv:2']
    >>> view.circuit = "ov"
    >>> view.grid.colorbar_label, MechanismView.create(model=model, layers=[1]).layer
    ('OV operator correlation (centred across heads)', 1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import traitlets as t
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.analysis.conversions import convert
from headwidget.analysis.diversity import head_diversity
from headwidget.analysis.operator_space import operator_similarity
from headwidget.analysis.weights import head_weights
from headwidget.core.panels import Panel, PanelGrid
from headwidget.errors import StatsMismatchError
from headwidget.stats import KVStats
from headwidget.views._base import LayerView, ViewSourceError, check_sources, state
from headwidget.views._controls import checklist, select
from headwidget.views._registry import register_view

__all__ = ["CIRCUITS", "MechanismView", "default_mechanisms"]

CIRCUITS = ["qk", "ov"]


def default_mechanisms(model: nn.Module) -> list[str]:
    """The reference figure's line-up sized for this model: the model itself, LRKV at d_h/8 and d_h/2,
    MQA, and MLA with a latent of 4·d_h (DeepSeek-V2's ratio)."""
    d_h = adapter_for(model).layout().head_dim
    return ["model", f"lrkv:{max(1, d_h // 8)}", f"lrkv:{max(1, d_h // 2)}", "mqa", f"mla:{4 * d_h}"]


MV = TypeVar("MV", bound="MechanismView")


@register_view("mechanisms", order=30)
class MechanismView(LayerView):
    """One head-correlation panel per mechanism spec (or per real model)."""

    title = "Mechanisms"
    needs_stats = False
    needs_model = True

    circuit = state(t.Unicode("qk"), select("Circuit", options="circuits_available"))
    circuits_available = t.List(t.Unicode()).tag(sync=True)
    mechanisms = state(t.List(t.Unicode()), checklist("Mechanisms", options="mechanisms_available"))
    mechanisms_available = t.List(t.Unicode()).tag(sync=True)

    def __init__(
        self,
        model: nn.Module | Mapping[str, nn.Module],
        *,
        layer: int = 0,
        mechanisms: Sequence[str] | None = None,
        circuit: str = "qk",
        stats: KVStats | None = None,
        **kwargs: Any,
    ) -> None:
        """``mechanisms=None``: :func:`default_mechanisms`; a dict of models shows each as it is.

        ``stats`` must come from the model (from each model of a dict): statistics of another model
        raise :class:`~headwidget.errors.StatsMismatchError`, as :func:`~headwidget.convert` does.
        """
        self.models = dict(model) if isinstance(model, Mapping) else None
        if self.models is not None and not self.models:
            raise ViewSourceError("the mechanism view needs at least one model; got an empty dict")
        sources: list[tuple[str | None, Any]] = (
            [(None, model)] if self.models is None else [*self.models.items()]
        )
        for name, each in sources:
            what = "mechanism view" if name is None else f"mechanism view (model {name!r})"
            if each is None:
                raise ViewSourceError(f"the {what} needs a model (its weights), got None")
            try:
                check_sources(stats, each, what)
            except StatsMismatchError as err:
                if name is None:
                    raise
                raise StatsMismatchError(f"model {name!r}: {err}") from err
        self.model = next(iter(self.models.values())) if self.models else model
        self.stats = stats
        self._weights: dict[tuple[int, int], Any] = {}
        super().__init__(**kwargs)
        first = self.model
        assert isinstance(first, nn.Module)
        with self.initial_state():
            self.num_layers = min(
                adapter_for(m).layout().num_layers for m in (self.models or {"": first}).values()
            )
            self.layer = layer
            self.circuits_available = CIRCUITS
            self.circuit = circuit
            if self.models is None:
                self.mechanisms_available = default_mechanisms(first)
                self.mechanisms = list(mechanisms) if mechanisms is not None else self.mechanisms_available

    @classmethod
    def create(
        cls: type[MV],
        stats: KVStats | None = None,
        model: nn.Module | None = None,
        *,
        layers: Sequence[int] = (),
        interactive: bool = True,
        **state: Any,
    ) -> MV:
        """The first of ``layers`` (default 0) under each mechanism; ``stats`` makes errors data-aware."""
        return cls(cls._model(model), layer=layers[0] if layers else 0, stats=stats, **state)

    def _source(self, model: nn.Module) -> Any:
        key = (id(model), self.layer)
        if key not in self._weights:
            self._weights[key] = head_weights(model, self.layer)
        return self._weights[key]

    def _panel(self, panel_id: str, title: str, model: nn.Module, spec: str) -> Panel:
        conversion = convert(self._source(model), self.layer, spec, self.stats)
        sim = operator_similarity(conversion, self.layer, self.circuit)
        rank = head_diversity(sim)["effective_rank"]
        err = conversion.reconstruction_error
        subtitle = (
            f"{conversion.kv_bytes_per_token()} B/token · eff. rank {rank:.2f} · "
            f"err K {err['key']:.3f} V {err['value']:.3f}"
        )
        labels = [f"H{h}" for h in range(sim.shape[0])]
        return Panel(panel_id, title, sim, subtitle=subtitle, row_labels=labels, col_labels=labels)

    def compute(self) -> PanelGrid:
        """One panel per mechanism spec (or per real model), in order, colour −1..1."""
        if self.circuit not in CIRCUITS:
            raise ValueError(f"circuit must be 'qk' or 'ov', got {self.circuit!r}")
        if self.models is not None:
            panels = [self._panel(name, name, m, "model") for name, m in self.models.items()]
        else:
            assert isinstance(self.model, nn.Module)
            panels = [self._panel(spec, spec, self.model, spec) for spec in self.mechanisms]
        self.layer_label = f"layer {self.layer} of {self.num_layers}"
        label = f"{self.circuit.upper()} operator correlation (centred across heads)"
        return PanelGrid(panels, vmin=-1.0, vmax=1.0, colormap="diverging", colorbar_label=label)
