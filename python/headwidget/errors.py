"""Exception types raised by headwidget.

Every error says what was wrong and what to do about it. They derive from the built-in
type a caller would expect (``ValueError``, ``MemoryError``...) so generic handlers still work.
"""

from __future__ import annotations


class HeadwidgetError(Exception):
    """Base class of every error headwidget raises on purpose."""


class UnsupportedModelError(HeadwidgetError, TypeError):
    """The model's architecture has no capture adapter."""


class CaptureInputError(HeadwidgetError, ValueError):
    """The texts, token ids or batches given to ``capture`` cannot be used."""


class UnknownKindError(HeadwidgetError, KeyError):
    """A statistics kind (``"key"``, ``"value"``...) that was not captured or does not exist."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


class UnknownOptionError(HeadwidgetError, ValueError):
    """A named choice (metric, circuit, alignment method, aggregation, view...) that does not exist.

    The message names the choice, what was given, and every valid value.
    """


class UnknownMetricError(UnknownOptionError):
    """A similarity metric name that headwidget does not know."""


class UnknownCircuitError(UnknownOptionError):
    """An operator circuit other than ``"qk"`` or ``"ov"``."""


class UnknownAlignmentMethodError(UnknownOptionError):
    """An alignment method other than ``"rope"``, ``"orthogonal"`` or ``"none"``."""


class UnknownAggregationError(UnknownOptionError):
    """A downsampling aggregation other than ``"mean"`` or ``"maxabs"``."""


class UnknownViewError(UnknownOptionError):
    """A view name that is not in the view registry."""


class LayerIndexError(HeadwidgetError, IndexError):
    """A layer index outside the model, or a layer that was not captured."""


class BudgetError(HeadwidgetError, ValueError):
    """A K/V byte budget no allocation fits in (below the cheapest candidate at every layer), or one too
    fine-grained for the exact solver."""


class MemoryBudgetError(HeadwidgetError, MemoryError):
    """The statistics a request needs would not fit in the allowed memory."""


class NonFiniteActivationError(HeadwidgetError, FloatingPointError):
    """A captured activation was NaN or infinite (typically an fp16 overflow)."""


class CaptureConflictError(HeadwidgetError, RuntimeError):
    """Other code changed the model while a capture was running on it (for example another thread
    switched it to training mode), so the statistics could not be exact."""


class StatsMismatchError(HeadwidgetError, ValueError):
    """Two statistics objects that cannot be combined (different models, layers or kinds)."""


class StatsFileError(HeadwidgetError, OSError):
    """A statistics file that is missing, corrupt or not written by headwidget."""


class RopeCaptureError(HeadwidgetError, ValueError):
    """Post-RoPE keys were requested where they cannot be captured."""


class CrossLayerMissingError(HeadwidgetError, ValueError):
    """Heads of different layers were compared but the cross-layer statistics were not captured."""


class RopeAlignmentError(HeadwidgetError, ValueError):
    """RoPE-compatible alignment was asked for heads that have no rotary embedding."""


class HeldOutSplitError(HeadwidgetError, ValueError):
    """A held-out score was asked for but it cannot be formed (an empty token split, or a metric
    whose statistics are not kept per split)."""


class MechanismSpecError(HeadwidgetError, ValueError):
    """A mechanism spec (``"mha"``, ``"gqa:4"``, ``"lrkv:16"``, ``"mla:512"``...) that cannot be parsed."""


class GroupCountError(HeadwidgetError, ValueError):
    """A number of groups that does not divide the number of heads evenly."""


class RankRangeError(HeadwidgetError, ValueError):
    """A rank (LRKV ``r``, MLA ``d_c``) outside the range the weights allow."""


class DegenerateHeadsError(HeadwidgetError, ValueError):
    """Heads whose centred Gram vanishes (for example identical heads): no correlation is defined."""


class UnsupportedAlignmentError(HeadwidgetError, TypeError):
    """A model whose attention cannot be rotated exactly (family or per-head key/query norms)."""


class UnsupportedConversionError(HeadwidgetError, TypeError):
    """A mechanism that cannot be built into this model's family (the message names the families
    that support it)."""


class MissingStatisticsError(HeadwidgetError, ValueError):
    """A fit needs statistics that were not given or not captured (``+align`` needs keys and values,
    data-aware fits and partial RoPE need ``inputs=True``)."""


class EvaluationInputError(HeadwidgetError, ValueError):
    """Evaluation texts that give nothing to measure (fewer than two real tokens in every sequence)."""


class NonFiniteLogitsError(NonFiniteActivationError):
    """A converted model produced NaN or infinite outputs; the message names the variant and the layer."""


class EncoderMeasureError(HeadwidgetError, ValueError):
    """A language-model measure (perplexity, NLL, KL, top-1) asked of an encoder, or an encoder
    measure asked of a language model."""


class ReportFileError(HeadwidgetError, OSError):
    """An evaluation report file that is missing, corrupt or not written by headwidget."""


class ArgumentError(HeadwidgetError, ValueError, TypeError):
    """A public argument of the wrong type or outside its range (a float where a count is needed, a
    number given as a string, NaN, a huge value); the message names the argument and what to pass."""


class VariantSaveError(HeadwidgetError, TypeError):
    """A variant built by ``apply`` that a transformers checkpoint cannot hold (partial RoPE, layers
    with different KV-head counts): ``save_pretrained`` / ``push_to_hub`` refuse before writing
    anything, and the message says what to keep instead."""


class TimelineFileError(HeadwidgetError, OSError):
    """A timeline folder (``Tracker(path=...)``, ``Timeline.load``) whose index is missing, corrupt or not
    written by headwidget, or that holds another model's snapshots."""


class TrackingError(HeadwidgetError, ValueError):
    """A tracking request that cannot be met: a probe set with no tokens, a step that is not in the
    timeline, a snapshot of a step already taken."""


class HealingInputError(HeadwidgetError, ValueError):
    """A healing request that cannot be met: a ``variant`` that is not a converted copy of ``model``, a
    quantized variant (nothing to train), overlapping healing and evaluation texts, a token budget
    below one batch, ``method="lm"`` on a model without a language-model head."""


class NonFiniteLossError(NonFiniteActivationError):
    """Healing met a loss (or gradient) that is not finite; the message names the step. ``run`` holds the
    run up to the last good step, its ``model`` with the last good weights."""

    def __init__(self, message: str, run: object = None) -> None:
        super().__init__(message)
        self.run = run


class PathRefusedError(HeadwidgetError, OSError):
    """A path headwidget does not read or write: a symlink where a file must be (a link planted in a
    shared folder would redirect the read or the write outside it), a name that leaves its folder, a NUL
    byte, or something other than a regular file."""


class ChartError(HeadwidgetError, ValueError):
    """A chart or series that cannot be drawn as given (mismatched lengths, an unknown style)."""


class NotRegularFileError(PathRefusedError):
    """The path to read or write names something other than a regular file (a directory, FIFO...)."""


class NoSamplesError(HeadwidgetError, ValueError):
    """Token samples were asked of statistics captured without them (``capture(..., samples=R)``)."""


class ChannelEntropyError(ArgumentError):
    """Arguments of :func:`channel_entropy` that give no entropy (a group size outside 1..C, bins
    outside 1..:data:`BINS_MAX`, a flag that is not a bool, fewer than two samples, samples that are
    not a finite 2-D array). An :class:`~headwidget.errors.ArgumentError` (a ``ValueError`` and a
    ``TypeError``)."""


class EmbeddedModelMissingError(HeadwidgetError, ImportError):
    """The package that ships an embedded model is not installed."""


class UnknownEmbeddedModelError(HeadwidgetError, KeyError):
    """A name that is not one of :data:`EMBEDDED_MODELS`."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


class ExportError(HeadwidgetError, ValueError):
    """A grid or an export request that cannot be written (empty grid, bad matrix, unknown format…)."""


class MagicUsageError(HeadwidgetError, ValueError):
    """The ``%headwidget`` line could not be used as written."""


class ModelLoadError(HeadwidgetError, OSError):
    """A model directory whose config, weights or tokenizer cannot be loaded."""


class FigureError(HeadwidgetError, ValueError):
    """The requested figure cannot be drawn from these statistics."""


class VariantError(HeadwidgetError, ValueError):
    """A variant spec the model cannot take (the message names the spec and what is possible)."""


class ChannelSelectionError(ArgumentError, IndexError):
    """A channel selection that holds no channel, reaches outside the channels, or is not integers."""


class ViewSourceError(HeadwidgetError, ValueError):
    """A view was asked for without what it is computed from (statistics, or a model's weights)."""


class UnknownDamageMeasureError(HeadwidgetError, ValueError):
    """A damage measure the report does not hold (``perplexity`` of an encoder, a misspelling)."""


class ChannelWindowError(HeadwidgetError, IndexError):
    """A channel window (``channel_start``, ``channel_width``) that holds no channel of the layer."""


class QuantizationViewError(HeadwidgetError, ValueError):
    """A quantization view asked of statistics without token samples, or with a bad option."""


class StepIndexError(HeadwidgetError, IndexError):
    """A step index outside the timeline's snapshots (the slider counts them from 0)."""


class TimelineStepsError(TrackingError):
    """Timelines shown side by side that do not hold the same steps (they share one step slider)."""
