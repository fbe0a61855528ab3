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
``kv:int{b}/g{n}r{R}`` groups of ``n`` channels (default ``n`` = 32); after a prefill (``prefill:P``) the
                       newest tokens stay exact as KIVI's residual of length ``R`` (a multiple of ``n``,
                       default ``n``) keeps them: the keys' last ``P mod R``, the values' last
                       ``min(P, R)``; ``r`` is refused where no prefilled cache is read
``kv:cq{c}c{b}b``      coupled quantization: every ``c`` contiguous channels → the nearest of ``2**b``
                       k-means centroids (1 ≤ b ≤ 12; ``b/c`` bits per channel; plain k-means, where
                       the paper's centroids are Fisher-guided)
``share:g``            cross-layer sharing (CLA): in each group of ``g`` adjacent layers the first layer's
                       K/V are read by the others, whose own K/V are never used (0 bytes)
``merge:2``            MiniCache: each pair's prefilled K/V merged after prefill (pairs only)
``xkv:r/g``            xKV: one shared rank-``r`` SVD of the group's prefilled K (pre-RoPE) and V
                       (``xkv:k{r_k}v{r_v}/g``: a rank for each, as xKV's ``rank_k`` and ``rank_v``)
=====================  ===============================================================================

A cross-layer part (``share:g``, ``merge:g``, ``xkv:r/g``) stands alone or ends a conversion, joined by
``+``: ``mqa+share:2`` converts every layer to MQA and shares each pair's K/V (CLA's MQA + CLA),
``mla:128+xkv:64/2`` compresses the MLA-converted layers' caches. The groups are the layers a spec
applies to, sorted, cut into runs of adjacent layers, each run into groups of ``g`` (a last shorter
group keeps what is left; a group of one layer is left as the conversion made it, except by ``xkv``,
which compresses it by its own SVD as xKV's authors do, and takes ``g = 1``: their single-layer SVD):
:func:`~headwidget.analysis.cross_layer.layer_groups`. ``merge`` and ``xkv`` transform a prefilled cache
and exist only under ``protocol="prefill:P"``; ``share`` is exact in any protocol.

Quantizers (``kv:...``) combine with nothing else: ``kv:int4+align`` and ``kv:int4+share:2`` are
refused. The numbers in a spec are ASCII digits (``gqa:２`` is refused) of at most
:data:`SPEC_NUMBER_MAX`.

**Mixed specs** give layers different specs: ``spec@layers`` parts joined by ``;``, the layers a list
of indices and ranges (``"mla:64@0-9;mla:128@10-29"``, ``"model@0,1;mqa+align@2-29"``,
``"kv:int4@0-3,8;kv:int2@4-7"``). A layer named in no part keeps the model's own attention; a layer
named twice is refused, and so (once the model is known, :meth:`MixedSpec.check_layers`) is a layer
the model does not have. The canonical form lists the parts by their first layer, each spec once,
its layers as ranges.

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
    >>> mixed = parse_variant("mla:128@10-11 ; MLA:64@0-4,5,6-9")
    >>> mixed.text, mixed.spec_at(10).text, mixed.spec_at(12).text
    ('mla:64@0-9;mla:128@10-11', 'mla:128', 'model')
    >>> cla = parse_variant("MQA+Share:2")
    >>> cla.text, cla.mechanism, cla.cross
    ('mqa+share:2', 'mqa', CrossLayer(kind='share', group=2, rank=None, value_rank=None))
    >>> parse_variant("xkv:64/4").text, parse_variant("xkv:64/4").base
    ('xkv:64/4', 'model')
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from headwidget.errors import MechanismSpecError

__all__ = [
    "CQ_BITS",
    "CROSS_LAYER_KINDS",
    "INT_BITS",
    "INT_GROUP",
    "LAYER_MAX",
    "SPEC_ARGUMENTS",
    "SPEC_NUMBER_MAX",
    "VARIANT_FORMS",
    "CrossLayer",
    "MixedSpec",
    "Variant",
    "VariantSpec",
    "layer_ranges",
    "parse_uniform",
    "parse_variant",
    "short",
    "spec_number",
    "spec_text",
    "uniform_parts",
    "unreadable_digits",
    "variant_group",
]

VARIANT_FORMS = (
    "model, mha, gqa:G, mqa, lrkv:r, mla:d_c, gqa:G+align, mqa+align, rope:r, mla:d_c+rope:r, "
    "kv:int{b}, kv:int{b}/g{n}, kv:int{b}/g{n}r{R}, kv:cq{c}c{b}b, a cross-layer share:g, merge:2, "
    "xkv:r/g or xkv:k{r}v{r}/g alone or after a conversion (mqa+share:2), or spec@layers parts joined by "
    "';' (mla:64@0-9;mla:128@10-29)"
)
#: The cross-layer mechanisms: ``share`` changes the model, ``merge`` and ``xkv`` a prefilled cache.
CROSS_LAYER_KINDS = ("share", "merge", "xkv")
# a cross-layer part: at the end of a spec, alone or after '+'
_CROSS = re.compile(
    r"(?:^|\+)(?P<cross>(?P<kind>share|merge):(?P<g>[0-9]+)"
    r"|xkv:(?:(?P<r>[0-9]+)|k(?P<rk>[0-9]+)v(?P<rv>[0-9]+))/(?P<xg>[0-9]+))$"
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
#: The largest layer index a mixed spec may name (beyond it a layer list is a typo).
LAYER_MAX = 2**16 - 1
# ``[0-9]``, not ``\d``: Python's ``\d`` and ``int()`` also take other scripts' digits ("２").
_QUANTIZER = re.compile(
    r"kv:(?:int(?P<bits>[0-9]+)(?:/(?=[gr])(?:g(?P<group>[0-9]+))?(?:r(?P<residual>[0-9]+))?)?"
    r"|cq(?P<c>[0-9]+)c(?P<cb>[0-9]+)b)"
)
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
class CrossLayer:
    """A cross-layer part of a spec: ``kind`` (``"share"``, ``"merge"``, ``"xkv"``) over groups of
    ``group`` adjacent layers; ``rank``: xKV's shared rank ``r`` of the keys, and of the values unless
    ``value_rank`` gives theirs (xKV's ``rank_k`` and ``rank_v``).

    >>> CrossLayer("xkv", 4, 64).text, CrossLayer("xkv", 2, 192, 288).text
    ('xkv:64/4', 'xkv:k192v288/2')
    >>> CrossLayer("share", 2).cache_transform
    False
    """

    kind: str
    group: int
    rank: int | None = None
    value_rank: int | None = None

    @property
    def smallest_group(self) -> int:
        """The smallest group it acts on: xKV compresses a layer alone by its own SVD (its authors'
        single-layer baseline, and a run's last layer left over), while sharing and merging need two."""
        return 1 if self.kind == "xkv" else 2

    @property
    def ranks(self) -> dict[str, int]:
        """xKV's rank per kind (``{"key": r_k, "value": r_v}``; empty for the other kinds)."""
        if self.rank is None:
            return {}
        return {"key": self.rank, "value": self.rank if self.value_rank is None else self.value_rank}

    @property
    def text(self) -> str:
        """The canonical form (``share:2``, ``merge:2``, ``xkv:64/4``, ``xkv:k64v96/4``)."""
        if self.kind != "xkv":
            return f"{self.kind}:{self.group}"
        if self.value_rank is None or self.value_rank == self.rank:
            return f"xkv:{self.rank}/{self.group}"
        return f"xkv:k{self.rank}v{self.value_rank}/{self.group}"

    @property
    def cache_transform(self) -> bool:
        """Whether it transforms a prefilled cache (``merge``, ``xkv``), rather than the model (``share``)."""
        return self.kind != "share"


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
    #: ``kv:int``: KIVI's residual length R, the newest tokens a deployed cache keeps exact (a multiple
    #: of ``group``; ``group`` itself when not given).
    residual: int | None = field(default=None, repr=False)
    #: The cross-layer part (``share:g``, ``merge:g``, ``xkv:r/g``), None for a spec within layers.
    cross: CrossLayer | None = field(default=None, repr=False)

    @property
    def unchanged(self) -> bool:
        """Whether the spec leaves a layer as the model has it (``model``, with no cross-layer part)."""
        return self.mechanism == "model" and self.cross is None

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


def layer_ranges(layers: Iterable[int]) -> str:
    """Sorted distinct layer indices as ranges: ``[0, 1, 2, 5, 7, 8]`` → ``"0-2,5,7-8"``.

    >>> layer_ranges([8, 0, 1, 2, 5, 7])
    '0-2,5,7-8'
    """
    ordered = sorted(set(layers))
    runs: list[list[int]] = []
    for layer in ordered:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass(frozen=True)
class MixedSpec:
    """A parsed mixed spec (``spec@layers`` parts joined by ``;``; see the module docstring).

    ``parts`` pairs each uniform spec with the layers it is applied to (sorted), ordered by first layer;
    ``text`` is the canonical form.

    Example:
        >>> m = parse_variant("model@0,1;mqa+align@2-5;kv:int4@6")
        >>> m.converted, m.quantized
        ({'mqa+align': (2, 3, 4, 5)}, {'kv:int4': (6,)})
        >>> m.align, m.layers
        (True, (0, 1, 2, 3, 4, 5, 6))
    """

    text: str
    parts: tuple[tuple[VariantSpec, tuple[int, ...]], ...]

    @property
    def layers(self) -> tuple[int, ...]:
        """Every layer a part names (sorted)."""
        return tuple(sorted(layer for _, layers in self.parts for layer in layers))

    def spec_at(self, layer: int) -> VariantSpec:
        """The uniform spec of ``layer`` (``model`` when no part names it)."""
        for part, layers in self.parts:
            if layer in layers:
                return part
        return _MODEL

    @property
    def converted(self) -> dict[str, tuple[int, ...]]:
        """The conversions' canonical specs and their layers (``model`` parts and quantizers left out)."""
        return {p.text: ls for p, ls in self.parts if not p.unchanged and not p.quantizer}

    @property
    def quantized(self) -> dict[str, tuple[int, ...]]:
        """The quantizers' canonical specs and their layers."""
        return {p.text: ls for p, ls in self.parts if p.quantizer}

    @property
    def align(self) -> bool:
        """Whether any part aligns heads before merging (needs the keys' and values' statistics)."""
        return any(p.align for p, _ in self.parts)

    def check_layers(self, num_layers: int) -> None:
        """Refuse a layer that a model with ``num_layers`` layers does not have.

        >>> parse_variant("mqa@0-3").check_layers(2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        headwidget.errors.MechanismSpecError: 'mqa@0-3': layers 2, 3 are not in the model, which has 2 ...
        """
        outside = [layer for layer in self.layers if layer >= num_layers]
        if outside:
            named = ", ".join(str(layer) for layer in outside[:8]) + (", ..." if len(outside) > 8 else "")
            noun = "layer" if len(outside) == 1 else "layers"
            verb = "is" if len(outside) == 1 else "are"
            raise MechanismSpecError(
                f"{short(self.text)}: {noun} {named} {verb} not in the model, which has {num_layers} layers "
                f"(0..{num_layers - 1}); name layers 0..{num_layers - 1} only"
            )


#: A parsed spec: one for every layer, or mixed.
Variant = VariantSpec | MixedSpec


def uniform_parts(parsed: Variant) -> list[VariantSpec]:
    """The uniform specs a parsed spec is made of: itself, or a mixed spec's parts.

    >>> [p.text for p in uniform_parts(parse_variant("mqa@0;kv:int4@1"))]
    ['mqa', 'kv:int4']
    """
    return [parsed] if isinstance(parsed, VariantSpec) else [p for p, _ in parsed.parts]


def variant_group(spec: str) -> str:
    """``"quantizers"`` for a K/V quantizer, ``"mixed"`` for a mixed spec, else ``"mechanisms"`` (how
    the views group variants).

    >>> [variant_group(s) for s in ("mqa", "kv:int4", "mla:64@0-9;kv:int4@10-29")]
    ['mechanisms', 'quantizers', 'mixed']
    """
    parsed = parse_variant(spec)
    if isinstance(parsed, MixedSpec):
        return "mixed"
    return "quantizers" if parsed.quantizer else "mechanisms"


def parse_uniform(spec: str, where: str) -> VariantSpec:
    """:func:`parse_variant` for a place that applies one spec to every layer it is given (``where``
    names it): a mixed spec is refused.

    >>> parse_uniform("mqa@0-1", "fit_quantizer")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.MechanismSpecError: fit_quantizer takes one spec for every layer ... 'mqa@0-1'; ...
    """
    parsed = parse_variant(spec)
    if isinstance(parsed, MixedSpec):
        raise MechanismSpecError(
            f"{where} takes one spec for every layer it is given, not the mixed spec {short(parsed.text)}; "
            "give its parts one at a time with their layers (layers=[...]), or pass the mixed spec to "
            "headwidget.apply / headwidget.evaluate"
        )
    return parsed


def _parse_layers(spec: str, part: str, text: str) -> tuple[int, ...]:
    """The layers of one ``spec@layers`` part: indices and ``a-b`` ranges joined by commas."""
    layers: list[int] = []
    for item in text.split(","):
        item = item.strip()
        m = re.fullmatch(r"([0-9]+)(?:\s*-\s*([0-9]+))?", item)
        if m is None:
            raise MechanismSpecError(
                f"{short(spec)}: cannot read the layers {item!r} of part {part!r}{unreadable_digits(item)}; "
                "write layer indices and ranges joined by commas, e.g. 'mqa@0-9', 'mla:64@0,1,4-7'"
            )
        what, top = "a layer index", LAYER_MAX
        first = spec_number(spec, m.group(1), what, "layer", 0, top)
        last = first if m.group(2) is None else spec_number(spec, m.group(2), what, "layer", 0, top)
        if last < first:
            raise MechanismSpecError(
                f"{short(spec)}: the layer range {item!r} of part {part!r} runs backwards; write it "
                f"{last}-{first}"
            )
        layers.extend(range(first, last + 1))
    return tuple(layers)


def _parse_mixed(spec: str, text: str) -> MixedSpec:
    seen: dict[int, str] = {}
    merged: dict[str, tuple[VariantSpec, list[int]]] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            raise MechanismSpecError(
                f"{short(spec)}: an empty part; join spec@layers parts with single ';' "
                "(e.g. 'mla:64@0-9;mla:128@10-29')"
            )
        if part.count("@") != 1:
            raise MechanismSpecError(
                f"{short(spec)}: part {part!r} is not spec@layers; in a mixed spec every part names its "
                "layers (e.g. 'mla:64@0-9;mla:128@10-29')"
            )
        head, _, tail = part.partition("@")
        uniform = parse_variant(head.strip())
        assert isinstance(uniform, VariantSpec)
        for layer in _parse_layers(spec, part, tail):
            if layer in seen:
                raise MechanismSpecError(
                    f"{short(spec)}: layer {layer} is named twice (in {seen[layer]!r} and {part!r}); name "
                    "each layer in one part only"
                )
            seen[layer] = part
            merged.setdefault(uniform.text, (uniform, []))[1].append(layer)
    parts = sorted(((u, tuple(sorted(ls))) for u, ls in merged.values()), key=lambda item: item[1][0])
    canonical = ";".join(f"{u.text}@{layer_ranges(ls)}" for u, ls in parts)
    return MixedSpec(canonical, tuple(parts))


def parse_variant(spec: str) -> Variant:
    """Read a variant spec, uniform or mixed (see the module docstring): the only reader of specs.

    >>> parse_variant("gqa:3+align").arg
    3

    Raises:
        MechanismSpecError: an unreadable spec, or a combination that does not exist (``+align`` is
            for ``gqa:G``/``mqa``, ``+rope:r`` for ``mla:d_c``, quantizers combine with nothing), or a
            quantizer's bits or group size out of range (the message names the allowed values); in a
            mixed spec, a part without layers, unreadable layers or a layer named twice.
    """
    text = spec_text(spec)
    if "@" in text or ";" in text:
        return _parse_mixed(spec, text)
    return _parse_single(spec, text)


def _parse_single(spec: str, text: str) -> VariantSpec:
    m = _CROSS.search(text)
    if m is not None:
        return _parse_cross(spec, text, m)
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


_MODEL = VariantSpec("model", "model", None)


def _parse_cross(spec: str, text: str, m: re.Match[str]) -> VariantSpec:
    """A spec ending in a cross-layer part: the conversion before it (``model`` when alone), and it."""
    head = text[: m.start()]
    what = "the group size of {kind}:g (layers per group)"
    if m.group("kind") is not None:
        kind = m.group("kind")
        group = spec_number(spec, m.group("g"), what.format(kind=kind), "g", 1)
        cross = CrossLayer(kind, group)
    else:
        if m.group("r") is not None:
            rank = value_rank = spec_number(spec, m.group("r"), "the shared rank of xkv:r/g", "r", 1)
        else:
            rank = spec_number(spec, m.group("rk"), "the keys' shared rank of xkv:k{r}v{r}/g", "r", 1)
            value_rank = spec_number(spec, m.group("rv"), "the values' shared rank of xkv:k{r}v{r}/g", "r", 1)
        group = spec_number(spec, m.group("xg"), what.format(kind="xkv:r/g"), "g", 1)
        cross = CrossLayer("xkv", group, rank, value_rank if value_rank != rank else None)
    if group < cross.smallest_group:
        raise MechanismSpecError(
            f"{short(spec)}: {cross.kind} acts across the layers of each group of g, so g ≥ 2 (a group of "
            f"one layer shares nothing); write e.g. {replace(cross, group=2).text!r}"
        )
    if cross.kind == "merge" and group != 2:
        raise MechanismSpecError(
            f"{short(spec)}: MiniCache merges the caches of pairs of adjacent layers (its SLERP "
            "interpolates two directions), so merge:g takes g = 2 only; write 'merge:2'"
        )
    if not head:
        return VariantSpec(cross.text, "model", None, cross=cross)
    if head.startswith("kv:") or _CROSS.search(head) is not None:
        raise MechanismSpecError(
            f"{short(spec)}: a cross-layer part ({cross.text}) follows a conversion (e.g. 'mqa+share:2', "
            "'mla:128+xkv:64/2'), once; a K/V quantizer or a second cross-layer part combines with it "
            "in no spec: evaluate them as separate variants"
        )
    within = _parse_single(spec, head)
    if within.mechanism == "model":
        raise MechanismSpecError(f"{short(spec)}: write the cross-layer part alone: {cross.text!r}")
    if cross.cache_transform and within.mechanism in ("lrkv", "mla"):
        raise MechanismSpecError(
            f"{short(spec)}: {cross.kind} transforms a cache of per-head keys and values, and "
            f"{within.mechanism} caches factors or a latent instead; combine {cross.text} with mha, gqa:G, "
            "mqa (+align) or rope:r, or share the latent with share:g"
        )
    return replace(within, text=f"{within.text}+{cross.text}", cross=cross)


def _parse_quantizer(spec: str, text: str) -> VariantSpec:
    top = SPEC_NUMBER_MAX
    forms = (
        f"kv:int{{b}} (1 ≤ b ≤ 16), kv:int{{b}}/g{{n}} (group size 1 ≤ n ≤ {top}), kv:int{{b}}/g{{n}}r{{R}} "
        f"(KIVI's residual length R, a multiple of n) or kv:cq{{c}}c{{b}}b (1 ≤ c ≤ {top}, 1 ≤ b ≤ 12)"
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
        residual = group
        if m.group("residual") is not None:
            residual = spec_number(
                spec, m.group("residual"), "KIVI's residual length of kv:int{b}/g{n}r{R}", "R", 1
            )
            if residual % group:
                raise MechanismSpecError(
                    f"{short(spec)}: KIVI's residual length R holds whole groups of n = {group} tokens, so R "
                    f"is a multiple of n; got R = {residual} (e.g. r{group * max(1, residual // group)})"
                )
        suffix = ("" if group == INT_GROUP else f"g{group}") + ("" if residual == group else f"r{residual}")
        text = f"kv:int{bits}" + (f"/{suffix}" if suffix else "")
        return VariantSpec(text, "kv:int", None, bits=bits, group=group, residual=residual)
    channels = spec_number(spec, m.group("c"), "kv:cq{c}c{b}b: the coupled channels", "c", 1)
    what = "kv:cq{c}c{b}b: the bits per codeword (2**b centroids)"
    bits = spec_number(spec, m.group("cb"), what, "b", *CQ_BITS)
    return VariantSpec(f"kv:cq{channels}c{bits}b", "kv:cq", None, bits=bits, group=channels)
