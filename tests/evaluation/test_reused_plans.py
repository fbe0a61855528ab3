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


def test_one_call_fits_a_layer_converted_alike_once(monkeypatch) -> None:
    """Within one evaluate (or allocate), a layer that several variants convert the same way is fitted
    once: a mixed spec's mqa layers and a cross-layer variant's mqa beside uniform mqa. Each variant's
    numbers equal those of an evaluation of it alone (float64, bit for bit)."""
    from headwidget.evaluation import _apply
    from tiny_models import three_layer_llama

    model = three_layer_llama(seed=2)
    texts = ragged_batches(seed=6, lengths=((12, 9, 11), (10, 8)))
    specs = ["mqa", "mqa@0-1;kv:int4@2", "mqa+share:2", "mla:8@1;mqa@2"]
    fitted: list[int] = []
    original = _apply.fit_layer

    def fit_layer(weights, layer, *args, **kwargs):
        fitted.append(layer)
        return original(weights, layer, *args, **kwargs)

    monkeypatch.setattr(_apply, "fit_layer", fit_layer)
    together = headwidget.evaluate(model, texts, specs, dtype=F64, progress=False)
    assert sorted(fitted) == [0, 1, 1, 2]  # mqa for every layer once, mla:8 for layer 1
    fitted.clear()
    alone = {s: headwidget.evaluate(model, texts, [s], dtype=F64, progress=False) for s in specs}
    assert sorted(fitted) == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]  # (each call fits its own)
    for spec in specs:
        assert together.kl[spec] == alone[spec].kl[spec], spec
        assert together.nll[spec] == alone[spec].nll[spec], spec
    fitted.clear()
    headwidget.allocate(model, texts, budget=0.5, candidates=["model", "mqa", "mqa+share:2"], progress=False)
    assert sorted(fitted) == [0, 1, 2]  # the cross-layer candidate's within-layer fits are mqa's
