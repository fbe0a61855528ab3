"""``View``: a user's state as traits, turned into panels by :meth:`View.compute`.

A view declares each state trait once, with :func:`state`: a change of it (from Python, or from the
browser when the view is shown by its widget) recomputes the panels, and its control, if any, is what
the control bar shows for it. A view built with a state it cannot show (a layer that was not captured,
say) raises that error; a later change to such a state (from Python, or from the browser) is
reported in ``error`` instead, and the last good panels stay.

The state traits together are one frozen value, :meth:`View.current_state` (an instance of the
view's :meth:`View.state_class`), and :meth:`View.compute` is a function of it: it reads the view's
sources (statistics, a model, a report: fixed when the view is built) and its state argument, never
the state traits, and sets nothing. So the panels of any state can be computed without moving the
view (what a saved page does for every state its controls reach), and the base class alone decides
when to compute: on a change, ahead of time for the :meth:`View.neighbours` of the state shown
(:mod:`~headwidget.views._prefetch`), and what text traits follow a state (:meth:`View.labels`).

A view shown on a screen computes its panels for that screen: ``resolution`` is the most cells a
panel side needs there (the widget sets it from the page's plot size in device pixels), and a view
with more cells than that (the channel view's 4096 channels) sends block means. Computed with
``resolution=None``, the panels are those of the view's own limit, which is what saved figures and
pages hold.

Views do not draw and import no widget library, yet a view is what a user displays and saves: the
layer that shows views (:mod:`headwidget.notebook`) registers itself with :func:`present_with`, and a
view displayed in a notebook (``_repr_mimebundle_``, marimo's ``_display_``) shows its
:attr:`View.widget`, a generic shell that mirrors the view's synced traits and is told of each grid
(:class:`ViewScreen`); :meth:`View.save` goes through the same presenter to
:func:`headwidget.export.save`. There is one class per view name.

Example:
    >>> import numpy as np
    >>> import traitlets as t
    >>> from headwidget.core.panels import Panel, PanelGrid
    >>> class Scaled(View):
    ...     factor = state(t.Float(1.0))
    ...     def compute(self, state, resolution=None) -> PanelGrid:
    ...         return PanelGrid([Panel("m", "scaled", state.factor * np.eye(2))], -1.0, 1.0, "diverging", "")
    >>> view = Scaled()
    >>> view.factor = 0.5
    >>> view.grid.panels[0].matrix[0, 0], Scaled.state_traits(), view.current_state()
    (np.float64(0.5), ['factor'], Scaled.State(factor=0.5))
    >>> view.compute(view.current_state().replace(factor=2.0)).panels[0].matrix[0, 0], view.factor
    (np.float64(2.0), 0.5)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import traitlets as t
from torch import nn

from headwidget.analysis.conversions import _check_stats_source
from headwidget.core.panels import PanelGrid, encode_ahead
from headwidget.errors import HeadwidgetError, LayerIndexError
from headwidget.stats import KVStats
from headwidget.views._controls import Control, slider
from headwidget.views._prefetch import Prefetcher
from headwidget.views._sources import ViewSources, missing_source, view_sources

__all__ = [
    "STATE_ERRORS",
    "LayerView",
    "Presenter",
    "View",
    "ViewScreen",
    "ViewSourceError",
    "ViewState",
    "WholeNumber",
    "check_sources",
    "check_view_layer",
    "present_with",
    "reduced",
    "state",
    "stats_model_name",
]

T = TypeVar("T", bound="t.TraitType[Any, Any]")
V = TypeVar("V", bound="View")

#: What :meth:`View.compute` raises for a state it cannot show (reported in ``error`` once built).
STATE_ERRORS: tuple[type[Exception], ...] = (HeadwidgetError, ValueError, IndexError, KeyError)


class WholeNumber(t.Int):
    """An integer trait that refuses bools too (``True`` is not a layer or a channel, though Python's
    ``bool`` is an ``int``); floats and strings are refused as by ``traitlets.Int``.

    Example:
        >>> class Counted(t.HasTraits):
        ...     n = WholeNumber(0)
        >>> Counted(n=3).n
        3
        >>> Counted(n=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        traitlets.traitlets.TraitError: The 'n' trait of a Counted instance expected an int, not the bool...
    """

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, bool):
            self.error(obj, value)
        return super().validate(obj, value)


def state(trait: T, control: Control | None = None) -> T:
    """Declare ``trait`` as state of a view, shown by ``control`` (none: no control of its own).

    State traits are synced to the browser when the view is shown by its widget.

    Example:
        >>> from headwidget.views import toggles
        >>> kind = state(t.Unicode("key"), toggles("Kind", options="kinds_available"))
        >>> kind.metadata["state"], kind.metadata["control"].type
        (True, 'toggles')
    """
    return trait.tag(sync=True, state=True, control=control)


@dataclasses.dataclass(frozen=True)
class ViewState:
    """Base of every view's frozen state (:meth:`View.state_class` makes one per view class): its
    fields are the view's state traits, lists held as tuples, so that a state is hashable (a cache
    key) and cannot change under a computation."""

    def replace(self: S, **changes: Any) -> S:
        """This state with some fields changed (lists become tuples, as in every state)."""
        return dataclasses.replace(self, **{k: frozen(v) for k, v in changes.items()})

    def values(self) -> dict[str, Any]:
        """The fields as trait values (tuples back to lists)."""
        return {f.name: thawed(getattr(self, f.name)) for f in dataclasses.fields(self)}


S = TypeVar("S", bound=ViewState)


def frozen(value: Any) -> Any:
    """A trait value as a state holds it: a list (of lists) as a tuple (of tuples)."""
    return tuple(frozen(v) for v in value) if isinstance(value, list | tuple) else value


def thawed(value: Any) -> Any:
    """A state's value as its trait holds it: tuples back to lists."""
    return [thawed(v) for v in value] if isinstance(value, tuple) else value


class ViewSourceError(HeadwidgetError, ValueError):
    """A view was asked for without what it is computed from (statistics, or a model's weights)."""


def check_sources(stats: KVStats | None, model: nn.Module | None, what: str = "view") -> None:
    """Refuse statistics and a model that do not belong together, as :func:`~headwidget.convert` does.

    Statistics carry the class, config fingerprint and weight fingerprint of the model they were
    captured from: a view that combines them with another model's weights (a fine-tune's, say) would
    show numbers of neither. Either may be
    None (nothing to combine). Raises :class:`~headwidget.errors.StatsMismatchError`, and
    :class:`ViewSourceError` when ``stats`` is not a :class:`~headwidget.stats.KVStats` or ``model``
    not a torch module.

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
        _check_stats_source(model, stats, opt_out=False)


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
    """How views are displayed and saved: registered by the layer that draws them
    (:mod:`headwidget.notebook`), so that views import no widget library."""

    def widget(self, view: View) -> Any:
        """A new widget that shows ``view`` (it attaches itself with :meth:`View.attach`)."""

    def save(self, view: View, path: str | os.PathLike[str], **options: Any) -> Path:
        """Write what ``view`` shows to ``path`` (the suffix picks the format)."""


_presenter: list[Presenter] = []


def present_with(presenter: Presenter) -> None:
    """Register how views are displayed and saved (the notebook layer does it when imported)."""
    _presenter[:] = [presenter]


def presenter() -> Presenter:
    """The registered :class:`Presenter`: the notebook layer's, imported on the first display or save
    (``import headwidget`` leaves the widget libraries out until a view is shown)."""
    if not _presenter:
        importlib.import_module("headwidget.notebook")  # registers itself; the name keeps views below it
    if not _presenter:
        raise RuntimeError("no presenter is registered: import headwidget.notebook (it registers one)")
    return _presenter[0]


class View(t.HasTraits):
    """Base of every view: state traits in, a :class:`PanelGrid` out. Subclasses implement
    :meth:`compute` and one constructor, whose first argument names what the view is built from
    (:meth:`sources`); ``view_name`` is set by :func:`~headwidget.views.register_view`."""

    #: The registry name (``"channels"``...), set by ``register_view``.
    view_name: ClassVar[str] = ""
    #: What a tab showing the view is called.
    title: ClassVar[str] = ""
    #: The class :meth:`state_class` made (per class: a subclass with more state makes its own).
    _state_class: ClassVar[type[ViewState] | None] = None

    error = t.Unicode("").tag(sync=True)
    #: Whether the panels of :meth:`neighbours` are computed in the background (views that have
    #: neighbours take ``prefetch=`` in their constructor).
    prefetch: bool = False

    def __init__(self, **kwargs: Any) -> None:
        self._grid: PanelGrid | None = None
        self._setting_up = False
        self._screens: list[ViewScreen] = []
        self._widget: Any = None
        #: The most cells a panel side needs where the view is shown (None: no screen to fit, the
        #: view's own limit); set by the widget from the page, passed to ``compute``.
        self.resolution: int | None = None
        self._prefetcher = Prefetcher()
        super().__init__(**kwargs)
        self.observe(self._on_state_change, names=self.state_traits())

    # ------------------------------------------------------------------ what the view declares
    @classmethod
    def state_traits(cls) -> list[str]:
        """Names of the traits whose change recomputes the panels (sorted)."""
        return sorted(cls.class_trait_names(state=True))

    @classmethod
    def state_class(cls) -> type[ViewState]:
        """The frozen dataclass of the view's state: one field per state trait (made once per class).

        Example:
            >>> from headwidget.views import view_class
            >>> [f.name for f in dataclasses.fields(view_class("channels").state_class())]
            ['channel_start', 'channel_width', 'kind', 'layer', 'pinned']
        """
        made: type[ViewState] | None = cls.__dict__.get("_state_class")  # this class's own
        if made is None:
            fields = [(name, Any) for name in cls.state_traits()]
            made = dataclasses.make_dataclass(
                "State", fields, bases=(ViewState,), frozen=True, namespace={"__module__": cls.__module__}
            )
            made.__qualname__ = f"{cls.__name__}.State"
            cls._state_class = made
        return made

    def current_state(self) -> Any:
        """The state shown now: the state traits' values, frozen (see :meth:`state_class`)."""
        return self.state_class()(**{name: frozen(getattr(self, name)) for name in self.state_traits()})

    @classmethod
    def view_controls(cls) -> list[Control]:
        """The controls of the view's state traits, in declaration order (base classes first).

        Example:
            >>> from headwidget.views import view_class
            >>> [(c.trait, c.type) for c in view_class("channels").view_controls()]
            [('layer', 'slider'), ('channel_start', 'window'), ('kind', 'toggles')]
        """
        found: dict[str, Control | None] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                # State traits, and traits that only take input (an entry whose text the view consumes)
                if isinstance(value, t.TraitType) and (
                    value.metadata.get("state") or value.metadata.get("control")
                ):
                    found[name] = value.metadata.get("control")
        return [control.bind(name) for name, control in found.items() if control is not None]

    @classmethod
    def sources(cls) -> ViewSources:
        """What the view is built from and what it does with the layers a user names, read off its
        constructor (:mod:`~headwidget.views._sources`).

        Example:
            >>> from headwidget.views import view_class
            >>> view_class("consequences").sources().main, view_class("quantization").sources().optional
            ('report', ('report',))
        """
        return view_sources(cls)

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
        """The view of whichever sources it takes, for the layers a user named: the command line,
        the magic and ``explore`` build every view through this, one function for all views (a view
        has one constructor, which this calls).

        Sources the view does not take are ignored; the one it is built from must be there
        (:class:`ViewSourceError` says how to get it), and statistics given with a model must come
        from that model. ``layers``: the first is selected; the rest are pinned beside it or shown
        with it, where the view's constructor takes ``pinned`` or ``layers``; none: the view's
        default. ``interactive=False`` skips work that only speeds up exploring (prefetching
        neighbours). ``state``: the constructor's other arguments (initial values of state traits);
        a ``layer`` among them wins over ``layers``.

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
        made = cls.sources()
        name = cls.view_name or cls.__name__
        if made.main and given[made.main] is None:
            raise ViewSourceError(missing_source(name, made.main))
        if made.takes("stats") and not made.takes("model"):  # (a view taking both checks them itself)
            check_sources(stats, model, f"{name} view")
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
    def _stats(cls, stats: KVStats | None, model: nn.Module | None = None) -> KVStats:
        """``stats``, checked to be statistics, and to come from ``model`` when one is given."""
        if stats is None:
            raise ViewSourceError(missing_source(cls.view_name or cls.__name__, "stats"))
        check_sources(stats, model, f"{cls.view_name or cls.__name__} view")
        return stats

    @property
    def caption(self) -> str:
        """What the panels are of, in words: the model and the layer(s) (``""``: nothing to add).

        The export titles a saved figure with it unless given another ``title``.
        """
        return ""

    # ------------------------------------------------------------------ computing panels
    def compute(self, state: Any, resolution: int | None = None) -> PanelGrid:
        """The panels of ``state`` (an instance of :meth:`state_class`), at most ``resolution`` cells
        a side where the view can reduce them (None: the view's own limit). Views override this; it
        reads ``state`` and the view's sources, never the state traits, and changes nothing."""
        raise NotImplementedError

    def labels(self, state: Any) -> dict[str, Any]:
        """The text traits that follow ``state`` (the layer read-out...), set with its panels."""
        return {}

    def neighbours(self, state: Any) -> Sequence[Any]:
        """The states a user is likely to move to from ``state`` (computed ahead with ``prefetch``)."""
        return ()

    def ready(self, state: Any, resolution: int | None = None) -> bool:
        """Whether the panels of ``state`` are at hand (from parts the view keeps: computing them
        takes no noticeable time), so that a screen need not say "computing" (default: no)."""
        return False

    def refresh(self, *, strict: bool = False) -> None:
        """Recompute the panels; on a bad state, report it in ``error`` and keep the last panels.

        ``strict=True`` raises the error instead (what a view being built does: a view that cannot
        show its initial state is not built).
        """
        state, resolution = self.current_state(), self.resolution
        key = (state, resolution)
        self._prefetcher.drop_others(key)
        # A screen is told of the computing only when there is some: not for panels at hand
        # (computed ahead, or from parts the view keeps), which a revisit of a state usually is.
        busy = not (self._prefetcher.ready(key) or self.ready(state, resolution))
        if busy:
            for screen in self._screens:
                screen.computing(True)
        try:
            grid = self._prefetcher.take(key)
            if grid is None:
                grid = self.compute(state, resolution)
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
            self._set_grid(grid)
            self._computed(busy)
        self.compute_ahead()

    def compute_ahead(self) -> None:
        """Queue the :meth:`neighbours` of the state shown, at the current ``resolution``, on the
        background thread (views built with ``prefetch``; what was queued before and is not among
        them is dropped). :meth:`refresh` calls it, and the widget when the page's size changes."""
        if self.prefetch:
            state, resolution = self.current_state(), self.resolution
            self._prefetcher.queue(
                {(n, resolution): self._ahead(n, resolution) for n in self.neighbours(state)}
            )

    def page_drew(self) -> None:
        """A page has drawn the grid shown now: the states ahead may be computed."""
        self._prefetcher.release()

    def _computed(self, busy: bool) -> None:
        if busy:
            for screen in self._screens:
                screen.computing(False)

    def _ahead(self, state: Any, resolution: int | None) -> Any:
        def compute_and_encode() -> PanelGrid:
            grid = self.compute(state, resolution)
            encode_ahead(grid)  # (showing it then costs no encoding)
            return grid

        return compute_and_encode

    def _set_grid(self, grid: PanelGrid) -> None:
        self._grid = grid
        self.error = ""
        for screen in self._screens:
            screen.shown(grid)

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

    @contextlib.contextmanager
    def initial_state(self) -> Iterator[None]:
        """Set a new view's state traits together: the panels are computed once, when the block ends.

        A state the view cannot show raises its error here (the view is not built): the
        :class:`~headwidget.errors.LayerIndexError` of a layer outside the model, say, rather than a
        view that shows nothing and reports it later.
        """
        self._setting_up = True
        try:
            with self.hold_trait_notifications():
                yield
        finally:
            self._setting_up = False
        self.refresh(strict=True)

    def full_grid(self) -> PanelGrid:
        """The panels of the current state at the view's own limit (what a saved figure or page
        shows), whatever ``resolution`` the screen asked for; the view is not changed. A state the
        view cannot show raises its error.

        Example:
            >>> import numpy as np
            >>> from headwidget.core.panels import Panel
            >>> class Sized(View):
            ...     def compute(self, state, resolution=None) -> PanelGrid:
            ...         n = min(8, resolution or 8)
            ...         panel = Panel("m", "m", np.zeros((n, n)), row_step=8 // n, col_step=8 // n)
            ...         return PanelGrid([panel], -1.0, 1.0, "diverging", "")
            >>> view = Sized()
            >>> view.resolution = 2
            >>> view.refresh()
            >>> view.full_grid().panels[0].matrix.shape, view.grid.panels[0].matrix.shape
            ((8, 8), (2, 2))
        """
        if self.resolution is None and self._grid is not None and not self.error:
            return self._grid
        return self.compute(self.current_state(), None)

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


class LayerView(View):
    """A view of one selected layer at a time, with the layer slider."""

    layer = state(WholeNumber(0), slider("Layer", count="num_layers", text="layer_label"))
    num_layers = t.Int(0).tag(sync=True)
    layer_label = t.Unicode("").tag(sync=True)

    def layer_text(self, layer: int) -> str:
        """``layer`` among the model's, as the slider says it: ``"layer 3 of 0–29"`` (layers count
        from 0, so "of 30" would read as if a 30th layer existed)."""
        return f"layer {layer} of 0–{self.num_layers - 1}"

    def labels(self, state: Any) -> dict[str, Any]:
        """The layer read-out beside the slider."""
        return {"layer_label": self.layer_text(state.layer)}

    def layer_neighbours(self, state: Any) -> list[Any]:
        """``state`` at the layers next to its own (those the model has): the slider's next steps."""
        return [
            state.replace(layer=n) for n in (state.layer + 1, state.layer - 1) if 0 <= n < self.num_layers
        ]

    def check_layer(self, layer: int) -> None:
        """Refuse a layer outside ``0 .. num_layers - 1`` (:func:`check_view_layer`)."""
        check_view_layer(layer, self.num_layers)
