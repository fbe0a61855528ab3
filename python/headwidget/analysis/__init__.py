"""Pure functions from statistics (and weights) to matrices: every one has a float64 reference test."""

from headwidget.analysis.correlation import channel_corr_from_moments, corr_from_comoment
from headwidget.analysis.head_metrics import HEAD_METRICS, head_similarity_from_moments

__all__ = ["HEAD_METRICS", "channel_corr_from_moments", "corr_from_comoment", "head_similarity_from_moments"]
