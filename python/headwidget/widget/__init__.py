"""The Jupyter widget: views that turn statistics into panels, and the anywidget that shows them."""

from headwidget.core.panels import Panel, PanelGrid
from headwidget.widget.alignment_view import AlignmentView
from headwidget.widget.base import HeadWidget
from headwidget.widget.channel_view import ChannelView
from headwidget.widget.explore import Dashboard, explore
from headwidget.widget.mechanism_view import MechanismView
from headwidget.widget.trends import LayerTrends

__all__ = [
    "AlignmentView",
    "ChannelView",
    "Dashboard",
    "HeadWidget",
    "LayerTrends",
    "MechanismView",
    "Panel",
    "PanelGrid",
    "explore",
]
