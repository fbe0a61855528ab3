"""What a model's attention looks like to headwidget: heads, KV heads, head sizes and RoPE layout."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from headwidget.core.kinds import Kind
from headwidget.core.stored import stored

__all__ = ["AttentionLayout", "Mechanism", "Pairing", "RopeLayout"]

#: How a model's query heads share KV heads (``"mla"``: a compressed latent, DeepSeek).
Mechanism = Literal["mha", "gqa", "mqa", "mla"]
#: How a head's rotated dims pair into rotary planes (``"none"``: no RoPE).
Pairing = Literal["half", "interleaved", "none"]


@dataclass(frozen=True)
class RopeLayout:
    """Which dimensions of a key head rotate, and how they pair into rotary planes.

    ``pairing`` is ``"half"`` (HF ``rotate_half``: dim m pairs with m + rotary_dim/2), ``"interleaved"``
    (GPT-J style: 2m pairs with 2m+1) or ``"none"``. The rotated dims are
    ``offset .. offset + rotary_dim`` of each head (partial rotary: the rest pass through).
    ``post_pairing`` is the pairing of the post-RoPE keys as the attention receives them (DeepSeek-V3
    de-interleaves while rotating).

    >>> RopeLayout("half", rotary_dim=4).planes()
    [(0, 2), (1, 3)]
    >>> RopeLayout("interleaved", rotary_dim=4, offset=2).planes()
    [(2, 3), (4, 5)]
    """

    pairing: Pairing = "none"
    rotary_dim: int = stored(default=0, minimum=0)
    offset: int = stored(default=0, minimum=0)
    post_pairing: Pairing | None = None

    @property
    def uses_rope(self) -> bool:
        """Whether any key dims rotate."""
        return self.pairing != "none" and self.rotary_dim > 0

    def planes(self, post: bool = False) -> list[tuple[int, int]]:
        """Index pairs (within one key head) of the rotary planes."""
        pairing = (self.post_pairing or self.pairing) if post else self.pairing
        half = self.rotary_dim // 2
        o = self.offset
        if pairing == "half":
            return [(o + m, o + m + half) for m in range(half)]
        if pairing == "interleaved":
            return [(o + 2 * m, o + 2 * m + 1) for m in range(half)]
        return []


@dataclass(frozen=True)
class AttentionLayout:
    """Shape facts of one model's attention, shared by all its layers.

    >>> lay = AttentionLayout("llama", "gqa", num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
    ...                       value_head_dim=64, hidden_size=576, rope=RopeLayout("half", rotary_dim=64))
    >>> lay.channels_of("key"), lay.head_dim_of("value"), lay.head_dim_of("input")
    (192, 64, None)
    """

    family: str
    mechanism: Mechanism
    num_layers: int = stored(minimum=1)
    num_heads: int = stored(minimum=1)
    num_kv_heads: int = stored(minimum=1)
    head_dim: int = stored(minimum=1)
    value_head_dim: int = stored(minimum=1)
    hidden_size: int = stored(minimum=1)
    rope: RopeLayout = field(default_factory=RopeLayout)
    latent_dim: int | None = stored(default=None, minimum=1)

    def head_dim_of(self, kind: Kind) -> int | None:
        """Channels per head of a statistics kind (None: the kind is not split into heads)."""
        if kind in ("key", "key_post"):
            return self.head_dim
        if kind == "value":
            return self.value_head_dim
        return None

    def channels_of(self, kind: Kind) -> int:
        """Channels of one statistics kind (all KV heads together; the hidden size for ``"input"``)."""
        if kind in ("key", "key_post"):
            return self.num_kv_heads * self.head_dim
        if kind == "value":
            return self.num_kv_heads * self.value_head_dim
        if kind == "latent":
            return int(self.latent_dim or 0)
        if kind == "input":
            return self.hidden_size
        raise KeyError(kind)

    def to_json(self) -> dict[str, Any]:
        """The layout as plain JSON data (what statistics files store)."""
        return asdict(self)


def mechanism_of(num_heads: int, num_kv_heads: int) -> Mechanism:
    """``"mha"``, ``"mqa"`` or ``"gqa"`` from the head counts."""
    if num_kv_heads == num_heads:
        return "mha"
    if num_kv_heads == 1:
        return "mqa"
    return "gqa"
