"""The bottom layer: plain shared types that every other part of headwidget may import.

- :mod:`.layout`: what a model's attention looks like (heads, KV heads, head sizes, RoPE planes);
- :mod:`.kinds`: the statistics kinds (``Kind``) and which of them split into heads;
- :mod:`.panels`: the panel model (matrices with labels and a colour scale) and its binary encoding;
- :mod:`.bundle`: where the built front-end bundle lives;
- :mod:`.weights`: the per-head Q/K/V/O weights of one layer (``HeadWeights``), read by the adapters;
- :mod:`.memory_limits`: how much more host memory the process's cgroup and rlimits let it take;
- :mod:`.ranks`: which of what the ranks of a ``torch.distributed`` group were given differ.

Nothing in this package imports any other part of headwidget except :mod:`headwidget.errors`.
"""

from headwidget.core.bundle import bundle_path
from headwidget.core.kinds import HEAD_KINDS, KEY_KINDS, KINDS, Kind, check_kind
from headwidget.core.layout import AttentionLayout, RopeLayout, mechanism_of
from headwidget.core.panels import Panel, PanelGrid, encode_panel
from headwidget.core.weights import HeadWeights

__all__ = [
    "HEAD_KINDS",
    "KEY_KINDS",
    "KINDS",
    "AttentionLayout",
    "HeadWeights",
    "Kind",
    "Panel",
    "PanelGrid",
    "RopeLayout",
    "bundle_path",
    "check_kind",
    "encode_panel",
    "mechanism_of",
]
