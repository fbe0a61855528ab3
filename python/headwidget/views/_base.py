"""``View``: a user's state, declared as data, turned into panels by :meth:`View.compute`.

A view class names its state (:mod:`~headwidget.views._state`: a frozen dataclass, one field per
thing a user chooses, each with the control that shows it) as its parameter, ``View[ChannelState]``,
and what it is built from as its ``sources`` (:mod:`~headwidget.views._sources`). The state's fields
are the view's state traits: a change of one (from Python, or from the browser when the view is shown
by its widget) recomputes the panels. A view built with a state it cannot show (a layer that was not
captured, say) raises that error; a later change to such a state is reported in ``error`` instead,
and the last good panels stay.

:meth:`View.compute` is a function of a state (:meth:`View.current_state`, the traits' values as one
value) and of the view's sources (statistics, a model, a report: fixed when the view is built): it
reads no trait and sets nothing, so the panels of any state can be computed without moving the view
(what a saved page does for every state its controls reach). The base class alone decides when to
compute: it keeps the most recent grids by (state, resolution) (:data:`GRIDS_KEPT` of them, safe to
share with the thread that computes ahead), computes the :meth:`View.neighbours` of the state shown
ahead of time (:mod:`~headwidget.views._prefetch`), and sets the text traits that follow a state
(:meth:`View.labels`).

A view shown on a screen computes its panels for that screen: ``resolution`` is the most cells a
panel side needs there (the widget sets it from the page's plot size in device pixels), and a view
with more cells than that (the channel view's 4096 channels) sends block means. Computed with
``resolution=None``, the panels are those of the view's own limit, which is what saved figures and
pages hold.

Views do not draw and import no widget library, yet a view is what a user displays and saves: the
package registers how (:func:`present_with`: ``import headwidget`` registers the notebook layer, which
is imported on a view's first display or save), and a view displayed in a notebook
(``_repr_mimebundle_``, marimo's ``_display_``) shows its :attr:`View.widget`; :meth:`View.save`
writes it through the same presenter.

Example:
    >>> import numpy as np
    >>> from headwidget.core.panels import Panel, PanelGrid
    >>> @dataclasses.dataclass(frozen=True)
    ... class ScaledState(ViewState):
    ...     factor: float = 1.0
    >>> class Scaled(View[ScaledState]):
    ...     def compute(self, state: ScaledState, resolution: int | None = None) -> PanelGrid:
    ...         return PanelGrid([Panel("m", "scaled", state.factor * np.eye(2))], -1.0, 1.0, "diverging", "")
    >>> view = Scaled()
    >>> view.factor = 0.5
    >>> view.grid.panels[0].matrix[0, 0], Scaled.state_traits(), view.current_state()
    (np.float64(0.5), ['factor'], ScaledState(factor=0.5))
    >>> view.compute(view.current_state().replace(factor=2.0)).panels[0].matrix[0, 0], view.factor
    (np.float64(2.0), 0.5)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import traitlets as t
from torch import nn

from headwidget.analysis.conversions import check_stats_source
from headwidget.core.panels import PanelGrid, encode_ahead
from headwidget.errors import HeadwidgetError, LayerIndexError, ViewSourceError
from headwidget.stats import KVStats
from headwidget.views._controls import Control, slider
from headwidget.views._memo import Memo
from headwidget.views._models import check_same_models
from headwidget.views._prefetch import Prefetcher
from headwidget.views._sources import ViewSources, missing_source
from headwidget.views._state import ViewState, field_controls, frozen, state, state_traits

__all__ = [
    "GRIDS_KEPT",
    "STATE_ERRORS",
    "LayerState",
    "LayerView",
    "Presenter",
    "View",
    "ViewScreen",
    "ViewSourceError",
    "check_sources",
    "check_view_layer",
    "present_with",
    "reduced",
    "stats_model_name",
]

S = TypeVar("S", bound=ViewState)
V = TypeVar("V", bound="View[Any]")

#: What :meth:`View.compute` raises for a state it cannot show (reported in ``error`` once built).
STATE_ERRORS: tuple[type[Exception], ...] = (HeadwidgetError, ValueError, IndexError, KeyError)
#: The grids a view keeps, by (state, resolution): the most recently shown or computed ahead.
GRIDS_KEPT = 16


def check_sources(stats: KVStats | None, model: nn.Module | None, what: str = "view") -> None:
    """Refuse statistics and a model that do not belong together, as :func:`~headwidget.convert` does.

    Statistics carry the class, config fingerprint and weight fingerprint of the model they were
    captured from: a view that combines them with another model's weights (a fine-tune's, say) would
    show numbers of neither. Either may be None (nothing to combine). Raises
    :class:`~headwidget.errors.StatsMismatchError`, and :class:`ViewSourceError` when ``stats`` is not a
    :class:`~headwidget.stats.KVStats` or ``model`` not a torch module.

    Example:
        >>> import torch, headwidget
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> def gpt2(layers):
        ...     return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=layers, n_head=4)).eval()
        >>> model = gpt2(2)
        >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
        >>> check_sources(stats, model)  # the model the statistics come from: fine
        >>> try:
        ...     check_sources(stats, gpt2(3))
        ... except headwidget.StatsMismatchError as err:
        ...     print(type(err).__name__)
        StatsMismatchError
    """
    if stats is not None and not isinstance(stats, KVStats):
        raise ViewSourceError(
            f"the {what} needs captured statistics (a KVStats, from headwidget.capture or KVStats.load), "
            f"got {type(stats).__name__}"
        )
    if model is not None and not isinstance(model, nn.Module):
        raise ViewSourceError(f"the {what} needs a torch model (its weights), got {type(model).__name__}")
    if stats is not None and model is not None:
        check_stats_source(model, stats, opt_out=False)


class ViewScreen(Protocol):
    """Where a view is shown (the notebook's widget shell): told when the view starts and stops
    computing, and given every grid the view shows."""

    def computing(self, busy: bool) -> None:
        """The view started (``busy``) or stopped computing its panels."""

    def shown(self, grid: PanelGrid) -> None:
        """The view now shows ``grid`` (its labels and ``error`` are already set)."""

    def together(self) -> contextlib.AbstractContextManager[Any]:
        """A block whose changes (a grid's labels, the grid) the screen passes on as one."""

    def drawn_by_page(self) -> bool:
        """Whether a page draws what this screen is sent, and says when it has (then the view
        computes ahead after the page has drawn, and calls :meth:`View.page_drew` when it has)."""


class Presenter(Protocol):
    """How views are displayed and saved: registered by the package (the notebook layer draws them),
    so that views import no widget library."""

    def widget(self, view: View[Any]) -> Any:
        """A new widget that shows ``view`` (it attaches itself with :meth:`View.attach`)."""

    def save(self, view: View[Any], path: str | os.PathLike[str], **options: Any) -> Path:
        """Write what ``view`` shows to ``path`` (the suffix picks the format)."""


_presenter: list[Presenter] = []


def present_with(presenter: Presenter) -> None:
    """Register how views are displayed and saved (``import headwidget`` registers the notebook layer)."""
    _presenter[:] = [presenter]


def presenter() -> Presenter:
    """The registered :class:`Presenter`."""
    if not _presenter:
        raise RuntimeError("no presenter is registered: import headwidget.notebook (it registers one)")
    return _presenter[0]


class _ViewClass(t.MetaHasTraits):
    """Makes a view class's state traits from the state dataclass it names (``View[SomeState]``)."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any) -> Any:
        named = [a for b in namespace.get("__orig_bases__", ()) for a in typing.get_args(b)]
        for state_class in (a for a in named if isinstance(a, type) and issubclass(a, ViewState)):
            namespace["State"] = state_class
            for field, trait in state_traits(state_class).items():
                namespace.setdefault(field, trait)
        return super().__new__(mcls, name, bases, namespace, **kwargs)


class View(t.HasTraits, Generic[S], metaclass=_ViewClass):
    """Base of every view: a state of type ``S`` in, a :class:`PanelGrid` out. Subclasses implement
    :meth:`compute` and one constructor, whose first argument is their ``sources.main``;
    ``view_name`` is set by :func:`~headwidget.views.register_view`."""

    #: The registry name (``"channels"``...), set by ``register_view``.
    view_name: ClassVar[str] = ""
    #: What a tab showing the view is called.
    title: ClassVar[str] = ""
    #: The view's state class (the parameter of ``View[...]``): its fields are the state traits.
    State: ClassVar[type[ViewState]] = ViewState
    #: What the view is built from (:class:`~headwidget.views._sources.ViewSources`).
    sources: ClassVar[ViewSources] = ViewSources()
    #: Where a dashboard shows the view: in a tab of its own, or above the tabs (the trends).
    placement: ClassVar[str] = "tab"

    error = t.Unicode("").tag(sync=True)
    #: Whether the panels of :meth:`neighbours` are computed in the background (views that have
    #: neighbours take ``prefetch=`` in their constructor).
    prefetch: bool = False

    def __init__(self) -> None:
        self._grid: PanelGrid | None = None
        self._state_shown: S | None = None
        self._setting_up = False
        self._screens: list[ViewScreen] = []
        self._widget: Any = None
        #: The most cells a panel side needs where the view is shown (None: no screen to fit, the
        #: view's own limit); set by the widget from the page, passed to ``compute``.
        self.resolution: int | None = None
        self._grids: Memo[PanelGrid] = Memo(self.compute, size=GRIDS_KEPT)
        self._prefetcher = Prefetcher()
        super().__init__()
        self.observe(self._on_state_change, names=self.state_traits())

    # ------------------------------------------------------------------ what the view declares
    @classmethod
    def state_traits(cls) -> list[str]:
        """Names of the traits whose change recomputes the panels (sorted)."""
        return sorted(f.name for f in dataclasses.fields(cls.State))

    def current_state(self) -> S:
        """The state shown now: the state traits' values, frozen (an instance of ``State``)."""
        values = {name: frozen(getattr(self, name)) for name in self.state_traits()}
        return typing.cast(S, self.State(**values))

    @classmethod
    def view_controls(cls) -> list[Control]:
        """The controls of the view's state fields, in field order, then those of traits that only
        take input (an entry whose text the view consumes).

        Example:
            >>> from headwidget.views import view_class
            >>> [(c.trait, c.type) for c in view_class("channels").view_controls()]
            [('layer', 'slider'), ('channel_start', 'window'), ('kind', 'toggles')]
        """
        inputs = cls.class_traits(state=None, control=lambda c: isinstance(c, Control))
        return [
            *field_controls(cls.State),
            *(trait.metadata["control"].bind(n) for n, trait in inputs.items()),
        ]

    @classmethod
    def create(
        cls: type[V],
        stats: KVStats | None = None,
        model: nn.Module | None = None,
        *,
        layers: Sequence[int] = (),
        interactive: bool = True,
        report: Any = None,
        timeline: Any = None,
        healing: Any = None,
        **state: Any,
    ) -> V:
        """The view of whichever sources it takes (its ``sources``), for the layers a user named: the
        command line, the magic and ``explore`` build every view through this, one function for all
        views (a view has one constructor, which this calls).

        Sources the view does not take are ignored; the one it is built from must be there
        (:class:`ViewSourceError` says how to get it), and statistics given with a model must come
        from that model. ``layers``: the first is selected; the rest are pinned beside it or shown
        with it, as the view's ``sources.layers`` says; none: the view's default.
        ``interactive=False`` skips work that only speeds up exploring (prefetching neighbours).
        ``state``: the constructor's other arguments (initial values of state fields); a ``layer``
        among them wins over ``layers``.

        Example:
            >>> import torch, headwidget
            >>> from headwidget.views import view_class
            >>> from transformers import GPT2Config, GPT2LMHeadModel
            >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
            >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
            >>> view = view_class("channels").create(stats, model, layers=[1, 0], interactive=False)
            >>> view.layer, view.pinned, view.prefetch
            (1, [0], False)
        """
        given = {"stats": stats, "model": model, "report": report, "timeline": timeline, "healing": healing}
        made = cls.sources
        name = cls.view_name or cls.__name__
        if made.main and given[made.main] is None:
            raise ViewSourceError(missing_source(name, made.main))
        if made.takes("stats") and not made.takes("model"):  # (a view taking both checks them itself,
            check_sources(stats, model, f"{name} view")  # by the weights' fingerprint first)
            check_same_models({s: v for s, v in given.items() if made.takes(s)}, f"{name} view")
        elif not made.takes("stats"):
            check_same_models({s: v for s, v in given.items() if made.takes(s)}, f"{name} view")
        arguments = {source: given[source] for source in made.optional if given[source] is not None}
        chosen = made.arguments(tuple(layers), interactive)
        if "layer" in state:  # an explicit layer wins over the named layers
            chosen.pop("layer", None)
        main = (given[made.main],) if made.main else ()
        return cls(*main, **arguments, **{**chosen, **state})

    @classmethod
    def shows(cls, stats: KVStats | None) -> bool:
        """Whether the view can be built from ``stats`` as captured (default: yes; a view that needs
        what a capture may lack, such as token samples, says no)."""
        return True

    @classmethod
    def capture_options(cls, layers: Sequence[int]) -> dict[str, Any]:
        """Extra ``capture(...)`` options the view needs to show ``layers`` (default: none)."""
        return {}

    @classmethod
    def layers_offered(cls, stats: KVStats) -> list[int] | None:
        """The layers the view of ``stats`` can select, when not every one (default: None); a
        dashboard opens the view on the first of them."""
        return None

    @classmethod
    def _stats(cls, stats: KVStats | None, model: nn.Module | None = None) -> KVStats:
        """``stats``, checked to be statistics, and to come from ``model`` when one is given."""
        if stats is None:
            raise ViewSourceError(missing_source(cls.view_name or cls.__name__, "stats"))
        check_sources(stats, model, f"{cls.view_name or cls.__name__} view")
        return stats

    def describe(self, state: S) -> str:
        """What the panels of ``state`` are of, in words: the model (or models) first, then `` · `` and
        which part of it, the layer(s) (``""``: nothing to add). Views override this; it reads
        ``state`` and the view's sources only."""
        return ""

    @property
    def subject(self) -> str:
        """What the view shows whatever its state: the model (or models), as :meth:`describe` begins
        (a saved page's title; each state's panels are headed by their own :meth:`describe`)."""
        return self.caption.split(" · ", 1)[0]

    @property
    def caption(self) -> str:
        """:meth:`describe` of the state shown (:meth:`shown_state`): the widget's heading, and the
        title of a saved figure unless given another ``title`` (a saved page heads each state's
        panels with that state's)."""
        return self.describe(self.shown_state())

    def shown_state(self) -> S:
        """The state whose panels the view shows: that of its last computed grid (a state set since
        that it cannot show leaves the panels, and what describes them, as they were), else the
        current state."""
        return self.current_state() if self._state_shown is None else self._state_shown

    # ------------------------------------------------------------------ computing panels
    def compute(self, state: S, resolution: int | None = None) -> PanelGrid:
        """The panels of ``state``, at most ``resolution`` cells a side where the view can reduce
        them (None: the view's own limit). Views override this; it reads ``state`` and the view's
        sources, never the state traits, and changes nothing."""
        raise NotImplementedError

    def labels(self, state: S) -> dict[str, Any]:
        """The text traits that follow ``state`` (the layer read-out...), set with its panels."""
        return {}

    def neighbours(self, state: S) -> Sequence[S]:
        """The states a user is likely to move to from ``state`` (computed ahead with ``prefetch``)."""
        return ()

    def ready(self, state: S, resolution: int | None = None) -> bool:
        """Whether the panels of ``state`` are at hand (kept, or computed ahead), so that a screen
        need not say "computing"."""
        return self._grids.holds(state, resolution)

    def set_state(self, **changes: Any) -> None:
        """Change state fields as controls do (the panels are computed once, for all of them)."""
        with self.hold_trait_notifications():
            for name, value in changes.items():
                setattr(self, name, value)

    def set_up(self, state: S, **traits: Any) -> None:
        """Show ``state`` first, once ``traits`` (what its controls read: a layer count, options...)
        are set: the panels are computed once. A state the view cannot show raises its error here
        (the view is not built): the :class:`~headwidget.errors.LayerIndexError` of a layer outside
        the model, say, rather than a view that shows nothing and reports it later."""
        self._setting_up = True
        try:
            with self.hold_trait_notifications():
                for name, value in {**traits, **state.values()}.items():
                    setattr(self, name, value)
        finally:
            self._setting_up = False
        self.refresh(strict=True)

    def refresh(self, *, strict: bool = False) -> None:
        """Recompute the panels; on a bad state, report it in ``error`` and keep the last panels.

        ``strict=True`` raises the error instead (what a view being built does: a view that cannot
        show its initial state is not built).
        """
        state, resolution = self.current_state(), self.resolution
        self._prefetcher.drop_others((state, resolution))
        # A screen is told of the computing only when there is some: not for panels at hand.
        busy = not self.ready(state, resolution)
        if busy:
            for screen in self._screens:
                screen.computing(True)
        try:
            self._prefetcher.take((state, resolution))  # (being computed ahead now: waited for)
            grid = self._grids(state, resolution)
            labels = self.labels(state)
        except BaseException as err:
            self._computed(busy)
            if strict or not isinstance(err, STATE_ERRORS):
                raise
            self.error = str(err)
            return
        if self.prefetch and any(screen.drawn_by_page() for screen in self._screens):
            self._prefetcher.hold()  # (computing ahead now would compete with the page's drawing)
        with contextlib.ExitStack() as together:  # the labels and the grid reach a screen as one
            for screen in self._screens:
                together.enter_context(screen.together())
            for name, value in labels.items():
                setattr(self, name, value)
            self._grid, self._state_shown = grid, state
            self.error = ""
            for screen in self._screens:
                screen.shown(grid)
            self._computed(busy)
        self.compute_ahead()

    def compute_ahead(self) -> None:
        """Queue the :meth:`neighbours` of the state shown, at the current ``resolution``, on the
        background thread (views built with ``prefetch``; what was queued before and is not among
        them is dropped). :meth:`refresh` calls it, and the widget when the page's size changes."""
        if self.prefetch:
            state, resolution = self.current_state(), self.resolution
            ahead = [n for n in self.neighbours(state) if not self.ready(n, resolution)]
            self._prefetcher.queue({(n, resolution): self._ahead(n, resolution) for n in ahead})

    def page_drew(self) -> None:
        """A page has drawn the grid shown now: the states ahead may be computed."""
        self._prefetcher.release()

    def _computed(self, busy: bool) -> None:
        if busy:
            for screen in self._screens:
                screen.computing(False)

    def _ahead(self, state: S, resolution: int | None) -> Callable[[], PanelGrid]:
        def compute_and_encode() -> PanelGrid:
            grid = self._grids(state, resolution)
            encode_ahead(grid)  # (showing it then costs no encoding)
            return grid

        return compute_and_encode

    # ------------------------------------------------------------------ where the view is shown
    def attach(self, screen: ViewScreen) -> None:
        """Tell ``screen`` of every computation and grid from now on (the widget shell does this)."""
        self._screens.append(screen)

    def detach(self, screen: ViewScreen) -> None:
        """Stop telling ``screen`` (a closed widget)."""
        self._screens = [s for s in self._screens if s is not screen]

    @property
    def widget(self) -> Any:
        """The widget that shows this view in a notebook (made once, on first use): it mirrors the
        view's synced traits both ways, so a control moved in the browser sets the view's state and a
        state set from Python moves the control. Put it in ipywidgets containers, or in marimo's
        ``mo.ui.anywidget(view.widget)``."""
        if self._widget is None:
            self._widget = presenter().widget(self)
        return self._widget

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """What Jupyter displays for the view: its :attr:`widget`."""
        return self.widget._repr_mimebundle_(**kwargs)

    def _display_(self) -> Any:
        """What marimo displays for the view: its :attr:`widget`."""
        return self.widget

    def save(self, path: str | os.PathLike[str], **options: Any) -> Path:
        """Save what the view shows: ``.png``/``.svg``/``.pdf`` (matplotlib) or a standalone ``.html``.

        Options: ``dpi``, ``size`` (inches), ``title``; ``layers`` and ``max_states`` for ``.html``.
        See :func:`headwidget.export.save`.
        """
        return presenter().save(self, path, **options)

    @property
    def grid(self) -> PanelGrid:
        """The panels for the current state (float64 matrices, labels, colour scale)."""
        if self._grid is None:
            self.refresh()
        if self._grid is None:
            raise RuntimeError(f"nothing to show: {self.error}")
        return self._grid

    def full_grid(self) -> PanelGrid:
        """The panels of the current state at the view's own limit (what a saved figure or page
        shows), whatever ``resolution`` the screen asked for; the view is not changed. A state the
        view cannot show raises its error.

        Example:
            >>> import numpy as np
            >>> from headwidget.core.panels import Panel
            >>> class Sized(View[ViewState]):
            ...     def compute(self, state: ViewState, resolution: int | None = None) -> PanelGrid:
            ...         n = min(8, resolution or 8)
            ...         panel = Panel("m", "m", np.zeros((n, n)), row_step=8 // n, col_step=8 // n)
            ...         return PanelGrid([panel], -1.0, 1.0, "diverging", "")
            >>> view = Sized()
            >>> view.resolution = 2
            >>> view.refresh()
            >>> view.full_grid().panels[0].matrix.shape, view.grid.panels[0].matrix.shape
            ((8, 8), (2, 2))
        """
        return self._grids(self.current_state(), None)

    def _on_state_change(self, change: dict[str, Any]) -> None:
        if not self._setting_up:
            self.refresh()

    def select_cell(self, panel: str, row: int, col: int) -> None:
        """What a click on cell (``row``, ``col``) of panel ``panel`` does (default: nothing)."""

    def select_point(self, chart: str, series: int, point: int) -> None:
        """What a click on point ``point`` of series ``series`` of chart ``chart`` does (default:
        nothing)."""

    def close(self) -> None:
        """Release what the view holds (background work; a widget's connection to the browser)."""
        prefetcher = getattr(self, "_prefetcher", None)  # absent when __init__ failed before it
        if prefetcher is not None:
            prefetcher.close()
        widget, self._widget = getattr(self, "_widget", None), None
        if widget is not None:
            widget.close()  # (it detaches itself)


def reduced(grid: PanelGrid, cells: float = float("inf")) -> bool:
    """Whether a panel of ``grid`` shows block means and has fewer than ``cells`` cells on that side
    (more of its cells could be shown).

    Example:
        >>> import numpy as np
        >>> from headwidget.core.panels import Panel
        >>> panel = Panel("m", "m", np.zeros((4, 4)), row_step=2, col_step=2)
        >>> grid = PanelGrid([panel], 0.0, 1.0, "magma", "")
        >>> reduced(grid), reduced(grid, cells=4)
        (True, False)
    """
    return any(
        (p.row_step > 1 and p.matrix.shape[0] < cells) or (p.col_step > 1 and p.matrix.shape[1] < cells)
        for p in grid.panels
    )


def check_view_layer(
    layer: int, num_layers: int, captured: Sequence[int] | None = None, where: str = "this capture"
) -> None:
    """Refuse a view's ``layer`` outside ``0 .. num_layers - 1``, or (given ``captured``) one that
    ``where`` did not capture, with :class:`~headwidget.errors.LayerIndexError`. Unlike
    ``KVStats``, a negative layer is not counted from the end: a view's slider and labels show the
    layer as it is.

    Example:
        >>> try:
        ...     check_view_layer(3, 4, captured=[0, 1])
        ... except LayerIndexError as err:
        ...     print(err)
        layer 3 was not captured in this capture: its layers are [0, 1]
    """
    if not 0 <= layer < num_layers:
        raise LayerIndexError(
            f"layer {layer} is out of range: the model has {num_layers} layers (0..{num_layers - 1})"
        )
    if captured is not None and layer not in captured:
        raise LayerIndexError(f"layer {layer} was not captured in {where}: its layers are {list(captured)}")


def stats_model_name(stats: KVStats) -> str:
    """What a figure calls the model statistics were captured from: its name, else its class."""
    return stats.meta.model_name or stats.meta.model_class


@dataclasses.dataclass(frozen=True)
class LayerState(ViewState):
    """The state of a view of one selected layer at a time: the layer, on the layer slider, shared
    by a dashboard's views."""

    layer: int = state(0, slider("Layer", count="num_layers", text="layer_label"), shared=True)


LS = TypeVar("LS", bound=LayerState)


class LayerView(View[LS]):
    """A view of one selected layer at a time, with the layer slider."""

    num_layers = t.Int(0).tag(sync=True)
    layer_label = t.Unicode("").tag(sync=True)

    def layer_text(self, layer: int) -> str:
        """``layer`` among the model's, as the slider says it: ``"layer 3 of 0–29"`` (layers count
        from 0, so "of 30" would read as if a 30th layer existed)."""
        return f"layer {layer} of 0–{self.num_layers - 1}"

    def labels(self, state: LS) -> dict[str, Any]:
        """The layer read-out beside the slider."""
        return {"layer_label": self.layer_text(state.layer)}

    def layer_neighbours(self, state: LS) -> list[LS]:
        """``state`` at the layers next to its own (those the model has): the slider's next steps."""
        return [
            state.replace(layer=n) for n in (state.layer + 1, state.layer - 1) if 0 <= n < self.num_layers
        ]

    def check_layer(self, layer: int) -> None:
        """Refuse a layer outside ``0 .. num_layers - 1`` (:func:`check_view_layer`)."""
        check_view_layer(layer, self.num_layers)
