"""``reusing_plans``: inside it, evaluations of one model with the same statistics share their fits (the
demo's table of variants and its per-layer sweep); the numbers are those of fits made afresh."""

from __future__ import annotations

import threading

import pytest
import torch

import headwidget
from headwidget import KVStats
from headwidget.adapters import adapter_for
from headwidget.analysis.variants import parse_variant
from headwidget.evaluation import _plan, evaluate
from headwidget.evaluation._plan import plan_variant, reusing_plans
from tiny_models import make_model, ragged_batches

F64 = torch.float64
SPECS = ["model", "mqa", "mqa+align", "mla:16", "kv:int4"]


@pytest.fixture(scope="module")
def setup():
    model = make_model("llama_gqa")
    stats = headwidget.capture(model, ragged_batches(seed=3), progress=False, inputs=True)
    return model, stats, ragged_batches(seed=5)


def counting_fits(monkeypatch) -> list[str]:
    fitted: list[str] = []
    original = _plan.fit_parts

    def fit_parts(adapter, parsed, *args, **kwargs):
        fitted.append(parsed.text)
        return original(adapter, parsed, *args, **kwargs)

    monkeypatch.setattr(_plan, "fit_parts", fit_parts)
    return fitted


def test_a_table_and_its_sweep_share_their_fits_and_give_the_numbers_of_fresh_ones(setup, monkeypatch):
    model, stats, batches = setup
    options = {"stats": stats, "dtype": F64, "progress": False}
    fresh_table = evaluate(model, batches, SPECS, **options)
    fresh_sweep = evaluate(model, batches[:1], SPECS, per_layer=True, **options)
    fitted = counting_fits(monkeypatch)
    with reusing_plans():
        table = evaluate(model, batches, SPECS, **options)
        sweep = evaluate(model, batches[:1], SPECS, per_layer=True, **options)
    assert fitted == SPECS[1:]  # each variant fitted once: the sweep's came from the table
    assert table.measures == fresh_table.measures
    assert sweep.measures == fresh_sweep.measures and sweep.per_layer == fresh_sweep.per_layer
    evaluate(model, batches[:1], ["model", "mqa"], **options)
    assert fitted == [*SPECS[1:], "mqa"]  # outside the block: fitted again


def test_plans_are_reused_only_for_the_same_model_statistics_layers_and_dtype(setup, tmp_path):
    model, stats, _ = setup
    adapter, mqa = adapter_for(model), parse_variant("mqa")
    other = make_model("llama_gqa", seed=1)
    same_numbers = KVStats.load(stats.save(tmp_path / "stats.safetensors"))  # another object
    with reusing_plans():
        first = plan_variant(adapter, mqa, stats, [0, 1])
        assert plan_variant(adapter, mqa, stats, [0, 1]) is first
        assert plan_variant(adapter, parse_variant("mqa@0-1"), stats, [0, 1]) is not first  # another spec
        assert plan_variant(adapter, mqa, stats, [0]) is not first
        assert plan_variant(adapter, mqa, None, [0, 1]) is not first
        assert plan_variant(adapter, mqa, stats, [0, 1], weight_dtype=torch.float32) is not first
        assert plan_variant(adapter_for(other), mqa, stats, [0, 1]) is not first
        assert plan_variant(adapter, mqa, same_numbers, [0, 1]) is not first
        # another thread has no block of its own: it fits afresh
        seen: list[object] = []
        worker = threading.Thread(target=lambda: seen.append(plan_variant(adapter, mqa, stats, [0, 1])))
        worker.start()
        worker.join()
        assert seen and seen[0] is not first
    assert plan_variant(adapter, mqa, stats, [0, 1]) is not first  # the block is over
