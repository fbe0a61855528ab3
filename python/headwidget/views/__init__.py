"""Views: a user's state (layer, kind, channel window, mechanisms…) turned into panels.

Each view is a ``traitlets.HasTraits`` class in one module of this package: it declares its state
traits once, with the control that shows each (:func:`state`, :mod:`._controls`), implements
``compute() -> PanelGrid`` and registers by name (:func:`register_view`). Every public module here is
imported when the package is, so a new view is one file. Views do not draw, yet a view is what a user
displays (``view`` as a cell's last line, ``view.widget`` in containers) and saves (``view.save``):
:mod:`headwidget.notebook` registers the widget shell that shows any view, and
:mod:`headwidget.export` writes the files (:func:`present_with`).

Example:
    >>> view_names()[:3]
    ['channels', 'alignment', 'mechanisms']
    >>> [c.to_json()["type"] for c in view_class("mechanisms").view_controls()]
    ['slider', 'select', 'checklist', 'entry']
"""

import importlib
import pkgutil

from headwidget.views._base import (
    STATE_ERRORS,
    LayerView,
    Presenter,
    View,
    ViewScreen,
    ViewSourceError,
    ViewState,
    check_sources,
    present_with,
    reduced,
    state,
)
from headwidget.views._controls import Control, ControlType, checklist, entry, select, slider, toggles, window
from headwidget.views._registry import UnknownViewError, register_view, view_class, view_names
from headwidget.views.alignment import AlignmentView
from headwidget.views.channels import ChannelView, ChannelWindowError
from headwidget.views.consequences import ConsequenceView
from headwidget.views.healing import HealingView
from headwidget.views.mechanisms import MechanismView, default_mechanisms
from headwidget.views.quantization import QuantizationView
from headwidget.views.timeline import StepIndexError, TimelineStepsError, TimelineView
from headwidget.views.trends import TrendView

__all__ = [
    "STATE_ERRORS",
    "AlignmentView",
    "ChannelView",
    "ChannelWindowError",
    "ConsequenceView",
    "Control",
    "ControlType",
    "HealingView",
    "LayerView",
    "MechanismView",
    "Presenter",
    "QuantizationView",
    "StepIndexError",
    "TimelineStepsError",
    "TimelineView",
    "TrendView",
    "UnknownViewError",
    "View",
    "ViewScreen",
    "ViewSourceError",
    "ViewState",
    "check_sources",
    "checklist",
    "default_mechanisms",
    "entry",
    "present_with",
    "reduced",
    "register_view",
    "select",
    "slider",
    "state",
    "toggles",
    "view_class",
    "view_names",
    "window",
]


def _import_view_modules() -> None:
    """Import every public module of this package: each registers its views."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_import_view_modules()
