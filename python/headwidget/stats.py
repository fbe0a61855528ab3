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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headwidget.core.kinds import Kind, check_kind
from headwidget.core.layout import AttentionLayout
from headwidget.errors import (
    CrossLayerMissingError,
    LayerIndexError,
    StatsFileError,
    StatsMismatchError,
    UnknownKindError,
    UnknownMetricError,
)
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
        """Write the statistics as safetensors (tensors) with JSON metadata; never pickle."""
        from safetensors.torch import save_file

        tensors: dict[str, torch.Tensor] = {}
        for (layer, kind), m in sorted(self._moments.items()):
            tensors.update(m.to_tensors(f"layer{layer}.{kind}"))
        for kind, m in sorted(self._cross.items()):
            tensors.update(m.to_tensors(f"cross.{kind}"))
        header = {"format": FORMAT, "format_version": FORMAT_VERSION,
                  "meta": json.dumps(self.meta.to_json())}  # fmt: skip
        path = Path(path)
        save_file(tensors, str(path), metadata=header)
        return path

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu") -> KVStats:
        """Read statistics written by :meth:`save`."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file, safe_open

        path = Path(path)
        if not path.is_file():
            raise StatsFileError(f"no statistics file at {path}")
        try:
            with safe_open(str(path), framework="pt") as fh:
                header = fh.metadata() or {}
            tensors = load_file(str(path), device=str(device))
        except (SafetensorError, OSError, ValueError) as err:
            raise StatsFileError(
                f"{path} is not a readable safetensors file ({err}); statistics files are written "
                "by KVStats.save()"
            ) from err
        if header.get("format") != FORMAT:
            raise StatsFileError(f"{path} is a safetensors file but was not written by headwidget")
        try:
            meta = StatsMeta.from_json(json.loads(header["meta"]))
            layout = meta.layout
            moments = {
                (layer, kind): Moments.from_tensors(tensors, f"layer{layer}.{kind}", layout.head_dim_of(kind))
                for layer in meta.layers
                for kind in meta.kinds
            }
            cross = {}
            if meta.cross_layers:
                for kind in meta.kinds:
                    if f"cross.{kind}.mean" in tensors:
                        cross[kind] = Moments.from_tensors(tensors, f"cross.{kind}", layout.head_dim_of(kind))
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as err:
            raise StatsFileError(f"{path} is corrupt or incomplete: {err}") from err
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
