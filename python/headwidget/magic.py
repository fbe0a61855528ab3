"""The IPython extension: ``%load_ext headwidget``.

It registers

- the line magic ``%headwidget NAME [--texts VAR] [--tokenizer VAR] [--view VIEW|all] [--layers 0,1,12]
  [--max-tokens N] [--rope pre|post|both] [--report VAR] [--runs VAR] [--timeline VAR]``, where
  ``NAME`` is a model or a
  :class:`~headwidget.stats.KVStats` in the notebook's namespace, or one of the embedded models the
  command line takes too (``smollm2-135m``, ``minilm-l6``: :data:`headwidget.embedded.EMBEDDED_MODELS`;
  loaded with their tokenizer, captured over the English sample unless ``--texts`` is given), and
  ``VIEW`` any registered view (:func:`headwidget.views.view_names`; the views of an evaluation report,
  healing runs or a timeline take the notebook's variable of that name: ``--report``, ``--runs``,
  ``--timeline``, which the explorer of ``all`` shows in tabs too); it returns the widget, so the
  cell shows it;
- a display formatter: a ``KVStats`` as the last expression of a cell shows the explorer.

Example (in a notebook)::

    %load_ext headwidget
    %headwidget model --texts texts --tokenizer tok --view channels --layers 0,1,12
    %headwidget smollm2-135m --view channels
"""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from headwidget.embedded import EMBEDDED_MODELS
from headwidget.errors import MagicUsageError
from headwidget.stats import KVStats
from headwidget.views import view_class, view_names

__all__ = ["HeadwidgetMagics", "load_ipython_extension", "unload_ipython_extension"]

VIEWS = ("all", *view_names())
#: What an embedded model is captured over when no ``--texts`` is given (as ``explore()`` does).
SAMPLE_CAPTURE = {"max_tokens": 4096, "max_length": 256}


def _layers(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise MagicUsageError(f"--layers takes comma-separated integers like 0,1,12; got {text!r}") from err


@magics_class
class HeadwidgetMagics(Magics):
    """``%headwidget``: show a model's (or saved statistics') heads and channels."""

    def _lookup(self, name: str | None, what: str) -> Any:
        if name is None:
            return None
        namespace = self.shell.user_ns if self.shell is not None else {}
        if name not in namespace:
            raise MagicUsageError(f"{what} {name!r} is not defined in this notebook")
        return namespace[name]

    def _source(self, name: str) -> tuple[Any, Any]:
        """The notebook's object called ``name``, else the embedded model of that name with its
        tokenizer (the second item: None for a notebook object)."""
        namespace = self.shell.user_ns if self.shell is not None else {}
        if name in namespace or name not in EMBEDDED_MODELS:
            if name not in namespace:
                raise MagicUsageError(
                    f"source {name!r} is not defined in this notebook, nor one of the embedded models "
                    f"({', '.join(EMBEDDED_MODELS)})"
                )
            return namespace[name], None
        from headwidget.embedded import load_embedded

        return load_embedded(name)

    @magic_arguments()
    @argument("source", help="name of a transformers model or a KVStats in the notebook")
    @argument("--texts", default=None, help="name of the texts / token ids / batches to capture over")
    @argument("--tokenizer", default=None, help="name of the tokenizer (for string texts)")
    @argument("--view", default="all", choices=VIEWS, help="which view to show (default: all, in tabs)")
    @argument("--layers", default=None, help="comma-separated layers: the first is selected, the rest pinned")
    @argument("--max-tokens", type=int, default=None, help="stop capturing after this many tokens")
    @argument("--rope", default="pre", choices=("pre", "post", "both"), help="which keys to capture")
    @argument("--report", default=None, help="name of an evaluation report (headwidget.evaluate)")
    @argument("--runs", default=None, help="name of healing runs (headwidget.heal results, or names → runs)")
    @argument("--timeline", default=None, help="name of a headwidget.Timeline")
    @line_magic
    def headwidget(self, line: str) -> Any:
        """Show the headwidget explorer (or one view) for a model or saved statistics."""
        from headwidget.capture import capture
        from headwidget.notebook import explore

        args = parse_argstring(self.headwidget, line)
        layers = _layers(args.layers)
        source, embedded_tokenizer = self._source(args.source)
        texts = self._lookup(args.texts, "texts")
        tokenizer = self._lookup(args.tokenizer, "tokenizer") or embedded_tokenizer
        report = self._lookup(args.report, "report")
        healing = self._lookup(args.runs, "runs")
        timeline = self._lookup(args.timeline, "timeline")
        model = None if isinstance(source, KVStats) else source
        stats = source if isinstance(source, KVStats) else None
        view = None if args.view == "all" else view_class(args.view)
        if view is not None and view.sources.main == "model" and model is None:
            raise MagicUsageError(f"the {args.view} view needs a model (its weights), not statistics")
        if model is not None and (view is None or view.sources.main == "stats"):
            options: dict[str, Any] = {"max_tokens": args.max_tokens, "rope": args.rope, "inputs": True}
            if texts is None and embedded_tokenizer is not None:
                from headwidget.texts import english_sample

                texts = english_sample()
                options["max_tokens"] = args.max_tokens or SAMPLE_CAPTURE["max_tokens"]
                options["max_length"] = SAMPLE_CAPTURE["max_length"]
            if texts is None:
                raise MagicUsageError("capturing a model needs --texts NAME (strings need --tokenizer too)")
            if view is None and timeline is None:
                return explore(model, texts, tokenizer=tokenizer, report=report, healing=healing, **options)
            if view is not None:
                options.update(view.capture_options(layers))
                stats = capture(model, texts, tokenizer=tokenizer, **options)
        if view is None:
            if timeline is not None:
                return explore(timeline, report=report, healing=healing)
            assert stats is not None
            return explore(stats, report=report, healing=healing)
        return view.create(stats, model, layers=layers, report=report, timeline=timeline, healing=healing)


def _stats_bundle(stats: KVStats) -> dict[str, Any]:
    from headwidget.notebook import explore

    bundle = dict(explore(stats)._repr_mimebundle_())
    bundle["text/plain"] = repr(stats)  # where widgets cannot render, say what the object is
    return bundle


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%headwidget`` and the ``KVStats`` display formatter."""
    ipython.register_magics(HeadwidgetMagics)
    ipython.display_formatter.mimebundle_formatter.for_type(KVStats, _stats_bundle)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext headwidget``: removes the ``KVStats`` display formatter."""
    ipython.display_formatter.mimebundle_formatter.pop(KVStats, None)
