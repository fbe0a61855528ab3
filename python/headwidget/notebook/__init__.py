"""What users meet in a notebook: the widget that shows any view, views put together, and ``explore``.

- every view of :mod:`headwidget.views` (:class:`~headwidget.ChannelView`, …) is displayed by its
  :attr:`~headwidget.views.View.widget`, a :class:`ViewShell` (:func:`shell_class` makes one class per
  view class); :data:`PRESENTER` is how views are displayed and saved (the package registers it);
- :func:`compose` lays widgets above one tab per view, in Jupyter or marimo; :func:`share` moves the
  fields that views declare shared together;
- :func:`explore` / :class:`Dashboard`: the per-layer trends above one tab per registered view.
"""

from headwidget.notebook._compose import JUPYTER_DRAWINGS, compose, drawing, share
from headwidget.notebook._explore import Dashboard, explore
from headwidget.notebook._widget import PRESENTER, ViewShell, shell_class

__all__ = [
    "JUPYTER_DRAWINGS",
    "PRESENTER",
    "Dashboard",
    "ViewShell",
    "compose",
    "drawing",
    "explore",
    "share",
    "shell_class",
]
