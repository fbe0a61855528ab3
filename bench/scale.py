"""The scale ladder: capture, evaluate, heal and allocate on random-init models of real shapes, each rung in a
fresh process, printed as one table of ratios.

Rungs (Llama-family configs; random weights: only the shapes matter here):

- ``smollm2-135m``: SmolLM2-135M (30 layers, hidden 576, 9 query / 3 KV heads of 64, MLP 1536,
  vocabulary 49,152, tied embeddings);
- ``llama-3.2-1b``: Llama-3.2-1B (16 layers, hidden 2048, 32 / 8 heads of 64, MLP 8192, vocabulary
  128,256, tied embeddings; its RoPE scaling left out);
- ``llama-3-8b``: Llama-3-8B (hidden 4096, 32 / 8 heads of 128, MLP 14,336, vocabulary 128,256) with
  ``--layers N`` of its 32 layers (full width: on this 24 GB CPU one or two layers);
- ``llama-2-7b``: LLaMA-2-7B (hidden 4096, 32 MHA heads of 128, MLP 11,008, vocabulary 32,000) with
  ``--layers N`` of its 32.

For each rung, on ``batch × length`` random tokens:

- **capture ÷ forward**: ``capture`` of K and V (all layers) against the same forward stopped after the
  last attention, interleaved, the median of ``--repeats``;
- **evaluate**: ``evaluate(per_layer=True)`` of ``mqa``;
- **heal ÷ plain**: ``heal(kd, kv)`` of ``mqa`` (``--checkpoint`` for ``checkpoint=True``), training
  tokens/s ÷ a plain AdamW next-token loop on the same k_proj/v_proj (steps after the first; CPU seconds
  on the CPU, wall seconds on a GPU);
- **allocate**: one ``allocate`` round (``refine=0``) over ``model``, ``mqa`` and ``kv:int4``;

and for each of capture, evaluate, heal and allocate its peak memory beside its estimate
(``headwidget.estimate``, ``estimate_evaluation``, ``estimate_healing``, ``estimate_allocation``): on a GPU
``max_memory_allocated`` above what was allocated before the call; on the CPU the CPU allocator's peak of
live tensors (``torch.profiler``; the counterpart of CUDA's number), and the rise of the resident set
beside it (``bench/peaks.py``: it counts what glibc keeps after frees; ``--returned`` runs the rungs with
``MALLOC_MMAP_THRESHOLD_=131072``, where it follows the live tensors). The table prints measured ÷
estimate (target 0.8–1.2).

Run: ``.venv/bin/python bench/scale.py --quick`` (under 5 minutes on a 2-core CPU: 2×64 tokens, the 1B
rung with 2 layers and the 8B and 7B rungs with 1); ``bench/scale.py`` (2×256 tokens, 1B whole, 8B and 7B
with ``--layers 2``); ``--device cuda`` on a GPU (bfloat16; ``--layers 32`` for the whole 8B and 7B
stacks on an 80 GB GPU); ``--rungs smollm2-135m,llama-3-8b`` for some of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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
from heal import _Clock, _plain
from peaks import Peak, allocator_peak

RUNGS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    "llama-3.2-1b": {
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
    },
    "llama-3-8b": {
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
    "llama-2-7b": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
}
#: The rungs ``--layers`` cuts (the others run whole unless the quick form cuts them).
CUT = ("llama-3-8b", "llama-2-7b")


class _Stop(Exception):
    pass


def tiny(config: dict[str, Any]) -> dict[str, Any]:
    """A rung's config shrunk for a smoke run on the CPU: hidden and MLP widths ÷ 16, the vocabulary ÷ 64, at
    most two layers; the head counts (and so the attention's layout) kept.

    >>> c = tiny(RUNGS["smollm2-135m"])
    >>> c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
    (36, 4, 9, 3, 768)
    """
    hidden = config["hidden_size"] // 16
    return {
        **config,
        "hidden_size": hidden,
        "head_dim": hidden // config["num_attention_heads"],
        "intermediate_size": config["intermediate_size"] // 16,
        "vocab_size": config["vocab_size"] // 64,
        "num_hidden_layers": min(2, config["num_hidden_layers"]),
    }


def build(
    name: str, layers: int | None, device: torch.device, dtype: torch.dtype, small: bool = False
) -> nn.Module:
    """The rung's random-init model (seed 0), ``layers`` of its layers when given (``small``: :func:`tiny`),
    in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = tiny(RUNGS[name]) if small else dict(RUNGS[name])
    if layers is not None and not small:
        config["num_hidden_layers"] = layers
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(LlamaConfig(**config)).to(dtype)
    return model.eval()


def forward_to_last_attention(model: nn.Module, ids: torch.Tensor) -> None:
    """The model's forward on ``ids``, stopped once its last attention has run (what capture runs)."""

    def stop(*_: object) -> None:
        raise _Stop

    attention = headwidget.adapters.adapter_for(model).attention_at(-1)
    handle = attention.register_forward_hook(stop)
    try:
        with torch.no_grad(), suppress(_Stop):
            model(input_ids=ids, use_cache=False)
    finally:
        handle.remove()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    start = clock()
    fn()
    _sync(device)
    return clock() - start


def _peak(fn: Callable[[], object], device: torch.device) -> dict[str, int]:
    """The peak of one call: ``device`` (CUDA) or, on the CPU, the allocator's and the resident set's."""
    if device.type == "cuda":
        with Peak(device) as peak:
            fn()
        return {"peak": peak.bytes}
    with Peak(device) as rss:
        allocated = allocator_peak(fn)
    return {"peak": allocated, "rss": rss.bytes}


def capture_ratio(model: nn.Module, ids: torch.Tensor, repeats: int) -> float:
    """capture (K, V of every layer) ÷ the forward to the last attention: medians of interleaved runs."""
    device = ids.device
    batch, length = ids.shape

    def captured() -> object:
        return headwidget.capture(model, ids, batch_size=batch, max_length=length, progress=False)

    forward_to_last_attention(model, ids)
    captured()  # warm-up
    forward, capture = [], []
    for _ in range(repeats):
        forward.append(_seconds(lambda: forward_to_last_attention(model, ids), device))
        capture.append(_seconds(captured, device))
    return statistics.median(capture) / statistics.median(forward)


def heal_ratio(
    model: nn.Module,
    stream: torch.Tensor,
    held: torch.Tensor,
    batch: int,
    length: int,
    steps: int,
    **options: Any,
) -> float:
    """heal(kd, kv) of mqa, training tokens/s ÷ a plain AdamW loop's (steps after the first)."""
    device = next(model.parameters()).device
    cast = torch.bfloat16 if device.type == "cuda" else None
    clock = _Clock(device, cpu_time=True)
    headwidget.heal(
        headwidget.apply(model, "mqa"),
        model,
        stream,
        tokens=steps * batch * length,
        batch_size=batch,
        max_length=length,
        eval_texts=held,
        eval_tokens=batch * length // 2,
        eval_every=10**9,
        per_layer=False,
        progress=False,
        callbacks=[clock],
        **options,
    )
    healed = clock.steps()
    plain = _plain(model, None, batch, length, steps, cast)
    return statistics.median(plain[1:] or plain) / statistics.median(healed[1:] or healed)


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of one rung (in this process)."""
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    layers = args.layers if name in CUT else args.small_layers
    model = build(name, layers, device, dtype, small=args.tiny)
    vocab = int(model.config.vocab_size)
    batch, length = args.batch, args.length
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (batch, length), generator=generator).to(device)
    calibration = torch.randint(1, vocab, (2 * batch, length), generator=generator)
    held = torch.randint(1, vocab, (batch, length), generator=generator)
    stream = torch.randint(1, vocab, (1, 8 * batch * length), generator=generator)
    out: dict[str, Any] = {
        "rung": name,
        "layers": int(model.config.num_hidden_layers),
        "params": sum(p.numel() for p in model.parameters()),
        "tokens": f"{batch}×{length}",
    }
    # capture
    out["capture_ratio"] = capture_ratio(model, ids, args.repeats)
    out["capture"] = _peak(
        lambda: headwidget.capture(model, ids, batch_size=batch, max_length=length, progress=False), device
    )
    out["capture"]["estimate"] = headwidget.estimate(model, batch_size=batch, max_length=length)
    # evaluate
    options = {"per_layer": True, "dtype": dtype, "batch_size": batch, "max_length": length}
    out["evaluate"] = _peak(
        lambda: headwidget.evaluate(model, held, ["mqa"], progress=False, **options), device
    )
    out["evaluate"]["estimate"] = headwidget.estimate_evaluation(model, ["mqa"], **options)
    # heal
    healing = {"checkpoint": True} if args.checkpoint else {}
    out["heal_ratio"] = heal_ratio(model, stream, held, batch, length, args.steps, **healing)
    one_step = {
        "tokens": batch * length,
        "batch_size": batch,
        "max_length": length,
        "eval_texts": held,
        "eval_tokens": batch * length // 2,
        "per_layer": False,
        **healing,
    }
    variants = [headwidget.apply(model, "mqa")]
    out["heal"] = _peak(
        lambda: headwidget.heal(variants[0], model, stream, progress=False, **one_step), device
    )
    out["heal"]["estimate"] = headwidget.estimate_healing(variants[0], model, **one_step)
    variants.clear()
    # allocate
    choose = {
        "candidates": ["model", "mqa", "kv:int4"],
        "dtype": dtype,
        "batch_size": batch,
        "max_length": length,
    }
    out["allocate"] = _peak(
        lambda: headwidget.allocate(model, calibration, budget=0.5, refine=0, progress=False, **choose),
        device,
    )
    out["allocate"]["estimate"] = headwidget.estimate_allocation(model, calibration, **choose)
    return out


def _ratio(row: dict[str, Any], what: str) -> str:
    cell = row[what]
    text = f"{cell['peak'] / cell['estimate']:.2f}"
    if "rss" in cell:
        text += f" ({cell['rss'] / cell['estimate']:.2f})"
    return text


def table(rows: list[dict[str, Any]]) -> str:
    """The ladder's ratios, one row per rung."""
    head = (
        "| rung | layers | params | tokens | capture ÷ forward | capture peak ÷ est. | evaluate peak ÷ est. "
        "| heal ÷ plain AdamW | heal peak ÷ est. | allocate peak ÷ est. |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        shape = f"| {r['rung']} | {r['layers']} | {r['params'] / 1e6:,.0f} M | {r['tokens']} "
        memory = [_ratio(r, what) for what in ("capture", "evaluate", "heal", "allocate")]
        lines.append(
            f"{shape}| {r['capture_ratio']:.2f} | {memory[0]} | {memory[1]} | {r['heal_ratio']:.2f} "
            f"| {memory[2]} | {memory[3]} |"
        )
    return "\n".join(lines)


def run_rung(name: str, argv: list[str], returned: bool = False) -> dict[str, Any]:
    """:func:`measure` of ``name`` in a fresh process (the same options; ``returned``: with
    ``MALLOC_MMAP_THRESHOLD_=131072``, so that its resident set follows the live tensors)."""
    env = dict(os.environ)
    if returned:
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    command = [sys.executable, __file__, "--rung", name, *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"rung {name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2×64 tokens, 1B with 2 layers, 8B and 7B with 1")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rungs", default=",".join(RUNGS), help="comma-separated rungs")
    p.add_argument("--layers", type=int, help="layers of the 8B and 7B rungs (default 2; quick 1)")
    p.add_argument("--small-layers", type=int, help="layers of the other rungs (default all; quick: 1B 2)")
    p.add_argument("--batch", type=int, help="rows a batch (default 2)")
    p.add_argument("--length", type=int, help="tokens a row (default 256; quick 64)")
    p.add_argument("--steps", type=int, help="heal and plain AdamW steps (default 3; quick 2)")
    p.add_argument("--repeats", type=int, help="capture ÷ forward repeats (default 5; quick 3)")
    p.add_argument("--checkpoint", action="store_true", help="heal with checkpoint=True")
    p.add_argument("--tiny", action="store_true", help="every rung shrunk (a smoke run of the code)")
    p.add_argument("--returned", action="store_true", help="rungs run with MALLOC_MMAP_THRESHOLD_=131072")
    p.add_argument("--largest", action="store_true", help="only the largest batches on one 80 GB GPU")
    p.add_argument("--rung", help=argparse.SUPPRESS)
    return p


def _defaults(args: argparse.Namespace) -> argparse.Namespace:
    quick = args.quick
    args.layers = args.layers or (1 if quick else 2)
    args.batch = args.batch or 2
    args.length = args.length or (64 if quick else 256)
    args.steps = args.steps or (2 if quick else 3)
    args.repeats = args.repeats or (3 if quick else 5)
    if args.small_layers is None and quick and args.rung == "llama-3.2-1b":
        args.small_layers = 2
    return args


#: Llama-3-70B's shape (for the estimates of :func:`largest_batches`; nothing is allocated).
LLAMA_3_70B = {
    **RUNGS["llama-3-8b"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
}


def _largest(fits: Callable[[int], bool], limit: int = 4096) -> int:
    """The largest batch in 1..limit that ``fits`` (0 when even one row does not)."""
    if not fits(1):
        return 0
    if fits(limit):
        return limit
    low, high = 1, limit
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def _largest_row(config: dict[str, Any], gpu: float, length: int, world: int) -> list[str]:
    """One row of :func:`largest_batches`: the weights, then each call's largest batch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    weights = sum(p.numel() for p in model.parameters()) * 2
    bf16 = torch.bfloat16

    def capture(b: int) -> int:
        return headwidget.estimate(model, batch_size=b, max_length=length)

    def evaluate(b: int) -> int:
        return headwidget.estimate_evaluation(
            model, ["mqa"], per_layer=True, dtype=bf16, batch_size=b, max_length=length
        )

    def allocate(b: int) -> int:
        candidates = ["model", "mqa", "kv:int4"]
        options = {"dtype": bf16, "batch_size": b, "max_length": length, "max_tokens": 8 * b * length}
        return headwidget.estimate_allocation(model, candidates=candidates, **options)

    def heal(b: int, options: dict[str, Any]) -> int:
        return headwidget.estimate_healing(
            "mqa", model, batch_size=b, max_length=length, dtype=bf16, **options
        )

    def heal_sharded(b: int, options: dict[str, Any]) -> int:  # a rank's share of the batch and weights
        options = {"distributed": "fsdp", "world_size": world, **options}
        return headwidget.estimate_healing(
            "mqa", model, batch_size=b * world, max_length=length, dtype=bf16, **options
        )

    def most(rows: int) -> str:
        return f"≥ {rows}" if rows == limit else str(rows)

    limit = 4096
    cells = [f"{weights / 1e9:.0f} GB"]
    cells += [
        most(_largest(lambda b, f=f: f(b) + weights <= gpu, limit)) for f in (capture, evaluate, allocate)
    ]
    for options in HEALS:
        if 2 * weights <= gpu:
            cells.append(most(_largest(lambda b, o=options: heal(b, o) + 2 * weights <= gpu, limit)))
        else:
            rows = _largest(lambda b, o=options: heal_sharded(b, o) <= gpu, limit // world)
            cells.append(f"{most(rows * world)} on {world} GPUs (FSDP)")
    return cells


#: The heals of :func:`largest_batches`' columns: as it is, with checkpoints, one window at a time.
HEALS: tuple[dict[str, Any], ...] = ({}, {"checkpoint": True}, {"micro_batch_size": 1})


def largest_batches(gpu: float = 80e9, length: int = 2048, world: int = 8) -> str:
    """From the estimates, the largest batch of ``length`` tokens each call takes on one GPU of ``gpu`` bytes
    for the Llama-3-8B and -70B shapes in bfloat16 (models on the meta device: nothing allocated): the
    call's estimate plus the weights it holds (the model; heal: the model and its variant) within ``gpu``;
    a 70B model's heal with FSDP over ``world`` GPUs (the batch over all of them). Markdown."""
    lines = [
        "| shape (bfloat16) | weights | capture | evaluate (mqa, per layer) | allocate (3 candidates, "
        "8 batches) | heal (mqa) | heal, checkpoint=True | heal, micro_batch_size=1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, config in (("Llama-3-8B", RUNGS["llama-3-8b"]), ("Llama-3-70B", LLAMA_3_70B)):
        lines.append(f"| {name} | " + " | ".join(_largest_row(config, gpu, length, world)) + " |")
    return "\n".join(lines)


def _child_argv(args: argparse.Namespace) -> list[str]:
    """The options of a rung's process (the same as this one's, the defaults filled in)."""
    argv = ["--device", args.device, "--layers", str(args.layers), "--batch", str(args.batch)]
    argv += ["--length", str(args.length), "--steps", str(args.steps), "--repeats", str(args.repeats)]
    if args.small_layers is not None:
        argv += ["--small-layers", str(args.small_layers)]
    if args.quick:
        argv.append("--quick")
    if args.checkpoint:
        argv.append("--checkpoint")
    if args.tiny:
        argv.append("--tiny")
    return argv


def main() -> None:
    args = _defaults(parser().parse_args())
    if args.rung:
        print(json.dumps(measure(args.rung, args)))
        return
    if args.largest:
        print(largest_batches())
        return
    start = time.perf_counter()
    rows = []
    for name in (n.strip() for n in args.rungs.split(",")):
        rows.append(run_rung(name, _child_argv(args), args.returned))
        print(f"{name}: done after {time.perf_counter() - start:.0f} s", file=sys.stderr)
    memory = "max_memory_allocated" if args.device.startswith("cuda") else "CPU allocator (resident set)"
    if args.returned:
        memory += ", MALLOC_MMAP_THRESHOLD_=131072"
    healing = ", heal with checkpoint=True" if args.checkpoint else ""
    print(f"scale ladder on {args.device}; peaks: {memory}{healing}")
    print(table(rows))
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
