"""Views: a user's state (layer, kind, channel window, mechanisms…) turned into panels.

Each view is a class in one module of this package: it declares its state as a frozen dataclass whose
fields carry the control that shows each (:class:`ViewState`, :func:`state`, :mod:`._controls`) and
names it as its parameter (``View[ChannelState]``: the state traits are made from it), names what it is
built from (``sources``, a :class:`ViewSources`), implements ``compute(state) -> PanelGrid`` and
registers by name (:func:`register_view`). Every public module here is imported when the package is,
so a new view is one file. Views do not draw, yet a view is what a user displays (``view`` as a
cell's last line, ``view.widget`` in containers) and saves (``view.save``): the package registers
:mod:`headwidget.notebook`, the widget shell that shows any view, and :mod:`headwidget.export`, which
writes the files (:func:`present_with`).

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
    LayerState,
    LayerView,
    Presenter,
    View,
    ViewScreen,
    ViewSourceError,
    check_sources,
    present_with,
    reduced,
)
from headwidget.views._controls import Control, ControlType, checklist, entry, select, slider, toggles, window
from headwidget.views._models import check_same_models
from headwidget.views._registry import UnknownViewError, register_view, view_class, view_names
from headwidget.views._sources import ViewSources
from headwidget.views._state import ViewState, WholeNumber, shared_fields, state
from headwidget.views.alignment import AlignmentView
from headwidget.views.channels import ChannelView, ChannelWindowError
from headwidget.views.consequences import ConsequenceView
from headwidget.views.healing import HealingView
from headwidget.views.layer_similarity import LayerSimilarityView
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
    "LayerSimilarityView",
    "LayerState",
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
    "ViewSources",
    "ViewState",
    "WholeNumber",
    "check_same_models",
    "check_sources",
    "checklist",
    "default_mechanisms",
    "entry",
    "present_with",
    "reduced",
    "register_view",
    "select",
    "shared_fields",
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
