"""What users meet in a notebook: each registered view as a widget, and ``explore``.

- :class:`ChannelView`, :class:`AlignmentView`, :class:`MechanismView`, :class:`ConsequenceView`,
  :class:`QuantizationView`, :class:`TimelineView`, :class:`HealingView`: the views of
  :mod:`headwidget.views` that are also :class:`~headwidget.widget.HeadWidget` s, with ``save(path)``;
- :func:`widget_class` / :func:`displayable`: the same for any registered view, by name or class;
- :func:`explore` / :class:`Dashboard`: one tab per registered view under the per-layer trends.
"""

from headwidget.notebook._explore import Dashboard, explore
from headwidget.notebook._views import (
    AlignmentView,
    ChannelView,
    ConsequenceView,
    HealingView,
    MechanismView,
    QuantizationView,
    TimelineView,
)
from headwidget.notebook._widget import ViewWidget, displayable, widget_class

__all__ = [
    "AlignmentView",
    "ChannelView",
    "ConsequenceView",
    "Dashboard",
    "HealingView",
    "MechanismView",
    "QuantizationView",
    "TimelineView",
    "ViewWidget",
    "displayable",
    "explore",
    "widget_class",
]
