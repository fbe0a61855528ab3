"""The Jupyter transport: the anywidget that shows panels, and the bqplot per-layer trends.

Views (:mod:`headwidget.views`) decide what the panels are; :mod:`headwidget.notebook` makes each view
a ``HeadWidget``. This package never imports the export (which imports views, not widgets).
"""

from headwidget.widget.base import HeadWidget
from headwidget.widget.trends import LayerTrends

__all__ = ["HeadWidget", "LayerTrends"]
