"""What a change does to a model's outputs, accumulated batch by batch in float64.

For language models (an LM head), over every predicted token — position ``t`` predicts token ``t + 1``
of the same sequence, so a sequence's first token is never predicted and padding never counts:

- ``nll``: mean next-token cross-entropy of the variant, in nats; ``perplexity = exp(nll)``;
- ``kl``: mean ``KL(p_original ‖ p_variant)`` of the next-token distributions, in nats;
- ``top1``: share of predicted tokens where the variant's argmax equals the original's.

Sums are float64; the log-softmax and KL of each row run in float32, or in float64 when the logits are
float64 (``evaluate(..., dtype=torch.float64)`` is float64 throughout), on chunks of
:data:`CHUNK_BYTES` of rows, so the work memory does not grow with the batch: two log-softmaxes of a
chunk, the KL computed in their memory (:func:`measure_work_bytes`).

For encoders without an LM head, over every real token and sentence:

- ``hidden_rel_error``: ``‖H_variant − H_original‖_F / ‖H_original‖_F`` of the last hidden states;
- ``embedding_cosine``: mean cosine of the mean-pooled sentence embeddings.

Example:
    >>> import torch
    >>> logits = torch.randn(2, 5, 11)
    >>> labels = torch.randint(0, 11, (2, 5))
    >>> mask = torch.ones(2, 5, dtype=torch.long)
    >>> same = PredictionTotals()
    >>> same.add(logits, logits, labels, mask)
    >>> same.tokens, round(same.kl, 12), same.top1
    (8, 0.0, 1.0)
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch

__all__ = [
    "CHUNK_BYTES",
    "EncoderTotals",
    "PredictionTotals",
    "chunk_rows",
    "measure_work_bytes",
    "predicted_positions",
    "work_dtype",
]

F64 = torch.float64


#: Bytes of work the measures use at once: predicted rows are scored in chunks of this many bytes of logits.
CHUNK_BYTES = 16 * 2**20


def work_dtype(logits: torch.Tensor) -> torch.dtype:
    """The dtype the measures are computed in: float64 for float64 logits, else float32.

    >>> work_dtype(torch.zeros(1, dtype=torch.bfloat16)), work_dtype(torch.zeros(1, dtype=torch.float64))
    (torch.float32, torch.float64)
    """
    return F64 if logits.dtype == F64 else torch.float32


def chunk_rows(vocab: int) -> int:
    """How many rows of ``vocab`` logits one chunk of the measures takes (at least 1).

    >>> chunk_rows(49152), chunk_rows(10**9)
    (85, 1)
    """
    return max(1, CHUNK_BYTES // (4 * max(1, vocab)))


def measure_work_bytes(rows: int, vocab: int, logits_bytes: int) -> int:
    """Peak bytes of the measures' work on ``rows`` predicted rows of ``vocab`` logits of
    ``logits_bytes`` each (:meth:`PredictionTotals.add_rows`): one chunk's two log-softmaxes in the work
    dtype, and a float32 cast of the variant's chunk from a narrower dtype while the reference's is held.

    >>> measure_work_bytes(1000, 49152, 4) == 2 * chunk_rows(49152) * 49152 * 4  # float32: no cast
    True
    >>> measure_work_bytes(10, 100, 2), measure_work_bytes(10, 100, 8)  # bf16: 3 float32 chunks
    (12000, 16000)
    """
    chunk = min(rows, chunk_rows(vocab)) * vocab * max(logits_bytes, 4)
    return (2 if logits_bytes >= 4 else 3) * chunk


def predicted_positions(attention_mask: torch.Tensor, scored: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T−1) booleans: position ``t`` predicts a real token ``t + 1`` from a real token ``t`` (and,
    given ``scored`` (B, T), a token ``t + 1`` that is scored).

    >>> predicted_positions(torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])).tolist()
    [[True, True, False], [False, True, True]]
    >>> predicted_positions(torch.tensor([[1, 1, 1, 1]]), torch.tensor([[0, 0, 1, 1]])).tolist()
    [[False, True, True]]
    """
    real = attention_mask.bool()
    keep = real[:, :-1] & real[:, 1:]
    return keep if scored is None else keep & scored.bool().to(keep.device)[:, 1:]


@dataclass
class PredictionTotals:
    """Running sums of next-token NLL, KL to the original and top-1 agreement (float64)."""

    tokens: int = 0
    nll_sum: float = 0.0
    kl_sum: float = 0.0
    top1_hits: int = 0

    def add(
        self,
        original_logits: torch.Tensor,
        variant_logits: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
    ) -> None:
        """Add one batch: logits (B, T, V) of the original and the variant on ``input_ids`` (B, T)."""
        keep = predicted_positions(attention_mask.to(original_logits.device))
        if not bool(keep.any()):
            return
        targets = input_ids.to(original_logits.device)[:, 1:][keep]
        self.add_rows(original_logits[:, :-1][keep], variant_logits[:, :-1][keep], targets)

    @torch.no_grad()
    def add_rows(self, original: torch.Tensor, variant: torch.Tensor, targets: torch.Tensor) -> None:
        """Add predicted positions already picked out: logits (N, V) and the tokens they predict (N,).

        >>> t = PredictionTotals()
        >>> t.add_rows(torch.zeros(2, 4), torch.zeros(2, 4), torch.tensor([0, 3]))
        >>> t.tokens, abs(t.nll - math.log(4)) < 1e-6
        (2, True)
        """
        if not targets.numel():
            return
        targets = targets.to(variant.device)
        work = work_dtype(variant)
        step = chunk_rows(variant.shape[-1])
        for start in range(0, int(targets.numel()), step):
            rows = slice(start, start + step)
            ref = torch.log_softmax(original[rows].to(variant.device, work), dim=-1)
            var = torch.log_softmax(variant[rows].to(work), dim=-1)
            nll = -var.gather(1, targets[rows, None]).squeeze(1)
            self.nll_sum += float(nll.to(F64).sum())
            self.top1_hits += int((ref.argmax(-1) == var.argmax(-1)).sum())
            # KL = Σ p_ref·(ref − var), in the two chunks' own memory: var − ref is −(ref − var) exactly
            # and so is every product and sum taken of it (rounding is symmetric), so the sum is the
            # same number as that of ref.exp() * (ref - var)
            kl = -var.sub_(ref).mul_(ref.exp_()).sum(-1)
            self.kl_sum += float(kl.to(F64).sum())
            del ref, var  # freed before the next chunk's
        self.tokens += int(targets.numel())

    @property
    def nll(self) -> float:
        return self.nll_sum / self.tokens if self.tokens else math.nan

    @property
    def perplexity(self) -> float:
        """``exp(nll)``; +inf where that overflows a float (an NLL above about 709 nats).

        >>> PredictionTotals(tokens=1, nll_sum=800.0).perplexity
        inf
        """
        if not self.tokens:
            return math.nan
        return math.exp(self.nll) if self.nll < math.log(sys.float_info.max) else math.inf

    @property
    def kl(self) -> float:
        return self.kl_sum / self.tokens if self.tokens else math.nan

    @property
    def top1(self) -> float:
        return self.top1_hits / self.tokens if self.tokens else math.nan


@dataclass
class EncoderTotals:
    """Running sums for an encoder: hidden-state error and sentence-embedding cosine (float64).

    >>> h = torch.randn(2, 4, 3)
    >>> totals = EncoderTotals()
    >>> totals.add(h, h, torch.ones(2, 4, dtype=torch.long))
    >>> totals.hidden_rel_error, round(totals.embedding_cosine, 12)
    (0.0, 1.0)
    """

    tokens: int = 0
    sentences: int = 0
    diff_sq: float = 0.0
    ref_sq: float = 0.0
    cosine_sum: float = 0.0

    def add(self, original: torch.Tensor, variant: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Add one batch of last hidden states (B, T, D) of the original and the variant."""
        real = attention_mask.to(original.device).bool()
        ref, var = original.to(F64), variant.to(F64)
        self.tokens += int(real.sum())
        self.diff_sq += float(((var - ref)[real] ** 2).sum())
        self.ref_sq += float((ref[real] ** 2).sum())
        weights = real.to(F64)[..., None]
        counts = weights.sum(1).clamp_min(1)
        pooled_ref, pooled_var = (ref * weights).sum(1) / counts, (var * weights).sum(1) / counts
        has_tokens = real.any(1)
        cos = torch.nn.functional.cosine_similarity(pooled_ref, pooled_var, dim=-1)
        self.sentences += int(has_tokens.sum())
        self.cosine_sum += float(cos[has_tokens].sum())

    @property
    def hidden_rel_error(self) -> float:
        return math.sqrt(self.diff_sq / self.ref_sq) if self.ref_sq > 0 else math.nan

    @property
    def embedding_cosine(self) -> float:
        return self.cosine_sum / self.sentences if self.sentences else math.nan
