"""Mechanisms-tab interactions on all-MiniLM-L6-v2: each timed against the 200 ms target.

A :class:`~headwidget.views.MechanismView` of the embedded MiniLM (6 layers × 12 heads × 32) with the
default line-up (model, lrkv:4, lrkv:16, mqa, mla:128) and data-aware errors (statistics over the
English sample, ``inputs=True``), as ``explore()`` builds the tab. Each interaction is the time from
setting the trait (what the browser's control does) to the view's new panels. "after a pause": the
background work the previous interaction queued (the other circuit, the neighbouring layers) has
finished, as it has while a user reads the panels; "at once": it has not.

Run: ``.venv/bin/python bench/mechanisms.py`` (``--tokens N``: statistics over N tokens, default 2048).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from headwidget.capture import capture
from headwidget.embedded import load_minilm
from headwidget.texts import english_sample
from headwidget.views import MechanismView

TARGET_MS = 200.0


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return 1000 * (time.perf_counter() - start)


def settle(view: MechanismView) -> None:
    """Wait for the background work queued so far (a user's pause between two interactions)."""
    view._prefetcher.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    model, tokenizer = load_minilm()
    stats = capture(
        model,
        english_sample(),
        tokenizer=tokenizer,
        inputs=True,
        max_tokens=args.tokens,
        max_length=256,
        progress=False,
    )
    rows: list[tuple[str, float]] = []

    def run(name: str, action: Callable[[], object]) -> None:
        rows.append((name, timed(action)))

    def setter(view: MechanismView, trait: str, value: object) -> Callable[[], object]:
        return lambda: (setattr(view, trait, value), view.grid)

    # Without the caches' head start: every interaction computes its conversions and Grams.
    cold = MechanismView(model, stats=stats, prefetch=False)
    run("no prefetch · circuit switch qk → ov", setter(cold, "circuit", "ov"))
    run("no prefetch · layer change 0 → 1", setter(cold, "layer", 1))
    cold.close()

    view = MechanismView(model, stats=stats)
    specs = list(view.mechanisms)
    settle(view)
    run("circuit switch qk → ov (after a pause)", setter(view, "circuit", "ov"))
    settle(view)
    run("circuit switch ov → qk (after a pause)", setter(view, "circuit", "qk"))
    settle(view)
    run("layer change 0 → 1 (after a pause)", setter(view, "layer", 1))
    settle(view)
    run("layer change 1 → 2 (after a pause)", setter(view, "layer", 2))
    run("layer change 2 → 3 (at once)", setter(view, "layer", 3))
    settle(view)
    run("layer change back 3 → 2 (revisit)", setter(view, "layer", 2))
    run("checkbox: uncheck lrkv:16", setter(view, "mechanisms", [s for s in specs if s != specs[2]]))
    run("checkbox: check lrkv:16 again", setter(view, "mechanisms", specs))
    run("checkbox: add gqa:4 (a spec never computed)", setter(view, "mechanisms", [*specs, "gqa:4"]))
    view.close()

    print(f"MiniLM-L6 mechanisms tab, statistics over {stats.tokens} tokens; target ≤ {TARGET_MS:.0f} ms")
    width = max(len(name) for name, _ in rows)
    for name, ms in rows:
        verdict = "meets" if ms <= TARGET_MS else "misses"
        print(f"  {name:<{width}}  {ms:8.1f} ms  {ms / TARGET_MS:5.2f}× target  {verdict}")


if __name__ == "__main__":
    main()
