"""Offline: JupyterLab showing the widget fetches nothing from outside this machine, and the module the
page runs is the bundle shipped in the installed package.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from .jupyter_fixtures import DASHBOARD_CELL, write_notebook

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "python" / "headwidget" / "static" / "widget.js"

#: SHA-256 of every JavaScript blob anywidget turned into a module URL.
BLOB_HASHES = """async () => {
  const hex = (b) => Array.from(new Uint8Array(b), (x) => x.toString(16).padStart(2, '0')).join('');
  const out = [];
  for (const blob of window.__hwScripts)
    out.push(hex(await crypto.subtle.digest('SHA-256', await blob.arrayBuffer())));
  return out;
}"""

#: Prints the bundle path of the imported package, and hashes of that file and of every view's `_esm`.
KERNEL_BUNDLE = (
    "import hashlib, pathlib; "
    "f = pathlib.Path(headwidget.__file__).resolve().parent / 'static' / 'widget.js'; "
    "print(f); print(hashlib.sha256(f.read_bytes()).hexdigest()); "
    "views = (dash.channels, dash.alignment, dash.mechanisms); "
    "print(*(hashlib.sha256(v.widget._esm.encode()).hexdigest() for v in views), sep='\\n')"
)


@pytest.fixture(scope="module")
def lab(lab_page, bundle):
    write_notebook(lab_page.lab.root_dir / "offline.ipynb", DASHBOARD_CELL)
    lab_page.open("offline.ipynb")
    lab_page.run_cell(0, timeout_s=90)
    lab_page.page.wait_for_selector('.hw-root[data-view="channels"] .hw-panel canvas.hw-heatmap')
    return lab_page


def test_no_request_leaves_the_machine(lab):
    # The page really loaded through the recorder: JupyterLab's own files and the kernel websocket.
    assert any("/static/lab/" in u for u in lab.requests), lab.requests[:5]
    assert any("/api/kernels/" in u for u in lab.websockets), lab.websockets
    assert lab.remote_requests() == []


def test_the_page_runs_the_installed_bundle(lab):
    want = hashlib.sha256(BUNDLE.read_bytes()).hexdigest()
    path, file_hash, *esm_hashes = lab.run(KERNEL_BUNDLE).splitlines()
    assert Path(path) == BUNDLE.resolve()
    assert file_hash == want
    assert esm_hashes == [want] * 3  # channels, alignment, mechanisms: the file's exact text
    assert want in lab.page.evaluate(BLOB_HASHES), "the page did not import the bundle's text"
