"""headwidget: how redundant are a model's attention heads and KV channels?

Capture streaming key/value statistics from any supported Hugging Face model, then look at
channel × channel correlations and head × head similarities.

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
    >>> stats.meta.mechanism, stats.head_similarity(0, "key").shape
    ('mqa', (1, 1))
"""

from typing import TYPE_CHECKING, Any

from headwidget._version import __version__
from headwidget.analysis import (
    align,
    align_model,
    channel_entropy,
    convert,
    downsample,
    group_heads,
    head_diversity,
    layer_similarity,
    mechanism_sweep,
    operator_similarity,
)
from headwidget.capture import capture, estimate, supported_families
from headwidget.errors import (
    ArgumentError,
    BudgetError,
    CaptureConflictError,
    CaptureInputError,
    ChannelEntropyError,
    CrossLayerMissingError,
    DegenerateHeadsError,
    GroupCountError,
    HeadwidgetError,
    HealingInputError,
    HeldOutSplitError,
    LayerIndexError,
    MechanismSpecError,
    MemoryBudgetError,
    NonFiniteActivationError,
    NonFiniteLossError,
    NoSamplesError,
    RankRangeError,
    RopeAlignmentError,
    RopeCaptureError,
    StatsFileError,
    StatsMismatchError,
    TimelineFileError,
    TrackingError,
    UnknownAggregationError,
    UnknownAlignmentMethodError,
    UnknownCircuitError,
    UnknownKindError,
    UnknownMetricError,
    UnknownOptionError,
    UnknownViewError,
    UnsupportedAlignmentError,
    UnsupportedModelError,
)
from headwidget.evaluation import (
    EvaluationReport,
    allocate,
    allocate_frontier,
    apply,
    estimate_allocation,
    estimate_evaluation,
    evaluate,
)
from headwidget.healing import HealingRun, estimate_healing, heal
from headwidget.stats import KVStats
from headwidget.tracking import Timeline, Tracker
from headwidget.views import (
    AlignmentView,
    ChannelView,
    ConsequenceView,
    HealingView,
    LayerSimilarityView,
    MechanismView,
    QuantizationView,
    TimelineView,
    TrendView,
    present_with,
)

if TYPE_CHECKING:
    from headwidget.notebook import explore
    from headwidget.widget import HeadWidget

#: What ``headwidget.<name>`` imports on first use: the notebook layer and the widgets (ipywidgets, bqplot,
#: pandas, matplotlib) are imported when first asked for, or when a view is first displayed or saved, so
#: ``import headwidget`` for a capture, an evaluation or the command line does not load them.
_ON_FIRST_USE = {
    "explore": "headwidget.notebook",
    "HeadWidget": "headwidget.widget",
}


class _NotebookOnFirstUse:
    """How views are displayed and saved: by :mod:`headwidget.notebook`, imported on a view's first
    display or save (importing it registers it in this one's place; the views never import it)."""

    def widget(self, view: Any) -> Any:
        import headwidget.notebook

        return headwidget.notebook.PRESENTER.widget(view)

    def save(self, view: Any, path: Any, **options: Any) -> Any:
        import headwidget.notebook

        return headwidget.notebook.PRESENTER.save(view, path, **options)


present_with(_NotebookOnFirstUse())


def __getattr__(name: str) -> Any:
    """``headwidget.explore`` and the widgets, imported on first use (with :mod:`headwidget.notebook`,
    which registers how views are displayed and saved)."""
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module 'headwidget' has no attribute {name!r}")
    import importlib

    importlib.import_module("headwidget.notebook")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext headwidget``: registers the ``%headwidget`` magic and the ``KVStats`` display."""
    from headwidget.magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext headwidget``: removes the ``%headwidget`` magic and the ``KVStats`` display."""
    from headwidget.magic import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "AlignmentView",
    "ArgumentError",
    "BudgetError",
    "CaptureConflictError",
    "CaptureInputError",
    "ChannelEntropyError",
    "ChannelView",
    "ConsequenceView",
    "CrossLayerMissingError",
    "DegenerateHeadsError",
    "EvaluationReport",
    "GroupCountError",
    "HeadWidget",
    "HeadwidgetError",
    "HealingInputError",
    "HealingRun",
    "HealingView",
    "HeldOutSplitError",
    "KVStats",
    "LayerIndexError",
    "LayerSimilarityView",
    "MechanismSpecError",
    "MechanismView",
    "MemoryBudgetError",
    "NoSamplesError",
    "NonFiniteActivationError",
    "NonFiniteLossError",
    "QuantizationView",
    "RankRangeError",
    "RopeAlignmentError",
    "RopeCaptureError",
    "StatsFileError",
    "StatsMismatchError",
    "Timeline",
    "TimelineFileError",
    "TimelineView",
    "Tracker",
    "TrackingError",
    "TrendView",
    "UnknownAggregationError",
    "UnknownAlignmentMethodError",
    "UnknownCircuitError",
    "UnknownKindError",
    "UnknownMetricError",
    "UnknownOptionError",
    "UnknownViewError",
    "UnsupportedAlignmentError",
    "UnsupportedModelError",
    "__version__",
    "align",
    "align_model",
    "allocate",
    "allocate_frontier",
    "apply",
    "capture",
    "channel_entropy",
    "convert",
    "downsample",
    "estimate",
    "estimate_allocation",
    "estimate_evaluation",
    "estimate_healing",
    "evaluate",
    "explore",
    "group_heads",
    "head_diversity",
    "heal",
    "layer_similarity",
    "load_ipython_extension",
    "mechanism_sweep",
    "operator_similarity",
    "supported_families",
    "unload_ipython_extension",
]
