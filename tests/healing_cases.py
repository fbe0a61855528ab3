"""Small healing runs shared by the healing tests: float64 tiny models, random token streams."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import headwidget
from tiny_models import VOCAB, make_model, three_layer_llama

F64 = torch.float64


def stream(seed: int, tokens: int = 1024) -> torch.Tensor:
    """One row of random ids (a healing stream)."""
    return torch.randint(1, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(seed))


def held_out(seed: int = 99, rows: int = 6, length: int = 20) -> torch.Tensor:
    """Evaluation rows of random ids (another seed than any healing stream)."""
    return torch.randint(1, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def small_heal(variant: nn.Module, model: nn.Module, **kwargs: Any) -> headwidget.HealingRun:
    """``heal`` with tiny budgets: 4 windows of 16 tokens a step, 4 steps, a point every 2 steps."""
    options: dict[str, Any] = {
        "tokens": 256,
        "batch_size": 4,
        "max_length": 16,
        "eval_texts": held_out(),
        "eval_every": 128,
        "eval_tokens": 120,
        "progress": False,
        "lr": 1e-3,
    }
    options.update(kwargs)
    texts = options.pop("texts", stream(1))
    return headwidget.heal(variant, model, texts, **options)


def llama() -> nn.Module:
    return three_layer_llama(seed=3)


def family(name: str) -> nn.Module:
    return make_model(name, dtype=F64, seed=2)
