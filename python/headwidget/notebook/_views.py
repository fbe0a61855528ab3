"""The displayable built-in views: ``ChannelView``, ``AlignmentView``, ``MechanismView``,
``ConsequenceView``, ``QuantizationView``, ``TimelineView`` and ``HealingView``.

Each is its view of :mod:`headwidget.views` (same arguments, traits and panels) and a
:class:`~headwidget.widget.HeadWidget`: displayed in a notebook it draws the panels, its controls
set its traits, and ``save(path)`` writes what it shows.

Example:
    >>> import torch, headwidget, tempfile, pathlib
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
    >>> view = ChannelView(stats, layer=1, channel_width=8)
    >>> view.layer = 0  # what a move of the layer slider does
    >>> [p["title"] for p in view.panels], view.layer_label
    (['Keys · layer 0', 'Values · layer 0'], 'layer 0 of 0–1 (32 tokens)')
    >>> view.save(pathlib.Path(tempfile.mkdtemp()) / "channels.png", dpi=50).suffix
    '.png'
    >>> MechanismView(model, mechanisms=["model", "mqa"]).controls[1]
    {'trait': 'circuit', 'type': 'select', 'label': 'Circuit', 'options': 'circuits_available'}
"""

from __future__ import annotations

from headwidget import views
from headwidget.notebook._widget import ViewWidget

__all__ = [
    "AlignmentView",
    "ChannelView",
    "ConsequenceView",
    "HealingView",
    "MechanismView",
    "QuantizationView",
    "TimelineView",
]


class ChannelView(ViewWidget, views.ChannelView):
    """K and V channel correlation for the selected layer (and pinned layers), one window, as a widget.

    See :class:`headwidget.views.ChannelView` for the arguments.
    """


class AlignmentView(ViewWidget, views.AlignmentView):
    """Keys/values × before/after head similarity (one layer or a flattened layer set), as a widget.

    See :class:`headwidget.views.AlignmentView` for the arguments.
    """


class MechanismView(ViewWidget, views.MechanismView):
    """One head-correlation panel per mechanism spec (or per real model), as a widget.

    See :class:`headwidget.views.MechanismView` for the arguments.
    """


class ConsequenceView(ViewWidget, views.ConsequenceView):
    """KV bytes against damage per variant, and the per-layer damage map, as a widget (a click on a
    cell selects its layer).

    See :class:`headwidget.views.ConsequenceView` for the arguments.
    """


class QuantizationView(ViewWidget, views.QuantizationView):
    """Joint against summed marginal entropy of coupled channels per layer, and (with a report) bits per
    channel against damage for each quantizer, as a widget.

    See :class:`headwidget.views.QuantizationView` for the arguments.
    """


class TimelineView(ViewWidget, views.TimelineView):
    """One training step's K and V panels of one or two timelines beside the layer's trend over the
    steps, as a widget: the step slider plays through the snapshots, and a click on a point of a trend
    chart shows its step.

    See :class:`headwidget.views.TimelineView` for the arguments.
    """


class HealingView(ViewWidget, views.HealingView):
    """Recovery curves of healed variants and the per-layer recovery map of one run, as a widget (a click
    on a row of the map selects its layer).

    See :class:`headwidget.views.HealingView` for the arguments.
    """
