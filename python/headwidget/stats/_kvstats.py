"""``KVStats``: every captured (layer, kind)'s moments, the cross-layer moments, and what follows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from headwidget.checks import flag
from headwidget.core.kinds import Kind, check_kind
from headwidget.core.ranks import rank_differences
from headwidget.errors import (
    CrossLayerMissingError,
    LayerIndexError,
    MissingStatisticsError,
    StatsMismatchError,
    UnknownKindError,
    UnknownMetricError,
)
from headwidget.moments import (
    HEAD_METRICS,
    Moments,
    channel_corr_from_moments,
    head_similarity_from_moments,
    off_diagonal_mean,
)
from headwidget.moments.correlation import resolve_channels
from headwidget.stats._file import read_stats, write_stats
from headwidget.stats._meta import StatsMeta
from headwidget.stats._plane_norms import PlaneNorms
from headwidget.stats._samples import NoSamplesError, SamplePart, all_reduce_samples, merge_samples

__all__ = ["KVStats"]


#: What two statistics must share to be merged or summed over ranks: the tensors they hold.
_LAYOUT = ("model_class", "config_fingerprint", "layers", "kinds", "skip_first_token", "cross_layers")


class KVStats:
    """Streaming key/value statistics of one model: moments per captured (layer, kind).

    Everything derived (correlations, head similarities) is computed on demand in float64.

    Example:
        >>> import torch, headwidget
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        ...                   num_attention_heads=4, num_key_value_heads=2)
        >>> stats = headwidget.capture(LlamaForCausalLM(cfg).eval(), torch.randint(0, 64, (2, 16)),
        ...                            inputs=True, samples=16, progress=False)
        >>> stats.channel_corr(0, "key").shape, stats.head_similarity(1, "value").shape, stats.tokens
        ((16, 16), (2, 2), 32)
        >>> stats.samples(1, "value").shape, stats.samples(0, "key").dtype
        (torch.Size([16, 16]), torch.float32)
        >>> norms = stats.plane_norms(0)
        >>> tuple(norms.query_mean().shape), tuple(norms.key_mean().shape), norms.count
        ((4, 4), (2, 4), 32)
        >>> sorted(stats.summary()[0])
        ['key_abs_corr', 'key_head_cos', 'layer', 'value_abs_corr', 'value_head_cos']
        >>> sorted(stats.summary("pearson", channels=False)[0])
        ['key_head_cos', 'layer', 'value_head_cos']
    """

    def __init__(
        self,
        meta: StatsMeta,
        moments: dict[tuple[int, Kind], Moments],
        cross: dict[Kind, Moments] | None = None,
        samples: dict[tuple[int, Kind], torch.Tensor] | None = None,
        plane_norms: dict[int, PlaneNorms] | None = None,
    ) -> None:
        self.meta = meta
        self._moments = moments
        self._cross = cross or {}
        self._samples = samples or {}
        self._plane_norms = plane_norms or {}

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

    def samples(self, layer: int, kind: Kind = "key") -> torch.Tensor:
        """The uniform sample of real token rows of one layer and kind: ``(min(R, N), C)`` float32.

        Kept by ``capture(..., samples=R)``: ``R`` of the ``N`` token rows that entered the moments
        (never padding, never a skipped first token), every ``R``-subset of them equally likely, in a
        random order, on the layer's device. All (layer, kind)s hold the same tokens in the same
        order. The tensor is the stored one: clone it before changing it.

        Raises:
            NoSamplesError: the statistics were captured without ``samples=R``.
        """
        key = (self._check_layer(layer), self._check_kind(kind))
        if self.meta.sample_size == 0 or key not in self._samples:
            raise NoSamplesError(
                "these statistics hold no token samples: capture with samples=R (for example "
                "samples=4096) to keep a uniform sample of R token rows per layer and kind"
            )
        return self._samples[key]

    def plane_norms(self, layer: int) -> PlaneNorms:
        """Token sums of every rotary pair's 2-norm of the queries and keys of one layer.

        Kept by ``capture(..., inputs=True)`` for models with rotary embeddings whose adapter gives
        the queries: ``query`` (H, planes) and ``key`` (G, planes) sums over the captured tokens, planes
        in the order of ``meta.layout.rope.planes()`` (see :mod:`headwidget.stats._plane_norms`). They are
        what ``rope:r`` ranks the rotary pairs by. The tensors are the stored ones: clone before changing.

        Raises:
            MissingStatisticsError: the statistics hold none (captured without ``inputs=True``, of a
                model without rotary embeddings, or by a headwidget that did not record them).
        """
        layer = self._check_layer(layer)
        norms = self._plane_norms.get(layer)
        if norms is None:
            if not self.meta.layout.rope.uses_rope:
                why = "the model has no rotary embeddings"
            elif "input" not in self.meta.kinds:
                why = "they were captured without inputs=True"
            elif not self._plane_norms:
                why = (
                    "the capture recorded none: a headwidget from before they were recorded, a merge with "
                    "statistics without them, or a model family whose adapter gives no queries"
                )
            else:
                why = f"layer {layer} has none"
            raise MissingStatisticsError(
                f"these statistics hold no per-pair query/key norms for layer {layer} ({why}); capture "
                "again with inputs=True (headwidget.capture(model, texts, inputs=True), or `headwidget "
                "capture --inputs`) to record them"
            )
        return norms

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
        """Moments over the heads of one layer, or of several layers flattened layer-major (the stored
        ones, or views of them for consecutive cross layers: never change them).

        Several layers need the cross-layer statistics (``capture(..., cross_layer=[...])``).
        """
        self._check_kind(kind)
        if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
            return self.moments(int(layers), kind)
        if isinstance(layers, (str, bytes, bool)) or not isinstance(layers, Iterable):
            raise LayerIndexError(f"layers must be a layer or a list of layers, got {layers!r}")
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
        positions = [cross.index(layer) for layer in layers]
        first = positions[0]
        if positions == list(range(first, first + len(positions))):  # consecutive: views, no copy
            return self._cross[kind].window(first * width, (first + len(positions)) * width)
        index = torch.cat([torch.arange(width) + p * width for p in positions])
        return self._cross[kind].select(index)

    def cross_moments(self, kind: Kind = "key") -> tuple[Moments, list[int]]:
        """The joint moments of every cross layer for ``kind`` (the stored ones, not a copy: never change
        them) and the cross layers, in the order their channels are stacked (layer-major).

        Raises:
            CrossLayerMissingError: the statistics hold no cross-layer moments of ``kind``.
        """
        kind = self._check_kind(kind)
        cross = list(self.meta.cross_layers or [])
        if kind not in self._cross or not cross:
            raise CrossLayerMissingError(
                f"these statistics hold no cross-layer moments of kind {kind!r} (captured cross_layer="
                f"{cross or None}); capture with cross_layer=True, or a list of the layers to compare"
            )
        return self._cross[kind], cross

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
        for name in _LAYOUT:
            if getattr(a, name) != getattr(b, name):
                problems.append(f"{name}: {getattr(a, name)!r} vs {getattr(b, name)!r}")
        mine, theirs = a.weights_fingerprint, b.weights_fingerprint
        if mine is not None and theirs is not None and mine != theirs:
            problems.append(
                f"weights_fingerprint: {mine!r} vs {theirs!r} (statistics of different weights, such as "
                "a base model's and its fine-tune's)"
            )
        return problems

    def merge(self, other: KVStats) -> KVStats:
        """Statistics of both token sets together (exact: Chan et al.'s pairwise merge).

        Token samples merge into a uniform sample of the union, of the smaller of the two sample
        sizes (none when either side has none): see :mod:`headwidget.stats._samples`. The merge's
        draw is seeded by both sides' seeds and token counts, so it is reproducible. Statistics of
        different weights (``meta.weights_fingerprint``) do not merge; with one side's weights unknown
        (a file of an older version) the merge's are unknown too.
        """
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
        # plane norms only where both sides hold them (statistics of an older capture hold none)
        planes = {
            layer: n.merge(other._plane_norms[layer])
            for layer, n in self._plane_norms.items()
            if layer in other._plane_norms
        }
        size = min(self.meta.sample_size, other.meta.sample_size)
        samples: dict[tuple[int, Kind], torch.Tensor] = {}
        seed = 0
        if size:
            parts = [SamplePart(s._samples, s.meta.tokens, s.meta.sample_seed) for s in (self, other)]
            samples, seed = merge_samples(parts, size)
        meta = replace(
            self.meta, tokens=self.meta.tokens + other.meta.tokens, sample_size=size, sample_seed=seed
        )
        if other.meta.weights_fingerprint != meta.weights_fingerprint:  # one side unknown
            meta.weights_fingerprint = None
        return KVStats(meta, moments, cross, samples, planes)

    __add__ = merge

    def to(self, device: torch.device | str) -> KVStats:
        """A copy with every accumulator and token sample on ``device``."""
        return KVStats(
            replace(self.meta),
            {k: m.to(device) for k, m in self._moments.items()},
            {k: m.to(device) for k, m in self._cross.items()},
            {k: s.to(device) for k, s in self._samples.items()},
            {layer: n.to(device) for layer, n in self._plane_norms.items()},
        )

    def all_reduce(self, group: object = None) -> KVStats:
        """Sum statistics over the ranks of ``torch.distributed`` (data-parallel capture), in place.

        Every rank must have captured the same layers and kinds; afterwards every rank holds the
        statistics of all ranks' tokens. Token samples become one uniform sample of all ranks' tokens
        (the same on every rank, of the smallest rank's sample size; draw each rank's with its own
        ``sample_seed``, such as the rank, so that their picks are independent). Ranks whose statistics
        hold other tensors (other layers, kinds, cross layers or first-token rule) or come from other
        weights (``meta.weights_fingerprint``) raise :class:`~headwidget.errors.StatsMismatchError`,
        every one of them, before anything is summed; with one rank's weights unknown the result's are
        unknown too. Returns ``self``.

        The sums equal one capture of all the ranks' batches; the two token splits of the normalised
        Grams (fitted on one, scored on the other) are drawn per batch by each rank from its own batch
        numbers, so each is a split of all the tokens, but not the one capture's: held-out alignment
        scores differ from it as another split's would (by 0.07–0.10 on 107 tokens of a tiny model).
        """
        self._check_layouts(group)
        self.meta.weights_fingerprint = self._all_reduce_fingerprint(group)
        samples, seed, size = all_reduce_samples(
            self._samples, self.meta.tokens, self.meta.sample_seed, self.meta.sample_size, group
        )
        self._samples, self.meta.sample_seed, self.meta.sample_size = samples, seed, size
        for key in sorted(self._moments):
            self._moments[key].all_reduce(group)
        for kind in sorted(self._cross):
            self._cross[kind].all_reduce(group)
        for layer in sorted(self._plane_norms):
            self._plane_norms[layer].all_reduce(group)
        total = self._moments[next(iter(sorted(self._moments)))].count if self._moments else 0
        self.meta.tokens = int(total)
        return self

    def _check_layouts(self, group: object) -> None:
        """Refuse, on every rank at once, ranks whose statistics hold other tensors (other layers, kinds,
        cross layers, first-token rule or model): summed, they would give numbers of no capture, or
        wait on each other forever."""
        import torch.distributed as dist

        layout: dict[str, object] = {name: getattr(self.meta, name) for name in _LAYOUT}
        layout["plane_norms"] = sorted(self._plane_norms)
        differ = rank_differences(layout, dist.get_world_size(cast(Any, group)), group)
        if differ is not None:
            raise StatsMismatchError(
                f"cannot all_reduce statistics of different captures: {differ}. Capture every rank with the "
                "same model and the same layers/rope/inputs/cross_layer/skip_first_token options"
            )

    def _all_reduce_fingerprint(self, group: object) -> str | None:
        """Every rank's ``weights_fingerprint`` compared: the common one, None when a rank's is unknown."""
        import torch.distributed as dist

        own = self.meta.weights_fingerprint
        device = next(iter(self._moments.values())).mean.device if self._moments else torch.device("cpu")
        word = int(own, 16) - (1 << 63) if own is not None else 0  # 64 bits as a signed int64
        mine = torch.tensor([own is not None, word], dtype=torch.int64, device=device)
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size(cast(Any, group)))]
        dist.all_gather(every, mine, group=cast(Any, group))
        facts = [(bool(v[0]), int(v[1])) for v in (t.cpu() for t in every)]
        known = sorted({f"{value + (1 << 63):016x}" for is_known, value in facts if is_known})
        if len(known) > 1:
            raise StatsMismatchError(
                f"cannot all_reduce statistics of different weights: the ranks' weight fingerprints are "
                f"{', '.join(known)} (meta.weights_fingerprint); capture every rank from the same model"
            )
        return own if all(is_known for is_known, _ in facts) else None

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the statistics as safetensors (tensors) with JSON metadata; never pickle.

        The write is atomic (see :mod:`headwidget.files`): the file at ``path`` is either the old one or
        the complete new one, and an existing file keeps its permissions. A ``path`` that is a symlink
        (never written through), a directory, FIFO or device, a missing or read-only directory, or a full
        disk raise :class:`~headwidget.errors.StatsFileError` naming ``path``; nothing is left behind.

        Example:
            >>> import pathlib, shutil, tempfile
            >>> from headwidget.core import AttentionLayout
            >>> from headwidget.moments import Moments
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
        return write_stats(
            Path(path), self.meta, self._moments, self._cross, self._samples, self._plane_norms
        )

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu") -> KVStats:
        """Read statistics written by :meth:`save`, checking that every number in the file can be true.

        Besides the safetensors syntax, every metadata field is checked for its type and range and
        against the others (layers within the model and unique, known kinds, cross-layer layers among
        the captured ones, head counts that divide, RoPE dims within a head), and every tensor for its
        dtype, shape (from the layout), finiteness and meaning: counts equal to ``meta.tokens``, token
        splits adding up to them, co-moments symmetric with non-negative variances and no entry
        above the geometric mean of its variances, normalised Grams at most one per token and head.
        Cross-layer moments must agree with each layer's own. Token samples (files written without
        them load as statistics without samples) must be float32 of ``min(meta.sample_size,
        meta.tokens)`` rows of the kind's channels, finite, and no farther from the mean than the
        co-moment allows one token to be. Rotary-pair norm sums of queries and keys (files written
        without them load as statistics without them) must be float64 sums over ``meta.tokens`` tokens,
        for every captured layer or none, of a model with rotary planes, never negative, and each key
        sum within what the key moments allow. ``path`` must be the file itself: a symlink is refused
        unread. Any problem raises :class:`~headwidget.errors.StatsFileError` naming the file and the field.

        Example:
            >>> import json, pathlib, shutil, tempfile
            >>> from headwidget.core import AttentionLayout
            >>> from headwidget.moments import Moments
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
            headwidget.errors.StatsFileError: ...: meta.tokens must be an integer, not the string "12"; ...
            >>> shutil.rmtree(folder)
        """
        meta, moments, cross, samples, planes = read_stats(Path(path))
        if torch.device(device) != torch.device("cpu"):
            moments = {key: m.to(device) for key, m in moments.items()}
            cross = {kind: m.to(device) for kind, m in cross.items()}
            samples = {key: s.to(device) for key, s in samples.items()}
            planes = {layer: n.to(device) for layer, n in planes.items()}
        return cls(meta, moments, cross, samples, planes)

    # ------------------------------------------------------------------ display
    def summary(self, metric: str = "token_cosine", *, channels: bool = True) -> list[dict[str, Any]]:
        """One row per captured layer: mean |channel correlation| of K and V (``{kind}_abs_corr``) and
        mean head similarity before any alignment (``{kind}_head_cos``, under ``metric``: the per-token
        cosine by default; see :meth:`head_similarity`), both over the off-diagonal entries.

        The one source of these per-layer means: the demo's table, a timeline's series and the trend
        chart (which adds the aligned similarity) read them here. ``channels=False`` leaves out the
        channel correlations (what a trend needs when only the metric changed).
        """
        channels = flag("channels", channels)
        rows = []
        for layer in self.meta.layers:
            row: dict[str, Any] = {"layer": layer}
            for kind in ("key", "value"):
                if kind not in self.meta.kinds:
                    continue
                if channels:
                    corr = self.channel_corr(layer, kind)
                    row[f"{kind}_abs_corr"] = off_diagonal_mean(corr, absolute=True)
                row[f"{kind}_head_cos"] = off_diagonal_mean(self.head_similarity(layer, kind, metric))
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
