"""Benchmark the per-layer sweep of ``evaluate(per_layer=True)`` against the naive sweep, on SmolLM2.

Run: ``.venv/bin/python bench/evaluate.py`` (a few minutes on a 2-core CPU; the first SmolLM2 load
takes about 20 s more).

Both sides compute ΔNLL of every (variant, layer) cell on the same evaluation batches, in one run:

- **sweep**: :func:`headwidget.evaluation._sweep.layer_sweep`, which records the original model's
  layer outputs once per batch and computes only layers ``ℓ..L−1`` (and the head) for layer ``ℓ``;
- **naive**: for each cell, ``apply(model, spec, stats, layers=[ℓ])`` and full forwards over the
  batches. A naive cell costs the same for every layer, so it is timed on ``--naive-layers`` evenly
  spaced layers and scaled to all L (``--naive-layers 30`` times them all).

Both start from the same fitted layers (the fits are shared work, timed separately). The ΔNLLs of the
two sides are checked to agree on the layers both computed. Target: sweep ÷ naive ≤ 0.6.

``--table`` instead prints (and with ``--out`` saves) the evaluation table of ``--variants`` on
``--tokens`` evaluation tokens of ``english_sample(split="evaluation")``, with statistics captured
(``inputs=True, rope="both"``) on ``--calibration-tokens`` of ``split="calibration"``.

``--prefill P`` instead times the ``prefill:P`` protocol against the ``documents`` protocol on the same
tokens: the same batches (each document with at least P + 2 tokens) and the same scored predictions,
run by :class:`~headwidget.evaluation._prefill.PrefillRunner` (a prefill of P tokens, then one forward
of the rest that reads its cache) and by the one-forward runner, interleaved, ``--repeats`` times each
(the best of each side counts); the two sides' logits are checked to agree. Then, for scale, the same
batches under the model with ``--variants`` (e.g. ``kv:int4,xkv:64/2``) transforming the prefilled
cache. Target: prefill ÷ documents ≤ 1.2.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.functional import cross_entropy

from headwidget.adapters import adapter_for
from headwidget.analysis.variants import parse_variant
from headwidget.capture import capture
from headwidget.embedded import load_smollm2
from headwidget.evaluation._apply import build_variant, fit_variant
from headwidget.evaluation._evaluate import evaluate
from headwidget.evaluation._inputs import evaluation_batches, forward_kwargs, predicted_count
from headwidget.evaluation._outputs import OutputRunner
from headwidget.evaluation._plan import plan_variant
from headwidget.evaluation._prefill import PrefillRunner, prefill_batches
from headwidget.evaluation._sweep import layer_sweep
from headwidget.stats import KVStats
from headwidget.texts import english_sample

TARGET = 0.6
PREFILL_TARGET = 1.2


@torch.no_grad()
def nll_of(model: torch.nn.Module, batches: list, tokens: int) -> float:
    total = 0.0
    for b in batches:
        logits = model(**forward_kwargs(model, b, torch.device("cpu"))).logits
        m = b.attention_mask.bool()
        keep = m[:, :-1] & m[:, 1:]
        total += float(cross_entropy(logits[:, :-1][keep].float(), b.input_ids[:, 1:][keep], reduction="sum"))
    return total / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="mqa,lrkv:16", help="comma-separated variant specs")
    parser.add_argument("--tokens", type=int, default=1024, help="evaluation tokens")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--calibration-tokens", type=int, default=4096)
    parser.add_argument("--naive-layers", type=int, default=6, help="layers the naive side is timed on")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--table", action="store_true", help="print the evaluation table instead")
    parser.add_argument("--per-layer", action="store_true", help="with --table: the per-layer sweep too")
    parser.add_argument("--out", default=None, help="with --table: save the report (.json or .md)")
    parser.add_argument("--prefill", type=int, default=0, help="time prefill:P against documents instead")
    parser.add_argument("--repeats", type=int, default=3, help="with --prefill: timed passes per side")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, dtype {args.dtype}")
    t = time.perf_counter()
    model, tok = load_smollm2(dtype=dtype)
    print(f"SmolLM2 loaded ({time.perf_counter() - t:.1f} s)")
    t = time.perf_counter()
    calibration = english_sample(split="calibration")
    stats = capture(
        model,
        calibration,
        tokenizer=tok,
        inputs=True,
        rope="both",
        progress=False,
        max_tokens=args.calibration_tokens,
        max_length=args.max_length,
    )
    print(f"statistics: {stats.tokens} calibration tokens ({time.perf_counter() - t:.1f} s)")
    specs = [s.strip() for s in args.variants.split(",") if s.strip()]
    if args.prefill:
        prefill_bench(model, tok, stats, specs, args)
        return
    if args.table:
        t = time.perf_counter()
        report = evaluate(
            model,
            english_sample(split="evaluation"),
            specs,
            tokenizer=tok,
            stats=stats,
            per_layer=args.per_layer,
            dtype=dtype,
            batch_size=args.batch_size,
            max_length=args.max_length,
            max_tokens=args.tokens,
            progress=False,
        )
        took = time.perf_counter() - t
        print(
            f"evaluated in {took:.0f} s: {report.tokens} predicted tokens in {report.sequences} sequences, "
            f"fingerprint {report.fingerprint}, KV bytes in {args.dtype}\n"
        )
        print(report.table())
        if args.out:
            report.save(args.out)
        return
    batches = evaluation_batches(
        english_sample(split="evaluation"),
        tok,
        batch_size=args.batch_size,
        max_length=args.max_length,
        max_tokens=args.tokens,
    )
    tokens = predicted_count(batches)
    layers = list(range(model.config.num_hidden_layers))
    t = time.perf_counter()
    fits = {s: fit_variant(model, s, stats, layers) for s in specs}
    fit_time = time.perf_counter() - t
    print(
        f"{len(batches)} batches, {tokens} predicted tokens; {len(specs)} variants × {len(layers)} layers; "
        f"fits {fit_time:.1f} s (shared by both sides, not counted)"
    )

    runner = OutputRunner.for_model(model)
    t = time.perf_counter()
    swept = layer_sweep(model, batches, fits, layers, runner)
    sweep_time = time.perf_counter() - t

    step = max(1, len(layers) // max(1, args.naive_layers))
    timed_layers = layers[::step][: args.naive_layers]
    base = nll_of(model, batches, tokens)
    t = time.perf_counter()
    naive: dict[str, dict[int, float]] = {s: {} for s in specs}
    for spec in specs:
        for layer in timed_layers:
            variant = build_variant(model, spec, {layer: fits[spec][layer]})  # apply() on one layer
            naive[spec][layer] = nll_of(variant, batches, tokens) - base
            del variant
    naive_time = (time.perf_counter() - t) * len(layers) / len(timed_layers)

    worst = max(abs(swept[s][layer] - naive[s][layer]) for s in specs for layer in timed_layers)
    assert worst < 1e-4, f"the sweep and the naive ΔNLL disagree by {worst}"
    ratio = sweep_time / naive_time
    print(f"\n{'side':<58}{'seconds':>9}")
    print(f"{'sweep (recorded layer outputs, layers ℓ..L−1 per cell)':<58}{sweep_time:>9.1f}")
    naive_label = f"naive (apply one layer + full forwards; timed on {len(timed_layers)} layers)"
    print(f"{naive_label:<58}{naive_time:>9.1f}")
    print(
        f"sweep ÷ naive = {ratio:.3f} (target ≤ {TARGET}: {'met' if ratio <= TARGET else 'MISSED'}); "
        f"ΔNLL of both sides agree to {worst:.1e}"
    )
    for spec in specs:
        worst_layer = max(layers, key=lambda layer, s=spec: swept[s][layer])
        print(f"  {spec}: most fragile layer {worst_layer} (ΔNLL {swept[spec][worst_layer]:+.4f})")


@torch.no_grad()
def prefill_bench(
    model: torch.nn.Module, tok: object, stats: KVStats, specs: list[str], args: argparse.Namespace
) -> None:
    """``--prefill P``: the prefill:P runner against the one-forward runner on the same batches."""
    p = int(args.prefill)
    documents = evaluation_batches(
        english_sample(split="evaluation"),
        tok,
        batch_size=args.batch_size,
        max_length=args.max_length,
        max_tokens=args.tokens,
        min_tokens=p + 2,
    )
    batches = prefill_batches(documents, p, batch_size=args.batch_size)
    tokens = sum(int(b.attention_mask.sum()) for b in batches)
    print(f"{len(batches)} batches, {tokens} tokens, {predicted_count(batches)} scored")
    whole, prefilled = OutputRunner.for_model(model), PrefillRunner.for_model(model, p)
    worst = 0.0
    for batch in batches[:2]:
        a, b = whole(model, batch), prefilled(model, batch)
        worst = max(worst, float((a.values.float() - b.values.float()).abs().max()))
    name = f"prefill:{p}"
    times: dict[str, list[float]] = {"documents": [], name: []}
    for _ in range(args.repeats):
        for side, runner in (("documents", whole), (name, prefilled)):
            t = time.perf_counter()
            for batch in batches:
                runner(model, batch)
            times[side].append(time.perf_counter() - t)
    best = {side: min(v) for side, v in times.items()}
    ratio = best[name] / best["documents"]
    print(f"\n{f'side (best of {args.repeats})':<40}{'seconds':>9}")
    for side, seconds in best.items():
        print(f"{side:<40}{seconds:>9.2f}")
    verdict = "met" if ratio <= PREFILL_TARGET else "MISSED"
    agree = f"logits agree to {worst:.0e}"
    print(f"{name} ÷ documents = {ratio:.3f} (target ≤ {PREFILL_TARGET}: {verdict}); {agree}")
    adapter = adapter_for(model)
    layers = list(range(adapter.layout().num_layers))
    for spec in specs:
        plan = plan_variant(adapter, parse_variant(spec), stats, layers)
        t = time.perf_counter()
        with plan.running(model, prefill=True) as variant:
            for batch in batches:
                prefilled(variant, batch)
        took = time.perf_counter() - t
        share = took / best["documents"]
        print(f"  {spec}, transforming the prefilled cache: {took:.2f} s ({share:.2f}× documents)")


if __name__ == "__main__":
    main()
