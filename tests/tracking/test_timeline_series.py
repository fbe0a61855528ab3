"""``Timeline.layer_series`` and ``Timeline.log_series``: the trend lines a view draws are the numbers of
``Timeline.summary``, per layer and step, and the trainer's logged numbers by step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import headwidget
from headwidget import Timeline
from headwidget.errors import ArgumentError
from headwidget.moments import effective_rank
from headwidget.tracking._timeline import SUMMARY_METRICS, SUMMARY_RANKS
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


def entropy_rank_of_rows(rows: object) -> float:
    """Roy & Vetterli's effective rank of the sample covariance of token rows, by hand in float64."""
    eigen = np.clip(np.linalg.eigvalsh(np.cov(np.asarray(rows, dtype=np.float64).T)), 0.0, None)
    p = eigen[eigen > 0] / eigen.sum()
    return float(np.exp(-sum(x * math.log(x) for x in p)))


def test_effective_ranks_equal_the_spectrum_of_every_token_row():
    """Every probe token kept as a sample, so the raw K/V rows are there to compare with."""
    model = make_model("llama_gqa", dtype=torch.float32, seed=4)
    stats = headwidget.capture(model, PROBE, samples=PROBE.numel(), progress=False)
    timeline = Timeline({0: stats})
    for row in timeline.summary():
        for kind in ("key", "value"):
            rows = stats.samples(row["layer"], kind)
            assert rows.shape[0] == PROBE.numel()
            assert row[f"{kind}_eff_rank"] == pytest.approx(entropy_rank_of_rows(rows), rel=1e-6)
    assert set(SUMMARY_RANKS) <= set(timeline.summary()[0])


def test_effective_rank_closed_forms():
    assert effective_rank(np.eye(5)) == pytest.approx(5.0, rel=1e-12)
    assert effective_rank(np.diag([2.0, 0.0, 0.0])) == pytest.approx(1.0, rel=1e-12)
    two = np.diag([3.0, 1.0])  # p = (3/4, 1/4)
    assert effective_rank(two) == pytest.approx(math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))))
    assert math.isnan(effective_rank(np.zeros((3, 3))))
    assert math.isnan(effective_rank(np.full((2, 2), np.nan)))


def test_aligned_similarity_is_what_the_alignment_view_shows(timeline):
    """The summary's aligned head similarity: the off-diagonal mean of AlignmentView's "after" panels."""
    for row in timeline.summary():
        view = headwidget.views.AlignmentView(timeline[row["step"]], layer=row["layer"])
        panels = {p.id: p.matrix for p in view.grid.panels}
        for kind in ("key", "value"):
            after = np.asarray(panels[f"{kind}-after"], dtype=np.float64)
            off = after[~np.eye(len(after), dtype=bool)]
            assert row[f"{kind}_aligned_sim"] == pytest.approx(float(off.mean()), abs=1e-6)
