"""The demo's per-layer summary numbers against numpy on independently computed K/V."""

from __future__ import annotations

import numpy as np

import headwidget
from headwidget.report import summary_table
from references import token_cosine
from tiny_models import make_model, ragged_batches, reference_activations


def test_summary_rows_match_numpy():
    model = make_model("llama_gqa")
    batches = ragged_batches()
    stats = headwidget.capture(model, batches, progress=False)
    ref = reference_activations("llama_gqa", model, batches)
    rows = stats.summary()
    assert [r["layer"] for r in rows] == [0, 1]
    for row in rows:
        for kind in ("key", "value"):
            x = ref[row["layer"]][kind]
            rho = np.corrcoef(x.T)
            off = ~np.eye(len(rho), dtype=bool)
            assert abs(row[f"{kind}_abs_corr"] - np.abs(rho[off]).mean()) < 1e-9
            sim = token_cosine(x, 8)
            assert abs(row[f"{kind}_head_cos"] - sim[~np.eye(2, dtype=bool)].mean()) < 1e-9
    table = summary_table(stats).splitlines()
    assert len(table) == 3
    assert table[1].split()[1] == f"{rows[0]['key_abs_corr']:.3f}"
