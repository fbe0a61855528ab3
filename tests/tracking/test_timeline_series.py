"""``Timeline.layer_series`` and ``Timeline.log_series``: the trend lines a view draws are the numbers of
``Timeline.summary``, per layer and step, and the trainer's logged numbers by step."""

from __future__ import annotations

import math

import pytest
import torch

from headwidget import Timeline
from headwidget.errors import ArgumentError
from headwidget.tracking._timeline import SUMMARY_METRICS
from tiny_models import VOCAB, make_model

PROBE = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    models = [make_model("llama_gqa", dtype=torch.float32, seed=s) for s in (0, 1, 2)]
    made = Timeline.from_checkpoints(models, [0, 10, 20], PROBE)
    made.logs = {5: {"loss": 4.0, "learning_rate": 0.1}, 15: {"learning_rate": 0.05}, 20: {"loss": 3.5}}
    return made


def test_layer_series_are_the_summary_rows_of_that_layer(timeline):
    rows = timeline.summary()
    for layer in (0, 1):
        series = timeline.layer_series(layer)
        assert list(series) == list(SUMMARY_METRICS)
        for metric, values in series.items():
            assert values == [r[metric] for r in rows if r["layer"] == layer]
    assert timeline.layer_series(0) != timeline.layer_series(1)


def test_a_layer_no_snapshot_captured_is_nan_at_every_step(timeline):
    assert all(math.isnan(v) for values in timeline.layer_series(5).values() for v in values)


def test_the_summary_is_computed_once_and_handed_out_as_copies(timeline, monkeypatch):
    first = timeline.summary()
    first[0]["key_abs_corr"] = -1.0  # a caller's change stays the caller's
    monkeypatch.setattr(type(timeline[0]), "summary", lambda self: pytest.fail("computed again"))
    again = timeline.summary()
    assert again[0]["key_abs_corr"] != -1.0 and len(again) == 3 * 2


def test_log_series_are_the_logged_steps_and_values(timeline):
    assert timeline.log_series() == ([5, 20], [4.0, 3.5])
    assert timeline.log_series("learning_rate") == ([5, 15], [0.1, 0.05])
    assert timeline.log_series("grad_norm") == ([], [])


@pytest.mark.parametrize("bad", [0.5, "1", True, math.nan, None, -1])
def test_a_bad_layer_is_refused(timeline, bad):
    with pytest.raises(ArgumentError, match=r"^layer must be"):
        timeline.layer_series(bad)


def test_a_bad_log_name_is_refused(timeline):
    with pytest.raises(ArgumentError, match=r"^name must be the name of a logged number"):
        timeline.log_series(3)
