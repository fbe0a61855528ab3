"""What a saved page's offline controls cost: ``page_data`` of each view of SmolLM2-135M, side by side.

For each view, two pages of the same view in one run: "layers only" holds the saved state at every
layer (``max_states`` = the number of layers: what a page held before its other controls worked
offline), "every control" the default (every toggle, drop-down option and checklist subset too, nearest
the saved state first, up to 256 states). Printed: states held, the page's panel data (MiB, each
distinct matrix once), seconds, and the ratios of the two. Statistics: the English sample, 2048
tokens, ``rope="both"`` and ``inputs=True`` (the data-aware mechanism errors), as ``explore()`` has.

Run: ``.venv/bin/python bench/export_page.py`` (``--tokens N``).
"""

from __future__ import annotations

import argparse
import time

from headwidget.capture import capture
from headwidget.embedded import load_smollm2
from headwidget.export._source import collect_frames
from headwidget.texts import english_sample
from headwidget.views import AlignmentView, ChannelView, MechanismView

MAX_BYTES = 256 * 2**20


def measure(view: object, max_states: int) -> tuple[int, float, float]:
    start = time.perf_counter()
    frames = collect_frames(view, None, MAX_BYTES, max_states)  # type: ignore[arg-type]
    seconds = time.perf_counter() - start
    return len(frames.frames) + len(frames.errors), frames.nbytes / 2**20, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    model, tokenizer = load_smollm2()
    stats = capture(
        model,
        english_sample(),
        tokenizer=tokenizer,
        rope="both",
        inputs=True,
        max_tokens=args.tokens,
        max_length=256,
        progress=False,
    )
    layers = stats.meta.layout.num_layers
    views = {
        "channels": lambda: ChannelView(stats, prefetch=False),
        "alignment": lambda: AlignmentView(stats),
        "mechanisms": lambda: MechanismView(model, stats=stats, prefetch=False),
    }
    print(f"SmolLM2-135M, {layers} layers, statistics over {stats.tokens} tokens; each view built afresh")
    print(f"{'view':<11} {'layers only':>28} {'every control':>30}   ratio states / MiB / time")
    for name, make in views.items():
        few = measure(make(), layers)
        every = measure(make(), 256)
        ratios = " / ".join(f"{b / a:.2f}×" if a else "–" for a, b in zip(few, every, strict=True))
        print(
            f"{name:<11} {few[0]:>5} states {few[1]:6.2f} MiB {few[2]:6.2f} s"
            f"   {every[0]:>5} states {every[1]:6.2f} MiB {every[2]:6.2f} s   {ratios}"
        )


if __name__ == "__main__":
    main()
