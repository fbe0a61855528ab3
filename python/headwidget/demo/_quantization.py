"""The demo's quantization part: SmolLM2's channel coupling in bits, and its K/V quantizers evaluated.

Both read the calibration statistics of the demo's capture, which keeps a uniform sample of token rows
per layer and kind (:data:`SAMPLES`): the entropies are estimated from them, the CQ codebooks fitted on
them. The quantizers are measured on the evaluation split, like the mechanism variants.

Fitting the CQ codebooks (k-means, 30 layers × 2 kinds × 2 quantizers) is the demo's costliest step, so
by default they are fitted on the first :data:`CODEBOOK_ROWS` of the sampled rows (the rows are in a
random order: these are a uniform sample too) and the quantizers measured on at most
:data:`QUANTIZER_TOKENS` held-out tokens; ``full=True`` (``headwidget demo --full``) fits them on every
sampled row and measures them on as many tokens as the variants' table.

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 40)), rope="both", samples=64,
    ...                            progress=False)
    >>> entropy_lines(stats, [0])[2].split(" | ")[:3]
    ['| layer', 'K pre-RoPE c=2/16 bins', 'K pre-RoPE c=4/4 bins']
    >>> cut = first_rows(stats, 16)
    >>> rows = cut.samples(0, "value")
    >>> rows.shape, torch.equal(rows, stats.samples(0, "value")[:16])
    (torch.Size([16, 16]), True)
    >>> cut.tokens == stats.tokens, first_rows(stats, 64) is stats
    (True, True)
    >>> reduced_run(stats, 200), reduced_run(stats, 2000)[:2], reduced_run(stats, 2000, full=True)
    ((64, 200, ''), (64, 256), (64, 2000, ''))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from headwidget.analysis.entropy import channel_entropy, channel_entropy_of, shuffled_rows
from headwidget.core.kinds import Kind
from headwidget.evaluation import evaluate
from headwidget.export import save_all
from headwidget.stats import KVStats
from headwidget.views import QuantizationView
from headwidget.views.quantization import COUPLING_KINDS, bits_per_channel

__all__ = [
    "CODEBOOK_ROWS",
    "KINDS",
    "QUANTIZER_TOKENS",
    "QUANTIZER_VARIANTS",
    "SAMPLES",
    "entropy_lines",
    "first_rows",
    "quantizer_lines",
    "reduced_run",
]

#: Token rows kept per (layer, kind) by the demo's SmolLM2 capture: enough that both readings below
#: stay under the estimator's bias flag (256 cells ≤ samples / 5).
SAMPLES = 2048
#: KIVI-style integer quantizers at 4 and 2 bits (5 and 3 bits per channel with their fp16 scales and
#: zeros), and coupled quantization at 2 and 1 bits per channel (the paper's CQ-4c8b and CQ-8c8b).
QUANTIZER_VARIANTS = ["kv:int4", "kv:int2", "kv:cq4c8b", "kv:cq8c8b"]
#: The kinds of the coupling table, named as in the QuantizationView's chart.
KINDS: dict[Kind, str] = {kind: name for kind, (name, _colour) in COUPLING_KINDS.items()}
#: The readings the plug-in estimator can make from :data:`SAMPLES` rows: c = 2 channels at 16 bins and
#: c = 4 channels at 4 bins (256 cells each).
READINGS = ((2, 16), (4, 4))
#: The default (not ``--full``) demo's CQ codebooks are fitted on this many of the :data:`SAMPLES` rows...
CODEBOOK_ROWS = 1024
#: ... and its quantizers measured on at most this many held-out tokens.
QUANTIZER_TOKENS = 256


def entropy_lines(stats: KVStats, layers: Sequence[int]) -> list[str]:
    """The report's coupling table: joint entropy ÷ sum of marginals, real and shuffled, per layer.

    A ratio below 1 is sub-additivity. The shuffled control (each channel permuted on its own across
    the sampled rows) is what the plug-in estimator reports for independent channels with the same
    marginals; only the gap beyond it is coupling.
    """
    head = ["layer"]
    for name in KINDS.values():
        head += [f"{name} c={c}/{b} bins" for c, b in READINGS]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    samples = 0
    for layer in layers:
        cells = [str(layer)]
        for kind in KINDS:
            rows = stats.samples(layer, kind).float().cpu()
            samples = rows.shape[0]
            control_rows = shuffled_rows(rows, seed=layer)
            for c, bins in READINGS:
                real = channel_entropy(stats, layer, kind, group_sizes=(c,), bins=bins)
                control = channel_entropy_of(control_rows, group_sizes=(c,), bins=bins)
                flag = "*" if real.biased[c] else ""
                ratio = real.joint[c] / real.marginal_sum[c]
                cells.append(f"{ratio:.3f}{flag} ({control.joint[c] / control.marginal_sum[c]:.3f})")
        lines.append("| " + " | ".join(cells) + " |")
    intro = (
        f"Joint entropy of c contiguous channels ÷ the sum of their marginal entropies (plug-in, bits, "
        f"averaged over the groups), from {samples} sampled token rows per layer and kind; in brackets the "
        "same for the rows shuffled channel by channel (independent channels, same marginals). Below the "
        "bracket is coupling; the bracket's own gap from 1 is the estimator's bias. * = bins**c exceeds "
        "samples/5 (biased low)."
    )
    return [intro, "", *lines]


def first_rows(stats: KVStats, rows: int) -> KVStats:
    """``stats`` with every (layer, kind)'s token sample cut to its first ``rows`` rows (``stats`` itself
    when it holds no more): the same moments and meta, no cross-layer moments. The samples are in a random
    order, so the first rows are a uniform sample of the token rows as well."""
    keys = [(layer, kind) for layer in stats.layers for kind in stats.kinds]
    if stats.samples(*keys[0]).shape[0] <= rows:  # every (layer, kind) holds the same token rows
        return stats
    moments = {key: stats.moments(*key) for key in keys}
    samples = {key: stats.samples(*key)[:rows] for key in keys}
    return KVStats(replace(stats.meta, sample_size=rows), moments, None, samples)


def reduced_run(stats: KVStats, max_tokens: int, full: bool = False) -> tuple[int, int, str]:
    """The rows the CQ codebooks are fitted on, the tokens the quantizers are measured on (at most), and
    the sentence that says how this run was reduced ("" when it was not: ``full``, or small inputs)."""
    sampled = stats.samples(stats.layers[0], "value").shape[0]
    if full:
        return sampled, max_tokens, ""
    rows, tokens = min(sampled, CODEBOOK_ROWS), min(max_tokens, QUANTIZER_TOKENS)
    if rows == sampled and tokens == max_tokens:
        return rows, tokens, ""
    note = (
        f"A reduced run: codebooks from {rows} of the {sampled} sampled rows, quantizers on at most "
        f"{tokens} held-out tokens; `headwidget demo --full` fits them on all {sampled} rows and "
        "measures them on the tokens of the variants' table."
    )
    return rows, tokens, note


def quantizer_lines(
    out: Path,
    model: Any,
    texts: list[str],
    stats: KVStats,
    echo: Callable[[str], None],
    *,
    max_tokens: int,
    full: bool = False,
    **options: Any,
) -> list[str]:
    """Evaluate :data:`QUANTIZER_VARIANTS` on ``texts``; save ``quantization.json`` and the view's figures;
    the report's lines (one row per quantizer, with honest bits per channel).

    Unless ``full``, the codebooks are fitted on the first :data:`CODEBOOK_ROWS` sampled rows of ``stats``
    and the quantizers measured on at most :data:`QUANTIZER_TOKENS` of ``max_tokens`` (:func:`reduced_run`).
    """
    rows, tokens, reduced = reduced_run(stats, max_tokens, full)
    started = time.perf_counter()
    report = evaluate(
        model,
        texts,
        ["model", *QUANTIZER_VARIANTS],
        stats=first_rows(stats, rows),
        max_tokens=tokens,
        **options,
    )
    took = time.perf_counter() - started
    echo(
        f"\nsmollm2-135m: {len(QUANTIZER_VARIANTS)} K/V quantizers on {report.tokens} held-out tokens "
        f"(codebooks from {rows} calibration rows) in {took:.1f} s"
    )
    if reduced:
        echo(reduced)
    echo(report.table())
    echo(f"wrote {report.save(out / 'quantization.json')}")
    view = QuantizationView(stats, layer=0, report=report)
    for path in save_all(view, [out / "quantization.png", out / "quantization.pdf"], dpi=150):
        echo(f"wrote {path}")
    head = ["spec", "bits/channel", "KV bytes/token", "constant bytes", "perplexity", "ΔNLL", "KL", "top-1"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    base = report.measures["model"]["nll"]
    for v in report.variants:
        m = report.measures[v]
        cells = [
            v,
            f"{bits_per_channel(report, v):.2f}",
            str(report.kv_bytes_per_token[v]),
            str(report.constant_bytes.get(v, 0)),
            f"{m['perplexity']:.3f}",
            f"{m['nll'] - base:+.4f}",
            f"{m['kl']:.4f}",
            f"{m['top1']:.4f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    intro = (
        f"Fake-quantized post-RoPE keys and values, every layer, on {report.tokens} held-out tokens of the "
        "evaluation split of the table above. Bits per channel count the fp16 scales and zero points of "
        "kv:int; the fp16 CQ codebooks are a per-layer constant (constant bytes), fitted by k-means on "
        f"{rows} calibration samples per layer and kind."
    )
    return [f"{intro} {reduced}".strip(), "", *lines]
