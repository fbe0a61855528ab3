"""What healing costs, measured side by side on SmolLM2 (ratios; absolute times are noise).

(a) ``heal(method="kd", trainable="kv")`` of the ``mqa`` variant: training tokens per second, from its
    first step to its last (callbacks time the steps; the evaluation points are left out), ÷ those of a
    plain PyTorch loop over the same windows: AdamW on the same parameters (every layer's k_proj and
    v_proj) with the next-token loss, no teacher. Interleaved, the median of ``--repeats``. Target ≥ 0.7
    (KD adds one teacher forward). On the CPU the steps are timed in the process's CPU seconds (a machine
    shared with other work stretches wall time, not the work done).
(b) the heal of (a) at ``--batch``×``--length`` (8×512) in fresh processes, side by side: the heal of
    ``--against`` (a git revision: the whole-logits loss, the trained copy a whole copy of the variant;
    default the last commit before the chunked head), and this one as it is, with ``checkpoint=True`` and
    with ``micro_batch_size=1`` (the same steps of 8 windows, run one window at a time): each one's peak
    resident set during the heal call (and the process's, load and ``apply`` included), its median step
    after the first, and this heal's estimate (:func:`headwidget.estimate_healing`). Targets: peak ≤ 1/3
    of ``--against``'s at its tokens/s ± 5 %. Beside them, the floor of any heal of the whole batch at once
    that recomputes no matmul: the activations the student's forward saves for its
    backward (parameters left out; the SiLU's output, which a fused kernel would recompute from its
    input, counted apart), read with ``torch.autograd.graph.saved_tensors_hooks``. The resident set
    counts what glibc keeps after frees; ``--returned`` runs the processes with
    ``MALLOC_MMAP_THRESHOLD_=131072`` (blocks above 128 KiB go back to the system when freed), where the
    resident set follows the tensors alive.
(c) the Llama-3-8B shape (32 layers, on the meta device: nothing allocated) at 8×2048 tokens in bfloat16
    with ``checkpoint=True``: the estimate, and with the model's and the variant's weights, what one GPU
    holds. Target ≤ 70 GB.
(d) ``trainable="kv"`` against ``"all"`` in fresh processes: median step and peak resident set. Targets:
    time ≤ 0.8×, less memory.

Run: ``.venv/bin/python bench/heal.py`` (``--quick`` for a short smoke run, ``--only a|b|c|d``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import torch

import headwidget
from headwidget.embedded import load_smollm2
from headwidget.healing._data import TrainingWindows
from headwidget.texts import english_sample

ROOT = Path(__file__).resolve().parent.parent
#: The last commit whose heal formed the whole logits and copied the whole variant.
BEFORE = "e7692e6"


class _Clock:
    """A healing callback that notes when training starts and when each step ends (waiting for the
    device first, so a GPU's queued work counts in the step it belongs to). On the CPU, with
    ``cpu_time``, it reads the process's CPU seconds instead of the wall clock."""

    def __init__(self, device: torch.device | None = None, cpu_time: bool = False) -> None:
        self.device = device
        self.cpu_time = cpu_time
        self.marks: list[float] = []

    def _now(self) -> float:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return time.perf_counter()
        return time.process_time() if self.cpu_time else time.perf_counter()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks = [self._now()]

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.append(self._now())

    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.marks, self.marks[1:], strict=False)]


def _heal(
    model: Any,
    tokenizer: Any,
    trainable: str,
    batch: int,
    length: int,
    steps: int,
    variant: Any = None,
    **options: Any,
) -> _Clock:
    clock = _Clock(cpu_time=True)
    headwidget.heal(
        headwidget.apply(model, "mqa") if variant is None else variant,
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
        **options,
    )
    return clock


def _plain(
    model: Any, tokenizer: Any, batch: int, length: int, steps: int, cast: torch.dtype | None = None
) -> list[float]:
    """Seconds of each of ``steps`` plain AdamW steps (next-token loss) on every k_proj/v_proj of the variant,
    on the model's device (under ``cast`` autocast when given; CPU seconds on the CPU)."""
    variant = headwidget.apply(model, "mqa")
    for name, p in variant.named_parameters():
        p.requires_grad_(".k_proj." in name or ".v_proj." in name)
    opt = torch.optim.AdamW([p for p in variant.parameters() if p.requires_grad], lr=1e-3)
    if tokenizer is None:
        stream = torch.randint(1, int(model.config.vocab_size), (4 * steps * batch * length,))
    else:
        stream = torch.as_tensor(tokenizer("\n\n".join(english_sample(split="calibration")))["input_ids"])
    plan = TrainingWindows.of(
        stream, max_length=length, batch_size=batch, tokens=steps * batch * length, seed=0
    )
    device = next(variant.parameters()).device
    clock = _Clock(device, cpu_time=True)
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


def _one(config: dict[str, Any]) -> None:
    """One heal of (b) or (d) in this process: print its steps, peaks and estimate as JSON."""
    from peaks import Peak, process_peak

    model, tokenizer = load_smollm2(dtype=torch.float32)
    options: dict[str, Any] = {}
    if config.get("checkpoint"):
        options["checkpoint"] = True
    if config.get("micro"):
        options["micro_batch_size"] = config["micro"]
    estimate = None
    variant = headwidget.apply(model, "mqa")
    if "checkpoint" in inspect.signature(headwidget.heal).parameters:
        estimate = headwidget.estimate_healing(
            variant,
            model,
            trainable=config["trainable"],
            batch_size=config["batch"],
            max_length=config["length"],
            eval_tokens=64,
            per_layer=False,
            **options,
        )
    shape = config["trainable"], config["batch"], config["length"], config["steps"]
    with Peak(torch.device("cpu")) as peak:
        clock = _heal(model, tokenizer, *shape, variant=variant, **options)
    steps = clock.steps()
    print(
        json.dumps(
            {
                "step": statistics.median(steps[1:] or steps),
                "steps": steps,
                "peak": peak.bytes,
                "process": process_peak(),
                "estimate": estimate,
            }
        )
    )


#: Saved outputs of elementwise ops that backward could recompute from another saved tensor for free.
_RECOMPUTABLE = ("SiluBackward0", "GeluBackward0")


def _saved(config: dict[str, Any]) -> None:
    """(b)'s floor in this process: bytes of the activations one student forward keeps for backward."""
    model, _ = load_smollm2(dtype=torch.float32)
    student = headwidget.apply(model, "mqa")
    student.requires_grad_(False)
    for layer in student.model.layers:
        layer.self_attn.k_proj.requires_grad_(True)
        layer.self_attn.v_proj.requires_grad_(True)
    weights = {t.untyped_storage().data_ptr() for t in (*student.parameters(), *student.buffers())}
    kept: dict[int, tuple[int, bool]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        where = t.untyped_storage().data_ptr()
        if where not in weights:
            kept[where] = t.untyped_storage().nbytes(), type(t.grad_fn).__name__ in _RECOMPUTABLE
        return t

    ids = torch.randint(0, model.config.vocab_size, (config["batch"], config["length"]))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        student.model(input_ids=ids)
    total = sum(n for n, _ in kept.values())
    print(json.dumps({"saved": total, "recomputable": sum(n for n, free in kept.values() if free)}))


def _fresh(config: dict[str, Any], source: Path | None, returned: bool) -> dict[str, Any]:
    """:func:`_one` in a fresh process (its headwidget from ``source``, else this checkout's)."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    if returned:
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    done = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(config)], capture_output=True, text=True, env=env
    )
    if done.returncode:
        raise SystemExit(f"{config} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _revision(rev: str, into: Path) -> Path:
    """``python/`` of ``rev`` of this repository, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "python/headwidget"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches, one repeat")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--against", default=BEFORE, help="the git revision (b) compares with")
    parser.add_argument("--returned", action="store_true", help="(b), (d): MALLOC_MMAP_THRESHOLD_=131072")
    parser.add_argument("--only", choices=("a", "b", "c", "d"), help="run one part")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        config = json.loads(args.one)
        (_saved if config.get("saved") else _one)(config)
        return
    batch, length = (2, 128) if args.quick else (args.batch, args.length)
    repeats = 1 if args.quick else args.repeats
    steps = 2 if args.quick else args.steps
    if args.only in (None, "a"):
        _part_a(steps, batch, length, repeats)
    if args.only in (None, "b"):
        _part_b(steps, batch, length, args.against, args.returned)
    if args.only in (None, "c"):
        _part_c()
    if args.only in (None, "d"):
        _part_d(steps, batch, length, args.returned)


def _part_a(steps: int, batch: int, length: int, repeats: int) -> None:
    model, tokenizer = load_smollm2(dtype=torch.float32)
    tokens = steps * batch * length
    healed, plain = [], []
    for _ in range(repeats):
        healed.append(tokens / sum(_heal(model, tokenizer, "kv", batch, length, steps).steps()))
        plain.append(tokens / sum(_plain(model, tokenizer, batch, length, steps)))
    h, p = statistics.median(healed), statistics.median(plain)
    print(
        f"(a) mqa, {steps} steps of {batch}×{length} tokens, {torch.get_num_threads()} threads, CPU seconds"
    )
    print(
        f"    heal(kd, kv) {h:9.1f} tokens/s   plain AdamW loop {p:9.1f} tokens/s   ratio {h / p:.3f}"
        "   (target ≥ 0.7)"
    )


def _part_b(steps: int, batch: int, length: int, against: str, returned: bool) -> None:
    config = {"trainable": "kv", "batch": batch, "length": length, "steps": steps}
    with tempfile.TemporaryDirectory() as tmp:
        before = _fresh(config, _revision(against, Path(tmp)), returned)
    now = _fresh(config, None, returned)
    checkpointed = _fresh({**config, "checkpoint": True}, None, returned)
    micro = _fresh({**config, "micro": 1}, None, returned)
    floor = _fresh({**config, "saved": True}, None, returned)
    how = "MALLOC_MMAP_THRESHOLD_=131072" if returned else "glibc's defaults"
    print(f"(b) heal(kd, kv) of mqa, {batch}×{length} tokens, {steps} steps, fresh processes, {how}")
    print(
        "    heal of        step (CPU s)  tokens/s ÷ before   peak RSS of heal   ÷ before   process peak"
        "   estimate"
    )
    rows = ((against, before), ("this", now), ("checkpoint", checkpointed), ("micro 1", micro))
    for name, row in rows:
        estimate = "" if row["estimate"] is None else f"{row['estimate'] / 2**30:7.2f} GiB"
        print(
            f"    {name:12s} {row['step']:10.2f} {before['step'] / row['step']:14.3f}      "
            f"{row['peak'] / 2**30:9.2f} GiB {row['peak'] / before['peak']:10.3f} "
            f"{row['process'] / 2**30:10.2f} GiB   {estimate}"
        )
    print(
        "    targets (checkpoint): peak ≤ 1/3 of before's: "
        f"{'PASS' if checkpointed['peak'] <= before['peak'] / 3 else 'FAIL'}; tokens/s within ±5 %: "
        f"{'PASS' if abs(before['step'] / checkpointed['step'] - 1) <= 0.05 else 'FAIL'}"
    )
    print(
        f"    targets (micro_batch_size=1): peak ≤ 1/3 of before's: "
        f"{'PASS' if micro['peak'] <= before['peak'] / 3 else 'FAIL'}; tokens/s within ±5 %: "
        f"{'PASS' if before['step'] / micro['step'] >= 0.95 else 'FAIL'}"
    )
    needed = floor["saved"] - floor["recomputable"]
    print(
        f"    floor without recomputing a matmul: the student's forward saves {floor['saved'] / 2**30:.2f}"
        f" GiB for backward, {needed / 2**30:.2f} GiB\n    of it not recomputable elementwise; 1/3 of"
        f" before's peak is {before['peak'] / 3 / 2**30:.2f} GiB"
    )


def llama3_8b_need(layers: int = 32, batch: int = 8, length: int = 2048) -> tuple[int, int]:
    """The Llama-3-8B shape on the meta device: (estimate_healing of mqa in bfloat16 with checkpoints,
    the model's and the variant's weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    need = headwidget.estimate_healing(
        "mqa", model, batch_size=batch, max_length=length, dtype=torch.bfloat16, checkpoint=True
    )
    weights = sum(p.numel() for p in model.parameters()) * 2
    return need, 2 * weights  # the model and the variant (a whole copy)


def _part_c() -> None:
    need, weights = llama3_8b_need()
    total = need + weights
    print("(c) Llama-3-8B shape, 32 layers, 8×2048 tokens, bfloat16 autocast, checkpoint=True (estimate)")
    print(
        f"    heal allocates {need / 1e9:.1f} GB; with the model and the variant {total / 1e9:.1f} GB "
        f"(target ≤ 70 GB: {'PASS' if total <= 70e9 else 'FAIL'})"
    )


def _part_d(steps: int, batch: int, length: int, returned: bool) -> None:
    out = {
        t: _fresh({"trainable": t, "batch": batch, "length": length, "steps": steps}, None, returned)
        for t in ("kv", "all")
    }
    kv, every = out["kv"], out["all"]
    step_ratio, peak_ratio = kv["step"] / every["step"], kv["peak"] / every["peak"]
    print(
        f"(d) step: kv {kv['step']:.2f} s, all {every['step']:.2f} s, kv ÷ all {step_ratio:.3f}",
        "(target ≤ 0.8)",
    )
    print(
        f"    peak RSS of heal: kv {kv['peak'] / 2**20:.0f} MiB, all {every['peak'] / 2**20:.0f} MiB, "
        f"kv ÷ all {peak_ratio:.3f} (target < 1)"
    )


if __name__ == "__main__":
    main()
