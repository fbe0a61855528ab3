"""What users meet in a notebook: the widget that shows any view, and ``explore``.

- every view of :mod:`headwidget.views` (:class:`~headwidget.ChannelView`, …) is displayed by its
  :attr:`~headwidget.views.View.widget`, a :class:`ViewShell` (:func:`shell_class` makes one class per
  view class); importing this package registers it, and :func:`headwidget.export.save` for
  ``view.save``;
- :func:`explore` / :class:`Dashboard`: one tab per registered view under the per-layer trends.
"""

from headwidget.notebook._explore import Dashboard, explore
from headwidget.notebook._widget import ViewShell, shell_class

__all__ = ["Dashboard", "ViewShell", "explore", "shell_class"]
