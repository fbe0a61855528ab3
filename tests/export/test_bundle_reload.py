"""The widget's front end is anywidget's class-level module file: read once for every widget, and
reloaded on a rebuild while developing (``ANYWIDGET_HMR=1``, a source checkout, ``watchfiles``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from headwidget.widget import HeadWidget
from headwidget.widget.base import BUNDLE


def test_every_widget_shows_the_one_bundle_file():
    a, b = HeadWidget(), HeadWidget()
    assert a._esm == b._esm == BUNDLE.read_text()
    assert "_esm" in HeadWidget.__dict__ and "_esm" not in HeadWidget.class_trait_names()


#: Run in a child with ANYWIDGET_HMR=1: two widgets, then a "rebuild" of the bundle (the same module
#: with a comment appended, so the file stays a working bundle whatever happens), then the original.
CHILD = textwrap.dedent(
    """
    import time
    from headwidget.widget import HeadWidget
    from headwidget.widget.base import BUNDLE

    original = BUNDLE.read_text()
    a, b = HeadWidget(), HeadWidget()

    def wait_for(predicate):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not predicate():
            time.sleep(0.05)
        return predicate()

    time.sleep(0.5)  # the watcher is running
    try:
        BUNDLE.write_text(original + "\\n// rebuilt\\n")
        reloaded = wait_for(lambda: a._esm.endswith("// rebuilt\\n") and b._esm == a._esm)
    finally:
        BUNDLE.write_text(original)
    restored = wait_for(lambda: a._esm == original)
    print(reloaded, restored)
    """
)


def test_a_rebuilt_bundle_reloads_every_widget_while_developing():
    pytest.importorskip("watchfiles", reason="ANYWIDGET_HMR needs watchfiles (the dev extra)")
    if "site-packages" in BUNDLE.parts:
        pytest.skip("an installed package is not watched (anywidget reloads a source checkout only)")
    before = BUNDLE.read_bytes()
    env = {**os.environ, "ANYWIDGET_HMR": "1"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=90
        )
    finally:
        if BUNDLE.read_bytes() != before:  # the child died between its two writes
            BUNDLE.write_bytes(before)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
