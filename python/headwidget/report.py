"""Plain-text summaries of captured statistics (the demo's per-layer table)."""

from __future__ import annotations

import math

from headwidget.stats import KVStats

__all__ = ["summary_table"]

COLUMNS = (
    ("layer", "layer", "{:>5d}"),
    ("key_abs_corr", "mean|ρ| K", "{:>10.3f}"),
    ("value_abs_corr", "mean|ρ| V", "{:>10.3f}"),
    ("key_head_cos", "head cos K", "{:>11.3f}"),
    ("value_head_cos", "head cos V", "{:>11.3f}"),
)


def summary_table(stats: KVStats) -> str:
    """One line per layer: mean |channel correlation| (off-diagonal) and mean head token-cosine of K and V.

    Example:
        >>> import torch, headwidget
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> m = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40)).eval()
        >>> print(summary_table(headwidget.capture(m, torch.randint(0, 40, (2, 30)), progress=False)))
        ... # doctest: +ELLIPSIS
        layer   mean|ρ| K   mean|ρ| V   head cos K   head cos V
            0 ...
    """
    header = "  ".join(
        f"{title:>{len(fmt.format(0 if key == 'layer' else 0.0))}}" for key, title, fmt in COLUMNS
    )
    lines = [header]
    for row in stats.summary():
        cells = []
        for key, _, fmt in COLUMNS:
            value = row.get(key, math.nan)
            cells.append(fmt.format(value))
        lines.append("  ".join(cells))
    return "\n".join(lines)
