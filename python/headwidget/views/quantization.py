"""``QuantizationView``: how many bits coupled channels need, and what quantizing K/V does to the model.

Reference: the Coupled Quantization paper's panel (a) — the joint entropy of c channels grows more
slowly than the sum of their marginal entropies, so channels quantized together need fewer bits.

1. The coupling chart of the selected layer: for K before RoPE, K after RoPE (when captured) and V,
   the joint entropy of groups of c contiguous channels and the sum of their marginal entropies, in bits
   per group, against c (:func:`~headwidget.analysis.entropy.channel_entropy`: equal-width bins per
   channel over the token sample, plug-in estimates averaged over the groups). The gap between a
   dashed line (the sum) and the solid line of the same colour (joint) is coupling plus the plug-in
   estimator's low bias: a point's tooltip gives the ratio joint ÷ Σ marginals beside the same ratio on
   the rows shuffled channel by channel (:func:`~headwidget.analysis.entropy.coupling_control`:
   independent channels, same marginals), and calls only the gap between them coupling. Where
   ``bins**c`` exceeds a fifth of the samples the estimate is biased low, and the chart says so.
2. With an evaluation ``report`` holding quantizer variants (``kv:int{b}``, ``kv:cq{c}c{b}b``), the
   bits each spends per K/V channel (scales and zero points included, codebooks not: they are a
   per-layer constant) against its damage (ΔNLL against the original, or KL), one line per quantizer
   family, beside the original model.

Needs statistics captured with ``samples=R`` (``capture(..., samples=4096, rope="both")``).

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (4, 64)), rope="both", samples=256,
    ...                            progress=False)
    >>> view = QuantizationView(stats, layer=1, bins=4)
    >>> chart = view.grid.charts[0]
    >>> [s.name for s in chart.series][:2], chart.series[0].x
    (['K pre-RoPE · joint', 'K pre-RoPE · Σ marginals'], [1.0, 2.0, 4.0, 8.0])
    >>> all(j <= m + 1e-12 for j, m in zip(chart.series[0].y, chart.series[1].y))
    True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import traitlets as t

from headwidget.analysis.entropy import BINS_MAX, ChannelEntropy, channel_entropy, coupling_control
from headwidget.analysis.variants import variant_group
from headwidget.checks import flag, optional_whole_number, whole_number, whole_numbers
from headwidget.core.charts import Chart, Series
from headwidget.core.kinds import Kind
from headwidget.core.kv_bytes import kv_bytes_text
from headwidget.core.panels import PanelGrid
from headwidget.errors import QuantizationViewError
from headwidget.evaluation import EvaluationReport
from headwidget.stats import KVStats
from headwidget.views._base import LayerState, LayerView, ViewSourceError, check_view_layer, stats_model_name
from headwidget.views._controls import toggles
from headwidget.views._memo import Memo
from headwidget.views._models import check_same_models
from headwidget.views._registry import register_view
from headwidget.views._sources import ViewSources
from headwidget.views._state import state

__all__ = [
    "COUPLING_KINDS",
    "QuantizationState",
    "QuantizationView",
    "QuantizationViewError",
    "bits_per_channel",
]


#: The kinds the coupling chart shows, with their names and colours.
COUPLING_KINDS: dict[Kind, tuple[str, str]] = {
    "key": ("K pre-RoPE", "#0072b2"),
    "key_post": ("K post-RoPE", "#d55e00"),
    "value": ("V", "#009e73"),
}
#: Bytes per element of the report's dtypes.
ELEMENT_BYTES = {"torch.float32": 4, "torch.float64": 8, "torch.bfloat16": 2, "torch.float16": 2}
DAMAGES = {"nll": "ΔNLL against the original (nats / token)", "kl": "KL(original ‖ variant) (nats / token)"}
#: What the damage toggles show each measure as.
DAMAGE_LABELS = {"nll": "ΔNLL", "kl": "KL"}


def bits_per_channel(report: EvaluationReport, spec: str) -> float:
    """The KV bits a variant spends per token and K/V channel of the layers it converts (NaN when the
    report has no ``model`` row or an unknown dtype).

    The original caches every K and V channel of every layer in the report's dtype. A variant converts
    ``report.layers`` (what the original caches there is ``converted_kv_bytes``) and leaves the others
    as they are; its bytes per token in the converted layers over their channel count is its cost per
    channel (scales and zero points included). A report that does not record which layers were
    converted counts every layer.

    Example:
        >>> report = EvaluationReport(model="m", kind="causal-lm", variants=["model", "kv:int4"],
        ...     measures={}, kv_bytes_per_token={"model": 1024, "kv:int4": 320}, tokens=1, sequences=1,
        ...     fingerprint="0", dtype="torch.bfloat16")
        >>> bits_per_channel(report, "model"), bits_per_channel(report, "kv:int4")
        (16.0, 5.0)
    """
    size = ELEMENT_BYTES.get(report.dtype)
    base = report.kv_bytes_per_token.get("model")
    if size is None or not base:
        return math.nan
    converted = report.converted_kv_bytes or base
    kept = base - converted  # the layers left as they were, at the original's cost
    return 8.0 * (report.kv_bytes_per_token[spec] - kept) / (converted / size)


def _family(spec: str) -> str:
    """``kv:int4/g64`` → ``kv:int``; ``kv:cq4c8b`` → ``kv:cq (4 channels)``."""
    if spec.startswith("kv:int"):
        group = spec.split("/", 1)[1] if "/" in spec else ""
        return f"kv:int{f' /{group}' if group else ''}"
    if spec.startswith("kv:cq"):
        c = spec[len("kv:cq") :].split("c", 1)[0]
        return f"kv:cq ({c} channels)"
    return spec


def coupling_reading(real: ChannelEntropy, control: ChannelEntropy, c: int) -> str:
    """What a coupling point says, fairly: the ratio joint ÷ Σ marginals beside the shuffled control's
    (the estimator's bias alone), and as coupling only the gap between them; on a point whose estimate
    is biased low (``bins**c > samples / 5``), no percentage at all.

    Example:
        >>> import torch
        >>> from headwidget.analysis.entropy import channel_entropy_of, shuffled_rows
        >>> x = torch.arange(4096.0)[:, None]
        >>> copies = torch.cat([x, x], 1)  # two copies of one channel: all of the second one is coupling
        >>> real = channel_entropy_of(copies, group_sizes=(2,), bins=4)
        >>> control = channel_entropy_of(shuffled_rows(copies, seed=0), group_sizes=(2,), bins=4)
        >>> print(coupling_reading(real, control, 2))
        joint ÷ Σ marginals 0.500 · shuffled control 1.000
        coupling beyond the estimator's bias: 50.0% of the marginal bits
    """
    real_total, control_total = real.marginal_sum[c], control.marginal_sum[c]
    if not (real_total and control_total):
        return "constant channels: no bits to couple"
    ratio, baseline = real.joint[c] / real_total, control.joint[c] / control_total
    line = f"joint ÷ Σ marginals {ratio:.3f} · shuffled control {baseline:.3f}"
    if real.biased[c]:
        return (
            f"{line}\nbiased low: {real.bins}^{c} bins > samples / 5 — read the gap to the control, "
            "not the ratio"
        )
    return f"{line}\ncoupling beyond the estimator's bias: {baseline - ratio:.1%} of the marginal bits"


@dataclasses.dataclass(frozen=True)
class QuantizationState(LayerState):
    """The selected layer and the damage measure of the bits-against-damage chart."""

    damage: str = state("nll", toggles("Damage", options="damages_available", labels=DAMAGE_LABELS))


@register_view("quantization", order=50)
class QuantizationView(LayerView[QuantizationState]):
    """Joint against summed marginal entropy of coupled channels per layer, and bits against damage."""

    title = "Quantization"
    sources = ViewSources("stats", ("report",), layers="layer")

    damages_available = t.List(t.Unicode()).tag(sync=True)

    def __init__(
        self,
        stats: KVStats,
        *,
        layer: int | None = None,
        report: EvaluationReport | None = None,
        bins: int = 16,
        group_sizes: Sequence[int] = (1, 2, 4, 8),
        miller_madow: bool = False,
        damage: str = "nll",
    ) -> None:
        """``bins`` per channel, channel ``group_sizes`` and the Miller–Madow correction as
        :func:`~headwidget.analysis.entropy.channel_entropy` takes them."""
        stats = self._stats(stats)
        if not stats.meta.sample_size:
            raise QuantizationViewError(
                "the quantization view needs token samples: capture with samples=R (for example "
                "headwidget.capture(model, texts, samples=4096, rope='both'))"
            )
        if report is not None and not isinstance(report, EvaluationReport):
            raise ViewSourceError(f"report must be an EvaluationReport, got {type(report).__name__}")
        check_same_models({"stats": stats, "report": report}, "quantization view")
        self.stats, self.report = stats, report
        layer = optional_whole_number("layer", layer)
        self.bins = whole_number("bins", bins, minimum=1, maximum=BINS_MAX, hint="bins per channel")
        self.group_sizes = tuple(
            whole_numbers("group_sizes", group_sizes, minimum=1, hint="channels per group")
        )
        self.miller_madow = flag("miller_madow", miller_madow)
        self.kinds = [k for k in COUPLING_KINDS if k in stats.kinds]
        self._entropy = Memo(self._layer_entropy, size=256)
        self._control = Memo(self._layer_control, size=256)
        super().__init__()
        quantizers = self._quantizers()
        self.set_up(
            QuantizationState(layer=stats.layers[0] if layer is None else layer, damage=damage),
            num_layers=stats.meta.layout.num_layers,
            damages_available=list(DAMAGES) if quantizers and report and report.kind == "causal-lm" else [],
        )

    @classmethod
    def capture_options(cls, layers: Sequence[int]) -> dict[str, Any]:
        """Token samples, and post-RoPE keys beside the pre-RoPE ones."""
        return {"samples": 4096, "rope": "both"}

    @classmethod
    def shows(cls, stats: KVStats | None) -> bool:
        """Whether the view can be built from ``stats``: it needs their token samples."""
        return stats is not None and bool(stats.meta.sample_size)

    def describe(self, state: QuantizationState) -> str:
        """The model and the layer."""
        return f"{stats_model_name(self.stats)} · layer {state.layer}"

    # ------------------------------------------------------------------ numbers
    def _layer_entropy(self, layer: int, kind: Kind) -> ChannelEntropy:
        return channel_entropy(self.stats, layer, kind, self.group_sizes, self.bins, self.miller_madow)

    def entropy(self, layer: int, kind: Kind) -> ChannelEntropy:
        """The channel entropies of one layer and kind (cached)."""
        return self._entropy(layer, kind)

    def _layer_control(self, layer: int, kind: Kind) -> ChannelEntropy:
        return coupling_control(self.stats, layer, kind, self.group_sizes, self.bins, self.miller_madow)

    def control(self, layer: int, kind: Kind) -> ChannelEntropy:
        """The same entropies of the layer's sample shuffled channel by channel (cached): what the
        estimator alone reports for independent channels."""
        return self._control(layer, kind)

    def _quantizers(self) -> list[str]:
        return [v for v in (self.report.variants if self.report else []) if variant_group(v) == "quantizers"]

    def _coupling(self, layer: int) -> Chart:
        series: list[Series] = []
        biased_at: set[int] = set()
        samples = 0
        for kind in self.kinds:
            name, colour = COUPLING_KINDS[kind]
            e, control = self.entropy(layer, kind), self.control(layer, kind)
            samples = e.samples
            sizes = sorted(e.joint)
            biased_at |= {c for c in sizes if e.biased[c]}

            def label(c: int, e: ChannelEntropy = e, ctl: ChannelEntropy = control, name: str = name) -> str:
                head = (
                    f"{name} · groups of {c} channel{'s' if c > 1 else ''}\n"
                    f"joint {e.joint[c]:.3f} bits · Σ marginals {e.marginal_sum[c]:.3f} bits"
                )
                return f"{head}\n{coupling_reading(e, ctl, c)}"

            xs = [float(c) for c in sizes]
            for part, values, dashed in (("joint", e.joint, False), ("Σ marginals", e.marginal_sum, True)):
                points, labels = [values[c] for c in sizes], [label(c) for c in sizes]
                series.append(Series(f"{name} · {part}", xs, points, labels, "points+line", colour, dashed))
        corrected = " + Miller–Madow" if self.miller_madow else ""
        # N samples hold at most N distinct tuples: no joint entropy above log2(N) can be measured.
        ceiling = math.log2(max(samples, 1))
        note = f"dotted: log2({samples:,}) = {ceiling:.1f} bits, the most that N samples can show"
        if biased_at:
            note += "; " + (
                f"groups of {', '.join(map(str, sorted(biased_at)))}: {self.bins}^c bins exceed a fifth "
                f"of the {samples:,} samples, so the plug-in joint entropy there is biased low"
            )
        missing = "" if "key_post" in self.kinds else " · capture with rope='both' for post-RoPE keys"
        return Chart(
            "coupling",
            f"Channel coupling in bits · layer {layer}",
            "channels per group (c)",
            "entropy per group (bits)",
            series,
            x_log=True,
            x_ticks=[float(c) for c in self.group_sizes],
            y_reference=ceiling,
            subtitle=(
                f"{stats_model_name(self.stats)} · {samples:,} sampled tokens · {self.bins} equal-width bins "
                f"per channel · plug-in{corrected}, averaged over groups · solid: joint, dashed: Σ marginals"
                f"{missing}"
            ),
            note=note,
        )

    def _bits_against_damage(self, measure: str) -> Chart | None:
        report = self.report
        quantizers = self._quantizers()
        if report is None or not quantizers or report.kind != "causal-lm":
            return None
        base = report.measures.get("model", {}).get("nll", math.nan)

        def damage(spec: str) -> float:
            m = report.measures[spec]
            return m["nll"] - base if measure == "nll" else m["kl"]

        def label(spec: str) -> str:
            m = report.measures[spec]
            return (
                f"{spec}\n{bits_per_channel(report, spec):.3f} bits per {channel} · "
                f"{kv_bytes_text(report.kv_bytes_per_token[spec], report.num_layers, report.dtype)}\n"
                f"ΔNLL {m['nll'] - base:+.4f} · KL {m['kl']:.4f} · top-1 {m['top1']:.3f}"
            )

        every = report.converts_every_layer
        channel = "K/V channel" if every else "K/V channel of the quantized layers"
        families: dict[str, list[str]] = {}
        for spec in quantizers:
            families.setdefault(_family(spec), []).append(spec)
        series = []
        for name, specs in families.items():
            specs = sorted(specs, key=lambda s: bits_per_channel(report, s))
            series.append(
                Series(
                    name,
                    [bits_per_channel(report, s) for s in specs],
                    [damage(s) for s in specs],
                    [label(s) for s in specs],
                    style="points+line",
                )
            )
        if "model" in report.measures:
            series.append(
                Series(
                    "original",
                    [bits_per_channel(report, "model")],
                    [damage("model")],
                    [label("model")],
                    color="#000000",
                )
            )
        return Chart(
            "bits",
            "Bits per channel against damage",
            f"KV bits per token and {'' if every else 'quantized '}K/V channel (with scales; log)",
            DAMAGES[measure],
            series,
            subtitle=(
                f"{report.model} · {report.tokens:,} held-out tokens · {report.dtype.removeprefix('torch.')}"
                f" · {report.scope()} quantized"
            ),
            x_log=True,
            y_reference=0.0,
            note=(
                "scales and zero points are counted per token; coupled-quantization codebooks are a "
                "per-layer constant, not counted"
            ),
        )

    def compute(self, state: QuantizationState, resolution: int | None = None) -> PanelGrid:
        """The coupling chart of the selected layer, and the bits-against-damage chart with a report."""
        check_view_layer(state.layer, self.num_layers, self.stats.layers)
        if self.damages_available and state.damage not in DAMAGES:
            raise QuantizationViewError(f"damage must be one of {', '.join(DAMAGES)}, got {state.damage!r}")
        charts = [self._coupling(state.layer)]
        bits = self._bits_against_damage(state.damage)
        if bits is not None:
            charts.append(bits)
        return PanelGrid([], 0.0, 1.0, "diverging", "", charts=charts)
