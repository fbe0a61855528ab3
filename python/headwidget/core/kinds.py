"""The kinds of token vectors headwidget keeps statistics of.

- ``"key"``: the key-projection output (pre-RoPE), one slice of ``head_dim`` channels per KV head;
- ``"key_post"``: the keys the attention actually uses (post-RoPE), same shape;
- ``"value"``: the value-projection output, ``value_head_dim`` channels per KV head;
- ``"input"``: the attention layer's input (hidden size channels, not split into heads);
- ``"latent"``: the compressed KV latent of MLA (DeepSeek) models, not split into heads.

>>> check_kind("value")
'value'
>>> try:
...     check_kind("query")
... except KeyError as err:
...     print(err.args[0])
unknown kind 'query'; kinds are key, value, key_post, input, latent
"""

from __future__ import annotations

from typing import Literal, cast, get_args

from headwidget.errors import UnknownKindError

__all__ = ["HEAD_KINDS", "KEY_KINDS", "KINDS", "KIND_LABELS", "Kind", "check_kind"]

Kind = Literal["key", "value", "key_post", "input", "latent"]
KINDS: tuple[Kind, ...] = get_args(Kind)
#: Kinds whose channels are KV heads of ``head_dim`` (keys) or ``value_head_dim`` (values) channels.
HEAD_KINDS: tuple[Kind, ...] = ("key", "key_post", "value")
#: The two kinds of keys: before and after the rotary embedding.
KEY_KINDS: tuple[Kind, ...] = ("key", "key_post")
#: What a control shows each kind as.
KIND_LABELS: dict[str, str] = {
    "key": "keys, pre-RoPE",
    "key_post": "keys, post-RoPE",
    "value": "values",
    "input": "layer input",
    "latent": "MLA latent",
}


def check_kind(kind: object) -> Kind:
    """``kind`` as a :data:`Kind`, or :class:`~headwidget.errors.UnknownKindError` naming the kinds."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise UnknownKindError(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
    return cast(Kind, kind)
