"""The protocol between the kernel and the front end, written down once.

Its TypeScript twin is ``js/lib/protocol.ts``: the same names, in the same order;
``tests/export/test_protocol.py`` builds the twin with esbuild, runs it in node and checks that both say
the same, that a panel encoded here decodes there to the same cells, and that a saved page's JSON has
the fields listed here. A view's state traits are named by its controls (``controls``).

- ``KERNEL_TRAITS``: what the kernel sets and the page draws (a grid, the control bar, messages);
- ``PAGE_TRAITS``: what the page sets and the kernel reads (the plot size, in device pixels);
- ``PAGE_MESSAGES``: custom messages from the page, by ``type``, with their fields (``frames``: the
  frame keys whose cells the page holds; ``missing``: keys it was sent without cells and lacks;
  ``drawn``: the keys of the panels the page has just drawn, sent once that frame is on screen);
- ``KERNEL_MESSAGES``: custom messages from the kernel, by ``type``;
- ``PANEL_FIELDS``: one entry of the ``panels`` trait (:func:`~headwidget.core.panels.encode_panel`);
  ``data`` is the matrix as raw little-endian bytes (a binary buffer of the message), as ``dtype``
  says, and ``key`` names those bytes (:func:`~headwidget.core.panels.frame_key`): a panel whose key
  the page said it holds comes with empty ``data``, and the page takes the cells it kept; ``hint``
  says what a click on the panel does (drawn only where a click does it: a saved page and a figure
  leave it out); ``mark_row`` / ``mark_col`` outline one row / column (the selected layer; -1: none);
- ``CHART_FIELDS``, ``SERIES_FIELDS``: one entry of the ``charts`` trait and one of its series
  (:func:`~headwidget.core.charts.encode_chart`): a chart's ``hint`` as a panel's, ``x_tick_labels``
  the text of each of ``x_ticks`` (empty: the values written out), ``x_range`` the x-axis' ends
  before padding (empty: the data's; charts that share an axis give the same), ``label_points``
  whether each point's name is written beside it (False: lines a legend names);
- ``CONTROL_TYPES``: each kind of control, with the fields it cannot do without; ``CONTROL_FIELDS``:
  one entry of the ``controls`` trait (``Control.to_json``; a slider's ``positions``: the trait listing
  the values it stops at, when not every one of ``0 .. count - 1``). A
  control of a type the page does not know is an error there, never dropped;
- the saved page (``export/_html.py``; read by ``js/offline.ts``): ``PAGE_FIELDS``, its JSON;
  ``AXIS_FIELDS``, one control the page holds frames for; ``FRAME_FIELDS``, one state's grid (its
  panels as ``STORED_PANEL_FIELDS``: each matrix by its index in ``blobs``, ``packed`` ``"upper"`` for
  a symmetric one stored as its upper triangle; its charts' ``series`` by their index in ``series``:
  a series that many states draw, such as a timeline's trend, is on the page once).

A JSON type is ``"string"``, ``"number"``, ``"boolean"``, ``"list"``, ``"object"``, ``"bytes"``, or
two of them joined by ``|`` (``"list|null"``); a ``?`` at the end: the field may be left out (an axis
holds ``values``, a checklist's its ``options``; a frame says ``window`` when the page crops it).

Example:
    >>> PAGE_MESSAGES["click"], KERNEL_MESSAGES
    (('panel', 'row', 'col'), {'export_png': ()})
    >>> sorted(PANEL_FIELDS)[:3], CONTROL_TYPES["window"]
    (['axis_prefix', 'axis_titles', 'col_axis'], ('width', 'total'))
"""

from __future__ import annotations

__all__ = [
    "AXIS_FIELDS",
    "CHART_FIELDS",
    "CONTROL_FIELDS",
    "CONTROL_TYPES",
    "FRAME_FIELDS",
    "KERNEL_MESSAGES",
    "KERNEL_TRAITS",
    "PAGE_FIELDS",
    "PAGE_MESSAGES",
    "PAGE_TRAITS",
    "PANEL_FIELDS",
    "SERIES_FIELDS",
    "STORED_PANEL_FIELDS",
]

KERNEL_TRAITS: dict[str, str] = {
    "panels": "list",
    "charts": "list",
    "vmin": "number",
    "vmax": "number",
    "colormap": "string",
    "colorbar_label": "string",
    "columns": "number",
    "view": "string",
    "controls": "list",
    "error": "string",
    "status": "string",
    "heading": "string",
}

PAGE_TRAITS: dict[str, str] = {"panel_pixels": "number"}

PAGE_MESSAGES: dict[str, tuple[str, ...]] = {
    "click": ("panel", "row", "col"),
    "chart_click": ("chart", "series", "point"),
    "png": ("data_url", "error"),
    "frames": ("keys",),
    "missing": ("keys",),
    "drawn": ("keys",),
}

KERNEL_MESSAGES: dict[str, tuple[str, ...]] = {"export_png": ()}

PANEL_FIELDS: dict[str, str] = {
    "id": "string",
    "title": "string",
    "subtitle": "string",
    "rows": "number",
    "cols": "number",
    "row_labels": "list|null",
    "col_labels": "list|null",
    "row_offset": "number",
    "col_offset": "number",
    "row_step": "number",
    "col_step": "number",
    "row_group": "number",
    "col_group": "number",
    "axis_prefix": "string",
    "row_axis": "string",
    "col_axis": "string",
    "dtype": "string",
    "data": "bytes",
    "key": "string",
    "note": "string",
    "hint": "string",
    "window_subtitle": "string",
    "mark_row": "number",
    "mark_col": "number",
    "axis_titles": "boolean",
}

CHART_FIELDS: dict[str, str] = {
    "id": "string",
    "title": "string",
    "subtitle": "string",
    "note": "string",
    "hint": "string",
    "x_label": "string",
    "y_label": "string",
    "x_log": "boolean",
    "y_log": "boolean",
    "y_reference": "number|null",
    "x_ticks": "list",
    "x_tick_labels": "list",
    "x_range": "list",
    "label_points": "boolean",
    "series": "list",
}

SERIES_FIELDS: dict[str, str] = {
    "name": "string",
    "x": "list",
    "y": "list",
    "labels": "list",
    "style": "string",
    "color": "string",
    "dashed": "boolean",
}

CONTROL_TYPES: dict[str, tuple[str, ...]] = {
    "slider": ("count",),
    "window": ("width", "total"),
    "toggles": ("options",),
    "select": ("options",),
    "checklist": ("options",),
    "entry": (),
}

CONTROL_FIELDS: dict[str, str] = {
    "trait": "string",
    "type": "string",
    "label": "string",
    "count": "string?",
    "text": "string?",
    "width": "string?",
    "total": "string?",
    "options": "string?",
    "step": "string?",
    "positions": "string?",
    "labels": "object?",
    "play": "boolean?",
}

PAGE_FIELDS: dict[str, str] = {
    "state": "object",
    "axes": "list",
    "frames": "object",
    "errors": "object",
    "blobs": "list",
    "series": "list",
    "bundle": "string",
}

AXIS_FIELDS: dict[str, str] = {
    "trait": "string",
    "type": "string",
    "label": "string",
    "values": "list?",
    "options": "list?",
}

FRAME_FIELDS: dict[str, str] = {
    "vmin": "number",
    "vmax": "number",
    "colormap": "string",
    "colorbar_label": "string",
    "columns": "number",
    "traits": "object",
    "panels": "list",
    "charts": "list",
    "window": "boolean?",
}

STORED_PANEL_FIELDS: dict[str, str] = {
    **{k: v for k, v in PANEL_FIELDS.items() if k not in ("data", "key")},
    "blob": "number",
    "packed": "string",
}
