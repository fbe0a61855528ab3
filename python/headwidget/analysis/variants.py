"""Variant specs: a mechanism, optionally aligned before merging or with partial RoPE, or a KV quantizer.

A variant spec names what a whole model (or one layer) becomes:

=====================  ===============================================================================
spec                   meaning
=====================  ===============================================================================
``model``              the model as it is
``mha``, ``gqa:G``,    the mechanism conversions of :func:`~headwidget.analysis.conversions.convert`
``mqa``, ``lrkv:r``,   (weight-space without statistics, data-aware with ``inputs=True`` statistics)
``mla:d_c``
``gqa:G+align``,       rotate the KV heads (RoPE-compatible for keys, orthogonal for values), group them
``mqa+align``          by aligned similarity, then merge each group by its mean
``rope:r``             partial RoPE: per KV head only ``r`` rotary frequency pairs keep rotating
``mla:d_c+rope:r``     partial RoPE, and the other key dims with the values through a rank-``d_c`` latent
``kv:int{b}``,         KIVI-style fake quantization of the K/V the attention uses: ``b`` bits
``kv:int{b}/g{n}``     (1 ≤ b ≤ 16), keys per channel over groups of ``n`` tokens, values per token over
                       groups of ``n`` channels (default ``n`` = 32)
``kv:cq{c}c{b}b``      coupled quantization: every ``c`` contiguous channels → the nearest of ``2**b``
                       k-means centroids (1 ≤ b ≤ 12; ``b/c`` bits per channel)
=====================  ===============================================================================

Quantizers (``kv:...``) combine with nothing else: ``kv:int4+align`` is refused.

Example:
    >>> parse_variant(" MQA+Align ")
    VariantSpec(text='mqa+align', mechanism='mqa', arg=None, align=True, rope=None)
    >>> parse_variant("mla:96+rope:8").base, parse_variant("rope:4").base
    ('mla:96', None)
    >>> q = parse_variant("kv:int4/g32")
    >>> q.text, q.mechanism, q.bits, q.group, q.quantizer
    ('kv:int4', 'kv:int', 4, 32, True)
    >>> parse_variant("KV:CQ4C8B").text, parse_variant("kv:cq4c8b").bits_per_channel
    ('kv:cq4c8b', 2.0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from headwidget.errors import MechanismSpecError

__all__ = ["CQ_BITS", "INT_BITS", "INT_GROUP", "VARIANT_FORMS", "VariantSpec", "parse_variant"]

VARIANT_FORMS = (
    "model, mha, gqa:G, mqa, lrkv:r, mla:d_c, gqa:G+align, mqa+align, rope:r, mla:d_c+rope:r, "
    "kv:int{b}, kv:int{b}/g{n}, kv:cq{c}c{b}b"
)
#: Bits of ``kv:int{b}`` (inclusive range).
INT_BITS = (1, 16)
#: Bits per codeword of ``kv:cq{c}c{b}b`` (inclusive range: ``2**b`` centroids per channel group).
CQ_BITS = (1, 12)
#: The token / channel group size of ``kv:int{b}`` when ``/g{n}`` is not given.
INT_GROUP = 32
_QUANTIZER = re.compile(r"kv:(?:int(?P<bits>\d+)(?:/g(?P<group>\d+))?|cq(?P<c>\d+)c(?P<cb>\d+)b)")
_GRAMMAR = re.compile(
    r"(?:(?P<plain>model|mha|mqa)|(?P<named>gqa|lrkv|mla|rope):(?P<arg>\d+))"
    r"(?P<align>\+align)?(?:\+rope:(?P<rope>\d+))?"
)


@dataclass(frozen=True)
class VariantSpec:
    """One parsed variant spec (see the module docstring); ``text`` is its canonical form."""

    text: str
    mechanism: str
    arg: int | None
    align: bool = False
    rope: int | None = None
    #: Quantizers: bits per value (``kv:int``) or per codeword of ``group`` channels (``kv:cq``).
    bits: int | None = field(default=None, repr=False)
    #: Quantizers: the token / channel group size (``kv:int``) or the channels per codeword (``kv:cq``).
    group: int | None = field(default=None, repr=False)

    @property
    def quantizer(self) -> bool:
        """Whether this is a K/V quantizer (``kv:int{b}``, ``kv:cq{c}c{b}b``) rather than a conversion."""
        return self.mechanism in ("kv:int", "kv:cq")

    @property
    def bits_per_channel(self) -> float | None:
        """Quantizers: the bits each cached channel costs, scales and codebooks left out (None otherwise).

        >>> parse_variant("kv:int2").bits_per_channel, parse_variant("kv:cq8c8b").bits_per_channel
        (2.0, 1.0)
        """
        if self.bits is None or self.group is None:
            return None
        return float(self.bits) if self.mechanism == "kv:int" else self.bits / self.group

    @property
    def base(self) -> str | None:
        """The :func:`~headwidget.analysis.conversions.convert` spec inside it (None for ``rope:r`` and
        the quantizers)."""
        if self.mechanism == "rope" or self.quantizer:
            return None
        return self.mechanism if self.arg is None else f"{self.mechanism}:{self.arg}"

    @property
    def rope_pairs(self) -> int | None:
        """Rotary frequency pairs kept per KV head (None: RoPE is left as the model has it)."""
        return self.arg if self.mechanism == "rope" else self.rope


def parse_variant(spec: str) -> VariantSpec:
    """Read a variant spec (see the module docstring).

    >>> parse_variant("gqa:3+align").arg
    3

    Raises:
        MechanismSpecError: an unreadable spec, or a combination that does not exist (``+align`` is
            for ``gqa:G``/``mqa``, ``+rope:r`` for ``mla:d_c``, quantizers combine with nothing), or a
            quantizer's bits or group size out of range (the message names the allowed values).
    """
    text = str(spec).strip().lower()
    if text.startswith("kv:"):
        return _parse_quantizer(spec, text)
    m = _GRAMMAR.fullmatch(text)
    if m is None:
        raise MechanismSpecError(
            f"cannot read variant spec {spec!r}; write one of {VARIANT_FORMS} with whole numbers, "
            "e.g. 'gqa:4', 'mqa+align', 'lrkv:16', 'mla:128', 'rope:8', 'mla:96+rope:8'"
        )
    mechanism = m.group("plain") or m.group("named")
    arg = None if m.group("arg") is None else int(m.group("arg"))
    align, rope = bool(m.group("align")), None if m.group("rope") is None else int(m.group("rope"))
    if align and mechanism not in ("gqa", "mqa"):
        raise MechanismSpecError(
            f"{spec!r}: '+align' merges aligned heads, so it goes with 'gqa:G' or 'mqa' only "
            "(e.g. 'gqa:4+align', 'mqa+align')"
        )
    if rope is not None and (mechanism != "mla" or align):
        raise MechanismSpecError(
            f"{spec!r}: '+rope:r' keeps r rotary pairs outside an MLA latent, so it goes with 'mla:d_c' "
            "only (e.g. 'mla:96+rope:8'); for partial RoPE alone write 'rope:r'"
        )
    pairs = arg if mechanism == "rope" else rope
    if pairs is not None and pairs < 1:
        raise MechanismSpecError(f"{spec!r}: partial RoPE keeps r ≥ 1 frequency pairs per KV head")
    canonical = mechanism if arg is None else f"{mechanism}:{arg}"
    canonical += "+align" if align else ""
    canonical += f"+rope:{rope}" if rope is not None else ""
    return VariantSpec(canonical, mechanism, arg, align, rope)


def _parse_quantizer(spec: str, text: str) -> VariantSpec:
    forms = "kv:int{b} (1 ≤ b ≤ 16), kv:int{b}/g{n} (group size n ≥ 1) or kv:cq{c}c{b}b (c ≥ 1, 1 ≤ b ≤ 12)"
    if "+" in text:
        raise MechanismSpecError(
            f"{spec!r}: a K/V quantizer combines with nothing else for now; evaluate "
            f"{text.split('+')[0]!r} and the other variant as two separate variants"
        )
    m = _QUANTIZER.fullmatch(text)
    if m is None:
        raise MechanismSpecError(
            f"cannot read quantizer spec {spec!r}; write {forms} with whole numbers, "
            "e.g. 'kv:int4', 'kv:int2/g64', 'kv:cq4c8b', 'kv:cq8c8b'"
        )
    if m.group("bits") is not None:
        bits = int(m.group("bits"))
        group = INT_GROUP if m.group("group") is None else int(m.group("group"))
        low, high = INT_BITS
        if not low <= bits <= high:
            raise MechanismSpecError(f"{spec!r}: kv:int{{b}} takes {low} ≤ b ≤ {high} bits, got {bits}")
        if group < 1:
            raise MechanismSpecError(
                f"{spec!r}: the group size n of kv:int{{b}}/g{{n}} is n ≥ 1, got {group}"
            )
        text = f"kv:int{bits}" + ("" if group == INT_GROUP else f"/g{group}")
        return VariantSpec(text, "kv:int", None, bits=bits, group=group)
    channels, bits = int(m.group("c")), int(m.group("cb"))
    low, high = CQ_BITS
    if channels < 1:
        raise MechanismSpecError(f"{spec!r}: kv:cq{{c}}c{{b}}b couples c ≥ 1 channels, got {channels}")
    if not low <= bits <= high:
        raise MechanismSpecError(
            f"{spec!r}: kv:cq{{c}}c{{b}}b takes {low} ≤ b ≤ {high} bits per codeword (2**b centroids), "
            f"got {bits}"
        )
    return VariantSpec(f"kv:cq{channels}c{bits}b", "kv:cq", None, bits=bits, group=channels)
