"""Streaming moments of token vectors and what follows from them alone.

:class:`Moments` accumulates counts, means, the centred co-moment and the per-head-normalised Gram
(:class:`MomentStack`: many of one shape, folded together);
:mod:`.correlation` and :mod:`.head_metrics` turn those into channel correlations and head × head
similarities. Nothing here knows about models, statistics files or analyses.
"""

from headwidget.moments.correlation import (
    channel_corr_from_moments,
    corr_from_comoment,
    effective_rank,
    off_diagonal_mean,
    resolve_channels,
)
from headwidget.moments.folding import (
    Allocate,
    FoldWork,
    GramMode,
    StackedMoments,
    bf16_products,
    gram_blocks,
    split_bf16,
)
from headwidget.moments.head_metrics import (
    HEAD_METRICS,
    head_blocks,
    head_similarity_from_moments,
    similarity_from_gram,
)
from headwidget.moments.stack import MomentStack
from headwidget.moments.streaming import Moments, normalise_heads

__all__ = [
    "HEAD_METRICS",
    "Allocate",
    "FoldWork",
    "GramMode",
    "MomentStack",
    "Moments",
    "StackedMoments",
    "bf16_products",
    "channel_corr_from_moments",
    "corr_from_comoment",
    "effective_rank",
    "gram_blocks",
    "head_blocks",
    "head_similarity_from_moments",
    "normalise_heads",
    "off_diagonal_mean",
    "resolve_channels",
    "similarity_from_gram",
    "split_bf16",
]
