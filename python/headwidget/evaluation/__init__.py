"""What a conversion or a quantizer does to a model's predictions, on held-out text.

- :func:`apply`: a converted copy of a model (``mqa``, ``gqa:G+align``, ``lrkv:r``, ``mla:d_c``,
  ``rope:r``, ``mla:d_c+rope:r``...), runnable as a normal transformers model.
- :func:`fit_quantizer`: a K/V quantizer (``kv:int{b}``, ``kv:int{b}/g{n}``, ``kv:cq{c}c{b}b``) that
  fake-quantizes the post-RoPE keys and the values where the attention function receives them, while
  the model runs inside :meth:`KVQuantizer.active`; :func:`fit_codebooks` is its k-means (the schemes'
  maths: :mod:`headwidget.analysis.quantizers`).
- :func:`evaluate`: NLL, perplexity, KL and top-1 agreement (or the encoder measures) and KV bytes per
  token of each variant (conversions and quantizers alike), for the whole model and (``per_layer=True``)
  one layer at a time, as an :class:`EvaluationReport`; :func:`estimate_evaluation` is the memory bound
  it checks against ``max_memory`` before any work. Every spec may be mixed, one spec per layer
  (``"mla:64@0-9;kv:int4@10-29"``).
- :func:`allocate`: the mixed spec with the least damage on calibration text within a K/V byte budget
  (an exact per-layer knapsack over candidates, refined with the whole spec applied);
  :func:`estimate_allocation` is the memory bound it checks against ``max_memory``.
- Cross-layer variants (``share:g``, ``merge:2``, ``xkv:r/g``) and the ``prefill:P`` protocol, under
  which a prefill builds the cache that the variant transforms and the rest is scored from it
  (:mod:`headwidget.evaluation._prefill`, :mod:`headwidget.evaluation._cache_transforms`).
"""

from headwidget.analysis.quantizers import Codebooks, fit_codebooks, quantize_int_keys, quantize_int_values
from headwidget.evaluation._allocate import (
    Allocation,
    AllocationRound,
    allocate,
    allocate_frontier,
    estimate_allocation,
)
from headwidget.evaluation._apply import AppliedVariant, apply, fit_variant
from headwidget.evaluation._evaluate import evaluate
from headwidget.evaluation._inputs import parse_protocol, position_ids_from_mask
from headwidget.evaluation._memory import estimate_evaluation
from headwidget.evaluation._model_facts import resolve_layers
from headwidget.evaluation._plan import reusing_plans
from headwidget.evaluation._quantize import KVQuantizer, fit_quantizer
from headwidget.evaluation._report import EvaluationReport
from headwidget.evaluation.measures import EncoderTotals, PredictionTotals, predicted_positions

__all__ = [
    "Allocation",
    "AllocationRound",
    "AppliedVariant",
    "Codebooks",
    "EncoderTotals",
    "EvaluationReport",
    "KVQuantizer",
    "PredictionTotals",
    "allocate",
    "allocate_frontier",
    "apply",
    "estimate_allocation",
    "estimate_evaluation",
    "evaluate",
    "fit_codebooks",
    "fit_quantizer",
    "fit_variant",
    "parse_protocol",
    "position_ids_from_mask",
    "predicted_positions",
    "quantize_int_keys",
    "quantize_int_values",
    "resolve_layers",
    "reusing_plans",
]
