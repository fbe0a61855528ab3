"""The report table's byte counts: whole ones as integers, fractional ones (a merge's measured retention,
xKV's basis spread over the prefill, a quantizer's scales) to two decimals."""

from __future__ import annotations

import math

from headwidget.evaluation import EvaluationReport


def _measures(nll: float) -> dict[str, float]:
    return {"nll": nll, "perplexity": math.exp(nll), "kl": 0.0, "top1": 1.0}


def test_fractional_kv_bytes_are_rounded_in_the_table_and_kept_in_the_report() -> None:
    kv = {"model": 512, "merge:2": 2 * (144.0 + 0.1 + 0.2 - 0.3), "xkv:8/2": 481 / 3, "kv:int3": 76.5}
    assert kv["merge:2"] != 288  # a float sum a rounding error away from a whole count
    report = EvaluationReport(
        model="tiny",
        kind="causal-lm",
        variants=list(kv),
        measures={spec: _measures(2.0) for spec in kv},
        kv_bytes_per_token=kv,
        tokens=10,
        sequences=1,
        fingerprint="0123456789abcdef",
        dtype="torch.float32",
        protocol="prefill:16",
    )
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[1] for line in report.table().splitlines()[2:]}
    assert cells == {"model": "512", "merge:2": "288", "xkv:8/2": "160.33", "kv:int3": "76.5"}
    assert report.kv_bytes_per_token["xkv:8/2"] == 481 / 3  # the report keeps the exact number
