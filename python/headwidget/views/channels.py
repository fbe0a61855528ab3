"""``ChannelView``: channel × channel correlation of K (top row) and V (bottom row) per layer.

Reference: the coupled-quantization paper's figure (keys over values, several layers, colour −1..1).
The layer slider picks the layer to explore; ``pinned`` layers stay beside it. The channel window
(start, width) is shown at full resolution when it has at most ``max_cells`` channels, otherwise
block-averaged (NaN-aware mean) down to at most ``max_cells``, and the panel says so. On a screen,
the limit is the screen's ``resolution`` when that is smaller (the page's plot side in device pixels).

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
    >>> view = ChannelView(stats, layer=1, channel_start=0, channel_width=8)
    >>> [p.title for p in view.grid.panels], view.grid.panels[0].matrix.shape
    (['Keys · layer 1', 'Values · layer 1'], (8, 8))
    >>> view = ChannelView.create(stats, layers=[1, 0], interactive=False)
    >>> view.layer, view.pinned, [p.id for p in view.grid.panels]
    (1, [0], ['key-0', 'key-1', 'value-0', 'value-1'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import traitlets as t

from headwidget.analysis.downsample import downsampled_corr
from headwidget.checks import flag, optional_whole_number, whole_number, whole_numbers
from headwidget.core.kinds import KIND_LABELS, check_kind
from headwidget.core.panels import Panel, PanelGrid
from headwidget.errors import ChannelWindowError, UnknownKindError
from headwidget.stats import KVStats
from headwidget.views._base import LayerState, LayerView, stats_model_name
from headwidget.views._controls import toggles, window
from headwidget.views._memo import Memo
from headwidget.views._registry import register_view
from headwidget.views._sources import ViewSources
from headwidget.views._state import state

__all__ = ["ChannelState", "ChannelView", "ChannelWindowError", "channel_panel"]

KIND_TITLES = {"key": "Keys", "key_post": "Keys (post-RoPE)", "value": "Values"}


def downsampled_note(channels: int, shown: int, block: int) -> str:
    """A channel panel's note on its cells: block means when ``block > 1``, else nothing.

    >>> downsampled_note(4096, 512, 8)
    'downsampled 4096→512: mean of 8×8 blocks (NaN cells ignored)'
    >>> downsampled_note(64, 64, 1)
    ''
    """
    if block <= 1:
        return ""
    return f"downsampled {channels}→{shown}: mean of {block}×{block} blocks (NaN cells ignored)"


def channel_panel(
    stats: KVStats, kind: str, window: tuple[int, int], shown: tuple[np.ndarray, int], **text: str
) -> Panel:
    """The panel of the channel correlation of ``kind`` over the channels ``window`` (start, stop):
    ``shown``, the matrix and its block size; ``text``: its id, title, subtitle, window_subtitle."""
    (start, stop), (matrix, block) = window, shown
    head_dim = stats.meta.layout.head_dim_of(check_kind(kind)) or 0
    return Panel(
        matrix=matrix,
        row_offset=start,
        col_offset=start,
        row_step=block,
        col_step=block,
        note=downsampled_note(stop - start, matrix.shape[0], block),
        row_group=head_dim,
        col_group=head_dim,
        axis_prefix="V" if kind == "value" else "K",
        **text,  # type: ignore[arg-type]
    )


def check_key_kind(kind: str, stats: KVStats, what: str) -> None:
    """Refuse a key kind the view cannot show: :class:`~headwidget.errors.UnknownKindError` names
    the ones it can (``key``, and ``key_post`` when captured)."""
    if kind not in ("key", "key_post"):
        captured = [k for k in ("key", "key_post") if k in stats.kinds]
        raise UnknownKindError(
            f"the {what} shows keys: kind must be one of {', '.join(map(repr, captured))}, got {kind!r}"
        )


@dataclasses.dataclass(frozen=True)
class ChannelState(LayerState):
    """The selected layer, the channel window ``[channel_start, channel_start + channel_width)``, the
    kind of keys, and the layers pinned beside the selected one."""

    channel_start: int = state(
        0, window("Channels", width="channel_width", total="num_channels", step="channel_step")
    )
    channel_width: int = 0
    kind: str = state("key", toggles("Kind", options="kinds_available", labels=KIND_LABELS))
    pinned: tuple[int, ...] = ()


@register_view("channels", order=10)
class ChannelView(LayerView[ChannelState]):
    """K and V channel correlation for the selected layer (and pinned layers), one window."""

    title = "Channels"
    sources = ViewSources("stats", layers="pinned", prefetch=True)

    num_channels = t.Int(0).tag(sync=True)
    #: The window sliders snap to multiples of this (the head size; 1: no snapping).
    channel_step = t.Int(1).tag(sync=True)
    kinds_available = t.List(t.Unicode()).tag(sync=True)

    def __init__(
        self,
        stats: KVStats,
        *,
        layer: int | None = None,
        pinned: Sequence[int] = (),
        kind: str = "key",
        channel_start: int = 0,
        channel_width: int | None = None,
        max_cells: int = 1024,
        prefetch: bool = True,
    ) -> None:
        """``channel_width=None``: every key channel; ``prefetch``: compute neighbouring layers ahead."""
        stats = self._stats(stats)
        self._max_cells = whole_number(
            "max_cells", max_cells, minimum=1, hint="the most cells a panel side shows"
        )
        layer = optional_whole_number("layer", layer)
        pinned = whole_numbers("pinned", pinned, hint="layers shown beside the selected one")
        channel_start = whole_number("channel_start", channel_start)
        channel_width = optional_whole_number("channel_width", channel_width)
        self.stats = stats
        self.prefetch = flag("prefetch", prefetch)
        channels = stats.meta.layout.channels_of("key")
        key_kinds: list[str] = [k for k in ("key", "key_post") if k in stats.kinds]
        # What panels show (at most max_cells² floats each), shared by the grids of every kind and
        # pinned layer that show the window.
        self._shown = Memo(self._window_matrix, size=64)
        super().__init__()
        first = ChannelState(
            layer=stats.layers[0] if layer is None else layer,
            channel_start=channel_start,
            channel_width=channels if channel_width is None else channel_width,
            kind=kind,
            pinned=tuple(pinned),
        )
        self.set_up(
            first,
            num_layers=stats.meta.layout.num_layers,
            num_channels=channels,
            channel_step=stats.meta.layout.head_dim,
            kinds_available=key_kinds if len(key_kinds) > 1 else [],
        )

    def _window_matrix(
        self, layer: int, kind: str, start: int, stop: int, max_cells: int
    ) -> tuple[np.ndarray, int]:
        """The matrix a panel shows for a window, and its block size (cached: revisits are free).

        Made from the co-moments at the size shown (:func:`downsampled_corr`): a 4096-channel layer
        never allocates its whole 128 MiB correlation.
        """
        matrix, block = downsampled_corr(self.stats, layer, check_kind(kind), start, stop, max_cells)
        matrix.setflags(write=False)  # cached and shared by panels: never changed in place
        return matrix, block

    def _channels(self, layer: int, kind: str) -> int:
        return self.stats.moments(layer, check_kind(kind)).channels

    @property
    def max_cells(self) -> int:
        """The most cells a panel side shows (fixed when the view is built: panels computed ahead
        for the next layers are computed with it)."""
        return self._max_cells

    def cells(self, resolution: int | None) -> int:
        """The most cells a panel side shows: ``max_cells``, or the screen's ``resolution`` if smaller."""
        if resolution is None:
            return self.max_cells
        return max(1, min(self.max_cells, resolution))

    def _windows(self, state: ChannelState, resolution: int | None) -> list[tuple[int, str, int, int, int]]:
        """(layer, kind, start, stop, cells) of each panel of ``state``, K panels over V panels, one
        column per shown layer: what a panel's window matrix is asked for with."""
        layers = sorted({state.layer, *state.pinned})
        cells = self.cells(resolution)
        return [
            (layer, kind, *self._window(state, self._channels(layer, kind)), cells)
            for kind in (state.kind, "value")
            for layer in layers
        ]

    def neighbours(self, state: ChannelState) -> list[ChannelState]:
        """The layers next to the selected one (same window, kind and pinned layers)."""
        return [n for n in self.layer_neighbours(state) if n.layer in self.stats.layers]

    def labels(self, state: ChannelState) -> dict[str, Any]:
        """The layer read-out, with the number of tokens the correlations are over."""
        return {"layer_label": f"{self.layer_text(state.layer)} ({self.stats.tokens} tokens)"}

    def describe(self, state: ChannelState) -> str:
        """The model and the layers shown (selected and pinned)."""
        shown = state
        layers = sorted({shown.layer, *shown.pinned})
        where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {', '.join(map(str, layers))}"
        return f"{stats_model_name(self.stats)} · {where}"

    @staticmethod
    def _window(state: ChannelState, total: int) -> tuple[int, int]:
        start, width = state.channel_start, state.channel_width
        if width < 1:
            raise ChannelWindowError(f"channel_width must be ≥ 1, got {width}")
        if not 0 <= start < total:
            raise ChannelWindowError(
                f"channel_start {start} is outside 0..{total - 1}: the window must start at a channel of "
                "the layer"
            )
        return start, min(start + width, total)

    def compute(self, state: ChannelState, resolution: int | None = None) -> PanelGrid:
        """K panels over V panels, one column per shown layer (selected and pinned), one window."""
        stats = self.stats
        check_key_kind(state.kind, stats, "channel view")
        layers = sorted({state.layer, *state.pinned})
        for layer in layers:
            self.check_layer(layer)
        panels = []
        window_subtitle = f"channels {{first}}–{{last}} · Pearson over {stats.tokens} tokens"
        for layer, kind, start, stop, cells in self._windows(state, resolution):
            shown = self._shown(layer, kind, start, stop, cells)
            panels.append(
                channel_panel(
                    stats,
                    kind,
                    (start, stop),
                    shown,
                    id=f"{kind}-{layer}",
                    title=f"{KIND_TITLES[kind]} · layer {layer}",
                    subtitle=window_subtitle.format(first=start, last=stop - 1),
                    window_subtitle=window_subtitle,
                )
            )
        return PanelGrid(
            panels,
            vmin=-1.0,
            vmax=1.0,
            colormap="diverging",
            colorbar_label="Pearson correlation",
            columns=len(layers),
        )
