"""Capture at the limit on a GPU: ``capture_section(device)`` prints each target with PASS or FAIL.

1. Accuracy: ``bench/capture.py`` (c)'s stress data (|mean| up to 300, 0.1 % 50σ outliers) in bfloat16,
   folded on the device as a capture folds a 16-bit model's rows there (on CUDA: bfloat16 hi + lo parts
   multiplied on the tensor cores with float32 output): max |corr − float64| ≤ 1e-5. The mean token
   cosines' error is printed beside it.
2. Speed: capture (keys and values of every layer) ÷ the forward stopped after the last attention, for
   random-init bfloat16 models with real layer shapes: SmolLM2-135M (30 layers, 8×256 tokens,
   target ≤ 1.3), Llama-3-8B (hidden 4096, 32 query / 8 KV heads of 128, MLP 14,336; ``layers``
   layers, 8×512 tokens, target ≤ 1.05) and LLaMA-2-7B (32 MHA heads of 128, MLP 11,008; target ≤ 1.4).
   Interleaved rounds; each round's own ratio, median.

``bench/gpu_check.py`` calls :func:`capture_section`. Run alone: ``python bench/capture_gpu.py`` on a
machine with a CUDA GPU; ``--dry-run`` (``--device cpu --small --rounds 1``) is a smoke run of the same
code here in seconds (the CPU folds in float32, so its ratios say nothing about the GPU's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch
from torch import nn

import headwidget

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture import _activations, split_accuracy

#: (name, config fields, tokens (batch, length), target of capture ÷ forward to the last attention)
SHAPES: list[tuple[str, dict[str, int], tuple[int, int], float]] = [
    (
        "SmolLM2-135M",
        {
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "head_dim": 64,
            "vocab_size": 49152,
            "num_hidden_layers": 30,
        },
        (8, 256),
        1.3,
    ),
    (
        "Llama-3-8B",
        {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 128256,
        },
        (8, 512),
        1.05,
    ),
    (
        "LLaMA-2-7B",
        {
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "head_dim": 128,
            "vocab_size": 32000,
        },
        (8, 512),
        1.4,
    ),
]


class _Stop(Exception):
    pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _model(fields: dict[str, int], layers: int | None, device: torch.device, small: bool) -> nn.Module:
    """A random-init Llama of these shapes on ``device``, in bfloat16 on a GPU (float32 on the CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config: dict[str, Any] = dict(fields)
    if layers is not None:
        config["num_hidden_layers"] = layers
    if small:  # the same kind of model, tiny
        config.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=256)
        config.update(head_dim=16, num_attention_heads=4, num_key_value_heads=2)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = LlamaForCausalLM(LlamaConfig(**config))
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def _ratio(
    model: nn.Module, ids: torch.Tensor, device: torch.device, rounds: int
) -> tuple[float, float, float, float]:
    """Median capture ÷ forward to the last attention over interleaved rounds (each round's own ratio),
    its smallest and largest, and the median forward's seconds."""
    last = model.model.layers[-1].self_attn  # type: ignore[union-attr,index]

    def forward() -> None:
        def stop(*_: object) -> None:
            raise _Stop

        handle = last.register_forward_hook(stop)
        try:
            with torch.no_grad(), suppress(_Stop):
                model(input_ids=ids, use_cache=False)
        finally:
            handle.remove()

    def capture() -> None:
        b, t = ids.shape
        headwidget.capture(model, ids, batch_size=b, max_length=t, progress=False)

    for fn in (forward, capture):  # warm-up: kernels, cuBLAS handles, the allocator's blocks
        fn()
    ratios, base = [], []
    for _ in range(rounds):
        f = _seconds(forward, device)
        c = _seconds(capture, device)
        ratios.append(c / f)
        base.append(f)
    return statistics.median(ratios), min(ratios), max(ratios), statistics.median(base)


def capture_section(
    device: torch.device | str = "cuda", *, rounds: int = 5, layers: int = 8, small: bool = False
) -> list[tuple[str, bool]]:
    """Run the GPU checks of capture (see the module docstring) on ``device`` and return ``(target,
    passed)`` for each of its four targets.

    It prints two headed blocks: the accuracy line (``PASS``/``FAIL``, max |corr − float64| on the
    stress data against 1e-5, the mean token cosines' error beside it), then one line per model shape
    (``PASS``/``FAIL``, the median of each round's capture ÷ forward to the last attention against its
    target, with the layers and tokens, the rounds' range, the forward's median milliseconds and how
    the Grams were formed: ``split`` on the tensor cores, ``exact`` elsewhere).

    ``layers``: how many layers the Llama-3-8B and LLaMA-2-7B shapes get (the ratio is per layer; 8 fit
    any GPU of 40 GB); ``small``: tiny shapes and few tokens (a smoke run: its ratios mean nothing).

    Example (the smoke run on the CPU, as ``python bench/capture_gpu.py --dry-run``):
        >>> results = capture_section("cpu", rounds=1, small=True)  # doctest: +ELLIPSIS
        <BLANKLINE>
        capture on cpu: accuracy on 20000×128 bfloat16 stress activations (emulated on the CPU)
          PASS  max |corr − float64| on the stress data: ...
        >>> len(results)
        4
    """
    device = torch.device(device)
    results: list[tuple[str, bool]] = []

    def report(target: str, value: float, limit: float, detail: str = "") -> None:
        passed = value <= limit
        results.append((target, passed))
        print(f"  {'PASS' if passed else 'FAIL'}  {target}: {value:.3g} (target ≤ {limit:g}){detail}")

    tokens, batch = (20_000, 2048) if small else (200_000, 2048)
    x = torch.from_numpy(_activations(tokens, 128, seed=7)).to(device=device, dtype=torch.bfloat16)
    how = "tensor cores" if device.type == "cuda" else "emulated on the CPU"
    print(f"\ncapture on {device}: accuracy on {tokens}×128 bfloat16 stress activations ({how})")
    corr_err, cosine_err = split_accuracy(x, batch, head_dim=64)
    report(
        "max |corr − float64| on the stress data",
        corr_err,
        1e-5,
        f"; mean token cosines within {cosine_err:.1e}",
    )
    del x

    print(f"\ncapture on {device}: ÷ forward to the last attention, median of {rounds} interleaved rounds")
    for name, fields, shape, target in SHAPES:
        many = None if name.startswith("SmolLM2") else layers
        model = _model(fields, many, device, small)
        config: Any = model.config
        vocab = int(config.vocab_size)
        b, t = (2, 32) if small else shape
        ids = torch.randint(0, vocab, (b, t), device=device, generator=torch.Generator(device).manual_seed(0))
        plan_mode = "split" if device.type == "cuda" else "exact"
        ratio, low, high, forward = _ratio(model, ids, device, rounds)
        n = int(config.num_hidden_layers)
        report(
            f"{name} shape ({n} layers, {b}×{t} tokens), capture ÷ forward",
            ratio,
            target,
            f" [rounds {low:.3f}–{high:.3f}; forward {forward * 1e3:.1f} ms; Grams: {plan_mode}]",
        )
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke run on CPU)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8, help="layers of the 8B and 7B shapes")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="the same code on the CPU, tiny shapes, one round (seconds): --device cpu --small --rounds 1",
    )
    args = parser.parse_args()
    if args.dry_run:
        args.device, args.small, args.rounds = "cpu", True, 1
    results = capture_section(args.device, rounds=args.rounds, layers=args.layers, small=args.small)
    print(f"\n{sum(p for _, p in results)} of {len(results)} capture targets PASS")


if __name__ == "__main__":
    main()
