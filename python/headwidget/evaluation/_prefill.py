"""``protocol="prefill:P"``: each window's first P tokens prefill a KV cache, the rest are scored from it.

Deployed caches are compressed after a prefill (MiniCache, xKV, KIVI, kvpress): the prefill's own
attention is exact, its cache is transformed, and every later token reads the transformed cache while
its own K/V are cached exactly. This protocol measures that: :func:`prefill_batches` keeps each
evaluation sequence (the ``documents`` protocol's, up to ``max_length`` tokens) that has at least
``P + 2`` real tokens, right-padded; :class:`PrefillRunner` runs its first ``P`` tokens as one forward
that fills a ``DynamicCache`` (the variant's cache transforms act on it as that forward returns:
:func:`~headwidget.evaluation._cache_transforms.transforming_prefill`), then the remaining tokens in one
forward that reads it. The scored predictions are those of the second forward: of tokens ``P + 1``
onwards, each made from a position that reads the prefilled cache. Without a transform the numbers are
the ``documents`` protocol's on the same predictions.

Layers a forward does not run (the replayed layers of the per-layer sweep,
:mod:`headwidget.evaluation._sweep`) get a stand-in cache of the prefill's length that is never read,
so that the scored forward counts its positions from the cache as a full model does.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> ids = torch.arange(1, 11).reshape(1, 10)
    >>> batches = prefill_batches([Batch(ids, torch.ones_like(ids))], 4)
    >>> batches[0].scored.tolist()
    [[0, 0, 0, 0, 0, 1, 1, 1, 1, 1]]
    >>> out = PrefillRunner.for_model(model, 4)(model, batches[0])
    >>> whole = OutputRunner.for_model(model)(model, batches[0])
    >>> out.targets.tolist(), bool(torch.allclose(out.values, whole.values, atol=1e-5))
    ([6, 7, 8, 9, 10], True)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headwidget.adapters import Adapter
from headwidget.capture.inputs import Batch
from headwidget.errors import EvaluationInputError
from headwidget.evaluation._cache_transforms import cache_argument
from headwidget.evaluation._inputs import forward_kwargs, position_ids_from_mask
from headwidget.evaluation._outputs import BatchOutput, OutputRunner, predicted_logits
from headwidget.evaluation.measures import predicted_positions

__all__ = ["PrefillRunner", "prefill_batches"]


def prefill_batches(batches: list[Batch], prefill: int, *, batch_size: int | None = None) -> list[Batch]:
    """The rows of ``batches`` with at least ``prefill + 2`` real tokens, right-padded, in batches of
    ``batch_size`` rows (default: the largest given batch's), each marking tokens ``prefill + 1``
    onwards as scored (module docstring).

    Raises:
        EvaluationInputError: no row is that long.
    """
    rows = [
        ids[mask.bool()]
        for batch in batches
        for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)
        if int(mask.sum()) >= prefill + 2
    ]
    if not rows:
        longest = max((int(b.attention_mask.sum(-1).max()) for b in batches), default=0)
        raise EvaluationInputError(
            f"protocol prefill:{prefill} prefills {prefill} tokens and scores from token {prefill + 1} on, "
            f"so a sequence needs at least {prefill + 2} tokens; the longest has {longest}. Use a shorter "
            "prefill, longer texts, or raise max_length / max_tokens"
        )
    size = batch_size or max(int(b.input_ids.shape[0]) for b in batches)
    out = []
    for start in range(0, len(rows), size):
        group = rows[start : start + size]
        width = max(int(r.numel()) for r in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, row in enumerate(group):
            ids[r, : row.numel()] = row
            mask[r, : row.numel()] = 1
        scored = mask.clone()
        scored[:, : prefill + 1] = 0
        out.append(Batch(ids, mask, scored))
    return out


def _stand_ins(cache: Any, rows: int, length: int, dtype: torch.dtype, device: torch.device) -> None:
    """Give every layer of ``cache`` the prefill did not reach a never-read stand-in of ``length`` tokens
    (one zero, expanded: no memory); a sliding-window layer's holds what its cache would, the last
    ``window − 1`` of them, and counts all ``length`` as seen."""
    for entry in getattr(cache, "layers", []):
        if not getattr(entry, "is_initialized", True) or entry.keys is None or entry.keys.numel() == 0:
            window = getattr(entry, "sliding_window", None)
            held = length if not window else min(length, int(window) - 1)
            stand_in = torch.zeros((), dtype=dtype, device=device).expand(rows, 1, held, 1)
            entry.keys, entry.values = stand_in, stand_in
            entry.is_initialized = True
            if hasattr(entry, "cumulative_length"):
                entry.cumulative_length = length


@dataclass(frozen=True)
class PrefillRunner(OutputRunner):
    """An :class:`~headwidget.evaluation._outputs.OutputRunner` for ``prefill:P`` (module docstring):
    ``prefill`` tokens build the cache, the rest are scored from it."""

    prefill: int = 0

    @classmethod
    def for_model(
        cls, model: nn.Module, prefill: int = 0, *, adapter: Adapter | None = None
    ) -> PrefillRunner:
        plain = OutputRunner.for_model(model, adapter=adapter)
        return cls(plain.kind, plain.device, prefill)

    @torch.no_grad()
    def __call__(self, model: nn.Module, batch: Batch) -> BatchOutput:
        from transformers import DynamicCache

        p = self.prefill
        params = inspect.signature(model.forward).parameters
        name = cache_argument(model)
        config: Any = getattr(model, "config", None)
        text_config = getattr(config, "get_text_config", None)
        cache = DynamicCache(config=text_config() if callable(text_config) else config)
        first = forward_kwargs(model, Batch(batch.input_ids[:, :p], batch.attention_mask[:, :p]), self.device)
        first.update({name: cache, "use_cache": True})
        if "logits_to_keep" in params:
            first["logits_to_keep"] = 1
        model(**first)
        dtype = next(model.parameters()).dtype
        _stand_ins(cache, int(batch.input_ids.shape[0]), p, dtype, self.device)
        mask = batch.attention_mask.to(self.device)
        second: dict[str, Any] = {
            "input_ids": batch.input_ids[:, p:].to(self.device),
            "attention_mask": mask,
            name: cache,
            "use_cache": True,
        }
        if "position_ids" in params:
            second["position_ids"] = position_ids_from_mask(batch.attention_mask)[:, p:].to(self.device)
        keep = predicted_positions(batch.attention_mask, batch.scored)[:, p:].to(self.device)
        targets = batch.input_ids.to(self.device)[:, p + 1 :][keep]
        return BatchOutput(predicted_logits(model, second, keep), targets)
