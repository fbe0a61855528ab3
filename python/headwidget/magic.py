"""The IPython extension: ``%load_ext headwidget``.

It registers

- the line magic ``%headwidget NAME [--texts VAR] [--tokenizer VAR] [--view channels|alignment|
  mechanisms|all] [--layers 0,1,12] [--max-tokens N] [--rope pre|post|both]``, where ``NAME`` is a model
  or a :class:`~headwidget.stats.KVStats` in the notebook's namespace; it returns the widget, so the
  cell shows it;
- a display formatter: a ``KVStats`` as the last expression of a cell shows the explorer.

Example (in a notebook)::

    %load_ext headwidget
    %headwidget model --texts texts --tokenizer tok --view channels --layers 0,1,12
"""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from headwidget.errors import HeadwidgetError
from headwidget.stats import KVStats

__all__ = ["HeadwidgetMagics", "load_ipython_extension", "unload_ipython_extension"]

VIEWS = ("all", "channels", "alignment", "mechanisms")


class MagicUsageError(HeadwidgetError, ValueError):
    """The ``%headwidget`` line could not be used as written."""


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

    @magic_arguments()
    @argument("source", help="name of a transformers model or a KVStats in the notebook")
    @argument("--texts", default=None, help="name of the texts / token ids / batches to capture over")
    @argument("--tokenizer", default=None, help="name of the tokenizer (for string texts)")
    @argument("--view", default="all", choices=VIEWS, help="which view to show (default: all, in tabs)")
    @argument("--layers", default=None, help="comma-separated layers: the first is selected, the rest pinned")
    @argument("--max-tokens", type=int, default=None, help="stop capturing after this many tokens")
    @argument("--rope", default="pre", choices=("pre", "post", "both"), help="which keys to capture")
    @line_magic
    def headwidget(self, line: str) -> Any:
        """Show the headwidget explorer (or one view) for a model or saved statistics."""
        from headwidget.capture import capture
        from headwidget.widget import AlignmentView, ChannelView, MechanismView, explore

        args = parse_argstring(self.headwidget, line)
        source = self._lookup(args.source, "source")
        layers = _layers(args.layers)
        texts = self._lookup(args.texts, "texts")
        tokenizer = self._lookup(args.tokenizer, "tokenizer")
        model = None if isinstance(source, KVStats) else source
        if args.view == "mechanisms":
            if model is None:
                raise MagicUsageError("the mechanisms view needs a model (its weights), not statistics")
            return MechanismView(model, layer=layers[0] if layers else 0)
        if model is not None:
            if texts is None:
                raise MagicUsageError("capturing a model needs --texts NAME (strings need --tokenizer too)")
            options: dict[str, Any] = {"max_tokens": args.max_tokens, "rope": args.rope, "inputs": True}
            if args.view == "alignment" and len(layers) > 1:
                options["cross_layer"] = layers
            if args.view == "all":
                return explore(model, texts, tokenizer=tokenizer, **options)
            stats = capture(model, texts, tokenizer=tokenizer, **options)
        else:
            stats = source
        if args.view == "all":
            return explore(stats)
        if args.view == "channels":
            return ChannelView(stats, layer=layers[0] if layers else None, pinned=layers[1:])
        if len(layers) > 1:
            return AlignmentView(stats, layers=layers)
        return AlignmentView(stats, layer=layers[0] if layers else None)


def _stats_bundle(stats: KVStats) -> dict[str, Any]:
    from headwidget.widget import explore

    bundle = dict(explore(stats)._repr_mimebundle_())
    bundle["text/plain"] = repr(stats)  # where widgets cannot render, say what the object is
    return bundle


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%headwidget`` and the ``KVStats`` display formatter."""
    ipython.register_magics(HeadwidgetMagics)
    ipython.display_formatter.mimebundle_formatter.for_type(KVStats, _stats_bundle)


def unload_ipython_extension(ipython: Any) -> None:
    ipython.display_formatter.mimebundle_formatter.pop(KVStats, None)
