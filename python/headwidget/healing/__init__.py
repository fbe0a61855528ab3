"""Healing: what a converted model recovers with a little training, per layer.

- :func:`heal`: distil (or fine-tune) a :func:`headwidget.apply` variant of a model on calibration text,
  training only its mechanism's own parameters (:mod:`headwidget.healing._trainable`), and measure its
  recovery on held-out text: a :class:`HealingRun` with the curve (tokens seen against NLL, KL, top-1,
  ΔNLL) and each converted layer's attention-output error.
- :func:`estimate_healing`: the peak bytes a :func:`heal` with the same arguments allocates (the bound it
  checks against ``max_memory``).
"""

from headwidget.healing._heal import DEFAULT_LR, HealingArguments, heal, learning_rate
from headwidget.healing._memory import estimate_healing
from headwidget.healing._run import HealingRun, load_runs, save_runs, summary_table
from headwidget.healing._trainable import TrainableParts, parse_trainable

__all__ = [
    "DEFAULT_LR",
    "HealingArguments",
    "HealingRun",
    "TrainableParts",
    "estimate_healing",
    "heal",
    "learning_rate",
    "load_runs",
    "parse_trainable",
    "save_runs",
    "summary_table",
]
