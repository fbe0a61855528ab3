"""A standalone, offline HTML page of a view: the widget's own front end over precomputed panels.

The page holds everything it needs: the built bundle (``static/widget.js``, base64) and the panels
(wire format of :func:`~headwidget.core.panels.encode_panel`, base64) in one JSON blob
(:mod:`._frames`), and a small
model (``static/offline.js``, built from ``js/offline.ts``) that stands in for the kernel. Hover, the
tooltip, the colorbar, the PNG button and every control but a text entry work as in the notebook:
the page holds the view's panels for each state its controls reach, keyed by state (see
:func:`._source.collect_frames`), and a control looks its new state up. A view with a channel window
(up to :data:`._source.MAX_WINDOW_CHANNELS` channels) keeps each state's whole matrices, which the
page crops to the window. Each distinct matrix is stored once (``blobs``: the value panels under both
key toggles are the same), a symmetric one as its upper triangle, and each distinct chart series once
(``series``: a timeline's trend lines are the same at every step). A Content-Security-Policy forbids
every network request, so the page shows the same thing offline, and runs no script but its own (by
hash: :func:`script_hash`) and the bundle.

Example:
    >>> import numpy as np
    >>> from headwidget.core.panels import Panel, PanelGrid
    >>> grid = PanelGrid([Panel("a", "A", np.eye(2))], -1.0, 1.0, "diverging", "r")
    >>> data = page_data(grid)
    >>> sorted(data), list(data["frames"]), data["frames"]["[]"]["panels"][0]["title"]
    (['axes', 'blobs', 'bundle', 'errors', 'frames', 'series', 'state'], ['[]'], 'A')
    >>> data["frames"]["[]"]["panels"][0]["packed"]  # symmetric: stored as its upper triangle
    'upper'
    >>> page = page_html(grid, title="A")
    >>> page.startswith("<!doctype html>"), "<h1>A</h1>" in page, default_title(grid)
    (True, True, '')
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headwidget.checks import flag, whole_number
from headwidget.core.bundle import bundle_path, offline_path
from headwidget.export._labels import printable
from headwidget.export._source import DEFAULT_MAX_STATES, GridSource, collect_frames
from headwidget.files import atomic_write
from headwidget.views import View

__all__ = [
    "DEFAULT_MAX_BYTES",
    "offline_script",
    "page_csp",
    "page_data",
    "page_html",
    "save_html",
    "script_hash",
]

DEFAULT_MAX_BYTES = 64 * 2**20
#: The page's Content-Security-Policy; ``{script_hashes}``: the ``'sha256-…'`` of each inline script
#: (the JSON data block is not run, so it needs none). No ``'unsafe-inline'`` for scripts: an inline
#: script or event handler other than the page's own module is refused. ``data:`` stays for the
#: bundle the module imports (browsers do not let ``'strict-dynamic'`` cover ``import()`` of a
#: ``data:`` URL). No request leaves the page.
CSP = (
    "default-src 'none'; script-src {script_hashes} data:; style-src 'unsafe-inline'; "
    "img-src data: blob:; base-uri 'none'; form-action 'none'"
)
#: The start of every page, up to its own style rules (a single view's page has none).
HEAD = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="headwidget">
<title>{title}</title>
<style>body {{ margin: 16px; background: #fff; color: #1f1f1f; font-family: system-ui, sans-serif; }}
h1 {{ font-size: 16px; font-weight: 600; margin: 0 0 10px; }}"""
TEMPLATE = (
    HEAD
    + """</style>
</head>
<body>
{heading}<div id="headwidget-root"></div>
<noscript>This page needs JavaScript to draw the heatmaps.</noscript>
<script type="application/json" id="headwidget-data">{data}</script>
<script type="module">{script}</script>
</body>
</html>
"""
)


def page_data(
    source: GridSource,
    *,
    layers: Sequence[int] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_states: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """The JSON the page embeds (``core/protocol.py``: ``PAGE_FIELDS``): ``state`` (the model's traits
    at the saved state), ``axes`` (each control the page holds frames for: its trait, type and the
    values held), ``frames`` by state key (:func:`~headwidget.export._frames.state_key` of the axes'
    values), ``errors`` (the view's message for a state it cannot show), ``blobs`` (the panels'
    matrices: a panel names its own by ``blob``), ``series`` (the charts' series: a chart names its
    own by index), ``bundle``."""
    states = (
        DEFAULT_MAX_STATES
        if max_states is None
        else whole_number("max_states", max_states, minimum=1, hint="the most states a page holds")
    )
    frames = collect_frames(source, layers, max_bytes, states, progress=flag("progress", progress))
    # The status line says what the page leaves out (a window too wide to crop, a text entry...).
    state = {**frames.state, "error": "", "status": frames.note}
    opening = str(state.pop("opening", "[]"))
    first = frames.frames[opening]
    state.update({k: first[k] for k in ("vmin", "vmax", "colormap", "colorbar_label", "columns")})
    state.update(panels=[], charts=frames.charts(opening))
    return {
        "state": state,
        "axes": [axis.to_json() for axis in frames.axes],
        "frames": frames.frames,
        "errors": dict(frames.errors),
        "blobs": frames.blobs,
        "series": frames.series,
        "bundle": base64.b64encode(bundle_path().read_bytes()).decode("ascii"),
    }


def _script_json(data: dict[str, Any]) -> str:
    # Inside <script>, "</script>" or "<!--" in a title must not end the element: escape < > &.
    text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def script_hash(script: str) -> str:
    """The CSP source that allows exactly the inline script whose text is ``script``.

    Example:
        >>> script_hash("")
        "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
    """
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


def page_html(
    source: GridSource,
    *,
    title: str | None = None,
    layers: Sequence[int] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_states: int | None = None,
    progress: bool = True,
) -> str:
    """The standalone page :func:`save_html` writes, as text: titled and headed ``title`` (default:
    :func:`default_title`, the view and its model; ``""``: no heading)."""
    data = page_data(source, layers=layers, max_bytes=max_bytes, max_states=max_states, progress=progress)
    name = printable(default_title(source) if title is None else title)
    script = offline_script()
    return TEMPLATE.format(
        csp=page_csp(),
        title=html.escape(name or "headwidget"),
        heading=f"<h1>{html.escape(name)}</h1>\n" if name else "",
        data=_script_json(data),
        script=script,
    )


def default_title(source: GridSource) -> str:
    """A page's title (and heading) when none is given: a view's title and what it is of, the model
    (``"Channels · SmolLM2-135M"``; the panels of each state are headed by what they show); a grid's:
    none."""
    if not isinstance(source, View):
        return ""
    return " · ".join(part for part in (source.title or source.view_name, source.subject) if part)


def offline_script() -> str:
    """The page's one inline script: the small model that stands in for the kernel."""
    return "\n" + offline_path().read_text(encoding="utf-8") + "\n"


def page_csp() -> str:
    """The Content-Security-Policy of every page: no request, only the page's own inline script."""
    return CSP.format(script_hashes=script_hash(offline_script()))


def save_html(
    source: GridSource,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    layers: Sequence[int] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_states: int | None = None,
    progress: bool = True,
) -> Path:
    """Write ``source`` as a standalone interactive page that works offline; returns the path.

    A view gets a frame for each state its controls reach (:func:`page_data`: the layer slider over
    ``layers``, default all of the view's layers; the other controls' states nearest the saved one
    first, up to ``max_states``); a :class:`PanelGrid` gets one. Raises :class:`ExportError` when
    the saved state at every layer needs more than ``max_bytes`` of panel data, with what to do
    about it. ``progress``: a bar of the states computed, when they take more than two seconds.

    Example:
        >>> import numpy as np, tempfile, pathlib
        >>> from headwidget.core.panels import Panel, PanelGrid
        >>> grid = PanelGrid([Panel("a", "Keys", np.eye(3))], -1.0, 1.0, "diverging", "correlation")
        >>> out = save_html(grid, pathlib.Path(tempfile.mkdtemp()) / "keys.html", title="Keys")
        >>> text = out.read_text()
        >>> "<title>Keys</title>" in text, "://" in text  # no URL anywhere
        (True, False)
    """
    page = page_html(
        source, title=title, layers=layers, max_bytes=max_bytes, max_states=max_states, progress=progress
    )
    path = Path(path)
    with atomic_write(path, "w", encoding="utf-8") as fh:  # the old page stays until the new one is whole
        fh.write(page)
    return path
