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

Quantizers (``kv:...``) combine with nothing else: ``kv:int4+align`` is refused. The numbers in a spec
are ASCII digits (``gqa:２`` is refused) of at most :data:`SPEC_NUMBER_MAX`.

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

__all__ = [
    "CQ_BITS",
    "INT_BITS",
    "INT_GROUP",
    "SPEC_ARGUMENTS",
    "SPEC_NUMBER_MAX",
    "VARIANT_FORMS",
    "VariantSpec",
    "parse_variant",
    "short",
    "spec_number",
    "spec_text",
    "unreadable_digits",
]

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
#: The largest number a spec may hold (a group size, rank, latent size, head or channel count):
#: beyond it a spec is a typo, and numbers such as ``g99999999999999999999`` would overflow in torch.
SPEC_NUMBER_MAX = 2**20
# ``[0-9]``, not ``\d``: Python's ``\d`` and ``int()`` also take other scripts' digits ("２").
_QUANTIZER = re.compile(r"kv:(?:int(?P<bits>[0-9]+)(?:/g(?P<group>[0-9]+))?|cq(?P<c>[0-9]+)c(?P<cb>[0-9]+)b)")
_GRAMMAR = re.compile(
    r"(?:(?P<plain>model|mha|mqa)|(?P<named>gqa|lrkv|mla|rope):(?P<arg>[0-9]+))"
    r"(?P<align>\+align)?(?:\+rope:(?P<rope>[0-9]+))?"
)
#: What the number of each named mechanism is, and its letter (for messages).
SPEC_ARGUMENTS = {
    "gqa": ("the KV-head count of gqa:G", "G"),
    "lrkv": ("the rank of lrkv:r", "r"),
    "mla": ("the latent size of mla:d_c", "d_c"),
    "rope": ("the rotary pairs kept by rope:r", "r"),
}


def short(spec: str) -> str:
    """``repr(spec)``, cut to 60 characters (a spec in a message is never a page long).

    >>> short("gqa:" + "9" * 100)
    "'gqa:999999999999999999999999999999999999999999999999999...' (104 characters)"
    """
    return repr(spec) if len(spec) <= 60 else f"{spec[:55] + '...'!r} ({len(spec)} characters)"


def unreadable_digits(spec: str) -> str:
    """A hint for a spec that holds digits other than ASCII ``0-9`` (``"gqa:２"``), else ``""``.

    >>> unreadable_digits("gqa:２")
    "; spec numbers are ASCII digits 0-9, and '２' is not one"
    """
    odd = [ch for ch in spec if ch.isdigit() and not ch.isascii()]
    return f"; spec numbers are ASCII digits 0-9, and {odd[0]!r} is not one" if odd else ""


def spec_text(spec: object, what: str = "variant spec") -> str:
    """``spec`` stripped and lower-cased; anything but a string is a :class:`MechanismSpecError`.

    >>> spec_text(" MQA ")
    'mqa'
    >>> spec_text(4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.MechanismSpecError: a variant spec must be a string such as 'mqa' ..., got 4 (int)
    """
    if not isinstance(spec, str):
        raise MechanismSpecError(
            f"a {what} must be a string such as 'mqa' or 'gqa:4', got {repr(spec)[:60]} "
            f"({type(spec).__name__})"
        )
    return spec.strip().lower()


def spec_number(
    spec: str, digits: str, what: str, symbol: str, low: int = 0, high: int = SPEC_NUMBER_MAX
) -> int:
    """The ASCII ``digits`` of ``spec`` as an int with ``low ≤ symbol ≤ high``, else a
    :class:`MechanismSpecError` naming ``what`` the number is and its range (checked on the digits,
    before any conversion, so a number of any length fails the same way).

    >>> spec_number("gqa:4", "4", "the KV-head count of gqa:G", "G")
    4
    >>> spec_number("kv:int4/g" + "9" * 20, "9" * 20, "the group size", "n", 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.MechanismSpecError: 'kv:int4/g999...': the group size takes 1 ≤ n ≤ 1048576, got 999...
    """
    stripped = digits.lstrip("0") or "0"
    if len(stripped) > len(str(high)) or not low <= int(stripped) <= high:
        shown = digits if len(digits) <= 40 else f"{digits[:20]}... ({len(digits)} digits)"
        raise MechanismSpecError(f"{short(spec)}: {what} takes {low} ≤ {symbol} ≤ {high}, got {shown}")
    return int(stripped)


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
    text = spec_text(spec)
    if text.startswith("kv:"):
        return _parse_quantizer(spec, text)
    m = _GRAMMAR.fullmatch(text)
    if m is None:
        raise MechanismSpecError(
            f"cannot read variant spec {short(spec)}{unreadable_digits(spec)}; write one of {VARIANT_FORMS} "
            "with whole numbers, e.g. 'gqa:4', 'mqa+align', 'lrkv:16', 'mla:128', 'rope:8', 'mla:96+rope:8'"
        )
    mechanism = m.group("plain") or m.group("named")
    arg = None if m.group("arg") is None else spec_number(spec, m.group("arg"), *SPEC_ARGUMENTS[mechanism])
    rope = m.group("rope")
    rope = None if rope is None else spec_number(spec, rope, "the rotary pairs kept by +rope:r", "r")
    align = bool(m.group("align"))
    if align and mechanism not in ("gqa", "mqa"):
        raise MechanismSpecError(
            f"{short(spec)}: '+align' merges aligned heads, so it goes with 'gqa:G' or 'mqa' only "
            "(e.g. 'gqa:4+align', 'mqa+align')"
        )
    if rope is not None and (mechanism != "mla" or align):
        raise MechanismSpecError(
            f"{short(spec)}: '+rope:r' keeps r rotary pairs outside an MLA latent, so it goes with 'mla:d_c' "
            "only (e.g. 'mla:96+rope:8'); for partial RoPE alone write 'rope:r'"
        )
    pairs = arg if mechanism == "rope" else rope
    if pairs is not None and pairs < 1:
        raise MechanismSpecError(f"{short(spec)}: partial RoPE keeps r ≥ 1 frequency pairs per KV head")
    canonical = mechanism if arg is None else f"{mechanism}:{arg}"
    canonical += "+align" if align else ""
    canonical += f"+rope:{rope}" if rope is not None else ""
    return VariantSpec(canonical, mechanism, arg, align, rope)


def _parse_quantizer(spec: str, text: str) -> VariantSpec:
    top = SPEC_NUMBER_MAX
    forms = (
        f"kv:int{{b}} (1 ≤ b ≤ 16), kv:int{{b}}/g{{n}} (group size 1 ≤ n ≤ {top}) or kv:cq{{c}}c{{b}}b "
        f"(1 ≤ c ≤ {top}, 1 ≤ b ≤ 12)"
    )
    if "+" in text:
        raise MechanismSpecError(
            f"{short(spec)}: a K/V quantizer combines with nothing else for now; evaluate "
            f"{text.split('+')[0]!r} and the other variant as two separate variants"
        )
    m = _QUANTIZER.fullmatch(text)
    if m is None:
        raise MechanismSpecError(
            f"cannot read quantizer spec {short(spec)}{unreadable_digits(spec)}; write {forms} with whole "
            "numbers, e.g. 'kv:int4', 'kv:int2/g64', 'kv:cq4c8b', 'kv:cq8c8b'"
        )
    if m.group("bits") is not None:
        bits = spec_number(spec, m.group("bits"), "kv:int{b}: the bits per value", "b", *INT_BITS)
        group = INT_GROUP
        if m.group("group") is not None:
            group = spec_number(spec, m.group("group"), "the group size of kv:int{b}/g{n}", "n", 1)
        text = f"kv:int{bits}" + ("" if group == INT_GROUP else f"/g{group}")
        return VariantSpec(text, "kv:int", None, bits=bits, group=group)
    channels = spec_number(spec, m.group("c"), "kv:cq{c}c{b}b: the coupled channels", "c", 1)
    what = "kv:cq{c}c{b}b: the bits per codeword (2**b centroids)"
    bits = spec_number(spec, m.group("cb"), what, "b", *CQ_BITS)
    return VariantSpec(f"kv:cq{channels}c{bits}b", "kv:cq", None, bits=bits, group=channels)
