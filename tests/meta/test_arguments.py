"""Every public argument refuses what would silently give a wrong number, with its own error and its name.

The classes of bad input, across the public API (what ``headwidget/__init__.py`` exports, the views, the
export and the sample text): a count given as a float (``0.5``, even ``2.0``), a bool, a string
(``"10"``), NaN or infinity, a huge value (``2**62``, ``10**30``), a negative one or ``None`` where none
is allowed; a flag given as ``"yes"`` or ``1``; a bare string or a number where a list is expected, a
list holding floats, strings or bools; statistics that are not a ``KVStats``; a dtype given as an
unknown name; spec numbers in other scripts' digits or of any length. Each case asserts the specific
headwidget error type and that the message names the argument; the calls that take a model also leave
it exactly as it was, with no hook left behind. The last tests pin the single defects of the tracker
("Hardening, third round", items 5 and 8) whose fix is not a refusal of an argument's type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import headwidget
from headwidget import errors
from headwidget.analysis.entropy import ChannelEntropyError
from headwidget.errors import ArgumentError
from headwidget.export import ExportError
from headwidget.moments.correlation import ChannelSelectionError
from headwidget.texts import english_sample
from tiny_models import VOCAB, make_model

# ------------------------------------------------------------------------------------------- fixtures


@dataclass
class Env:
    model: torch.nn.Module  # llama_gqa: 2 layers, 6 query heads over 2 KV heads, head size 8
    ids: torch.Tensor
    stats: headwidget.KVStats  # rope="both", inputs, 64 samples, cross-layer
    report: headwidget.EvaluationReport


@pytest.fixture(scope="module")
def env() -> Env:
    model = make_model("llama_gqa", dtype=torch.float32).eval()
    ids = torch.randint(1, VOCAB, (4, 24), generator=torch.Generator().manual_seed(0))
    stats = headwidget.capture(
        model, ids, rope="both", inputs=True, samples=64, cross_layer=True, progress=False
    )
    report = headwidget.evaluate(
        model, ids, ["model", "mqa"], per_layer=True, dtype=torch.float32, progress=False
    )
    return Env(model, ids, stats, report)


def no_hooks(model: torch.nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# ------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[Env], Any]
    error: type[Exception]
    names: str  # a regular expression the message must match: the argument's name (and what is wrong)


CASES: list[Case] = []


def case(id: str, call: Callable[[Env], Any], error: type[Exception], names: str) -> None:
    CASES.append(Case(id, call, error, names))


#: What a count must refuse: (label, value).
NOT_COUNTS: list[tuple[str, Any]] = [
    ("half", 0.5),
    ("whole float", 2.0),
    ("bool", True),
    ("string", "10"),
    ("nan", math.nan),
    ("inf", math.inf),
    ("huge", 2**62),
    ("huger", 10**30),
]
NEGATIVE = [("negative", -1)]
NONE = [("None", None)]
#: What a flag must refuse.
NOT_FLAGS: list[tuple[str, Any]] = [("string yes", "yes"), ("one", 1), ("None", None)]
#: What a list of layer indices must refuse (and the error), for a model of 2 layers.
NOT_LAYER_LISTS: list[tuple[str, Any, type[Exception]]] = [
    ("list of a float", [0.5], ArgumentError),
    ("list of a string", ["1"], ArgumentError),
    ("list of a bool", [True], ArgumentError),
    ("bare string", "01", ArgumentError),
    ("a float", 0.5, ArgumentError),
    ("empty", [], ArgumentError),
    ("outside the model", [7], errors.LayerIndexError),
    ("huge", [2**62], errors.LayerIndexError),
]


def counts(
    where: str,
    name: str,
    call: Callable[[Env, Any], Any],
    *,
    negative: bool = True,
    none: bool = True,
    huge: bool = True,
    seed: bool = False,
    error: type[Exception] = ArgumentError,
) -> None:
    """The bad counts for argument ``name`` of ``where``; ``call(env, value)`` passes ``value`` as it.

    ``seed``: 2**62 is a valid seed (seeds go up to 2**63 - 1), so only 10**30 is too large.
    """
    bad = [
        (k, v) for k, v in NOT_COUNTS if (huge or k not in ("huge", "huger")) and not (seed and k == "huge")
    ]
    bad += NEGATIVE if negative else []
    bad += NONE if none else []
    for label, value in bad:
        case(f"{where} {name}={label}", lambda e, v=value: call(e, v), error, rf"\b{re.escape(name)}\b")


def flags(where: str, name: str, call: Callable[[Env, Any], Any], *, none: bool = True) -> None:
    for label, value in NOT_FLAGS if none else NOT_FLAGS[:-1]:
        case(f"{where} {name}={label}", lambda e, v=value: call(e, v), ArgumentError, rf"\b{name}\b")


def layer_lists(where: str, name: str, call: Callable[[Env, Any], Any], skip: tuple[str, ...] = ()) -> None:
    for label, value, error in NOT_LAYER_LISTS:
        if label in skip:
            continue
        names = r"out of range" if error is errors.LayerIndexError else rf"\b{name}\b"
        case(f"{where} {name}={label}", lambda e, v=value: call(e, v), error, names)


# capture and estimate ------------------------------------------------------------------------------
def _capture(e: Env, **kw: Any) -> Any:
    return headwidget.capture(e.model, e.ids, **{"progress": False, **kw})


for _name in ("batch_size", "max_length"):
    counts("capture", _name, lambda e, v, n=_name: _capture(e, **{n: v}))
    counts("estimate", _name, lambda e, v, n=_name: headwidget.estimate(e.model, **{n: v}))
for _name in ("max_tokens", "max_memory"):
    counts("capture", _name, lambda e, v, n=_name: _capture(e, **{n: v}), none=False)
for _name in ("skip_first_token", "inputs", "progress"):
    flags("capture", _name, lambda e, v, n=_name: _capture(e, **{n: v}))
flags("estimate", "inputs", lambda e, v: headwidget.estimate(e.model, inputs=v))
layer_lists("capture", "layers", lambda e, v: _capture(e, layers=v))
layer_lists("capture", "cross_layer", lambda e, v: _capture(e, cross_layer=v), skip=("empty",))
layer_lists("estimate", "layers", lambda e, v: headwidget.estimate(e.model, v))
for _label, _value in [("string", "10"), ("float", 2.5), ("bool", True), ("negative", -1)]:
    case(
        f"capture samples={_label}",
        lambda e, v=_value: _capture(e, samples=v),
        errors.CaptureInputError,
        r"\bsamples\b",
    )
case(
    "capture sample_seed=-3",
    lambda e: _capture(e, samples=4, sample_seed=-3),
    errors.CaptureInputError,
    r"\bsample_seed\b",
)


# evaluate and apply ----------------------------------------------------------------------------------
def _evaluate(e: Env, **kw: Any) -> Any:
    options = {"dtype": torch.float32, "progress": False, **kw}
    variants = options.pop("variants", ["model", "mqa"])
    return headwidget.evaluate(e.model, options.pop("texts", e.ids), variants, **options)


for _name in ("batch_size", "max_length"):
    counts("evaluate", _name, lambda e, v, n=_name: _evaluate(e, **{n: v}))
counts("evaluate", "max_tokens", lambda e, v: _evaluate(e, max_tokens=v), none=False)
for _name in ("per_layer", "progress"):
    flags("evaluate", _name, lambda e, v, n=_name: _evaluate(e, **{n: v}))
layer_lists("evaluate", "layers", lambda e, v: _evaluate(e, layers=v))
layer_lists("apply", "layers", lambda e, v: headwidget.apply(e.model, "mqa", layers=v))
layer_lists(
    "fit_quantizer", "layers", lambda e, v: headwidget.evaluation.fit_quantizer(e.model, "kv:int4", layers=v)
)
case(
    "evaluate variants='mqa'",
    lambda e: _evaluate(e, variants="mqa"),
    ArgumentError,
    r"variants must be a list .*pass a list: \['mqa'\]",
)
case("evaluate variants=None", lambda e: _evaluate(e, variants=None), ArgumentError, r"\bvariants\b")
case("evaluate variants=[1]", lambda e: _evaluate(e, variants=[1]), ArgumentError, r"\bvariants\b")
case("evaluate variants=[]", lambda e: _evaluate(e, variants=[]), ArgumentError, r"variants is empty")
for _label, _dtype in [("unknown name", "fp16"), ("None", None), ("an integer dtype", torch.int64)]:
    case(f"evaluate dtype={_label}", lambda e, d=_dtype: _evaluate(e, dtype=d), ArgumentError, r"\bdtype\b")
for _where, _call in [
    ("evaluate", lambda e: _evaluate(e, stats={})),
    ("apply", lambda e: headwidget.apply(e.model, "mqa", stats={})),
    ("convert", lambda e: headwidget.convert(e.model, 0, "lrkv:2", stats={})),
    ("mechanism_sweep", lambda e: headwidget.mechanism_sweep(e.model, 0, ["mqa"], stats={})),
    ("fit_quantizer", lambda e: headwidget.evaluation.fit_quantizer(e.model, "kv:cq2c2b", {})),
    ("align", lambda e: headwidget.align({}, 0)),
    ("align_model", lambda e: headwidget.align_model(e.model, {}, [[0, 1]])),
]:
    case(f"{_where} stats={{}}", _call, ArgumentError, r"stats must be a KVStats")
case(
    "evaluate ids outside the vocabulary",
    lambda e: _evaluate(e, texts=e.ids + VOCAB),
    errors.CaptureInputError,
    r"vocabulary has 96 ids",
)
case(
    "evaluate negative ids",
    lambda e: _evaluate(e, texts=e.ids - VOCAB),
    errors.CaptureInputError,
    r"token ids cannot be negative",
)

# specs -------------------------------------------------------------------------------------------------
BAD_SPECS: list[tuple[str, str]] = [
    ("gqa:２", r"'gqa:２'.*ASCII digits 0-9, and '２' is not one"),
    ("mla:１２", r"ASCII digits"),
    ("kv:int4/g99999999999999999999", r"group size of kv:int\{b\}/g\{n\} takes 1 ≤ n ≤ 1048576"),
    ("kv:int4/g１", r"ASCII digits"),
    ("kv:cq99999999999999999999c8b", r"coupled channels takes 1 ≤ c ≤ 1048576"),
    ("kv:cq4c99999999999999999999b", r"bits per codeword .* takes 1 ≤ b ≤ 12"),
    ("gqa:" + "9" * 5000, r"KV-head count of gqa:G takes 0 ≤ G ≤ 1048576, got 9{20}\.\.\. \(5000 digits\)"),
    ("lrkv:10000000", r"rank of lrkv:r takes 0 ≤ r ≤ 1048576"),
    ("mla:96+rope:99999999999999999999", r"rotary pairs kept by \+rope:r takes"),
]
for _spec, _phrase in BAD_SPECS:
    case(
        f"apply spec={_spec[:30]}",
        lambda e, s=_spec: headwidget.apply(e.model, s),
        errors.MechanismSpecError,
        _phrase,
    )
    case(
        f"evaluate variants=[{_spec[:30]}]",
        lambda e, s=_spec: _evaluate(e, variants=[s]),
        errors.MechanismSpecError,
        _phrase,
    )
for _spec in ("gqa:２", "lrkv:99999999999999999999", "mla:" + "1" * 5000):
    case(
        f"convert spec={_spec[:20]}",
        lambda e, s=_spec: headwidget.convert(e.model, 0, s),
        errors.MechanismSpecError,
        r"mechanism spec|takes",
    )
# mixed specs and protocols
for _spec, _phrase in [
    ("mqa@0-1;mla:8@1", r"layer 1 is named twice"),
    ("mqa@0-5", r"layers 2, 3, 4, 5 are not in the model, which has 2 layers"),
    ("mqa@1-0", r"runs backwards"),
    ("mqa;mla:8@1", r"is not spec@layers"),
    ("mqa@1x", r"cannot read the layers '1x'"),
]:
    case(
        f"apply mixed spec={_spec}",
        lambda e, s=_spec: headwidget.apply(e.model, s),
        errors.MechanismSpecError,
        _phrase,
    )
    case(
        f"evaluate mixed variants=[{_spec}]",
        lambda e, s=_spec: _evaluate(e, variants=[s]),
        errors.MechanismSpecError,
        _phrase,
    )
case(
    "evaluate mixed spec with layers",
    lambda e: _evaluate(e, variants=["mqa@0"], layers=[0]),
    ArgumentError,
    r"layers=\[0\] was given with the mixed spec",
)
for _protocol in ("chunks:1", "chunks:0.5", "stride:8/9", "stride:8", 2048, None, "chunks:99999999999"):
    case(
        f"evaluate protocol={_protocol}",
        lambda e, p=_protocol: _evaluate(e, protocol=p),
        ArgumentError,
        r"\bprotocol\b",
    )


# allocate
def _allocate(e: Env, **kw: Any) -> Any:
    options = {
        "dtype": torch.float32,
        "progress": False,
        "budget": 0.5,
        "candidates": ["model", "mqa"],
        "refine": 0,
        **kw,
    }
    return headwidget.allocate(e.model, options.pop("texts", e.ids), **options)


for _label, _budget in [
    ("string", "0.5"),
    ("nan", math.nan),
    ("inf", math.inf),
    ("zero", 0.0),
    ("over one", 1.5),
    ("bool", True),
    ("negative", -3),
    ("None", None),
]:
    case(
        f"allocate budget={_label}", lambda e, b=_budget: _allocate(e, budget=b), ArgumentError, r"\bbudget\b"
    )
case(
    "allocate budget=below the cheapest",
    lambda e: _allocate(e, budget=1),
    errors.BudgetError,
    r"below the cheapest choice",
)
counts("allocate", "refine", lambda e, v: _allocate(e, refine=v), negative=True)
for _name in ("batch_size", "max_length"):
    counts("allocate", _name, lambda e, v, n=_name: _allocate(e, **{n: v}))
for _label, _candidates in [("string", "mqa"), ("empty", []), ("None", None)]:
    case(
        f"allocate candidates={_label}",
        lambda e, c=_candidates: _allocate(e, candidates=c),
        ArgumentError,
        r"\bcandidates\b",
    )
case(
    "allocate candidates=[mixed]",
    lambda e: _allocate(e, candidates=["model", "mqa@0"]),
    ArgumentError,
    r"mixed spec",
)
case(
    "allocate candidates=[banana]",
    lambda e: _allocate(e, candidates=["model", "banana"]),
    errors.MechanismSpecError,
    r"banana",
)
case("allocate objective=ppl", lambda e: _allocate(e, objective="ppl"), ArgumentError, r"\bobjective\b")
flags("allocate", "progress", lambda e, v: _allocate(e, progress=v))
flags("allocate", "distributed", lambda e, v: _allocate(e, distributed=v))
flags("evaluate", "distributed", lambda e, v: _evaluate(e, distributed=v))

for _where, _call in [
    ("apply", lambda e: headwidget.apply(e.model, None)),
    ("convert", lambda e: headwidget.convert(e.model, 0, 4)),
    ("fit_quantizer", lambda e: headwidget.evaluation.fit_quantizer(e.model, ["kv:int4"])),
]:
    case(f"{_where} spec not a string", _call, errors.MechanismSpecError, r"spec must be a string")
case(
    "fit_quantizer kv:int4/g99999999999999999999",
    lambda e: headwidget.evaluation.fit_quantizer(e.model, "kv:int4/g99999999999999999999"),
    errors.MechanismSpecError,
    r"1 ≤ n ≤ 1048576",
)
counts(
    "fit_quantizer", "iters", lambda e, v: headwidget.evaluation.fit_quantizer(e.model, "kv:int4", iters=v)
)
counts(
    "fit_quantizer",
    "seed",
    lambda e, v: headwidget.evaluation.fit_quantizer(e.model, "kv:int4", seed=v),
    seed=True,
)


# analyses -------------------------------------------------------------------------------------------
def _samples() -> torch.Tensor:
    return torch.randn(64, 8, generator=torch.Generator().manual_seed(0))


for _name in ("c", "b"):
    counts(
        "fit_codebooks",
        _name,
        lambda e, v, n=_name: headwidget.evaluation.fit_codebooks(_samples(), **{"c": 2, "b": 2, n: v}),
    )
for _name in ("iters", "seed"):
    counts(
        "fit_codebooks",
        _name,
        lambda e, v, n=_name: headwidget.evaluation.fit_codebooks(_samples(), 2, 2, **{n: v}),
        seed=_name == "seed",
    )
case(
    "fit_codebooks samples=list",
    lambda e: headwidget.evaluation.fit_codebooks([[1.0, 2.0]], 1, 1),
    ArgumentError,
    r"samples must be a floating",
)

#: One layer index: a float, bool, string or None is refused; a huge one is outside the model.
NOT_LAYERS: list[tuple[str, Any, type[Exception]]] = [
    ("half", 0.5, ArgumentError),
    ("whole float", 1.0, ArgumentError),
    ("bool", True, ArgumentError),
    ("string", "0", ArgumentError),
    ("None", None, ArgumentError),
    ("nan", math.nan, ArgumentError),
    ("huge", 2**62, errors.LayerIndexError),
]
for _where, _call in [
    ("convert", lambda e, v: headwidget.convert(e.model, v, "mqa")),
    ("mechanism_sweep", lambda e, v: headwidget.mechanism_sweep(e.model, v, ["mqa"])),
    ("operator_similarity", lambda e, v: headwidget.operator_similarity(e.model, v)),
    ("head_weights", lambda e, v: headwidget.analysis.head_weights(e.model, v)),
    ("channel_entropy", lambda e, v: headwidget.channel_entropy(e.stats, v)),
    ("KVStats.channel_corr", lambda e, v: e.stats.channel_corr(v)),
    ("KVStats.covariance", lambda e, v: e.stats.covariance(v)),
    ("KVStats.samples", lambda e, v: e.stats.samples(v)),
    ("KVStats.head_similarity", lambda e, v: e.stats.head_similarity(v)),
]:
    stats_method = _where.startswith("KVStats") or _where == "channel_entropy"
    for _label, _value, _error in NOT_LAYERS:
        # KVStats' layer checks (stats/) refuse a non-integer layer with LayerIndexError
        _error = errors.LayerIndexError if stats_method else _error
        _names = r"out of range" if _label == "huge" else r"\blayers?\b"
        case(f"{_where} layer={_label}", lambda e, v=_value, c=_call: c(e, v), _error, _names)
case(
    "mechanism_sweep specs='mqa'",
    lambda e: headwidget.mechanism_sweep(e.model, 0, "mqa"),
    ArgumentError,
    r"specs must be a list .*\['mqa'\]",
)
flags("operator_similarity", "centre", lambda e, v: headwidget.operator_similarity(e.model, 0, centre=v))
flags("head_diversity", "centre", lambda e, v: headwidget.head_diversity(np.eye(3), centre=v))
case("head_diversity matrix='x'", lambda e: headwidget.head_diversity("x"), ArgumentError, r"\bmatrix\b")
case(
    "head_diversity matrix=nan",
    lambda e: headwidget.head_diversity(np.full((2, 2), np.nan)),
    ArgumentError,
    r"matrix has NaN",
)
counts("downsample", "size", lambda e, v: headwidget.downsample(np.eye(4), v))
case("downsample matrix='x'", lambda e: headwidget.downsample("x", 2), ArgumentError, r"\bmatrix\b")
counts("group_heads", "num_groups", lambda e, v: headwidget.group_heads(np.eye(4), v))
counts("group_heads", "restarts", lambda e, v: headwidget.group_heads(np.eye(4), 2, restarts=v))
counts("group_heads", "seed", lambda e, v: headwidget.group_heads(np.eye(4), 2, seed=v), seed=True)
case("group_heads similarity='x'", lambda e: headwidget.group_heads("x", 1), ArgumentError, r"\bsimilarity\b")

layer_lists("align", "layers", lambda e, v: headwidget.align(e.stats, v), skip=("bare string",))
case("align layers='01'", lambda e: headwidget.align(e.stats, "01"), ArgumentError, r"\blayers\b")
flags("align", "heldout", lambda e, v: headwidget.align(e.stats, 0, heldout=v), none=False)
for _label, _groups in [
    ("a float head", [[0.5, 1]]),
    ("string heads", [["0", "1"]]),
    ("a bare string", "01"),
    ("a float layer", {0.5: [[0, 1]]}),
    ("None", None),
]:
    case(
        f"align_model groups={_label}",
        lambda e, g=_groups: headwidget.align_model(e.model, e.stats, g),
        ArgumentError,
        r"\bgroups|\blayer\b",
    )


def _align_model_layers(e: Env, layers: Any) -> Any:
    return headwidget.align_model(e.model, e.stats, [[0, 1]], layers=layers)


layer_lists("align_model", "layers", _align_model_layers, skip=("empty",))

# channel_entropy: its own error, an ArgumentError
counts(
    "channel_entropy",
    "bins",
    lambda e, v: headwidget.channel_entropy(e.stats, 0, bins=v),
    error=ChannelEntropyError,
)
for _label, _sizes in [("None", None), ("a string", "12"), ("a float", (2.0,)), ("huge", (2**62,))]:
    case(
        f"channel_entropy group_sizes={_label}",
        lambda e, s=_sizes: headwidget.channel_entropy(e.stats, 0, group_sizes=s),
        ChannelEntropyError,
        r"group_sizes|group size",
    )
flags("channel_entropy", "miller_madow", lambda e, v: headwidget.channel_entropy(e.stats, 0, miller_madow=v))

# KVStats channel windows
for _label, _channels in [
    ("list of a float", [0.5]),
    ("a string", "0:4"),
    ("list of strings", ["1"]),
    ("list of a bool", [True]),
    ("outside", [99]),
    ("a float slice", slice(0.5, 4)),
    ("a number", 4),
    ("a float tensor", torch.tensor([0.0, 1.0])),
]:
    for _method in ("channel_corr", "covariance"):
        case(
            f"KVStats.{_method} channels={_label}",
            lambda e, c=_channels, m=_method: getattr(e.stats, m)(0, "key", c),
            ChannelSelectionError,
            r"channel",
        )
case(
    "KVStats.head_similarity layers=None",
    lambda e: e.stats.head_similarity(None),
    errors.LayerIndexError,
    r"\blayers\b",
)


# views ------------------------------------------------------------------------------------------------
def _channels(e: Env, **kw: Any) -> Any:
    return headwidget.ChannelView(e.stats, prefetch=False, **kw)


counts("ChannelView", "max_cells", lambda e, v: _channels(e, max_cells=v))
counts("ChannelView", "channel_start", lambda e, v: _channels(e, channel_start=v), negative=False)
counts("ChannelView", "channel_width", lambda e, v: _channels(e, channel_width=v), none=False, negative=False)
counts("ChannelView", "layer", lambda e, v: _channels(e, layer=v), none=False, negative=False)
case("ChannelView pinned=[0.5]", lambda e: _channels(e, pinned=[0.5]), ArgumentError, r"\bpinned\b")
case("ChannelView pinned='1'", lambda e: _channels(e, pinned="1"), ArgumentError, r"\bpinned\b")
flags("ChannelView", "prefetch", lambda e, v: headwidget.ChannelView(e.stats, prefetch=v))
counts(
    "AlignmentView",
    "layer",
    lambda e, v: headwidget.AlignmentView(e.stats, layer=v),
    none=False,
    negative=False,
)
case(
    "AlignmentView layers='01'",
    lambda e: headwidget.AlignmentView(e.stats, layers="01"),
    ArgumentError,
    r"\blayers\b",
)
flags("AlignmentView", "heldout", lambda e, v: headwidget.AlignmentView(e.stats, heldout=v), none=False)
counts(
    "MechanismView",
    "layer",
    lambda e, v: headwidget.MechanismView(e.model, layer=v, prefetch=False),
    negative=False,
)
case(
    "MechanismView mechanisms='mqa'",
    lambda e: headwidget.MechanismView(e.model, mechanisms="mqa", prefetch=False),
    ArgumentError,
    r"mechanisms must be a list .*\['mqa'\]",
)
flags("MechanismView", "prefetch", lambda e, v: headwidget.MechanismView(e.model, prefetch=v))
counts(
    "ConsequenceView",
    "layer",
    lambda e, v: headwidget.ConsequenceView(e.report, layer=v),
    none=False,
    negative=False,
)
counts("QuantizationView", "bins", lambda e, v: headwidget.QuantizationView(e.stats, bins=v))
counts(
    "QuantizationView",
    "layer",
    lambda e, v: headwidget.QuantizationView(e.stats, layer=v),
    none=False,
    negative=False,
)
case(
    "QuantizationView group_sizes=None",
    lambda e: headwidget.QuantizationView(e.stats, group_sizes=None),
    ArgumentError,
    r"\bgroup_sizes\b",
)
flags("QuantizationView", "miller_madow", lambda e, v: headwidget.QuantizationView(e.stats, miller_madow=v))
counts(
    "TrendView",
    "layer",
    lambda e, v: headwidget.TrendView(e.stats, layer=v),
    none=False,
    negative=False,
)
case(
    "TrendView mechanisms='mqa'",
    lambda e: headwidget.TrendView(e.stats, model=e.model, mechanisms="mqa"),
    ArgumentError,
    r"mechanisms must be a list .*\['mqa'\]",
)
case(
    "TrendView alignment=3",
    lambda e: headwidget.TrendView(e.stats, alignment=3),
    ArgumentError,
    r"\balignment\b",
)
case(
    "TrendView metric=None",
    lambda e: headwidget.TrendView(e.stats, metric=None),
    errors.UnknownMetricError,
    r"\bmetric\b",
)
flags("explore", "mechanisms_trend", lambda e, v: headwidget.explore(e.stats, mechanisms_trend=v))
case("explore report={}", lambda e: headwidget.explore(e.stats, report={}), ArgumentError, r"\breport\b")
case("explore texts=None", lambda e: headwidget.explore(e.model), ArgumentError, r"needs texts")


# export and the sample text -----------------------------------------------------------------------------
def _save(e: Env, tmp: str = "fig.png", **kw: Any) -> Any:
    from headwidget.core.panels import Panel, PanelGrid
    from headwidget.export import save

    grid = PanelGrid([Panel("a", "A", np.eye(2))], -1.0, 1.0, "diverging", "")
    return save(grid, tmp, **kw)


# the type is checked by save/save_all (ArgumentError), the value by the figure (ExportError: > 0, finite,
# and a figure of at most so many pixels, naming the dpi that would fit)
for _label, _dpi, _error in [
    ("string", "200", ArgumentError),
    ("bool", True, ArgumentError),
    ("None", None, ArgumentError),
    ("nan", math.nan, ExportError),
    ("inf", math.inf, ExportError),
    ("0", 0, ExportError),
    ("huge", 10**30, ExportError),
]:
    case(f"export.save dpi={_label}", lambda e, d=_dpi: _save(e, dpi=d), _error, r"\bdpi\b")
    case(f"export.save_all dpi={_label}", lambda e, d=_dpi: _save_all(e, dpi=d), _error, r"\bdpi\b")
for _label, _size, _error in [
    ("one number", 3, ArgumentError),
    ("a string", "3x2", ArgumentError),
    ("strings", ("3", "2"), ArgumentError),
    ("zero", (0, 2), ExportError),
    ("too many pixels", (1000, 2), ExportError),
]:
    case(f"export.save size={_label}", lambda e, s=_size: _save(e, size=s), _error, r"\bsize\b|pixels")


def _save_all(e: Env, **kw: Any) -> Any:
    from headwidget.core.panels import Panel, PanelGrid
    from headwidget.export import save_all

    grid = PanelGrid([Panel("a", "A", np.eye(2))], -1.0, 1.0, "diverging", "")
    return save_all(grid, ["fig.png"], **kw)


def _save_all_to_one_string(e: Env) -> Any:
    from headwidget.export import save_all

    return save_all(None, "fig.png")  # type: ignore[arg-type]


case("export.save_all paths='fig.png'", _save_all_to_one_string, ArgumentError, r"paths must be a list")
counts("english_sample", "max_chars", lambda e, v: english_sample(max_chars=v), none=False)
counts("english_sample", "min_chars", lambda e, v: english_sample(min_chars=v))
counts("english_sample", "max_paragraph_chars", lambda e, v: english_sample(max_paragraph_chars=v))
case("english_sample split='train'", lambda e: english_sample(split="train"), ArgumentError, r"\bsplit\b")


# ------------------------------------------------------------------------------------------- the test
def test_the_cases_cover_every_class_and_count() -> None:
    """Every class of bad input is here (the count goes into the report of the tracker issue)."""
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    for label in (
        "half",
        "whole float",
        "bool",
        "string",
        "nan",
        "inf",
        "huge",
        "huger",
        "negative",
        "None",
        "string yes",
        "bare string",
        "list of a float",
    ):
        assert any(i.endswith(f"={label}") for i in ids), label
    assert len(CASES) > 400


@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_a_bad_argument_is_refused_by_name_and_changes_nothing(
    env: Env, bad: Case, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # an export that went through would land here
    before = {k: v.clone() for k, v in env.model.state_dict().items()}
    training = [m.training for m in env.model.modules()]
    with pytest.raises(bad.error) as raised:
        bad.call(env)
    assert isinstance(raised.value, errors.HeadwidgetError), type(raised.value)
    assert re.search(bad.names, str(raised.value)), str(raised.value)
    assert "\n" not in str(raised.value).strip()
    assert no_hooks(env.model)
    assert [m.training for m in env.model.modules()] == training
    assert all(torch.equal(v, before[k]) for k, v in env.model.state_dict().items())
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_argument_error_is_a_value_and_a_type_error() -> None:
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, TypeError)
    assert issubclass(ChannelEntropyError, ArgumentError) and issubclass(ChannelSelectionError, IndexError)


# ------------------------------------------------------------------------------- accepted forms stay so
def test_what_is_accepted_is_read_exactly(env: Env) -> None:
    """The forms a user may pass keep working and mean what they say: numpy integers, negative layer
    indices, one integer for ``layers``, dtype names (mapped to the torch dtype), an empty cross_layer."""
    a = headwidget.capture(env.model, env.ids, layers=[np.int64(-1)], max_tokens=np.int32(40), progress=False)
    b = headwidget.capture(env.model, env.ids, layers=1, max_tokens=40, cross_layer=[], progress=False)
    assert a.layers == b.layers == [1] and a.tokens == b.tokens == 40
    np.testing.assert_array_equal(a.channel_corr(1), b.channel_corr(1))
    by_name = headwidget.evaluate(env.model, env.ids, ["model", "mqa"], dtype="float32", progress=False)
    by_dtype = headwidget.evaluate(env.model, env.ids, ["model", "mqa"], dtype=torch.float32, progress=False)
    assert by_name.dtype == by_dtype.dtype == "torch.float32"
    assert by_name.nll == by_dtype.nll and by_name.kv_bytes_per_token == by_dtype.kv_bytes_per_token
    assert headwidget.evaluate(env.model, env.ids, ("mqa",), dtype="bfloat16", progress=False).dtype == (
        "torch.bfloat16"
    )
    assert env.stats.channel_corr(0, "key", torch.arange(4)).shape == (4, 4)
    np.testing.assert_array_equal(
        env.stats.channel_corr(0, "key", np.arange(4)), env.stats.channel_corr(0)[:4, :4]
    )


# ------------------------------------------------------------------------------- single defects
def test_a_group_larger_than_the_sequence_is_one_group_and_allocates_nothing(env: Env) -> None:
    """kv:int{b}/g{n} with n beyond the sequence: the same numbers as n = T (one group of all tokens),
    without padding the keys to n tokens (which overflowed, or allocated n × d per row)."""
    from headwidget.analysis.quantizers import quantize_int_keys

    key = torch.randn(2, 2, 7, 4, generator=torch.Generator().manual_seed(1))
    real = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    for group in (7, 8, 2**20):
        assert torch.equal(quantize_int_keys(key, 3, group, real), quantize_int_keys(key, 3, 7, real))
    whole = headwidget.evaluation.fit_quantizer(env.model, "kv:int4/g1048576")
    assert whole.group == 2**20


def test_mla_of_a_layer_with_all_zero_key_weights_is_built(env: Env) -> None:
    """``mla:1`` on a layer whose key projection is zero raised GroupCountError ("these weights differ
    between query heads that share a KV head"): the factorisation of the stacked [K; V] gives keys that
    are rounding noise of the values' size (≈ 1e-17), and the check that the copies of a KV head agree
    compared that noise to the keys' own (zero) scale. It is no error: the variant is built, its keys
    stay zero to rounding, and its values are the MLA fit's."""
    import copy

    model = copy.deepcopy(env.model)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.zero_()
        model.model.layers[0].self_attn.k_proj.bias.zero_()
    for spec in ("mla:1", "mla:3"):
        variant = headwidget.apply(model, spec, layers=[0])
        fit = headwidget.convert(model, 0, spec)
        w = headwidget.analysis.head_weights(variant, 0)
        assert float(w.k.abs().max()) < 1e-12
        np.testing.assert_allclose(w.v[w.kv_of].numpy(), fit.v_weight.numpy(), rtol=0, atol=1e-6)


def test_coupled_quantization_refuses_fewer_samples_than_centroids(env: Env) -> None:
    """kv:cq{c}c{b}b fits 2**b centroids per group: on fewer samples the k-means cannot be trusted (some
    centroids are single samples, or empty), so it is refused, saying how many samples it needs."""
    assert env.stats.samples(0, "value").shape[0] == 64
    fit = headwidget.evaluation.fit_quantizer(
        env.model, "kv:cq2c6b", env.stats
    )  # 64 centroids, 64 samples: enough
    assert set(fit.codebooks) == {0, 1}
    with pytest.raises(
        errors.MissingStatisticsError,
        match=r"kv:cq2c7b \(layer 0, key_post\): fitting "
        r"2\*\*7 = 128 centroids needs at least 128 calibration samples, got 64; capture "
        r"with samples=128 or more",
    ):
        headwidget.evaluation.fit_quantizer(env.model, "kv:cq2c7b", env.stats)
    with pytest.raises(
        errors.MissingStatisticsError, match=r"needs at least 256 calibration samples, got 64"
    ):
        _evaluate(env, variants=["kv:cq4c8b"], stats=env.stats)
    with pytest.raises(errors.MissingStatisticsError, match=r"needs at least 16 calibration samples, got 10"):
        headwidget.evaluation.fit_codebooks(torch.randn(10, 4), 2, 4)
