"""Statistics files: safetensors tensors with JSON metadata, written atomically, read with every check.

:func:`write_stats` and :func:`read_stats` are what :meth:`KVStats.save <headwidget.stats.KVStats.save>`
and :meth:`KVStats.load <headwidget.stats.KVStats.load>` call; see those for examples.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import torch

from headwidget.core.kinds import Kind
from headwidget.core.layout import AttentionLayout, mechanism_of
from headwidget.core.stored import StoredReader, describe, parse_json
from headwidget.errors import PathRefusedError, StatsFileError
from headwidget.files import atomic_output, regular_file
from headwidget.moments import Moments
from headwidget.stats._meta import FORMAT, FORMAT_VERSION, StatsMeta
from headwidget.stats._plane_norms import PlaneNorms

__all__ = ["read_stats", "write_stats"]


def write_stats(
    path: Path,
    meta: StatsMeta,
    moments: dict[tuple[int, Kind], Moments],
    cross: dict[Kind, Moments],
    samples: dict[tuple[int, Kind], torch.Tensor] | None = None,
    plane_norms: dict[int, PlaneNorms] | None = None,
) -> Path:
    """Write one capture's moments, token samples, plane norms and metadata to ``path`` atomically.

    See :mod:`headwidget.files` for what atomically means here. Samples are the float32 tensors
    ``layer{L}.{kind}.samples``; the per-pair query/key norm sums of a layer are
    ``layer{L}.plane_norms.count`` / ``.query`` / ``.key``.
    """
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for (layer, kind), m in sorted(moments.items()):
        tensors.update(m.to_tensors(f"layer{layer}.{kind}"))
    for kind, m in sorted(cross.items()):
        tensors.update(m.to_tensors(f"cross.{kind}"))
    for (layer, kind), rows in sorted((samples or {}).items()):
        tensors[f"layer{layer}.{kind}.samples"] = rows.detach().cpu().contiguous()
    for layer, norms in sorted((plane_norms or {}).items()):
        tensors.update(norms.to_tensors(f"layer{layer}.{_PLANE_NORMS}"))
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "meta": json.dumps(meta.to_json())}
    try:
        with atomic_output(path) as tmp:
            save_file(tensors, str(tmp), metadata=header)
    except PathRefusedError as err:
        raise StatsFileError(f"cannot save statistics: {err}") from err
    except OSError as err:
        raise StatsFileError(f"cannot save statistics to {path}: {err.strerror or err}") from err
    except SafetensorError as err:  # the writer's own I/O error (a full disk...)
        raise StatsFileError(
            f"cannot save statistics to {path}: {err}; check the free space and that the "
            "directory is writable"
        ) from err
    return path


def read_stats(
    path: Path,
) -> tuple[
    StatsMeta,
    dict[tuple[int, Kind], Moments],
    dict[Kind, Moments],
    dict[tuple[int, Kind], torch.Tensor],
    dict[int, PlaneNorms],
]:
    """The metadata, moments, token samples and plane norms (on the CPU) of the file at ``path``, every
    field checked. A file without plane norms (written before they were recorded) gives none. A symlink,
    a directory, FIFO or device is refused unread (:mod:`headwidget.files`)."""
    header, tensors = _read_safetensors(path)
    check = _FileCheck(path)
    meta = check.header(header)
    norm_tensors = {name: t for name, t in tensors.items() if name.split(".")[1:2] == [_PLANE_NORMS]}
    moments, cross = check.moments({n: t for n, t in tensors.items() if n not in norm_tensors}, meta)
    samples = check.samples(tensors, meta, moments)
    planes = check.plane_norms(norm_tensors, meta, moments)
    return meta, moments, cross, samples, planes


#: Relative slack for rounding: float32 Grams folded into float64 sums are off by well under 1e-4.
_RTOL = 1e-3
#: Relative float32 rounding of a batch mean (the shift a streaming update centres on), generously.
_MEAN_EPS = 1e-6
#: Matrix entries checked at a time, which bounds the checks' temporary memory.
_CHUNK = 1 << 22
#: Relative float32 rounding of a sampled value (of a float64 model), generously.
_SAMPLE_EPS = 1e-6
#: Absolute slack of a sampled value's distance from its mean (subnormal rounding).
_TINY = 1e-30
#: The middle part of the names of a layer's plane-norm tensors, ``layer{L}.plane_norms.{part}``.
_PLANE_NORMS = "plane_norms"
_PLANE_PARTS = ("count", "query", "key")
#: A weight fingerprint as :func:`~headwidget.adapters.fingerprint.weight_fingerprint` writes it.
_FINGERPRINT = re.compile(r"[0-9a-f]{16}")
_REPAIR = (
    "the file was damaged or edited after KVStats.save() wrote it; capture the statistics again or "
    "restore the file from a copy"
)


def _read_safetensors(path: Path) -> tuple[dict[str, str] | None, dict[str, torch.Tensor]]:
    """The header metadata and every tensor (on the CPU) of a safetensors file, read in one opening."""
    from safetensors import SafetensorError, safe_open

    try:
        with regular_file(path) as name, safe_open(name, framework="pt") as fh:
            header = fh.metadata()
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118
    except FileNotFoundError:
        raise StatsFileError(f"no statistics file at {path}") from None
    except PathRefusedError as err:
        raise StatsFileError(
            f"cannot load statistics: {err}; statistics files are written by KVStats.save()"
        ) from err
    except (SafetensorError, OSError, ValueError, TypeError, RuntimeError, OverflowError) as err:
        raise StatsFileError(
            f"{path} is not a readable safetensors file ({err}); statistics files are written by "
            "KVStats.save()"
        ) from err
    return header, tensors


def _parts(head_dim: int | None) -> tuple[str, ...]:
    return (
        ("count", "mean", "m2") if head_dim is None else ("count", "mean", "m2", "norm_gram", "split_count")
    )


def _scale(m2: torch.Tensor, mean: torch.Tensor, count: int) -> torch.Tensor:
    """Each channel's size in a co-moment: its root sum of squares about the mean, widened by the
    float32 rounding of the batch means a streaming update centres on (for large means, small spread)."""
    return torch.hypot(torch.diagonal(m2).clamp_min(0).sqrt(), mean.abs() * (math.sqrt(count) * _MEAN_EPS))


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0])


class _FileCheck(StoredReader):
    """Builds the contents of one statistics file, refusing every value that cannot be true.

    Each problem raises :class:`StatsFileError` naming the file and the field (``meta.layout.head_dim``,
    ``tensor layer0.key.m2``...).
    """

    def __init__(self, path: Path) -> None:
        super().__init__(StatsFileError, str(path), _REPAIR)
        self.path = path

    def layer_list(self, layers: list[int], field: str, num_layers: int, min_len: int) -> None:
        """Layers of the model (``meta.layout.num_layers``), at least ``min_len`` of them."""
        if len(layers) < min_len:
            self.fail(field, f"lists {len(layers)} layers; it needs at least {min_len}")
        for i, layer in enumerate(layers):
            self.integer(layer, f"{field}[{i}]", 0, num_layers - 1)

    # ------------------------------------------------------------------ the header
    def header(self, header: dict[str, str] | None) -> StatsMeta:
        header = header or {}
        if header.get("format") != FORMAT:
            raise StatsFileError(
                f"{self.path} is a safetensors file but was not written by headwidget (its metadata lacks "
                f"format={FORMAT!r}); statistics files are written by KVStats.save()"
            )
        version = header.get("format_version")
        if version is None:
            self.fail("header field format_version", "is missing")
        if version != FORMAT_VERSION:
            raise StatsFileError(
                f"{self.path}: header field format_version is {version!r}, but this headwidget reads "
                f"statistics format version {FORMAT_VERSION!r} only; read it with the headwidget that "
                "wrote it, or upgrade headwidget (pip install -U headwidget)"
            )
        text = header.get("meta")
        if text is None:
            self.fail("header field meta", "is missing")
        return self.meta(parse_json(text, lambda problem: self.fail("header field meta", problem)))

    def meta(self, data: object) -> StatsMeta:
        meta = self.read(data, StatsMeta, "meta")
        self.layout(meta.layout)
        layout = meta.layout
        self.layer_list(meta.layers, "meta.layers", layout.num_layers, min_len=1)
        self.kinds(meta.kinds, layout)
        cross = meta.cross_layers
        if cross is not None:
            self.layer_list(cross, "meta.cross_layers", layout.num_layers, min_len=2)
            outside = [layer for layer in cross if layer not in meta.layers]
            if outside:
                self.fail(
                    "meta.cross_layers", f"names layers {outside} that are not in meta.layers {meta.layers}"
                )
        if not isinstance(getattr(torch, meta.dtype, None), torch.dtype):
            self.fail("meta.dtype", f"is {meta.dtype!r}, which is not a torch dtype such as 'float32'")
        fingerprint = meta.weights_fingerprint
        if fingerprint is not None and _FINGERPRINT.fullmatch(fingerprint) is None:
            self.fail(
                "meta.weights_fingerprint",
                f"is {fingerprint!r}, which is not 16 lowercase hexadecimal digits",
            )
        return meta

    def kinds(self, kinds: list[Kind], layout: AttentionLayout) -> None:
        if not kinds:
            self.fail("meta.kinds", "must be a non-empty list of kinds, not a list of 0")
        if "latent" in kinds and layout.latent_dim is None:
            self.fail("meta.kinds", "lists 'latent' but meta.layout.latent_dim is null")

    def layout(self, layout: AttentionLayout) -> None:
        """What the layout's types cannot say: its head counts, mechanism and RoPE against each other."""
        f = "meta.layout"
        heads, kv, mechanism = layout.num_heads, layout.num_kv_heads, layout.mechanism
        self.integer(kv, f"{f}.num_kv_heads", 1, heads)
        if heads % kv:
            self.fail(f"{f}.num_kv_heads", f"is {kv}, which does not divide num_heads ({heads})")
        if (mechanism == "mla") != (layout.latent_dim is not None):
            self.fail(
                f"{f}.latent_dim",
                f"is {describe(layout.latent_dim)}, but only an 'mla' model (here {mechanism!r}) has a "
                "latent",
            )
        if mechanism != "mla" and mechanism != mechanism_of(heads, kv):
            self.fail(
                f"{f}.mechanism",
                f"is {mechanism!r}, but {heads} heads over {kv} KV heads make it {mechanism_of(heads, kv)!r}",
            )
        rope, head_dim = layout.rope, layout.head_dim
        rotary = self.integer(rope.rotary_dim, f"{f}.rope.rotary_dim", 0, head_dim)
        # the rotated dims offset .. offset + rotary_dim lie inside a head
        offset = self.integer(rope.offset, f"{f}.rope.offset", 0, head_dim - rotary)
        if rope.pairing == "none" and (rotary, offset, rope.post_pairing) != (0, 0, None):
            self.fail(
                f"{f}.rope.pairing",
                f"is 'none' (no RoPE), but rotary_dim={rotary}, offset={offset}, "
                f"post_pairing={rope.post_pairing!r}",
            )

    # ------------------------------------------------------------------ the tensors
    def moments(
        self, tensors: dict[str, torch.Tensor], meta: StatsMeta
    ) -> tuple[dict[tuple[int, Kind], Moments], dict[Kind, Moments]]:
        layout = meta.layout
        wanted: dict[str, tuple[int, int | None]] = {}
        for layer in meta.layers:
            for kind in meta.kinds:
                wanted[f"layer{layer}.{kind}"] = (layout.channels_of(kind), layout.head_dim_of(kind))
        head_kinds = [kind for kind in meta.kinds if layout.head_dim_of(kind) is not None]
        for kind in head_kinds if meta.cross_layers else []:
            width = len(meta.cross_layers or []) * layout.channels_of(kind)
            wanted[f"cross.{kind}"] = (width, layout.head_dim_of(kind))
        names = {f"{prefix}.{part}" for prefix, (_, hd) in wanted.items() for part in _parts(hd)}
        if meta.sample_size:
            names |= {f"layer{layer}.{kind}.samples" for layer in meta.layers for kind in meta.kinds}
        else:
            stray = sorted(name for name in tensors if name.endswith(".samples"))
            if stray:
                self.fail(
                    f"tensor {stray[0]}",
                    "holds token samples, but meta.sample_size is 0 (a capture without samples)",
                )
        missing = sorted(names - set(tensors))
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            self.fail(f"tensor {missing[0]}", f"is missing{more}")
        extra = sorted(set(tensors) - names)
        if extra:
            self.fail(
                f"tensor {extra[0]}",
                f"does not belong to meta.layers {meta.layers}, meta.kinds "
                f"{meta.kinds} and meta.cross_layers {meta.cross_layers}",
            )
        built = {
            prefix: self.one(tensors, prefix, width, hd, meta.tokens)
            for prefix, (width, hd) in wanted.items()
        }
        moments = {
            (layer, kind): built[f"layer{layer}.{kind}"] for layer in meta.layers for kind in meta.kinds
        }
        cross = {kind: built[f"cross.{kind}"] for kind in head_kinds if f"cross.{kind}" in built}
        for kind, joint in cross.items():
            for i, layer in enumerate(meta.cross_layers or []):
                self.same_tokens(kind, i, layer, joint, moments[(layer, kind)])
        return moments, cross

    def samples(
        self, tensors: dict[str, torch.Tensor], meta: StatsMeta, moments: dict[tuple[int, Kind], Moments]
    ) -> dict[tuple[int, Kind], torch.Tensor]:
        """Each (layer, kind)'s token sample: float32 ``(min(sample_size, tokens), C)`` real rows.

        A real token row lies no farther from the mean, on any channel, than the root of that
        channel's co-moment diagonal (one token's squared deviation is part of the sum), up to the
        rounding that :func:`_scale` allows and the sample's own float32 rounding.
        """
        size, tokens = meta.sample_size, meta.tokens
        if not size:
            return {}
        rows = min(size, tokens)
        out: dict[tuple[int, Kind], torch.Tensor] = {}
        for layer in meta.layers:
            for kind in meta.kinds:
                name = f"tensor layer{layer}.{kind}.samples"
                t = tensors[f"layer{layer}.{kind}.samples"]
                width = meta.layout.channels_of(kind)
                if t.dtype != torch.float32 or t.ndim != 2 or t.shape[1] != width:
                    got = str(t.dtype).removeprefix("torch.")
                    self.fail(
                        name,
                        f"must be float32 of shape ({rows}, {width}) (token rows of the channels that "
                        f"meta.layout gives this kind), but is {got} of shape {tuple(t.shape)}",
                    )
                n = int(t.shape[0])
                if n > tokens:
                    self.fail(
                        name,
                        f"holds {n} rows, more than the {tokens} tokens captured (meta.tokens); a "
                        "sample holds captured token rows only",
                    )
                if n > size:
                    self.fail(name, f"holds {n} rows, more than meta.sample_size ({size})")
                if n != rows:
                    self.fail(
                        name,
                        f"holds {n} rows, but a sample of up to meta.sample_size={size} rows of "
                        f"meta.tokens={tokens} tokens holds {rows}",
                    )
                if not bool(torch.isfinite(t).all()):
                    self.fail(name, f"holds NaN or infinite values (at {_first(~torch.isfinite(t))})")
                self.sample_rows(name, t, moments[(layer, kind)])
                out[(layer, kind)] = t
        return out

    def sample_rows(self, field: str, rows: torch.Tensor, m: Moments) -> None:
        """Every sampled value within the spread its channel's moments allow a single token."""
        scale = _scale(m.m2, m.mean, m.count)
        step = max(1, _CHUNK // max(m.channels, 1))
        for start in range(0, rows.shape[0], step):
            x = rows[start : start + step].double()
            gap = (x - m.mean).abs()
            far = gap > (1 + _RTOL) * scale + _SAMPLE_EPS * x.abs() + _TINY
            if bool(far.any()):
                a, c = _first(far)
                self.fail(
                    field,
                    f"row {start + a} has {float(x[a, c]):.6g} on channel {c}, "
                    f"{float(gap[a, c]):.6g} from the channel's mean {float(m.mean[c]):.6g}, but the "
                    f"co-moment allows a captured token at most {float(scale[c]):.6g}",
                )

    def plane_norms(
        self, tensors: dict[str, torch.Tensor], meta: StatsMeta, moments: dict[tuple[int, Kind], Moments]
    ) -> dict[int, PlaneNorms]:
        """Each layer's rotary-pair norm sums of queries and keys (``tensors``: the ``layer{L}.plane_norms.*``
        ones; none in a file written before they were recorded).

        Every captured layer has them or none does, and only a model with rotary planes. Each layer's
        ``count`` is ``meta.tokens``; ``query`` (H, planes) and ``key`` (G, planes) are float64 sums of
        norms: finite, never negative, zero without tokens. With keys captured, each key sum
        ``S₁ = Σ_t ‖k_m‖`` lies where the key moments' ``S₂ = Σ_t ‖k_m‖²`` put it: ``√S₂ ≤ S₁ ≤ √(n·S₂)``
        (Cauchy–Schwarz), up to rounding.
        """
        if not tensors:
            return {}
        layout = meta.layout
        planes = layout.rope.planes()
        if not planes:
            self.fail(
                f"tensor {min(tensors)}",
                "holds rotary-pair norms, but meta.layout.rope says the model has no rotary planes",
            )
        names = {f"layer{layer}.{_PLANE_NORMS}.{part}" for layer in meta.layers for part in _PLANE_PARTS}
        extra = sorted(set(tensors) - names)
        if extra:
            self.fail(
                f"tensor {extra[0]}",
                f"does not belong to meta.layers {meta.layers} (each captured layer L has "
                f"layer{{L}}.{_PLANE_NORMS}.count, .query and .key)",
            )
        missing = sorted(names - set(tensors))
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            self.fail(
                f"tensor {missing[0]}",
                f"is missing{more}; a capture keeps rotary-pair norms for every captured layer or for none",
            )
        shapes = {"query": (layout.num_heads, len(planes)), "key": (layout.num_kv_heads, len(planes))}
        out: dict[int, PlaneNorms] = {}
        for layer in meta.layers:
            name = f"layer{layer}.{_PLANE_NORMS}"
            prefix = f"tensor {name}"
            count = int(self.tensor(tensors, f"{name}.count", torch.int64, (1,))[0])
            if count != meta.tokens:
                self.fail(
                    f"{prefix}.count",
                    f"is {count}, but meta.tokens is {meta.tokens} (the norms are summed over the same "
                    "tokens as the moments)",
                )
            sums = {}
            for part, shape in shapes.items():
                heads = "query heads" if part == "query" else "KV heads"
                why = f" ({heads} × the rotary planes of meta.layout.rope)"
                t = self.tensor(tensors, f"{name}.{part}", torch.float64, shape, why)
                if bool((t < 0).any()):
                    at = _first(t < 0)
                    self.fail(
                        f"{prefix}.{part}",
                        f"has the negative entry {float(t[at]):.6g} at {at}; a sum of norms is never "
                        "negative",
                    )
                if count == 0 and bool(t.any()):
                    self.fail(f"{prefix}.{part}", "is not zero although no tokens were counted")
                sums[part] = t
            if "key" in meta.kinds:
                self.key_norm_bounds(f"{prefix}.key", sums["key"], moments[(layer, "key")], planes, count)
            out[layer] = PlaneNorms(count, sums["query"], sums["key"])
        return out

    def key_norm_bounds(
        self, field: str, sums: torch.Tensor, keys: Moments, planes: Sequence[tuple[int, int]], count: int
    ) -> None:
        """``√S₂ ≤ S₁ ≤ √(n·S₂)`` for every KV head and plane (see :meth:`plane_norms`)."""
        squares = torch.diagonal(keys.gram()).clamp_min(0).reshape(sums.shape[0], -1)
        a = torch.tensor([p for p, _ in planes], dtype=torch.long)
        b = torch.tensor([q for _, q in planes], dtype=torch.long)
        s2 = squares[:, a] + squares[:, b]
        low, high = s2.sqrt(), (count * s2).sqrt()
        below = sums < (1 - _RTOL) * low - _TINY
        above = sums > (1 + _RTOL) * high + _TINY
        for bad, bound, side in ((below, low, "below"), (above, high, "above")):
            if bool(bad.any()):
                g, m = _first(bad)
                self.fail(
                    field,
                    f"KV head {g}, plane {m}: the sum of norms {float(sums[g, m]):.6g} lies {side} "
                    f"{float(bound[g, m]):.6g}, which the key moments (layer's key m2 and mean) allow: a "
                    "sum of n norms lies between the root of their sum of squares and √n times it",
                )

    def same_tokens(self, kind: Kind, i: int, layer: int, joint: Moments, own: Moments) -> None:
        """Block ``i`` of the cross-layer moments of ``kind`` equals ``layer``'s own moments (same tokens)."""
        name, width = f"tensor cross.{kind}", own.channels
        block = slice(i * width, (i + 1) * width)
        where = (
            f"differs from layer{layer}.{kind} in its block of layer {layer} (both are over the same tokens)"
        )
        if joint.split_count != own.split_count:
            self.fail(f"{name}.split_count", f"{joint.split_count} {where}")
        scale = _scale(own.m2, own.mean, own.count)
        if bool(((joint.mean[block] - own.mean).abs() > _RTOL * scale / math.sqrt(max(own.count, 1))).any()):
            self.fail(f"{name}.mean", where)
        if bool(((joint.m2[block, block] - own.m2).abs() > _RTOL * torch.outer(scale, scale)).any()):
            self.fail(f"{name}.m2", where)
        if joint.norm_gram is not None and own.norm_gram is not None:
            for split in (0, 1):
                length = torch.diagonal(own.norm_gram[split]).sqrt()
                gap = (joint.norm_gram[split, block, block] - own.norm_gram[split]).abs()
                if bool((gap > _RTOL * torch.outer(length, length)).any()):
                    self.fail(f"{name}.norm_gram", f"(split {split}) {where}")

    def tensor(
        self,
        tensors: dict[str, torch.Tensor],
        name: str,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        why: str = "",
    ) -> torch.Tensor:
        t = tensors[name]
        if t.dtype != dtype or tuple(t.shape) != shape:
            want, got = str(dtype).removeprefix("torch."), str(t.dtype).removeprefix("torch.")
            self.fail(
                f"tensor {name}",
                f"must be {want} of shape {shape}{why}, but is {got} of shape {tuple(t.shape)}",
            )
        if dtype.is_floating_point and not bool(torch.isfinite(t).all()):
            self.fail(f"tensor {name}", f"holds NaN or infinite values (at {_first(~torch.isfinite(t))})")
        return t

    def one(
        self, tensors: dict[str, torch.Tensor], prefix: str, width: int, head_dim: int | None, tokens: int
    ) -> Moments:
        """The moments under ``prefix``: ``width`` channels (heads of ``head_dim``) over ``tokens``."""
        count = int(self.tensor(tensors, f"{prefix}.count", torch.int64, (1,))[0])
        if count != tokens:
            self.fail(
                f"tensor {prefix}.count",
                f"is {count}, but meta.tokens is {tokens} (every layer and kind counts the same tokens)",
            )
        why = " (the channels that meta.layout gives this kind" + (
            ", times the meta.cross_layers)" if prefix.startswith("cross.") else ")"
        )
        mean = self.tensor(tensors, f"{prefix}.mean", torch.float64, (width,), why)
        m2 = self.tensor(tensors, f"{prefix}.m2", torch.float64, (width, width), why)
        if count == 0 and (bool(mean.any()) or bool(m2.any())):
            self.fail(f"tensor {prefix}.mean/m2", "are not zero although no tokens were counted")
        self.comoment(f"tensor {prefix}.m2", m2, mean, count)
        if head_dim is not None:
            gram = self.tensor(tensors, f"{prefix}.norm_gram", torch.float64, (2, width, width), why)
            split_a, split_b = (
                int(v) for v in self.tensor(tensors, f"{prefix}.split_count", torch.int64, (2,))
            )
            if split_a < 0 or split_b < 0 or split_a + split_b != count:
                self.fail(
                    f"tensor {prefix}.split_count",
                    f"is ({split_a}, {split_b}), which are not two "
                    f"non-negative parts of the {count} tokens in {prefix}.count",
                )
            self.norm_gram(f"tensor {prefix}.norm_gram", gram, (split_a, split_b), head_dim)
        return Moments.from_tensors(tensors, prefix, head_dim)

    def comoment(self, field: str, m2: torch.Tensor, mean: torch.Tensor, count: int) -> None:
        """A co-moment ``Σ (x − μ)(x − μ)^T``: symmetric, non-negative variances, |m2_ab|² ≤ m2_aa·m2_bb.

        The rounding slack of each entry is relative to its channels' :func:`_scale`.
        """
        diag = torch.diagonal(m2)
        scale = _scale(m2, mean, count)
        negative = diag < -_RTOL * scale * scale
        if bool(negative.any()):
            (a,) = _first(negative)
            self.fail(
                field,
                f"has the negative variance {float(diag[a]):.6g} on channel {a}; a co-moment's "
                "diagonal is never negative",
            )
        self.pairs(field, m2, scale)

    def norm_gram(self, field: str, gram: torch.Tensor, splits: tuple[int, int], head_dim: int) -> None:
        """Grams of per-head unit vectors: each head's diagonal block sums to at most its split's tokens."""
        for split, tokens in enumerate(splits):
            g = gram[split]
            diag = torch.diagonal(g)
            if bool((diag < 0).any()):
                (a,) = _first(diag < 0)
                self.fail(
                    field,
                    f"split {split} has the negative entry {float(diag[a]):.6g} at ({a}, {a}) "
                    "of a sum of squares",
                )
            lengths = diag.reshape(-1, head_dim).sum(-1)
            too_long = lengths > tokens * (1 + _RTOL)
            if bool(too_long.any()):
                (head,) = _first(too_long)
                self.fail(
                    field,
                    f"split {split}: head {head} sums to {float(lengths[head]):.6g} over {tokens} "
                    "tokens (split_count), but the head vectors it sums are unit length, so at most "
                    f"{tokens}",
                )
            self.pairs(f"{field} (split {split})", g, diag.sqrt())

    def pairs(self, field: str, matrix: torch.Tensor, scale: torch.Tensor) -> None:
        """``matrix`` symmetric and ``|matrix_ab| ≤ scale_a·scale_b`` (Cauchy–Schwarz), up to rounding."""
        width = matrix.shape[-1]
        step = max(1, _CHUNK // max(width, 1))
        for start in range(0, width, step):
            rows = matrix[start : start + step]
            bound = scale[start : start + step, None] * scale[None, :]
            over = rows.abs() > (1 + _RTOL) * bound
            if bool(over.any()):
                a, b = _first(over)
                self.fail(
                    field,
                    f"entry ({start + a}, {b}) = {float(rows[a, b]):.6g} exceeds the geometric mean "
                    f"of its diagonal entries ({float(bound[a, b]):.6g}), which a Gram never does",
                )
            skew = (rows - matrix[:, start : start + step].T).abs() > _RTOL * bound
            if bool(skew.any()):
                a, b = _first(skew)
                self.fail(
                    field,
                    f"is not symmetric: entry ({start + a}, {b}) = {float(rows[a, b]):.6g} but "
                    f"({b}, {start + a}) = {float(matrix[b, start + a]):.6g}",
                )
