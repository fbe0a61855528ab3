"""What a publication figure costs: the demo's figures saved as PNG and PDF, with text widths remembered
(``export._labels.text_width`` as it is) and measured anew on every call, side by side in one run.

Each figure is laid out once and written to both files (``save_all``); the widths feed the panels' tick
locators, which matplotlib calls on every layout pass. Statistics: the English sample, ``--tokens`` tokens
of SmolLM2-135M, captured as the demo captures them (both RoPE sides, the alignment layers across
layers). The PNG files of both ways are compared byte for byte.

Run: ``.venv/bin/python bench/figures.py`` (``--tokens N``, ``--repeats N``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import headwidget.export._labels as labels
from headwidget.capture import capture
from headwidget.demo import ALIGNMENT_LAYERS, CHANNEL_LAYERS
from headwidget.embedded import load_smollm2
from headwidget.export._save import save_all
from headwidget.texts import english_sample
from headwidget.views import view_class


def seconds(save: Callable[[], None], anew: bool, repeats: int) -> float:
    """Median seconds of ``save()``; with ``anew``, every text width is measured (nothing remembered)."""
    remembered = labels._width
    times = []
    for _ in range(repeats):
        remembered.cache_clear()
        if anew:
            labels._width = remembered.__wrapped__  # type: ignore[assignment]
        try:
            start = time.perf_counter()
            save()
            times.append(time.perf_counter() - start)
        finally:
            labels._width = remembered
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, tokenizer = load_smollm2()
    stats = capture(
        model,
        english_sample(),
        tokenizer=tokenizer,
        rope="both",
        cross_layer=ALIGNMENT_LAYERS,
        max_tokens=args.tokens,
        max_length=256,
        progress=False,
    )
    figures = {
        "channel_correlation": view_class("channels").create(
            stats, layers=CHANNEL_LAYERS, interactive=False, channel_width=32
        ),
        "head_alignment": view_class("alignment").create(stats, layers=ALIGNMENT_LAYERS, interactive=False),
    }
    print(f"SmolLM2-135M, {stats.tokens} tokens of statistics; PNG, PDF at 150 dpi, median of {args.repeats}")
    with tempfile.TemporaryDirectory() as name:
        compare(figures, Path(name), args.repeats)


def compare(figures: dict[str, Any], folder: Path, repeats: int) -> None:
    """Print each figure's seconds both ways, their ratio, and whether the PNG files are equal."""
    print(f"{'figure':<20} {'widths measured anew':>21} {'widths remembered':>18}   ratio")
    for name, view in figures.items():
        runs = {}
        for anew in (True, False):
            paths = [folder / f"{name}-{anew}.png", folder / f"{name}-{anew}.pdf"]
            runs[anew] = seconds(lambda paths=paths, view=view: save_all(view, paths, dpi=150), anew, repeats)
        same = (folder / f"{name}-True.png").read_bytes() == (folder / f"{name}-False.png").read_bytes()
        print(
            f"{name:<20} {runs[True]:>19.2f} s {runs[False]:>16.2f} s   {runs[True] / runs[False]:.2f}×"
            f"{'' if same else '   (PNG files differ!)'}"
        )


if __name__ == "__main__":
    main()
