"""Which model each source of a view comes from, and the refusal of sources of different models.

Statistics, a report, healing runs and a timeline each record the model they were taken from: its name
(the config's ``name_or_path``, else its class) and its layer count, or at least the layers they name.
Shown together (one view built from several sources, or a dashboard's tabs sharing a layer), sources
of two models would show numbers of neither, and a layer of one is no layer of the other (a click on
layer 24 of a 30-layer report's damage map sends a 4-layer timeline's tabs out of range). So they are
refused when the view or dashboard is built, naming both models. Names are compared by their last
path component (a model saved to a folder and read back keeps its name), a report's or a run's name
that is a class name (what they record for a model without one) with the other's class; a source
that records no name or no layer count is not refused for it. Statistics and a model's weights are
compared by the weights' fingerprint (:func:`~headwidget.views.check_sources`), not here.

Example:
    >>> from headwidget.evaluation import EvaluationReport
    >>> def report(model, num_layers):
    ...     return EvaluationReport(model=model, kind="causal-lm", variants=["model"], measures={},
    ...         kv_bytes_per_token={"model": 1}, tokens=1, sequences=1, fingerprint="0",
    ...         dtype="torch.float32", layers=[0], num_layers=num_layers)
    >>> source_models({"report": report("org/SmolLM2-135M", 30)})
    [SourceModel(source='the report', name='org/SmolLM2-135M', layers=30, highest=0, model_class='')]
    >>> check_same_models({"report": report("SmolLM2-135M", 30), "timeline": None})  # one source: fine
    >>> check_same_models({"report": report("/tmp/SmolLM2-135M", 30), "healing": None})
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import nn

from headwidget.errors import StatsMismatchError
from headwidget.evaluation import EvaluationReport
from headwidget.healing import HealingRun
from headwidget.stats import KVStats
from headwidget.tracking import Timeline

__all__ = ["SourceModel", "check_same_models", "source_models"]


@dataclasses.dataclass(frozen=True)
class SourceModel:
    """The model one source was taken from: ``name`` ("" where it records none), ``layers`` (the
    model's layer count, 0 where it records none) and ``highest``, the highest layer the source names
    (-1: none)."""

    source: str
    name: str
    layers: int
    highest: int
    #: The model's class where the source records it apart from its name ("": not recorded).
    model_class: str = ""

    def words(self) -> str:
        """``"SmolLM2-135M (30 layers)"``; a source that records no layer count: its highest layer."""
        if self.layers:
            count = f"{self.layers} layer{'s' * (self.layers != 1)}"
        elif self.highest >= 0:
            count = f"layers up to {self.highest}"
        else:
            count = "layers not recorded"
        return f"{self.name or self.model_class or 'an unnamed model'} ({count})"


def _stats_model(source: str, stats: KVStats) -> SourceModel:
    meta = stats.meta
    return SourceModel(
        source, meta.model_name, meta.layout.num_layers, max(stats.layers, default=-1), meta.model_class
    )


def _module_model(model: nn.Module) -> SourceModel:
    from headwidget.adapters import adapter_for

    config = getattr(model, "config", None)
    name = str(getattr(config, "name_or_path", "") or "")
    layers = 0
    with contextlib.suppress(Exception):  # (a model no adapter knows: its layers are not recorded)
        layers = adapter_for(model).layout().num_layers
    return SourceModel("the model", name, layers, -1, type(model).__name__)


def _model_of(source: str, value: Any) -> SourceModel | None:
    """The model ``value`` (one source, called ``source`` in messages) records; None for another type."""
    if isinstance(value, KVStats):
        return _stats_model(source, value)
    if isinstance(value, nn.Module):
        return _module_model(value)
    if isinstance(value, EvaluationReport):
        return SourceModel(source, value.model, value.num_layers, max(value.layers, default=-1))
    if isinstance(value, HealingRun):
        return SourceModel(source, value.model_name, 0, max(value.layers, default=-1))
    if isinstance(value, Timeline) and value.steps:
        return _stats_model(source, value[value.steps[0]])
    return None


#: What each source is called in a message.
_CALLED = {
    "stats": "the statistics",
    "report": "the report",
    "timeline": "the timeline",
    "healing": "the run",
}
#: What one of a mapping of sources is called, by its name.
_ONE_OF = {"timeline": "timeline", "healing": "healing run"}


def source_models(given: Mapping[str, Any]) -> list[SourceModel]:
    """The model of each source in ``given`` (source name → value, as :meth:`View.create
    <headwidget.views.View.create>` takes them; None and values of other types are skipped): a
    mapping of healing runs or of timelines gives one entry each."""
    found: list[SourceModel | None] = []
    for key, value in given.items():
        if isinstance(value, Mapping) and key in _ONE_OF:
            found += [_model_of(f"{_ONE_OF[key]} {name!r}", each) for name, each in value.items()]
        elif value is not None:
            found.append(_model_of(_CALLED.get(key, key), value))
    return [m for m in found if m is not None]


def _stem(name: str) -> str:
    return name.strip().rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].casefold()


def _named_apart(a: SourceModel, b: SourceModel) -> bool:
    """Whether the names (and classes) two sources record say they are of different models. A report
    or a run records its model's name, or its class where the model had none: a name that is a class
    name is compared with the other's class."""
    if a.model_class and b.model_class and a.model_class != b.model_class:
        return True
    if a.name and b.name:
        same = _stem(a.name) == _stem(b.name) or a.name in (b.model_class,) or b.name in (a.model_class,)
        return not same
    for named, other in ((a, b), (b, a)):
        if named.name.isidentifier() and not named.model_class and other.model_class:
            return named.name != other.model_class
    return False


def _differ(a: SourceModel, b: SourceModel) -> bool:
    if _named_apart(a, b):
        return True
    if a.layers and b.layers and a.layers != b.layers:
        return True
    return (a.layers > 0 and b.highest >= a.layers) or (b.layers > 0 and a.highest >= b.layers)


def check_same_models(given: Mapping[str, Any], what: str = "view") -> None:
    """Refuse sources of different models (see the module docstring) with
    :class:`~headwidget.errors.StatsMismatchError`, naming both ("the report: tiny-llama (4
    layers); healing run 'mqa': SmolLM2-135M (layers up to 24)").

    Example:
        >>> from headwidget.healing import HealingRun
        >>> from headwidget.evaluation import EvaluationReport
        >>> report = EvaluationReport(model="tiny-llama", kind="causal-lm", variants=["model"], measures={},
        ...     kv_bytes_per_token={"model": 1}, tokens=1, sequences=1, fingerprint="0",
        ...     dtype="torch.float32", layers=[0, 1], num_layers=4)
        >>> run = HealingRun(model_name="SmolLM2-135M", spec="mqa", kind="causal-lm", method="kd",
        ...     loss="kd", trainable="kv", lr=1e-3, batch_size=2, max_length=8, tokens=32, seed=0,
        ...     dtype="torch.float32", steps=2, tokens_seen=32, reference_nll=2.0,
        ...     kv_bytes_per_token=64.0, layers=[0, 24], curve=[], per_layer=None, losses=[],
        ...     healing_fingerprint="ab", evaluation_fingerprint="cd", evaluation_tokens=40)
        >>> check_same_models({"report": report, "healing": {"mqa": run}}, "dashboard")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        headwidget.errors.StatsMismatchError: the dashboard's sources are of different models: the report: ...
    """
    models = source_models(given)
    for i, a in enumerate(models):
        for b in models[i + 1 :]:
            if _differ(a, b):
                raise StatsMismatchError(
                    f"the {what}'s sources are of different models: {a.source}: {a.words()}; "
                    f"{b.source}: {b.words()}; show the sources of one model together"
                )
