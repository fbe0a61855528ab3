"""Variant specs: a mechanism, optionally aligned before merging or with partial RoPE.

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
=====================  ===============================================================================

Example:
    >>> parse_variant(" MQA+Align ")
    VariantSpec(text='mqa+align', mechanism='mqa', arg=None, align=True, rope=None)
    >>> parse_variant("mla:96+rope:8").base, parse_variant("rope:4").base
    ('mla:96', None)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from headwidget.errors import MechanismSpecError

__all__ = ["VARIANT_FORMS", "VariantSpec", "parse_variant"]

VARIANT_FORMS = "model, mha, gqa:G, mqa, lrkv:r, mla:d_c, gqa:G+align, mqa+align, rope:r, mla:d_c+rope:r"
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

    @property
    def base(self) -> str | None:
        """The :func:`~headwidget.analysis.conversions.convert` spec inside it (None for ``rope:r``)."""
        if self.mechanism == "rope":
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
            for ``gqa:G``/``mqa``, ``+rope:r`` for ``mla:d_c``).
    """
    text = str(spec).strip().lower()
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
