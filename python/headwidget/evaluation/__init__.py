"""What a conversion or a quantizer does to a model's predictions, on held-out text."""

from headwidget.evaluation.measures import EncoderTotals, PredictionTotals, predicted_positions

__all__ = ["EncoderTotals", "PredictionTotals", "predicted_positions"]
