"""Views put together: widgets above a tab per view, in Jupyter or marimo, and the state they share.

- :func:`compose`: ipywidgets' ``VBox`` and ``Tab`` in Jupyter, marimo's ``vstack`` and ``ui.tabs``
  in marimo (which runs anywidgets, not ipywidgets' containers);
- :func:`drawing`: a view's widget, or in Jupyter its drawing in :data:`JUPYTER_DRAWINGS` (the
  trends: a bqplot chart of the trend view's series);
- :func:`share`: a change of a field that states declare shared (``state(..., shared=True)``: the
  layer, the alignment method and metric) moves it in the other views that offer the value (among
  their control's options or slider range: the trends keep their metric when the alignment tab picks CKA).

Example:
    >>> import torch, headwidget
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
    >>> channels, trends = headwidget.ChannelView(stats, prefetch=False), headwidget.TrendView(stats)
    >>> shared = share([channels, trends])
    >>> channels.layer = 1
    >>> trends.layer, type(compose([drawing(trends)], {"Channels": channels.widget})).__name__
    (1, 'VBox')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Literal

import ipywidgets

from headwidget.views import View, shared_fields
from headwidget.widget import LayerTrends

__all__ = ["JUPYTER_DRAWINGS", "Host", "compose", "drawing", "share"]

Host = Literal["jupyter", "marimo"]

#: How a view is drawn in Jupyter where not by its own widget, by view name.
JUPYTER_DRAWINGS: dict[str, Callable[[Any], Any]] = {"trends": LayerTrends}


def compose(above: Sequence[Any], tabs: Mapping[str, Any], host: Host = "jupyter") -> Any:
    """``above`` (widgets, top to bottom) over one tab per entry of ``tabs`` (title → widget)."""
    if host == "marimo":
        import marimo as mo

        return mo.vstack([*above, mo.ui.tabs(dict(tabs))])
    return ipywidgets.VBox([*above, ipywidgets.Tab(children=list(tabs.values()), titles=list(tabs))])


def drawing(view: View[Any], host: Host = "jupyter") -> Any:
    """What shows ``view`` in ``host``: its Jupyter drawing, if it has one, else its widget."""
    draw = JUPYTER_DRAWINGS.get(view.view_name) if host == "jupyter" else None
    return view.widget if draw is None else draw(view)


def _offers(view: View[Any], field: str, value: Any) -> bool:
    """Whether ``view`` offers ``value`` for ``field``: among its control's options, in its slider's
    range (a field without such a control takes any value, and says in ``error`` when it cannot)."""
    control = next((c for c in view.view_controls() if c.trait == field), None)
    if control is not None and control.options:
        return value in getattr(view, control.options)
    if control is not None and control.type == "slider" and control.positions:
        return value in getattr(view, control.positions)
    if control is not None and control.type == "slider":
        return isinstance(value, int) and 0 <= value < int(getattr(view, control.count))
    return True


def share(views: Sequence[View[Any]]) -> Callable[[], None]:
    """Move each shared field of ``views`` together (see the module docstring); returns what unties them."""
    untie: list[Callable[[], None]] = []
    fields = {f for view in views for f in shared_fields(view.State)}
    for field in sorted(fields):
        group = [v for v in views if field in shared_fields(v.State)]

        def follow(change: dict[str, Any], field: str = field, group: list[View[Any]] = group) -> None:
            new = change["new"]
            for other in group:
                if (
                    other is not change["owner"]
                    and getattr(other, field) != new
                    and _offers(other, field, new)
                ):
                    other.set_state(**{field: new})

        for view in group:
            view.observe(follow, names=[field])
            untie.append(partial(view.unobserve, follow, names=[field]))

    def untie_all() -> None:
        for each in untie:
            each()

    return untie_all
