"""KV-cache bytes in words, one convention for every view: per token, K and V, over all of the
model's layers, in the dtype named; the bytes of one layer beside it where a view shows one layer.

Example:
    >>> kv_bytes_text(34560, 30, "torch.bfloat16", this_layer=1152)
    'KV 34,560 B/token over 30 layers (bf16; 1,152 this layer)'
    >>> kv_bytes_text(256, 2, "float32"), kv_bytes_text(256, 0, "float32")  # 0: not recorded
    ('KV 256 B/token over 2 layers (fp32)', 'KV 256 B/token over all layers (fp32)')
"""

from __future__ import annotations

__all__ = ["dtype_name", "kv_bytes_text"]

#: Short names of the dtypes a KV cache is held in.
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def dtype_name(dtype: object) -> str:
    """``torch.bfloat16`` (or its text) as ``"bf16"``; a dtype without a short name as itself."""
    text = str(dtype).removeprefix("torch.")
    return SHORT.get(text, text)


def kv_bytes_text(total: int | float, layers: int, dtype: object, *, this_layer: int | None = None) -> str:
    """KV bytes per token over all ``layers`` in ``dtype`` (and ``this_layer``'s own, when given);
    ``layers`` 0: how many is not known (a report from before reports recorded it)."""
    where = f"over {layers} layer{'s' if layers != 1 else ''}" if layers > 0 else "over all layers"
    extra = f"; {this_layer:,} this layer" if this_layer is not None else ""
    return f"KV {round(total):,} B/token {where} ({dtype_name(dtype)}{extra})"
