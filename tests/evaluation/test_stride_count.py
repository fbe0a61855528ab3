"""stride:W/S scores every token but the stream's first exactly once, S = W included, each from a token
of context or more inside a window of at most W: a brute-force count over streams, windows and strides."""

from __future__ import annotations

import pytest
import torch

from headwidget.evaluation import evaluate
from headwidget.evaluation._inputs import stride_batches
from tiny_models import VOCAB, three_layer_llama


def scored_positions(n: int, window: int, stride: int) -> list[int]:
    """The stream positions the stride batches score (a stream of ids 0..n-1, so an id is its position),
    each window checked: at most ``window`` tokens, every scored token after a real one."""
    stream = torch.arange(n).reshape(1, n)
    seen = []
    for batch in stride_batches(stream, None, window, stride, batch_size=3, max_tokens=None, context=None):
        assert batch.scored is not None
        for ids, mask, scored in zip(batch.input_ids, batch.attention_mask, batch.scored, strict=True):
            real = int(mask.sum())
            assert 2 <= real <= window and bool(mask[:real].all())
            for t in range(real):
                if scored[t]:
                    assert t >= 1  # a token of context or more inside its window
                    seen.append(int(ids[t]))
    return seen


CASES = [
    (n, w, s) for n in (2, 3, 17, 149) for w in (2, 3, 8, 9, 64) for s in sorted({1, w // 4 or 1, w - 1, w})
]


@pytest.mark.parametrize(("n", "window", "stride"), CASES)
def test_every_token_but_the_first_is_scored_once(n: int, window: int, stride: int) -> None:
    seen = scored_positions(n, window, stride)
    assert sorted(seen) == list(range(1, n)), (len(seen), n - 1)


def test_stride_w_w_scores_every_token_in_evaluate() -> None:
    """stride:W/W on 149 tokens scored 132 (W = 9), 130 (W = 8) and 74 (W = 2) of the 148 predictable
    ones: each window's first token went unscored."""
    llama = three_layer_llama(seed=2)
    ids = torch.randint(1, VOCAB, (1, 149), generator=torch.Generator().manual_seed(3))
    for protocol in ["stride:9/9", "stride:8/8", "stride:2/2"]:
        report = evaluate(llama, ids, ["model"], dtype=torch.float64, protocol=protocol, progress=False)
        assert report.tokens == 148, protocol
