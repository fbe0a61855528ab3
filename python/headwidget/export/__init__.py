"""Export what a view shows: PNG, SVG and PDF figures (matplotlib) and standalone HTML pages.

Every exporter takes a view (``ChannelView``, ``AlignmentView``, ``MechanismView``, or anything with
a ``.grid``) or a :class:`~headwidget.core.panels.PanelGrid`, so a saved figure shows exactly the
panels, labels, colour range and colormap of the widget. Colours come from ``colormaps.json``, the
table the front end uses, by the same value → entry rule.

Example:
    >>> import numpy as np, tempfile, pathlib
    >>> from headwidget.core.panels import Panel, PanelGrid
    >>> grid = PanelGrid([Panel("k", "Keys · layer 0", np.eye(4)), Panel("v", "Values · layer 0", np.eye(4))],
    ...                  -1.0, 1.0, "diverging", "Pearson correlation", columns=1)
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> [save(grid, folder / f"corr{ext}", dpi=50).suffix for ext in (".png", ".svg", ".pdf", ".html")]
    ['.png', '.svg', '.pdf', '.html']
"""

from headwidget.export._colormaps import LutNorm, colormap, lut_color, lut_index, nan_color
from headwidget.export._figure import export_style, figure
from headwidget.export._html import page_data, page_html, save_html
from headwidget.export._save import FORMATS, cell_box, save, save_all
from headwidget.export._source import ExportError, GridSource, grid_of
from headwidget.export._tabs import save_tabbed_html, tabbed_html

__all__ = [
    "FORMATS",
    "ExportError",
    "GridSource",
    "LutNorm",
    "cell_box",
    "colormap",
    "export_style",
    "figure",
    "grid_of",
    "lut_color",
    "lut_index",
    "nan_color",
    "page_data",
    "page_html",
    "save",
    "save_all",
    "save_html",
    "save_tabbed_html",
    "tabbed_html",
]
