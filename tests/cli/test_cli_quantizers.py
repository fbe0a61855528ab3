"""``headwidget evaluate --variants kv:…``: quantizers beside conversions, codebooks fitted on the
calibration capture's token samples, never on the evaluation text."""

from __future__ import annotations

import math

import pytest
import torch

from cli_runs import TINY, char_tokenizer, run
from headwidget.evaluation import EvaluationReport
from tiny_models import make_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("quantizers") / "llama_gqa"
    make_model("llama_gqa", dtype=torch.float32).save_pretrained(root)
    char_tokenizer().save_pretrained(root)
    return root


def test_quantizers_and_conversions_in_one_report(capfd, model_dir, tmp_path):
    out = tmp_path / "q.json"
    code, stdout, stderr = run(
        capfd,
        [
            "evaluate",
            "--model",
            str(model_dir),
            "--variants",
            "kv:int4,kv:cq2c4b,mqa+align",
            *TINY,
            "--dtype",
            "float32",
            "--out",
            str(out),
        ],
    )
    assert code == 0, stderr
    report = EvaluationReport.load(out)
    assert report.variants == ["model", "kv:int4", "kv:cq2c4b", "mqa+align"]
    layers, channels = 2, 16  # K (and V) channels per layer: 2 KV heads × d_h 8
    # keys: 4 bits + fp16 scale and zero per channel and 32 tokens; values: per token, one group of 32
    # channels holding all 16 (a partial group still stores its scale and zero)
    keys, values = channels * 4 / 8 + 4 * channels / 32, channels * 4 / 8 + 4 * math.ceil(channels / 32)
    assert report.kv_bytes_per_token["kv:int4"] == layers * (keys + values) == 44
    assert report.kv_bytes_per_token["kv:cq2c4b"] == layers * 2 * (channels / 2) * 4 / 8
    assert report.constant_bytes["kv:cq2c4b"] > 0 == report.constant_bytes.get("kv:int4", 0)
    assert "kv:cq2c4b" in stdout


def test_an_impossible_quantizer_fails_before_the_calibration_capture(capfd, model_dir, tmp_path):
    code, _, stderr = run(
        capfd,
        [
            "evaluate",
            "--model",
            str(model_dir),
            "--variants",
            "kv:cq3c8b,mqa",
            *TINY,
            "--out",
            str(tmp_path / "x.json"),
        ],
    )
    assert code == 1
    assert (
        stderr.startswith("headwidget evaluate: --variants: kv:cq3c8b")
        and "allowed c: 1, 2, 4, 8, 16" in stderr
    )
    assert not (tmp_path / "x.json").exists()
