"""QuantizationView: the coupling chart shows the channel entropies of the captured samples, recomputed
here by brute force, and the bits chart each quantizer's bytes per channel and damage from the report."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

import headwidget
from headwidget.evaluation import EvaluationReport
from headwidget.export import page_data, save
from headwidget.views import QuantizationView
from headwidget.views.quantization import QuantizationViewError, bits_per_channel
from tiny_models import make_model


@pytest.fixture(scope="module")
def stats():
    model = make_model("llama_gqa", dtype=torch.float32)
    ids = torch.randint(0, 96, (6, 40), generator=torch.Generator().manual_seed(0))
    return headwidget.capture(model, ids, rope="both", samples=200, progress=False)


def plug_in_bits(rows: np.ndarray, bins: int) -> float:
    """Entropy (bits) of the tuples of bin indices of ``rows`` (n × c), binned per column, by hand."""
    codes = []
    for col in rows.T:
        lo, hi = col.min(), col.max()
        if hi == lo:
            codes.append(np.zeros(len(col), dtype=int))
        else:
            codes.append(np.minimum(((col - lo) / (hi - lo) * bins).astype(int), bins - 1))
    counts = Counter(zip(*codes, strict=True))
    n = len(rows)
    return -sum(k / n * math.log2(k / n) for k in counts.values())


def brute(samples: np.ndarray, c: int, bins: int) -> tuple[float, float]:
    groups = samples.shape[1] // c
    joint = [plug_in_bits(samples[:, g * c : (g + 1) * c], bins) for g in range(groups)]
    marg = [
        sum(plug_in_bits(samples[:, [ch]], bins) for ch in range(g * c, (g + 1) * c)) for g in range(groups)
    ]
    return float(np.mean(joint)), float(np.mean(marg))


def test_the_coupling_chart_is_the_samples_entropy_by_brute_force(stats):
    view = QuantizationView(stats, layer=1, bins=4)
    (chart,) = view.grid.charts
    assert view.grid.panels == [] and chart.id == "coupling" and "layer 1" in chart.title
    names = [s.name for s in chart.series]
    assert names == [
        f"{k} · {w}" for k in ("K pre-RoPE", "K post-RoPE", "V") for w in ("joint", "Σ marginals")
    ]
    for i, kind in enumerate(["key", "key_post", "value"]):
        samples = stats.samples(1, kind).double().numpy()
        joint, marginals = chart.series[2 * i], chart.series[2 * i + 1]
        assert joint.x == [1.0, 2.0, 4.0, 8.0]
        for k, c in enumerate((1, 2, 4, 8)):
            want_joint, want_marg = brute(samples, c, 4)
            assert joint.y[k] == pytest.approx(want_joint, abs=1e-9)
            assert marginals.y[k] == pytest.approx(want_marg, abs=1e-9)
            assert joint.y[k] <= marginals.y[k] + 1e-12  # sub-additivity
    # 4^4 = 256 > 200 / 5: groups of 4 and 8 are flagged, 1 and 2 (4, 16 ≤ 40) are not
    assert "groups of 4, 8: 4^c bins exceed a fifth of the 200 samples" in chart.note
    # no joint entropy of 200 samples can exceed log2(200) bits: the chart draws that ceiling
    assert (
        chart.y_reference == pytest.approx(math.log2(200)) and max(chart.series[0].y) <= math.log2(200) + 1e-9
    )
    assert chart.x_log and chart.x_ticks == [1.0, 2.0, 4.0, 8.0]
    assert "biased low" in chart.series[0].labels[2] and "biased low" not in chart.series[0].labels[1]
    view.layer = 0
    assert view.grid.charts[0].title.endswith("layer 0")
    assert view.grid.charts[0].series[0].y[0] == pytest.approx(
        brute(stats.samples(0, "key").double().numpy(), 1, 4)[0], abs=1e-9
    )


def test_a_coupling_point_reads_the_gap_to_the_shuffled_control_not_the_estimators_bias(stats):
    """Each tooltip: the ratio joint ÷ Σ marginals, the same on the channel-by-channel shuffled rows,
    and only their difference called coupling; a point flagged as biased states no percentage."""
    from headwidget.analysis.entropy import shuffled_rows

    view = QuantizationView(stats, layer=1, bins=4)
    (chart,) = view.grid.charts
    for i, kind in enumerate(["key", "key_post", "value"]):
        rows = stats.samples(1, kind).double().numpy()
        shuffled = shuffled_rows(torch.from_numpy(rows), seed=1).numpy()  # the control's seed: the layer
        for k, c in enumerate((1, 2, 4, 8)):
            joint, marginals = brute(rows, c, 4)
            control_joint, control_marginals = brute(shuffled, c, 4)
            ratio, baseline = joint / marginals, control_joint / control_marginals
            text = chart.series[2 * i].labels[k]
            assert f"joint ÷ Σ marginals {ratio:.3f} · shuffled control {baseline:.3f}" in text, text
            assert "saves" not in text
            if c >= 4:  # 4^4 = 256 cells > 200 / 5: biased low
                assert "biased low" in text and "%" not in text, text
            else:
                assert f"coupling beyond the estimator's bias: {baseline - ratio:.1%}" in text, text


def made_up_report() -> EvaluationReport:
    m = {
        "model": {"nll": 2.0, "perplexity": math.exp(2.0), "kl": 0.0, "top1": 1.0},
        "kv:int4": {"nll": 2.05, "perplexity": 0.0, "kl": 0.03, "top1": 0.97},
        "kv:int2": {"nll": 2.4, "perplexity": 0.0, "kl": 0.3, "top1": 0.8},
        "kv:cq4c8b": {"nll": 2.2, "perplexity": 0.0, "kl": 0.15, "top1": 0.9},
        "mqa": {"nll": 2.5, "perplexity": 0.0, "kl": 0.4, "top1": 0.7},
    }
    # bf16 model: 2 layers × 2 × 32 channels × 2 bytes = 256 B per token
    kv_bytes = {
        "model": 256,
        "kv:int4": 2 * 2 * (32 * 4 // 8 + 4 * 32 // 32),
        "kv:int2": 2 * 2 * (8 + 4),
        "kv:cq4c8b": 2 * 2 * (32 // 4) * 8 // 8,
        "mqa": 128,
    }
    return EvaluationReport(
        model="LlamaForCausalLM",  # (the statistics' model: a view refuses sources of two)
        kind="causal-lm",
        variants=list(m),
        measures=m,
        kv_bytes_per_token=kv_bytes,
        tokens=99,
        sequences=3,
        fingerprint="ab" * 8,
        dtype="torch.bfloat16",
    )


def test_bits_are_per_channel_of_the_quantized_layers_when_some_are_left_as_they_were():
    """6 of 30 bf16 layers quantized to 2 bits + scales: the rest still costs 16 bits per channel, and the
    quantized channels cost what the quantizer spends on them, not the average over all 30 layers."""
    from dataclasses import replace

    per_layer = 2 * 32 * 2  # K and V, 32 channels each, bf16
    quantized = 2 * (32 * 2 // 8 + 2 * 32 // 32)  # 2-bit codes + a bf16 scale and zero per 32 channels
    report = replace(
        made_up_report(),
        layers=list(range(6)),
        num_layers=30,
        converted_kv_bytes=6.0 * per_layer,
        kv_bytes_per_token={
            **made_up_report().kv_bytes_per_token,
            "model": 30 * per_layer,
            "kv:int2": 24 * per_layer + 6 * quantized,
        },
    )
    assert bits_per_channel(report, "kv:int2") == pytest.approx(8 * quantized / 64, abs=1e-12)  # 2.5 bits
    assert bits_per_channel(report, "model") == pytest.approx(16.0, abs=1e-12)
    assert report.scope() == "layers 0–5 of 30" and not report.converts_every_layer
    config = make_model("llama_gqa").config
    config.num_hidden_layers = 30  # the report's model (a view refuses the sources of two models)
    stats = headwidget.capture(
        LlamaForCausalLM(config).float().eval(),
        torch.randint(0, 96, (2, 16)),
        samples=16,
        layers=[0],
        progress=False,
    )
    bits = next(c for c in QuantizationView(stats, report=report).grid.charts if c.id == "bits")
    assert "layers 0–5 of 30 quantized" in bits.subtitle and "quantized K/V channel" in bits.x_label
    label = next(lab for s in bits.series for lab in s.labels if lab.startswith("kv:int2"))
    assert "2.500 bits per K/V channel of the quantized layers" in label
    tradeoff = headwidget.ConsequenceView(report).grid.charts[0]
    hover = next(lab for s in tradeoff.series for lab in s.labels if lab.startswith("mqa"))
    assert "layers 0–5 of 30 converted" in hover and "layers 0–5 of 30 converted" in tradeoff.subtitle


def test_bits_per_channel_is_bytes_over_the_originals_channels():
    report = made_up_report()
    channels = 256 / 2  # K and V channels of every layer
    for spec in report.variants:
        assert bits_per_channel(report, spec) == 8 * report.kv_bytes_per_token[spec] / channels
    assert bits_per_channel(report, "kv:int4") == 5.0  # 4 bits + fp16 scale and zero per 32 channels
    assert bits_per_channel(report, "kv:cq4c8b") == 2.0  # 8 bits per 4 channels


def test_the_bits_chart_draws_the_reports_quantizers(stats):
    report = made_up_report()
    view = QuantizationView(stats, report=report)
    _, bits = view.grid.charts
    assert bits.id == "bits" and bits.x_log
    by_name = {s.name: s for s in bits.series}
    assert list(by_name) == ["kv:int", "kv:cq (4 channels)", "original"]  # mqa is no quantizer
    assert by_name["kv:int"].x == [3.0, 5.0]  # int2, int4: sorted by bits
    assert by_name["kv:int"].y == pytest.approx([0.4, 0.05], abs=1e-12)
    assert by_name["original"].x == [16.0] and by_name["original"].y == [0.0]
    int4 = by_name["kv:int"].labels[1]
    assert int4.startswith("kv:int4\n5.000 bits per K/V channel · KV 80 B/token over all layers (bf16)")
    view.damage = "kl"
    assert view.grid.charts[1].series[0].y == [0.3, 0.03]
    assert view.damages_available == ["nll", "kl"]
    assert QuantizationView(stats).damages_available == []


def test_statistics_without_samples_are_refused_and_the_dashboard_leaves_the_tab_out(stats):
    model = make_model("llama_gqa", dtype=torch.float32)
    plain = headwidget.capture(model, torch.randint(0, 96, (2, 16)), progress=False)
    with pytest.raises(QuantizationViewError, match="capture with samples=R"):
        QuantizationView(plain)
    assert not QuantizationView.shows(plain) and QuantizationView.shows(stats)
    assert headwidget.explore(plain).quantization is None
    dash = headwidget.explore(stats)
    assert dash.quantization is not None and "quantization" in dash.views
    dash.channels.layer = 1
    assert dash.quantization.layer == 1
    with pytest.raises(headwidget.LayerIndexError, match="layer 5 is out of range"):
        QuantizationView(stats, layer=5)


def test_the_view_exports_and_its_page_has_a_frame_per_layer(stats, tmp_path):
    view = headwidget.QuantizationView(stats, report=made_up_report(), bins=4)
    svg = save(view, tmp_path / "q.svg").read_text()
    assert 'id="coupling"' in svg and 'id="bits"' in svg and "Channel coupling in bits" in svg
    data = page_data(view)
    assert sorted(data["frames"]) == ['[0,"kl"]', '[0,"nll"]', '[1,"kl"]', '[1,"nll"]']  # layer, damage
    assert data["frames"]['[1,"nll"]']["charts"][0]["title"].endswith("layer 1")
    for damage in ("nll", "kl"):  # the damage toggle works on the page: each option's own chart
        expected = view.compute(view.current_state().replace(layer=1, damage=damage))
        assert data["frames"][f'[1,"{damage}"]']["charts"][1]["y_label"] == expected.charts[1].y_label
    assert view.widget.heading == f"{stats.meta.model_name or stats.meta.model_class} · layer 0"
