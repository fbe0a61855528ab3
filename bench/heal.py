"""What healing costs, measured side by side in one run on SmolLM2 (ratios; absolute times are noise).

(a) ``heal(method="kd", trainable="kv")`` of the ``mqa`` variant: training tokens per second, from its
    first step to its last (callbacks time the steps; the evaluation points are left out), ÷ those of a
    plain PyTorch loop over the same windows: AdamW on the same parameters (every layer's k_proj and
    v_proj) with the next-token loss, no teacher. Interleaved, the median of ``--repeats``. Target ≥ 0.7
    (KD adds one teacher forward).
(b) the median step time and the peak resident memory of ``trainable="kv"`` against ``"all"``, each in a
    fresh process (peak RSS is per process). Targets: time ≤ 0.8×, less memory.

Run: ``.venv/bin/python bench/heal.py`` (``--quick`` for a short smoke run).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

import headwidget
from headwidget.embedded import load_smollm2
from headwidget.healing._data import TrainingWindows
from headwidget.texts import english_sample


class _Clock:
    """A healing callback that notes when training starts and when each step ends (waiting for the
    device first, so a GPU's queued work counts in the step it belongs to)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.marks: list[float] = []

    def _now(self) -> float:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks = [self._now()]

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.append(self._now())

    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]


def _heal(model: Any, tokenizer: Any, trainable: str, batch: int, length: int, steps: int) -> _Clock:
    clock = _Clock()
    headwidget.heal(
        headwidget.apply(model, "mqa"),
        model,
        tokenizer=tokenizer,
        trainable=trainable,
        tokens=steps * batch * length,
        batch_size=batch,
        max_length=length,
        eval_every=10**9,
        eval_tokens=64,
        per_layer=False,
        progress=False,
        callbacks=[clock],
    )
    return clock


def _plain(
    model: Any, tokenizer: Any, batch: int, length: int, steps: int, cast: torch.dtype | None = None
) -> list[float]:
    """Seconds of each of ``steps`` plain AdamW steps (next-token loss) on every k_proj/v_proj of the variant,
    on the model's device (under ``cast`` autocast when given)."""
    variant = headwidget.apply(model, "mqa")
    for name, p in variant.named_parameters():
        p.requires_grad_(".k_proj." in name or ".v_proj." in name)
    opt = torch.optim.AdamW([p for p in variant.parameters() if p.requires_grad], lr=1e-3)
    stream = torch.as_tensor(tokenizer("\n\n".join(english_sample(split="calibration")))["input_ids"])
    plan = TrainingWindows.of(
        stream, max_length=length, batch_size=batch, tokens=steps * batch * length, seed=0
    )
    device = next(variant.parameters()).device
    clock = _Clock(device)
    clock.on_train_begin(None, None, None)
    for step in range(steps):
        ids = plan.batch(step).input_ids.to(device)
        with torch.autocast(device.type, dtype=cast or torch.float32, enabled=cast is not None):
            loss = variant(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in variant.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.on_step_end(None, None, None)
    return clock.steps()


def _one(trainable: str, batch: int, length: int, steps: int) -> None:
    """(b) in this process: print the median step time and the peak RSS as JSON."""
    model, tokenizer = load_smollm2(dtype=torch.float32)
    clock = _heal(model, tokenizer, trainable, batch, length, steps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"step": statistics.median(clock.steps()), "peak": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches, one repeat")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=("a", "b"), help="run one part")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    batch, length = (2, 128) if args.quick else (8, 512)
    repeats = 1 if args.quick else args.repeats
    if args.one:
        _one(args.one, batch, length, args.steps)
        return
    if args.only != "b":
        _part_a(args.steps, batch, length, repeats)
    if args.only != "a":
        _part_b(args.steps, args.quick)


def _part_a(steps: int, batch: int, length: int, repeats: int) -> None:
    model, tokenizer = load_smollm2(dtype=torch.float32)
    tokens = steps * batch * length
    healed, plain = [], []
    for _ in range(repeats):
        healed.append(tokens / sum(_heal(model, tokenizer, "kv", batch, length, steps).steps()))
        plain.append(tokens / sum(_plain(model, tokenizer, batch, length, steps)))
    h, p = statistics.median(healed), statistics.median(plain)
    print(f"(a) mqa, {steps} steps of {batch}×{length} tokens, {torch.get_num_threads()} threads")
    print(
        f"    heal(kd, kv) {h:9.1f} tokens/s   plain AdamW loop {p:9.1f} tokens/s   ratio {h / p:.3f}"
        "   (target ≥ 0.7)"
    )


def _part_b(steps: int, quick: bool) -> None:
    out = {}
    for trainable in ("kv", "all"):
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                trainable,
                "--steps",
                str(steps),
                *(["--quick"] if quick else []),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise SystemExit(f"(b) {trainable} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        out[trainable] = json.loads(done.stdout.strip().splitlines()[-1])
    kv, every = out["kv"], out["all"]
    step_ratio, peak_ratio = kv["step"] / every["step"], kv["peak"] / every["peak"]
    print(
        f"(b) step: kv {kv['step']:.2f} s, all {every['step']:.2f} s, "
        f"kv ÷ all {step_ratio:.3f} (target ≤ 0.8)"
    )
    print(
        f"    peak RSS: kv {kv['peak'] / 2**20:.0f} MiB, all {every['peak'] / 2**20:.0f} MiB, "
        f"kv ÷ all {peak_ratio:.3f} (target < 1)"
    )


if __name__ == "__main__":
    main()
