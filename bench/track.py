"""What tracking costs a training run, measured side by side in one run (ratios; absolute times are noise).

(a) a small Llama trained from random initialisation by a hand loop (AdamW, batches of English-sample
    tokens) for ``--steps`` steps, with a Tracker snapshotting every ``--every`` steps and without one,
    interleaved: training time with ÷ without (target ≤ 1.02 at every=50);
(b) one snapshot's time ÷ a plain forward of the model over the same probe tokens (target ≤ 1.2), for
    rope="pre" and for the tracker's default (rope="auto": "both" for this rotary model).

Run: ``.venv/bin/python bench/track.py`` (``--quick`` for a short smoke run).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from headwidget import Tracker
from headwidget.embedded import load_smollm2
from headwidget.texts import english_sample


def _model(vocab: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
    )
    return LlamaForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps, one repeat")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    args = parser.parse_args()
    steps, repeats = (20, 1) if args.quick else (args.steps, 3)
    _, tokenizer = load_smollm2()
    stream = torch.cat([torch.tensor(tokenizer(t)["input_ids"]) for t in english_sample(split="calibration")])
    train_rows = stream[: (len(stream) // 128) * 128].reshape(-1, 128)
    probe = [english_sample(split="evaluation")[i] for i in range(8)]

    def run(tracker: Tracker | None) -> float:
        model = _model(tokenizer.vocab_size)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        torch.manual_seed(1)
        start = time.perf_counter()
        for step in range(steps):
            if tracker is not None and step % tracker.every == 0:
                tracker.snapshot(model, step)
            batch = train_rows[(step * 8) % (len(train_rows) - 8) :][:8]
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        return time.perf_counter() - start

    with_t: list[float] = []
    without: list[float] = []
    for _ in range(repeats):
        without.append(run(None))
        with_t.append(run(Tracker(probe, tokenizer=tokenizer, every=args.every, max_tokens=2048)))
    a, b = statistics.median(with_t), statistics.median(without)
    print(
        f"(a) Llama 6×256 from scratch, {steps} steps of 8×128 tokens, snapshot every {args.every}, "
        f"median of {repeats}"
    )
    print(f"    with tracker {a:.2f} s, without {b:.2f} s: ratio {a / b:.3f} (target ≤ 1.02)")

    model = _model(tokenizer.vocab_size).eval()
    tracker_pre = Tracker(probe, tokenizer=tokenizer, every=1, max_tokens=None, rope="pre")
    tracker_auto = Tracker(probe, tokenizer=tokenizer, every=1, max_tokens=None)
    batches = tracker_pre._batches  # the probe as the tracker holds it

    def forward() -> None:
        with torch.no_grad():
            for b in batches:
                model(**b, use_cache=False)

    times: dict[str, list[float]] = {"forward": [], "pre": [], "auto": []}
    for step in range(5):
        for name in times:
            start = time.perf_counter()
            if name == "forward":
                forward()
            else:
                (tracker_pre if name == "pre" else tracker_auto).snapshot(model, step)
            times[name].append(time.perf_counter() - start)
    f = statistics.median(times["forward"])
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    print(f"(b) one snapshot over {tokens} probe tokens ÷ a plain forward of them (median of 5):")
    print(
        f"    rope='pre' {statistics.median(times['pre']) / f:.3f}, rope='auto' (both) "
        f"{statistics.median(times['auto']) / f:.3f} (target ≤ 1.2)"
    )


if __name__ == "__main__":
    main()
