"""Training-time tracking: K/V statistics of a model at a series of training steps.

- :class:`Tracker`: a ``transformers.TrainerCallback`` (or, by hand, ``tracker.snapshot(model, step)``)
  that captures the model over a fixed probe set every ``every`` steps, without perturbing training,
  into memory or a timeline folder written one snapshot at a time.
- :class:`Timeline`: the snapshots by step (``timeline[step]`` is a :class:`~headwidget.stats.KVStats`),
  the trainer's logs, a per-step, per-layer summary; :meth:`Timeline.load` reads a folder lazily and
  :meth:`Timeline.from_checkpoints` captures a series of saved checkpoints.
"""

from headwidget.tracking._timeline import SUMMARY_METRICS, Timeline
from headwidget.tracking._tracker import Tracker

__all__ = ["SUMMARY_METRICS", "Timeline", "Tracker"]
