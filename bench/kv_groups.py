"""How much ``kv:int``'s token groups of keys depend on the tokens after a position, on SmolLM2.

``kv:int`` quantizes each key channel over groups of 32 tokens of the forward it runs in. In one
forward of a whole text, the keys a position attends to share their ranges with later tokens of their
group (the target among them); a deployed KIVI cache has not seen those tokens yet. This prints, side
by side, the NLL of each quantizer's variant when every position is predicted from one forward of the
whole text (what ``evaluate`` does) and from a forward of its own prefix only (no later token in any
range), on the same held-out tokens.

Run: ``.venv/bin/python bench/kv_groups.py`` (``--texts N --length T`` for more tokens; minutes: one
forward per position).
"""

from __future__ import annotations

import argparse
import math

import torch

from headwidget.embedded import load_smollm2
from headwidget.evaluation import apply
from headwidget.texts import english_sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=3, help="held-out texts (default 3)")
    parser.add_argument("--length", type=int, default=96, help="tokens per text (default 96)")
    args = parser.parse_args()
    model, tokenizer = load_smollm2()
    rows = [
        tokenizer(t, return_tensors="pt")["input_ids"][:, : args.length]
        for t in english_sample(split="evaluation")[: args.texts]
    ]
    print(f"SmolLM2-135M, {sum(r.shape[1] - 1 for r in rows)} predicted held-out tokens, float32")
    print(f"{'variant':10s} {'NLL, one forward':>17s} {'NLL, own prefix':>16s} {'difference':>11s}")
    for spec in ["model", "kv:int8", "kv:int4", "kv:int2"]:
        variant = apply(model, spec)
        whole: list[float] = []
        prefix: list[float] = []
        with torch.no_grad():
            for ids in rows:
                logp = variant(input_ids=ids).logits[0].double().log_softmax(-1)
                for t in range(ids.shape[1] - 1):
                    target = int(ids[0, t + 1])
                    whole.append(-float(logp[t, target]))
                    last = variant(input_ids=ids[:, : t + 1]).logits[0, -1].double().log_softmax(-1)
                    prefix.append(-float(last[target]))
        a, b = math.fsum(whole) / len(whole), math.fsum(prefix) / len(prefix)
        print(f"{spec:10s} {a:17.4f} {b:16.4f} {a - b:+11.4f}")


if __name__ == "__main__":
    main()
