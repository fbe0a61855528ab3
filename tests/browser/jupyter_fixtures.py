"""JupyterLab and Notebook 7 end to end: a real server per test session and notebooks driven in chromium.

The ``jupyterlab`` fixture starts ``python -m jupyterlab`` with the interpreter running the tests (so
the kernel imports this checkout's headwidget) on a free port of 127.0.0.1, with a random token and a
temporary root directory, config and runtime dirs; it waits for ``/api/status`` and always stops the
server (which shuts its kernels down). ``lab_page`` opens a notebook of that directory in a fresh
browser context and drives it like a user: click a cell, type, Shift+Enter, read the output.

Every request the page makes is recorded, and every JavaScript module anywidget loads from a blob
(the widget's ``_esm``) is kept, so tests can check what the page fetched and executed.

``notebook7`` and ``notebook7_page`` are the same for Notebook 7 (``python -m notebook``, 7.x).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 90
LAB_CONFIG = {
    "LabApp": {
        "news_url": None,
        "check_for_updates_class": "jupyterlab.handlers.announcements.NeverCheckForUpdate",
    }
}

#: Keeps the JavaScript blobs anywidget imports (it loads `_esm` through URL.createObjectURL).
RECORD_BLOBS = """
(() => {
  window.__hwScripts = [];
  const original = URL.createObjectURL.bind(URL);
  URL.createObjectURL = (obj) => {
    if (obj instanceof Blob && /javascript/.test(obj.type)) window.__hwScripts.push(obj);
    return original(obj);
  };
})();
"""

#: The cell that shows the dashboard of a tiny random-init Llama (GQA, 2 layers, 16 key channels).
DASHBOARD_CELL = f"""\
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
import torch
import headwidget
from tiny_models import make_model, ragged_batches
model = make_model("llama_gqa", dtype=torch.float32)
dash = headwidget.explore(model, ragged_batches(), progress=False)
dash"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class JupyterLab:
    """A running JupyterLab server."""

    base_url: str
    token: str
    root_dir: Path
    log: Path
    #: ``"lab"`` (JupyterLab) or ``"notebook"`` (Notebook 7): which front end the server serves.
    ui: str = "lab"

    def notebook_url(self, name: str) -> str:
        if self.ui == "notebook":
            return f"{self.base_url}/notebooks/{name}?token={self.token}"
        # `reset` drops any saved workspace, so every page starts with just this notebook.
        return f"{self.base_url}/lab/tree/{name}?reset&token={self.token}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def write_notebook(path: Path, *sources: str) -> Path:
    """A Python 3 notebook with one code cell per source."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, str(path))
    return path


@contextlib.contextmanager
def running_jupyterlab(
    root_dir: Path, work_dir: Path, python: str = sys.executable, app: str = "jupyterlab"
) -> Iterator[JupyterLab]:
    """Start JupyterLab (``app="notebook"``: Notebook 7) serving ``root_dir``; stop it (and its
    kernels) on exit."""
    port, token = free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(work_dir / "config"),
        JUPYTER_RUNTIME_DIR=str(work_dir / "runtime"),
        IPYTHONDIR=str(work_dir / "ipython"),
        JUPYTERLAB_WORKSPACES_DIR=str(work_dir / "workspaces"),
        PYTHONUNBUFFERED="1",
    )
    cmd = [
        python,
        "-m",
        app,
        "--allow-root",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root_dir}",
    ]
    # No news feed and no update check: nothing in the session may need more than 127.0.0.1.
    (work_dir / "config").mkdir(parents=True, exist_ok=True)
    (work_dir / "config" / "jupyter_server_config.json").write_text(json.dumps(LAB_CONFIG))
    ui = "notebook" if app == "notebook" else "lab"
    lab = JupyterLab(f"http://127.0.0.1:{port}", token, root_dir, work_dir / f"{app}.log", ui)
    with lab.log.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root_dir)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{app} exited with {proc.returncode}:\n{lab.log_tail()}")
            try:
                url = f"{lab.base_url}/api/status?token={token}"
                with direct.open(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{app} did not answer in {STARTUP_TIMEOUT_S} s:\n{lab.log_tail()}")
            time.sleep(0.2)
        yield lab
    finally:
        proc.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class LabPage:
    """One notebook open in JupyterLab, driven through the page."""

    page: object
    lab: JupyterLab
    requests: list[str] = field(default_factory=list)
    websockets: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def open(self, name: str) -> None:
        self.page.goto(self.lab.notebook_url(name))
        self.page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content", timeout=60_000)
        # A cell run before the kernel is connected is skipped, not queued: wait until it is idle.
        self.page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=60_000)
        self.dismiss_dialogs()

    def dismiss_dialogs(self) -> None:
        """Answer a modal dialog JupyterLab may raise while restoring a workspace that other tests
        used (a kernel choice, a file changed on disk): its default button, as a user would. The
        dialogs seen are kept in ``self.dialogs``."""
        for _ in range(3):
            dialog = self.page.locator(".jp-Dialog")
            if dialog.count() == 0 or not dialog.first.is_visible():
                return
            self.dialogs.append(dialog.first.inner_text())
            dialog.first.locator(".jp-mod-accept").first.click()
            dialog.first.wait_for(state="detached", timeout=10_000)

    def cells(self):
        return self.page.locator(".jp-Notebook .jp-Cell")

    def run_cell(self, index: int, timeout_s: float = 60) -> str:
        """Run cell ``index`` (click into it, Shift+Enter) and return its output text."""
        cell = self.cells().nth(index)
        prompt = cell.locator(".jp-InputPrompt")
        # The prompt reads "[*]:" while queued or running and "[n]:" once done. Just after the page
        # opens, JupyterLab can drop a run (the prompt stays "[ ]:"): run it again.
        for _attempt in range(3):
            self.dismiss_dialogs()
            cell.locator(".cm-content").click()
            self.page.keyboard.press("Shift+Enter")
            started = time.monotonic()
            while prompt.inner_text().strip() == "[ ]:" and time.monotonic() - started < 5:
                time.sleep(0.05)
            if prompt.inner_text().strip() != "[ ]:":
                break
        deadline = time.monotonic() + timeout_s
        while not re.fullmatch(r"\[\d+\]:", prompt.inner_text().strip()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell {index} did not finish in {timeout_s} s:\n{self.lab.log_tail()}")
            time.sleep(0.05)
        return self.output_text(index)

    def run(self, code: str, timeout_s: float = 60) -> str:
        """Type ``code`` into the last cell (Shift+Enter always leaves an empty one) and run it."""
        index = self.cells().count() - 1
        editor = self.cells().nth(index).locator(".cm-content")
        editor.click()
        self.page.keyboard.insert_text(code)
        return self.run_cell(index, timeout_s)

    def output_text(self, index: int) -> str:
        outputs = self.cells().nth(index).locator(".jp-OutputArea-output")
        return "\n".join(outputs.nth(i).inner_text() for i in range(outputs.count())).strip()

    def remote_requests(self) -> list[str]:
        """Requests (and websockets) to anything but this machine's loopback."""
        local = re.compile(r"^(https?|wss?)://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?/")
        return [
            u
            for u in self.requests + self.websockets
            if not (local.match(u) or u.startswith(("blob:", "data:")))
        ]


def require_modules(*modules: str) -> None:
    """Skip (under CI=true: fail) unless every one of ``modules`` can be imported."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"not installed: {', '.join(missing)} (pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: browser tests must run)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def jupyterlab(tmp_path_factory) -> Iterator[JupyterLab]:
    require_modules("jupyterlab", "ipykernel", "nbformat")
    root = tmp_path_factory.mktemp("notebooks")
    work = tmp_path_factory.mktemp("jupyter")
    with running_jupyterlab(root, work) as lab:
        yield lab


@pytest.fixture(scope="session")
def notebook7(tmp_path_factory) -> Iterator[JupyterLab]:
    """A Notebook 7 server (``python -m notebook``), set up like the JupyterLab one."""
    require_modules("notebook", "ipykernel", "nbformat")
    from importlib.metadata import version

    if not version("notebook").startswith("7."):
        pytest.fail(f"notebook {version('notebook')} is installed, the tests need Notebook 7", pytrace=False)
    root = tmp_path_factory.mktemp("notebook7")
    work = tmp_path_factory.mktemp("jupyter-nb7")
    with running_jupyterlab(root, work, app="notebook") as nb:
        yield nb


def open_lab_page(browser, server: JupyterLab) -> tuple[object, LabPage]:
    """A fresh browser context on ``server``: (the context, its page)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(RECORD_BLOBS)
    page = context.new_page()
    page.set_default_timeout(60_000)
    lp = LabPage(page=page, lab=server)
    page.on("request", lambda r: lp.requests.append(r.url))
    page.on("websocket", lambda ws: lp.websockets.append(ws.url))
    page.on("pageerror", lambda e: lp.errors.append(str(e)))
    return context, lp


@pytest.fixture(scope="module")
def lab_page(browser, jupyterlab) -> Iterator[LabPage]:
    """A fresh browser context on the JupyterLab server (open a notebook with ``.open(name)``)."""
    context, lp = open_lab_page(browser, jupyterlab)
    yield lp
    context.close()


@pytest.fixture(scope="module")
def notebook7_page(browser, notebook7) -> Iterator[LabPage]:
    """A fresh browser context on the Notebook 7 server (its notebook page has the same cells and
    prompts as JupyterLab's, so :class:`LabPage` drives it)."""
    context, lp = open_lab_page(browser, notebook7)
    yield lp
    context.close()
