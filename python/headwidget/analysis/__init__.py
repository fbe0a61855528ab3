"""Pure functions from statistics (and weights) to matrices: every one has a float64 reference test."""

from headwidget.analysis.align_model import align_model, fit_group_rotations
from headwidget.analysis.alignment import ALIGN_METHODS, ALIGN_METRICS, AlignmentResult, align
from headwidget.analysis.conversions import Conversion, convert, mechanism_sweep, parse_spec
from headwidget.analysis.diversity import head_diversity
from headwidget.analysis.downsample import DOWNSAMPLE_RULES, downsample
from headwidget.analysis.entropy import (
    ChannelEntropy,
    ChannelEntropyError,
    channel_entropy,
    channel_entropy_of,
)
from headwidget.analysis.grouping import group_heads, within_group_mean
from headwidget.analysis.layer_similarity import LAYER_METRICS, cross_layer_bytes, layer_similarity
from headwidget.analysis.operator_space import CIRCUITS, operator_gram, operator_similarity
from headwidget.analysis.quantizers import Codebooks, fit_codebooks, quantize_int_keys, quantize_int_values
from headwidget.analysis.weights import HeadWeights, head_weights
from headwidget.moments.correlation import channel_corr_from_moments, corr_from_comoment
from headwidget.moments.head_metrics import HEAD_METRICS, head_similarity_from_moments

__all__ = [
    "ALIGN_METHODS",
    "ALIGN_METRICS",
    "CIRCUITS",
    "DOWNSAMPLE_RULES",
    "HEAD_METRICS",
    "LAYER_METRICS",
    "AlignmentResult",
    "ChannelEntropy",
    "ChannelEntropyError",
    "Codebooks",
    "Conversion",
    "HeadWeights",
    "align",
    "align_model",
    "channel_corr_from_moments",
    "channel_entropy",
    "channel_entropy_of",
    "convert",
    "corr_from_comoment",
    "cross_layer_bytes",
    "downsample",
    "fit_codebooks",
    "fit_group_rotations",
    "group_heads",
    "head_diversity",
    "head_similarity_from_moments",
    "head_weights",
    "layer_similarity",
    "mechanism_sweep",
    "operator_gram",
    "operator_similarity",
    "parse_spec",
    "quantize_int_keys",
    "quantize_int_values",
    "within_group_mean",
]
