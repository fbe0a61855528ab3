"""One offline page holding several standalone pages under a tab bar (``Dashboard.save("….html")``).

The tab bar is radio buttons and CSS, with no script of its own; each tab is a page as
:func:`~headwidget.export._html.page_html` makes it, in an ``<iframe srcdoc>``. A ``srcdoc`` frame
inherits the outer page's Content-Security-Policy, so the outer page carries the tabs' own policy.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path

from headwidget.export._html import HEAD, page_csp
from headwidget.export._labels import printable
from headwidget.files import atomic_write

__all__ = ["save_tabbed_html", "tabbed_html"]

TABBED_TEMPLATE = (
    HEAD
    + """
.hw-tabs > input {{ position: absolute; opacity: 0; }}
.hw-tabs > label {{ display: inline-block; padding: 6px 12px; border: 1px solid #ccc; border-bottom: none;
  cursor: pointer; background: #f4f4f4; }}
.hw-tabs > section {{ display: none; border-top: 1px solid #ccc; }}
{rules}
.hw-tabs iframe {{ width: 100%; height: 88vh; border: none; }}</style>
</head>
<body>
<h1>{title}</h1>
<div class="hw-tabs">
{tabs}
</div>
</body>
</html>
"""
)


def tabbed_html(pages: Sequence[tuple[str, str]], title: str) -> str:
    """A page with one tab per ``(tab title, page text)``, the first tab open.

    Example:
        >>> page = tabbed_html([("A", "<p>a</p>"), ("B", "<p>b</p>")], "Two")
        >>> page.count("<iframe"), "<h1>Two</h1>" in page
        (2, True)
    """
    tabs, rules = [], []
    for i, (name, _) in enumerate(pages):
        checked = " checked" if i == 0 else ""
        tabs.append(
            f'<input type="radio" name="hw-tab" id="hw-tab-{i}"{checked}>'
            f'<label for="hw-tab-{i}">{html.escape(name)}</label>'
        )
        rules.append(f"#hw-tab-{i}:checked ~ #hw-page-{i} {{ display: block; }}")
    for i, (name, document) in enumerate(pages):
        tabs.append(
            f'<section id="hw-page-{i}" aria-label="{html.escape(name)}">'
            f'<iframe title="{html.escape(name)}" srcdoc="{html.escape(document, quote=True)}"></iframe>'
            "</section>"
        )
    return TABBED_TEMPLATE.format(
        csp=page_csp(),
        title=html.escape(printable(title)),
        rules="\n".join(rules),
        tabs="\n".join(tabs),
    )


def save_tabbed_html(path: str | os.PathLike[str], pages: Sequence[tuple[str, str]], title: str) -> Path:
    """Write :func:`tabbed_html` to ``path`` atomically (:mod:`headwidget.files`); returns the path."""
    path = Path(path)
    page = tabbed_html(pages, title)
    with atomic_write(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path
