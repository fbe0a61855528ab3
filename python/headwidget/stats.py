"""``KVStats``: the per-layer key/value statistics of one model over a set of tokens.

Holds a :class:`~headwidget.moments.Moments` for every captured (layer, kind) — kinds ``"key"``
(pre-RoPE), ``"key_post"`` (post-RoPE), ``"value"``, ``"input"`` (the attention input) and ``"latent"``
(MLA) — plus optional cross-layer moments over a set of layers, and the metadata needed to interpret
them. Everything derived (correlations, head similarities) is computed on demand in float64.

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                   num_attention_heads=4, num_key_value_heads=2)
    >>> model = LlamaForCausalLM(cfg).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
    >>> stats.channel_corr(0, "key").shape, stats.head_similarity(1, "value").shape
    ((16, 16), (2, 2))
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from headwidget.core.kinds import KINDS, Kind, check_kind
from headwidget.core.layout import AttentionLayout, RopeLayout, mechanism_of
from headwidget.errors import (
    CrossLayerMissingError,
    LayerIndexError,
    StatsFileError,
    StatsMismatchError,
    UnknownKindError,
    UnknownMetricError,
)
from headwidget.files import NotRegularFileError, atomic_output
from headwidget.moments import HEAD_METRICS, Moments, channel_corr_from_moments, head_similarity_from_moments
from headwidget.moments.correlation import resolve_channels

__all__ = ["KVStats", "StatsMeta", "config_fingerprint"]

FORMAT = "headwidget-stats"
FORMAT_VERSION = "1"


@dataclass
class StatsMeta:
    """What was captured, from which model, and how."""

    model_name: str
    model_class: str
    layout: AttentionLayout
    layers: list[int]
    kinds: list[Kind]
    tokens: int = 0
    dtype: str = "float32"
    skip_first_token: bool = False
    cross_layers: list[int] | None = None
    config_fingerprint: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    # Convenience views of the layout -------------------------------------------------
    @property
    def family(self) -> str:
        return self.layout.family

    @property
    def mechanism(self) -> str:
        return self.layout.mechanism

    @property
    def num_heads(self) -> int:
        return self.layout.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.layout.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.layout.head_dim

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["layout"] = self.layout.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StatsMeta:
        data = dict(data)
        data["layout"] = AttentionLayout.from_json(data["layout"])
        return cls(**data)


def config_fingerprint(config: Any) -> str:
    """A short hash of a model config's architecture fields (what must agree for a merge)."""
    try:
        raw = config.to_dict()
    except AttributeError:
        raw = dict(vars(config))
    keep = {k: v for k, v in raw.items() if not k.startswith("_") and k not in ("transformers_version",)}
    text = json.dumps(keep, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class KVStats:
    """Streaming key/value statistics of one model (see the module docstring)."""

    def __init__(
        self,
        meta: StatsMeta,
        moments: dict[tuple[int, Kind], Moments],
        cross: dict[Kind, Moments] | None = None,
    ) -> None:
        self.meta = meta
        self._moments = moments
        self._cross = cross or {}

    # ------------------------------------------------------------------ access
    @property
    def layers(self) -> list[int]:
        return list(self.meta.layers)

    @property
    def kinds(self) -> list[Kind]:
        return list(self.meta.kinds)

    @property
    def tokens(self) -> int:
        return self.meta.tokens

    def _check_layer(self, layer: int) -> int:
        if not isinstance(layer, (int, np.integer)) or isinstance(layer, bool):
            raise LayerIndexError(f"layer must be an int, got {type(layer).__name__}")
        n = self.meta.layout.num_layers
        layer = int(layer)
        if layer < 0:
            layer += n
        if not 0 <= layer < n:
            raise LayerIndexError(f"layer {layer} is out of range: the model has {n} layers (0..{n - 1})")
        if layer not in self.meta.layers:
            raise LayerIndexError(
                f"layer {layer} was not captured (captured: {self.meta.layers}); "
                f"capture again with layers=[..., {layer}]"
            )
        return layer

    def _check_kind(self, name: str) -> Kind:
        kind = check_kind(name)
        if kind not in self.meta.kinds:
            hint = {
                "key_post": "capture with rope='post' or rope='both'",
                "input": "capture with inputs=True",
                "latent": "only MLA (DeepSeek) models have a latent",
            }.get(kind, "")
            raise UnknownKindError(
                f"kind {kind!r} was not captured (captured: {', '.join(self.meta.kinds)})"
                + (f"; {hint}" if hint else "")
            )
        return kind

    def moments(self, layer: int, kind: Kind = "key") -> Moments:
        """The raw float64 moments of one layer and kind."""
        return self._moments[(self._check_layer(layer), self._check_kind(kind))]

    def heads_of(self, kind: Kind) -> int:
        hd = self.meta.layout.head_dim_of(kind)
        return self.meta.layout.channels_of(kind) // hd if hd else 1

    # ------------------------------------------------------------------ derived views
    def channel_corr(
        self, layer: int, kind: Kind = "key", channels: slice | range | list[int] | None = None
    ) -> np.ndarray:
        """Pearson correlation between channels (HF head-major order, ``c = head·d_h + j``).

        Equal to ``np.corrcoef(X[:, channels].T)`` over the captured tokens; NaN where a channel
        has zero variance. ``channels`` is a slice, range or list of channel indices.
        """
        return channel_corr_from_moments(self.moments(layer, kind), channels).cpu().numpy()

    def covariance(
        self, layer: int, kind: Kind = "key", channels: slice | range | list[int] | None = None
    ) -> np.ndarray:
        """Sample covariance (ddof=1, as ``np.cov``) of the channels of one layer and kind."""
        m = self.moments(layer, kind)
        sel = resolve_channels(channels, m.channels)
        return m.covariance()[sel][:, sel].cpu().numpy()

    def mean(self, layer: int, kind: Kind = "key") -> np.ndarray:
        return self.moments(layer, kind).mean.cpu().numpy()

    def head_moments(self, layers: int | Sequence[int], kind: Kind = "key") -> Moments:
        """Moments over the heads of one layer, or of several layers flattened layer-major.

        Several layers need the cross-layer statistics (``capture(..., cross_layer=[...])``).
        """
        self._check_kind(kind)
        if isinstance(layers, (int, np.integer)):
            return self.moments(int(layers), kind)
        layers = [self._check_layer(layer) for layer in layers]
        if len(layers) == 1:
            return self.moments(layers[0], kind)
        cross = self.meta.cross_layers or []
        missing = [layer for layer in layers if layer not in cross]
        if missing or kind not in self._cross:
            raise CrossLayerMissingError(
                f"comparing heads across layers {layers} needs cross-layer statistics for "
                f"kind {kind!r}, but layers {missing or layers} were not in cross_layer "
                f"(captured cross_layer={cross or None}); capture with cross_layer={layers}"
            )
        width = self.meta.layout.channels_of(kind)
        index = torch.cat([torch.arange(width) + cross.index(layer) * width for layer in layers])
        return self._cross[kind].select(index)

    def head_similarity(
        self, layer: int | Sequence[int], kind: Kind = "key", metric: str = "token_cosine"
    ) -> np.ndarray:
        """Head × head similarity over the real KV heads (never GQA copies).

        ``metric``: ``"token_cosine"`` (mean per-token cosine), ``"cosine"`` (Frobenius cosine),
        ``"pearson"`` (centred Frobenius cosine) or ``"cka"`` (linear CKA). A list of layers gives
        the flattened (layer, head) set, layer-major (index = position·G + g).
        """
        if metric not in HEAD_METRICS:
            raise UnknownMetricError(f"unknown metric {metric!r}; choose one of {', '.join(HEAD_METRICS)}")
        if self.meta.layout.head_dim_of(kind) is None:
            raise UnknownKindError(f"kind {kind!r} is not split into heads; use 'key' or 'value'")
        return head_similarity_from_moments(self.head_moments(layer, kind), metric).cpu().numpy()

    # ------------------------------------------------------------------ combination
    def _compatibility_problems(self, other: KVStats) -> list[str]:
        a, b = self.meta, other.meta
        problems = []
        for name in ("model_class", "config_fingerprint", "layers", "kinds", "skip_first_token",
                     "cross_layers"):  # fmt: skip
            if getattr(a, name) != getattr(b, name):
                problems.append(f"{name}: {getattr(a, name)!r} vs {getattr(b, name)!r}")
        return problems

    def merge(self, other: KVStats) -> KVStats:
        """Statistics of both token sets together (exact: Chan et al.'s pairwise merge)."""
        if not isinstance(other, KVStats):
            raise TypeError(f"can only merge KVStats with KVStats, not {type(other).__name__}")
        problems = self._compatibility_problems(other)
        if problems:
            raise StatsMismatchError(
                "cannot merge statistics of different captures: "
                + "; ".join(problems)
                + ". Capture both with the same model and the same layers/rope/inputs/cross_layer options."
            )
        moments = {key: m.merge(other._moments[key]) for key, m in self._moments.items()}
        cross = {kind: m.merge(other._cross[kind]) for kind, m in self._cross.items()}
        meta = replace(self.meta, tokens=self.meta.tokens + other.meta.tokens)
        return KVStats(meta, moments, cross)

    __add__ = merge

    def to(self, device: torch.device | str) -> KVStats:
        """A copy with every accumulator on ``device``."""
        return KVStats(
            replace(self.meta),
            {k: m.to(device) for k, m in self._moments.items()},
            {k: m.to(device) for k, m in self._cross.items()},
        )

    def all_reduce(self, group: object = None) -> KVStats:
        """Sum statistics over the ranks of ``torch.distributed`` (data-parallel capture), in place.

        Every rank must have captured the same layers and kinds; afterwards every rank holds the
        statistics of all ranks' tokens. Returns ``self``.
        """
        for key in sorted(self._moments):
            self._moments[key].all_reduce(group)
        for kind in sorted(self._cross):
            self._cross[kind].all_reduce(group)
        total = self._moments[next(iter(sorted(self._moments)))].count if self._moments else 0
        self.meta.tokens = int(total)
        return self

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the statistics as safetensors (tensors) with JSON metadata; never pickle.

        The write is atomic (see :mod:`headwidget.files`): the file at ``path`` is either the old one or
        the complete new one, a symlink at ``path`` keeps pointing to the file that gets the content, and
        an existing file keeps its permissions. A ``path`` that is a directory, FIFO or device, a missing
        or read-only directory, or a full disk raise :class:`~headwidget.errors.StatsFileError` naming
        ``path``; nothing is left behind.

        Example:
            >>> import pathlib, shutil, tempfile
            >>> stats = KVStats(StatsMeta("demo", "Demo", AttentionLayout("demo", "mha", 1, 1, 1, 2, 2, 2),
            ...                           layers=[0], kinds=["value"]),
            ...                 {(0, "value"): Moments.empty(2, head_dim=2)})
            >>> folder = pathlib.Path(tempfile.mkdtemp())
            >>> KVStats.load(stats.save(folder / "demo.safetensors")).kinds
            ['value']
            >>> stats.save(folder)
            Traceback (most recent call last):
            ...
            headwidget.errors.StatsFileError: cannot save statistics: ... is a directory, not a regular ...
            >>> shutil.rmtree(folder)
        """
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        for (layer, kind), m in sorted(self._moments.items()):
            tensors.update(m.to_tensors(f"layer{layer}.{kind}"))
        for kind, m in sorted(self._cross.items()):
            tensors.update(m.to_tensors(f"cross.{kind}"))
        header = {"format": FORMAT, "format_version": FORMAT_VERSION,
                  "meta": json.dumps(self.meta.to_json())}  # fmt: skip
        path = Path(path)
        try:
            with atomic_output(path) as tmp:
                save_file(tensors, str(tmp), metadata=header)
        except NotRegularFileError as err:
            raise StatsFileError(f"cannot save statistics: {err}") from err
        except OSError as err:
            raise StatsFileError(f"cannot save statistics to {path}: {err.strerror or err}") from err
        except SafetensorError as err:  # the writer's own I/O error (a full disk...)
            raise StatsFileError(
                f"cannot save statistics to {path}: {err}; check the free space and that the "
                "directory is writable"
            ) from err
        return path

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu") -> KVStats:
        """Read statistics written by :meth:`save`, checking that every number in the file can be true.

        Besides the safetensors syntax, every metadata field is checked for its type and range and
        against the others (layers within the model and unique, known kinds, cross-layer layers among
        the captured ones, head counts that divide, RoPE dims within a head), and every tensor for its
        dtype, shape (from the layout), finiteness and meaning: counts equal to ``meta.tokens``, token
        splits adding up to them, co-moments symmetric with non-negative variances and no entry
        above the geometric mean of its variances, normalised Grams at most one per token and head.
        Cross-layer moments must agree with each layer's own. Any problem raises
        :class:`~headwidget.errors.StatsFileError` naming the file and the field.

        Example:
            >>> import json, pathlib, shutil, tempfile
            >>> from safetensors import safe_open
            >>> from safetensors.torch import load_file, save_file
            >>> stats = KVStats(StatsMeta("demo", "Demo", AttentionLayout("demo", "mha", 1, 1, 1, 2, 2, 2),
            ...                           layers=[0], kinds=["value"]),
            ...                 {(0, "value"): Moments.empty(2, head_dim=2)})
            >>> folder = pathlib.Path(tempfile.mkdtemp())
            >>> path = stats.save(folder / "demo.safetensors")
            >>> with safe_open(str(path), "pt") as fh:
            ...     header = fh.metadata()
            >>> meta = json.loads(header["meta"]) | {"tokens": "12"}  # a count that is a string
            >>> save_file(load_file(str(path)), str(path), {**header, "meta": json.dumps(meta)})
            >>> KVStats.load(path)
            Traceback (most recent call last):
            ...
            headwidget.errors.StatsFileError: ...: meta.tokens must be an integer, not the string '12'; ...
            >>> shutil.rmtree(folder)
        """
        path = Path(path)
        if not path.exists():
            raise StatsFileError(f"no statistics file at {path}")
        if not path.is_file():
            raise StatsFileError(
                f"{path} is not a regular file (a directory, FIFO or device?); statistics files are "
                "written by KVStats.save()"
            )
        header, tensors = _read_safetensors(path)
        check = _FileCheck(path)
        meta = check.header(header)
        moments, cross = check.moments(tensors, meta)
        if torch.device(device) != torch.device("cpu"):
            moments = {key: m.to(device) for key, m in moments.items()}
            cross = {kind: m.to(device) for kind, m in cross.items()}
        return cls(meta, moments, cross)

    # ------------------------------------------------------------------ display
    def summary(self) -> list[dict[str, Any]]:
        """One row per captured layer: mean |channel correlation| of K and V and head similarity."""
        rows = []
        for layer in self.meta.layers:
            row: dict[str, Any] = {"layer": layer}
            for kind in ("key", "value"):
                if kind not in self.meta.kinds:
                    continue
                rho = self.channel_corr(layer, kind)
                off = rho[~np.eye(len(rho), dtype=bool)]
                row[f"{kind}_abs_corr"] = float(np.nanmean(np.abs(off))) if off.size else float("nan")
                sim = self.head_similarity(layer, kind, "token_cosine")
                offh = sim[~np.eye(len(sim), dtype=bool)]
                row[f"{kind}_head_cos"] = float(np.nanmean(offh)) if offh.size else float("nan")
            rows.append(row)
        return rows

    def __repr__(self) -> str:
        m = self.meta
        lay = m.layout
        return (
            f"KVStats({m.model_name or m.model_class}: {lay.family}/{lay.mechanism}, "
            f"{len(m.layers)} of {lay.num_layers} layers, H={lay.num_heads} G={lay.num_kv_heads} "
            f"d_h={lay.head_dim}, kinds={m.kinds}, tokens={m.tokens})"
        )


# ---------------------------------------------------------------------- reading and checking files
#: Relative slack for rounding: float32 Grams folded into float64 sums are off by well under 1e-4.
_RTOL = 1e-3
#: Relative float32 rounding of a batch mean (the shift a streaming update centres on), generously.
_MEAN_EPS = 1e-6
#: Matrix entries checked at a time, which bounds the checks' temporary memory.
_CHUNK = 1 << 22
_MECHANISMS = ("mha", "gqa", "mqa", "mla")
_PAIRINGS = ("half", "interleaved", "none")
_REPAIR = (
    "the file was damaged or edited after KVStats.save() wrote it; capture the statistics again or "
    "restore the file from a copy"
)


def _read_safetensors(path: Path) -> tuple[dict[str, str] | None, dict[str, torch.Tensor]]:
    """The header metadata and every tensor (on the CPU) of a safetensors file, read in one opening."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            header = fh.metadata()
            tensors = {name: fh.get_tensor(name) for name in fh.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError, TypeError, RuntimeError, OverflowError) as err:
        raise StatsFileError(
            f"{path} is not a readable safetensors file ({err}); statistics files are written by "
            "KVStats.save()"
        ) from err
    return header, tensors


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _describe(value: object) -> str:
    """A JSON value as a message shows it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value)
        return f"the number {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(value, str):
        text = repr(value)
        return f"the string {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return "an object"


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


class _FileCheck:
    """Builds the contents of one statistics file, refusing every value that cannot be true.

    Each problem raises :class:`StatsFileError` naming the file and the field (``meta.layout.head_dim``,
    ``tensor layer0.key.m2``...).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field: str, problem: str) -> NoReturn:
        raise StatsFileError(f"{self.path} is corrupt or incomplete: {field} {problem}; {_REPAIR}")

    # ------------------------------------------------------------------ JSON values
    def integer(self, value: object, field: str, low: int | None = None, high: int | None = None) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(field, f"must be an integer, not {_describe(value)}")
        if (low is not None and value < low) or (high is not None and value > high):
            allowed = f">= {low}" if high is None else f"{low}..{high}"
            self.fail(field, f"is {value}, outside the allowed {allowed}")
        return value

    def string(self, value: object, field: str, choices: Sequence[str] | None = None) -> str:
        if not isinstance(value, str):
            self.fail(field, f"must be a string, not {_describe(value)}")
        if choices is not None and value not in choices:
            self.fail(field, f"is {value!r}; it must be one of {', '.join(map(repr, choices))}")
        return value

    def boolean(self, value: object, field: str) -> bool:
        if not isinstance(value, bool):
            self.fail(field, f"must be true or false, not {_describe(value)}")
        return value

    def obj(
        self, value: object, field: str, required: Sequence[str], optional: Sequence[str]
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(field, f"must be an object, not {_describe(value)}")
        unknown = sorted(set(value) - {*required, *optional})
        if unknown:
            self.fail(field, f"has unknown fields {unknown} (known: {', '.join([*required, *optional])})")
        for key in required:
            if key not in value:
                self.fail(f"{field}.{key}", "is missing")
        return value

    def layer_list(self, value: object, field: str, num_layers: int, min_len: int) -> list[int]:
        if not isinstance(value, list):
            self.fail(field, f"must be a list of layer indices, not {_describe(value)}")
        if len(value) < min_len:
            self.fail(field, f"lists {len(value)} layers; it needs at least {min_len}")
        layers = [
            self.integer(item, f"{field}[{i}]", 0, num_layers - 1) for i, item in enumerate(value)
        ]  # the range is the model's layers, meta.layout.num_layers
        seen: set[int] = set()
        for layer in layers:
            if layer in seen:
                self.fail(field, f"lists layer {layer} twice")
            seen.add(layer)
        return layers

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
        try:
            data = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        except RecursionError:
            self.fail("header field meta", "is nested too deeply to be statistics metadata")
        except ValueError as err:
            self.fail("header field meta", f"is not valid JSON ({err})")
        return self.meta(data)

    def meta(self, data: object) -> StatsMeta:
        obj = self.obj(
            data,
            "meta",
            ("model_name", "model_class", "layout", "layers", "kinds", "tokens"),
            ("dtype", "skip_first_token", "cross_layers", "config_fingerprint", "versions"),
        )
        layout = self.layout(obj["layout"])
        layers = self.layer_list(obj["layers"], "meta.layers", layout.num_layers, min_len=1)
        kinds = self.kinds(obj["kinds"], layout)
        cross = obj.get("cross_layers")
        if cross is not None:
            cross = self.layer_list(cross, "meta.cross_layers", layout.num_layers, min_len=2)
            outside = [layer for layer in cross if layer not in layers]
            if outside:
                self.fail("meta.cross_layers", f"names layers {outside} that are not in meta.layers {layers}")
        dtype = self.string(obj.get("dtype", "float32"), "meta.dtype")
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            self.fail("meta.dtype", f"is {dtype!r}, which is not a torch dtype such as 'float32'")
        versions = obj.get("versions", {})
        if not isinstance(versions, dict) or not all(isinstance(v, str) for v in versions.values()):
            self.fail(
                "meta.versions", f"must map package names to version strings, not {_describe(versions)}"
            )
        return StatsMeta(
            model_name=self.string(obj["model_name"], "meta.model_name"),
            model_class=self.string(obj["model_class"], "meta.model_class"),
            layout=layout,
            layers=layers,
            kinds=kinds,
            tokens=self.integer(obj["tokens"], "meta.tokens", 0),
            dtype=dtype,
            skip_first_token=self.boolean(obj.get("skip_first_token", False), "meta.skip_first_token"),
            cross_layers=cross,
            config_fingerprint=self.string(obj.get("config_fingerprint", ""), "meta.config_fingerprint"),
            versions=dict(versions),
        )

    def kinds(self, value: object, layout: AttentionLayout) -> list[Kind]:
        if not isinstance(value, list) or not value:
            self.fail("meta.kinds", f"must be a non-empty list of kinds, not {_describe(value)}")
        kinds = [check_kind(self.string(k, f"meta.kinds[{i}]", KINDS)) for i, k in enumerate(value)]
        for i, kind in enumerate(kinds):
            if kind in kinds[:i]:
                self.fail("meta.kinds", f"lists {kind!r} twice")
        if "latent" in kinds and layout.latent_dim is None:
            self.fail("meta.kinds", "lists 'latent' but meta.layout.latent_dim is null")
        return kinds

    def layout(self, value: object) -> AttentionLayout:
        f = "meta.layout"
        obj = self.obj(
            value,
            f,
            (
                "family",
                "mechanism",
                "num_layers",
                "num_heads",
                "num_kv_heads",
                "head_dim",
                "value_head_dim",
                "hidden_size",
            ),
            ("rope", "latent_dim"),
        )
        family = self.string(obj["family"], f"{f}.family")
        mechanism = self.string(obj["mechanism"], f"{f}.mechanism", _MECHANISMS)
        num_layers = self.integer(obj["num_layers"], f"{f}.num_layers", 1)
        heads = self.integer(obj["num_heads"], f"{f}.num_heads", 1)
        kv = self.integer(obj["num_kv_heads"], f"{f}.num_kv_heads", 1, heads)
        if heads % kv:
            self.fail(f"{f}.num_kv_heads", f"is {kv}, which does not divide num_heads ({heads})")
        head_dim = self.integer(obj["head_dim"], f"{f}.head_dim", 1)
        value_head_dim = self.integer(obj["value_head_dim"], f"{f}.value_head_dim", 1)
        hidden = self.integer(obj["hidden_size"], f"{f}.hidden_size", 1)
        latent = obj.get("latent_dim")
        if latent is not None:
            latent = self.integer(latent, f"{f}.latent_dim", 1)
        if (mechanism == "mla") != (latent is not None):
            self.fail(
                f"{f}.latent_dim",
                f"is {_describe(latent)}, but only an 'mla' model (here {mechanism!r}) has a latent",
            )
        if mechanism != "mla" and mechanism != mechanism_of(heads, kv):
            self.fail(
                f"{f}.mechanism",
                f"is {mechanism!r}, but {heads} heads over {kv} KV heads make it {mechanism_of(heads, kv)!r}",
            )
        return AttentionLayout(
            family=family,
            mechanism=mechanism,
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            value_head_dim=value_head_dim,
            hidden_size=hidden,
            rope=self.rope(obj.get("rope", {}), head_dim),
            latent_dim=latent,
        )

    def rope(self, value: object, head_dim: int) -> RopeLayout:
        f = "meta.layout.rope"
        obj = self.obj(value, f, (), ("pairing", "rotary_dim", "offset", "post_pairing"))
        pairing = self.string(obj.get("pairing", "none"), f"{f}.pairing", _PAIRINGS)
        rotary = self.integer(obj.get("rotary_dim", 0), f"{f}.rotary_dim", 0, head_dim)
        # the rotated dims offset .. offset + rotary_dim lie inside a head
        offset = self.integer(obj.get("offset", 0), f"{f}.offset", 0, head_dim - rotary)
        post = obj.get("post_pairing")
        if post is not None:
            post = self.string(post, f"{f}.post_pairing", _PAIRINGS)
        if pairing == "none" and (rotary, offset, post) != (0, 0, None):
            self.fail(
                f"{f}.pairing",
                f"is 'none' (no RoPE), but rotary_dim={rotary}, offset={offset}, post_pairing={post!r}",
            )
        return RopeLayout(pairing=pairing, rotary_dim=rotary, offset=offset, post_pairing=post)

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
