"""Evaluation report files: every field checked on load, damage refused with ReportFileError, round trips.

A report file that ``EvaluationReport.load`` accepts holds every field of the right type (integers that
are integers, strings that are strings), every variant in every per-variant table, the measures of its
``kind`` within their ranges, per-layer lists as long as ``layers``, and nothing else. Anything else,
and anything that is not a JSON text of a report at all (truncated, not UTF-8, too big, too deep, a
directory, a FIFO), raises :class:`ReportFileError` naming the file and the field. The range rules
below (:func:`number_allowed`) are this test's own statement of what a report may hold.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import random
import threading
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

from disk_full import check_the_limit_works, disk_full_after, snapshot
from headwidget.errors import ReportFileError
from headwidget.evaluation import EvaluationReport, evaluate
from headwidget.files import partial_leftovers
from tiny_models import make_model, ragged_batches

INF, NAN = math.inf, math.nan


# ---------------------------------------------------------------------- valid reports
def lm_report(per_layer: bool = True, constant: bool = True) -> EvaluationReport:
    variants = ["model", "mqa", "kv:cq4c8b"]
    nll = {"model": 2.0, "mqa": 2.5, "kv:cq4c8b": 2.125}
    kl = {"model": 0.0, "mqa": 0.4, "kv:cq4c8b": 0.0625}
    top1 = {"model": 1.0, "mqa": 0.75, "kv:cq4c8b": 0.9}
    return EvaluationReport(
        model="tiny-llama",
        kind="causal-lm",
        variants=variants,
        measures={
            v: {"nll": nll[v], "perplexity": math.exp(nll[v]), "kl": kl[v], "top1": top1[v]} for v in variants
        },
        kv_bytes_per_token={"model": 512, "mqa": 128, "kv:cq4c8b": 68.5},
        tokens=100,
        sequences=4,
        fingerprint="0123456789abcdef",
        dtype="torch.float32",
        layers=[0, 1],
        per_layer={"model": [0.0, 0.0], "mqa": [0.25, -0.0625], "kv:cq4c8b": [0.05, 0.07]}
        if per_layer
        else None,
        per_layer_measure="delta_nll" if per_layer else None,
        calibration={"tokens": 4096, "kinds": ["key_post", "value"]} if constant else {},
        constant_bytes={"kv:cq4c8b": 8192} if constant else {},
        num_layers=4 if per_layer else 0,
        converted_kv_bytes=256.0 if per_layer else 0.0,
    )


def encoder_report(per_layer: bool = True, constant: bool = False) -> EvaluationReport:
    return EvaluationReport(
        model="tiny-bert",
        kind="encoder",
        variants=["model", "gqa:2", "kv:int4"],
        measures={
            "model": {"hidden_rel_error": 0.0, "embedding_cosine": 1.0},
            "gqa:2": {"hidden_rel_error": 0.3125, "embedding_cosine": 0.9375},
            "kv:int4": {"hidden_rel_error": NAN, "embedding_cosine": NAN},
        },  # undefined: legal
        kv_bytes_per_token={"model": 256, "gqa:2": 128, "kv:int4": 80},
        tokens=31,
        sequences=5,
        fingerprint="fedcba9876543210",
        dtype="torch.bfloat16",
        layers=[1] if per_layer else [],
        per_layer={"model": [0.0], "gqa:2": [0.125], "kv:int4": [NAN]} if per_layer else None,
        per_layer_measure="hidden_rel_error" if per_layer else None,
        constant_bytes={"kv:int4": 0} if constant else {},
    )


BUILDERS = {
    "lm": lambda: lm_report(),
    "lm-plain": lambda: lm_report(per_layer=False, constant=False),
    "encoder": lambda: encoder_report(),
    "encoder-plain": lambda: encoder_report(per_layer=False, constant=True),
}


def as_text(report: EvaluationReport) -> str:
    """The report as JSON text: equal texts are equal reports, NaN included (NaN != NaN in ``==``)."""
    return json.dumps(report.to_json(), allow_nan=True)


def write_tree(path: Path, tree: Any) -> Path:
    path.write_text(json.dumps(tree, indent=1, allow_nan=True), encoding="utf-8")
    return path


# ---------------------------------------------------------------------- the rules, stated independently
def number_allowed(report: EvaluationReport, where: tuple[Any, ...], value: Any) -> bool:
    """Whether ``report`` may hold the JSON number ``value`` at ``where`` (the rest unchanged)."""
    kind = report.kind
    if isinstance(value, bool):
        return False
    finite = isinstance(value, int) or math.isfinite(value)
    integer = isinstance(value, int)
    top = where[0]
    if top == "measures":
        name = where[2]
        if name == "nll":
            return finite and value >= 0
        if name == "perplexity":
            return not math.isnan(value) and value >= 1
        if name == "kl":
            return finite and value >= -1e-5
        if name == "top1":
            return finite and 0 <= value <= 1
        if name == "hidden_rel_error":
            return math.isnan(value) or (finite and value >= 0)
        if name == "embedding_cosine":
            return math.isnan(value) or (finite and -1 - 1e-6 <= value <= 1 + 1e-6)
    if top == "kv_bytes_per_token":  # the model's: at least what its converted layers cache
        least = report.converted_kv_bytes if where[1] == "model" else 0
        return finite and value >= least
    if top in ("constant_bytes", "calibration"):
        return integer and value >= 0
    if top in ("tokens", "sequences"):
        return integer and value >= 1
    if top == "version":
        return integer and value == 1
    if top == "per_layer":
        if kind == "causal-lm":
            return finite
        return math.isnan(value) or (finite and value >= 0)
    if top == "num_layers":  # 0: not recorded; else more than the largest converted layer
        return integer and (value == 0 or value > max(report.layers, default=-1))
    if top == "converted_kv_bytes":  # at most what the whole model caches
        return finite and 0 <= value <= report.kv_bytes_per_token["model"]
    raise AssertionError(f"no rule for {where}")


def field_name(where: tuple[Any, ...]) -> str:
    """How a message names a place in the file: ``measures["mqa"]["kl"]``, ``per_layer["mqa"][1]``."""
    name = str(where[0])
    for step in where[1:]:
        name += f"[{step}]" if isinstance(step, int) else f"[{json.dumps(step)}]"
    return name


def leaves(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    if isinstance(node, dict):
        return [leaf for key, value in node.items() for leaf in leaves(value, (*here, key))]
    if isinstance(node, list) and node:
        return [leaf for i, value in enumerate(node) for leaf in leaves(value, (*here, i))]
    return [(here, node)]


def put(tree: Any, where: tuple[Any, ...], value: Any) -> Any:
    tree = copy.deepcopy(tree)
    parent = tree
    for step in where[:-1]:
        parent = parent[step]
    parent[where[-1]] = value
    return tree


def refused(path: Path) -> str:
    with pytest.raises(ReportFileError) as info:
        EvaluationReport.load(path)
    message = str(info.value)
    assert str(path) in message, message
    assert "\n" not in message, message
    return message


#: The tables of real numbers: an integer is a number there too (``512`` bytes).
REAL_TABLES = ("measures", "kv_bytes_per_token", "per_layer")


def wrong_types(where: tuple[Any, ...], value: Any) -> list[Any]:
    """JSON values of every type other than the place's (a real-number place takes integers too)."""
    if value is None:
        return []  # the place takes null: an optional field that is absent
    if len(where) > 1 and where[0] in REAL_TABLES:
        return ["1.0", None, True, [], {}]
    if isinstance(value, str):
        return [1, None, True, [], {}, 1.5]
    if isinstance(value, bool):
        raise AssertionError("no report field is a boolean")
    if isinstance(value, int):
        return [1.0, 2.5, "1", None, True, [], {}]
    if isinstance(value, float):
        return ["1.0", None, True, [], {}]
    return []


# ---------------------------------------------------------------------- round trips
@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_saved_report_loads_back_equal(name: str, tmp_path: Path) -> None:
    report = BUILDERS[name]()
    path = report.save(tmp_path / "report.json")
    back = EvaluationReport.load(path)
    assert as_text(back) == as_text(report)
    if "encoder" not in name:
        assert back == report
    assert back.rows() == report.rows() or "encoder" in name
    assert back.table() == report.table()
    assert type(back.tokens) is int and type(back.kv_bytes_per_token["model"]) is int
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


@pytest.fixture(scope="module")
def evaluated() -> dict[str, EvaluationReport]:
    """Reports of real evaluations: a tiny Llama (per layer, a K/V quantizer) and a tiny BERT encoder."""
    llama = make_model("llama_gqa", torch.float32)
    bert = make_model("bert", torch.float32)
    options: dict[str, Any] = {"dtype": torch.float32, "progress": False}
    return {
        "lm": evaluate(llama, ragged_batches(), ["model", "mqa", "kv:int4"], per_layer=True, **options),
        "lm-plain": evaluate(llama, ragged_batches(seed=3), ["model", "gqa:1"], **options),
        "encoder": evaluate(bert, ragged_batches(), ["model", "mqa"], per_layer=True, **options),
        "encoder-plain": evaluate(bert, ragged_batches(seed=4), ["model", "kv:int8"], **options),
    }


@pytest.mark.parametrize("name", ["lm", "lm-plain", "encoder", "encoder-plain"])
def test_evaluated_reports_round_trip(
    name: str, evaluated: dict[str, EvaluationReport], tmp_path: Path
) -> None:
    report = evaluated[name]
    back = EvaluationReport.load(report.save(tmp_path / "r.json"))
    assert back == report and as_text(back) == as_text(report)
    upper = EvaluationReport.load(report.save(tmp_path / "R.JSON"))  # the suffix in any case
    assert upper == report


# ---------------------------------------------------------------------- every place, every wrong value
@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_leaf_with_a_wrong_type_is_refused_by_name(name: str, tmp_path: Path) -> None:
    tree = json.loads(json.dumps(BUILDERS[name]().to_json(), allow_nan=True))
    path = tmp_path / "r.json"
    checked = 0
    for where, value in leaves(tree):
        if where == ("format",):
            continue
        for bad in wrong_types(where, value):
            write_tree(path, put(tree, where, bad))
            message = refused(path)
            assert field_name(where) in message, (where, bad, message)
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_number_is_range_checked(name: str, tmp_path: Path) -> None:
    report = BUILDERS[name]()
    tree = json.loads(json.dumps(report.to_json(), allow_nan=True))
    path = tmp_path / "r.json"
    specials = [NAN, INF, -INF, -1, -1e-3, -1e-7, 0, 0.5, 1, 1.0 + 1e-7, 1.5, 3, 1e300, 2**64]
    outcomes = {"loaded": 0, "refused": 0}
    for where, value in leaves(tree):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or where[0] == "layers":
            continue
        for special in specials:
            if not (len(where) > 1 and where[0] in REAL_TABLES) and isinstance(special, float):
                continue  # a wrong type, the test above
            write_tree(path, put(tree, where, special))
            if number_allowed(report, where, special):
                loaded = EvaluationReport.load(path)
                assert as_text(loaded) == json.dumps(put(tree, where, special), allow_nan=True), where
                outcomes["loaded"] += 1
            else:
                message = refused(path)
                assert field_name(where) in message, (where, special, message)
                outcomes["refused"] += 1
    assert outcomes["loaded"] > 10 and outcomes["refused"] > 30, outcomes


def _default(name: str) -> object:
    """The value a report field takes when its file leaves it out: the dataclass's own default."""
    (spec,) = [f for f in dataclasses.fields(EvaluationReport) if f.name == name]
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return spec.default


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_field_removed(name: str, tmp_path: Path) -> None:
    """A required field (one without a default) missing is refused by name; an optional one is its default
    (where the rest of the file agrees with that default)."""
    report = BUILDERS[name]()
    tree = json.loads(json.dumps(report.to_json(), allow_nan=True))
    path = tmp_path / "r.json"
    optional = {
        "layers",
        "per_layer",
        "per_layer_measure",
        "calibration",
        "constant_bytes",
        "num_layers",
        "converted_kv_bytes",
        "chosen_on_these_tokens",
        "protocol",
    }
    for key in tree:
        write_tree(path, {k: v for k, v in tree.items() if k != key})
        if key == "format":
            assert "not a headwidget evaluation report" in refused(path)
        elif key not in optional:
            message = refused(path)
            assert f"{key} is missing" in message, message
        elif key in ("per_layer", "per_layer_measure") and report.per_layer is not None:
            assert "per_layer" in refused(path)
        elif key == "layers" and report.per_layer is not None:
            assert "layers" in refused(path)
        else:
            loaded = EvaluationReport.load(path)
            assert getattr(loaded, key) == _default(key) or getattr(report, key) is None


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_entry_of_a_table_removed_or_added(name: str, tmp_path: Path) -> None:
    report = BUILDERS[name]()
    tree = json.loads(json.dumps(report.to_json(), allow_nan=True))
    path = tmp_path / "r.json"
    for table in ("measures", "kv_bytes_per_token", "per_layer"):
        if tree[table] is None:
            continue
        for variant in tree[table]:
            write_tree(path, put(tree, (table,), {k: v for k, v in tree[table].items() if k != variant}))
            message = refused(path)
            assert field_name((table, variant)) in message and "missing" in message, message
        write_tree(path, put(tree, (table, "mha"), tree[table]["model"]))  # a variant not in variants
        assert field_name((table, "mha")) in refused(path)
    for variant, measures in tree["measures"].items():
        for measure in measures:
            write_tree(
                path, put(tree, ("measures", variant), {k: v for k, v in measures.items() if k != measure})
            )
            assert f"{field_name(('measures', variant, measure))} is missing" in refused(path)
        write_tree(path, put(tree, ("measures", variant, "bleu"), 0.5))
        assert field_name(("measures", variant)) in refused(path)
    # the measures of the other kind of model
    other = {"nll": 2.0, "perplexity": 7.5, "kl": 0.0, "top1": 1.0}
    if report.kind == "causal-lm":
        other = {"hidden_rel_error": 0.0, "embedding_cosine": 1.0}
    write_tree(path, put(tree, ("measures", "model"), other))
    assert field_name(("measures", "model")) in refused(path)
    write_tree(path, put(tree, ("kind",), "encoder" if report.kind == "causal-lm" else "causal-lm"))
    assert "measures" in refused(path)
    # constant bytes may be left out for any variant (0), but never name one that is not evaluated
    write_tree(path, put(tree, ("constant_bytes",), {}))
    assert EvaluationReport.load(path).constant_bytes == {}
    write_tree(path, put(tree, ("constant_bytes", "mha"), 10))
    assert field_name(("constant_bytes", "mha")) in refused(path)


def test_unknown_fields_are_refused_where_they_are(tmp_path: Path) -> None:
    tree = json.loads(json.dumps(lm_report().to_json()))
    path = tmp_path / "r.json"
    write_tree(path, {**tree, "comment": "hello"})
    message = refused(path)
    assert "comment" in message and "unknown" in message
    write_tree(path, put(tree, ("calibration", "texts"), 12))
    message = refused(path)
    assert "calibration" in message and "texts" in message


def test_variants_per_layer_lengths_and_layers(tmp_path: Path) -> None:
    tree = json.loads(json.dumps(lm_report().to_json()))
    path = tmp_path / "r.json"
    cases = [
        (("variants",), [], "variants"),
        (("variants",), ["model", "mqa", "mqa"], "variants"),
        (("variants",), ["model", "mqa"], 'measures["kv:cq4c8b"]'),
        (("variants",), ["model", "mqa", "kv:cq4c8b", "gqa:2"], 'measures["gqa:2"]'),
        (("variants", 1), "", "variants[1]"),
        (("per_layer", "mqa"), [0.25], 'per_layer["mqa"]'),
        (("per_layer", "mqa"), [0.25, 0.1, 0.2], 'per_layer["mqa"]'),
        (("per_layer", "mqa"), [], 'per_layer["mqa"]'),
        (("layers",), [0], 'per_layer["model"]'),
        (("layers",), [], "layers"),
        (("layers",), [0, 0], "layers"),
        (("layers",), [0, -1], "layers[1]"),
        (("per_layer_measure",), "hidden_rel_error", "per_layer_measure"),
        (("per_layer_measure",), None, "per_layer_measure"),
        (("per_layer",), None, "per_layer_measure"),
        (("kind",), "seq2seq", "kind"),
        (("dtype",), "float32", "dtype"),
        (("dtype",), "torch.int64", "dtype"),
        (("dtype",), "torch.nothing", "dtype"),
        (("calibration", "kinds"), ["key", "key"], 'calibration["kinds"]'),
        (("calibration", "kinds", 0), "query", 'calibration["kinds"][0]'),
        (("version",), 2, "version"),
    ]
    for where, value, named in cases:
        write_tree(path, put(tree, where, value))
        message = refused(path)
        assert named in message, (where, value, message)
    write_tree(path, put(put(tree, ("per_layer",), None), ("per_layer_measure",), None))
    assert EvaluationReport.load(path).per_layer is None


# ---------------------------------------------------------------------- not a report at all
def test_text_that_is_no_report(tmp_path: Path) -> None:
    good = json.dumps(lm_report().to_json(), indent=1)
    path = tmp_path / "r.json"
    cases = {
        "": "not valid JSON",
        "[]": "not a headwidget evaluation report",
        "null": "not a headwidget evaluation report",
        '{"format": "headwidget-stats"}': "not a headwidget evaluation report",
        good[:-1] + ', "tokens": 7}': "twice",
        good.replace('"tokens": 100', '"tokens": 1' + "0" * 5000): "tokens",
        "[" * 100_000 + "]" * 100_000: "nested",
        '{"format": "headwidget-evaluation-report", "version": 1, "model": ' + "[" * 100_000: "JSON",
        good.replace('"model": "tiny-llama"', '"model": NaN'): "model",
    }
    for cut in (0, 1, len(good) // 3, len(good) // 2, len(good) - 1):
        cases[good[:cut]] = "not valid JSON"
    for text, named in cases.items():
        path.write_text(text, encoding="utf-8")
        message = refused(path)
        assert named in message, (text[:60], message)
    path.write_bytes(good.encode("utf-8").replace(b"tiny-llama", b"tiny-\xff\xfellama"))
    assert "UTF-8" in refused(path)
    path.write_bytes(b"\xef\xbb\xbf" + good.encode())  # a byte-order mark is no JSON
    refused(path)


def test_paths_that_are_no_report_file(tmp_path: Path) -> None:
    assert "no evaluation report" in refused(tmp_path / "missing.json")
    assert "directory" in refused(tmp_path)
    big = tmp_path / "big.json"
    with big.open("wb") as fh:  # a sparse file, larger than the 64 MiB any report needs
        fh.truncate(65 << 20)
    assert "bytes" in refused(big)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    result: list[BaseException | None] = []

    def load() -> None:
        try:
            EvaluationReport.load(fifo)
        except BaseException as err:
            result.append(err)
        else:
            result.append(None)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():  # unblock it so the thread can end
        with open(fifo, "wb"):
            pass
        worker.join(timeout=5)
        pytest.fail("load() waited for a writer on the FIFO")
    (err,) = result
    assert isinstance(err, ReportFileError) and "FIFO" in str(err) and str(fifo) in str(err)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("<script>alert(1)</script>", "which is not a variant spec"),
        ("my favourite", "which is not a variant spec"),
        ("MQA", 'not a spec as evaluate writes it ("mqa")'),
        (" mqa", 'not a spec as evaluate writes it ("mqa")'),
    ],
)
def test_a_variant_that_is_no_spec_is_refused(name: str, problem: str, tmp_path: Path) -> None:
    """A report names variants by the specs evaluate writes; any other name (a label, HTML, another
    spelling) is refused by name on load, and cannot be saved."""
    report = lm_report(per_layer=False, constant=False)
    tree = json.loads(json.dumps(report.to_json()))
    tree["variants"][1] = name
    for table in ("measures", "kv_bytes_per_token"):
        tree[table][name] = tree[table].pop("mqa")
    message = refused(write_tree(tmp_path / "r.json", tree))
    assert f"variants[1] is {json.dumps(name)}, {problem}" in message, message
    renamed = dataclasses.replace(
        report, **{k: tree[k] for k in ("variants", "measures", "kv_bytes_per_token")}
    )
    with pytest.raises(ReportFileError, match=r"cannot save the evaluation report to .*: variants\[1\] is"):
        renamed.save(tmp_path / "saved.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_symlinked_report_is_neither_read_nor_written_through(tmp_path: Path) -> None:
    """A report file planted as a link in a shared folder: loading it would read a file from elsewhere,
    saving over it would overwrite that file."""
    outside = tmp_path / "outside.json"
    lm_report().save(outside)
    before = outside.read_bytes()
    link = tmp_path / "shared" / "report.json"
    link.parent.mkdir()
    link.symlink_to(outside)
    assert "is a symlink" in refused(link)
    with pytest.raises(ReportFileError, match=r"cannot save the report: .*report\.json is a symlink"):
        encoder_report().save(link)
    assert link.is_symlink() and outside.read_bytes() == before


def test_a_nul_byte_in_a_report_path_is_a_report_error(tmp_path: Path) -> None:
    bad = str(tmp_path / "r\x00.json")
    for attempt in (lambda: lm_report().save(bad), lambda: EvaluationReport.load(bad)):
        with pytest.raises(ReportFileError, match=r"holds a NUL byte, which no file name may; remove it"):
            attempt()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- seeded random damage
VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    100,
    2**63,
    0.5,
    -0.0,
    1e308,
    NAN,
    INF,
    -INF,
    "",
    "model",
    "mqa",
    "causal-lm",
    "encoder",
    "delta_nll",
    "torch.float32",
    "x" * 300,
    [],
    [0],
    [0, 1],
    [1.5],
    ["model"],
    {},
    {"nll": 1.0},
]


def locations(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [here]
    if isinstance(node, dict):
        for key, value in node.items():
            out += locations(value, (*here, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += locations(value, (*here, i))
    return out


def nearby(rng: random.Random, value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return rng.choice([value + 1, value - 1, -value, 2 * value, 0, value / 2, str(value), float(value)])
    if isinstance(value, str):
        return rng.choice(["", value.upper(), value + "x", value[:-1], f" {value}"])
    if isinstance(value, list):
        if not value:
            return [0.0]
        i = rng.randrange(len(value))
        return rng.choice([value[:i] + value[i + 1 :], [*value, value[i]], value[::-1]])
    if isinstance(value, dict) and value:
        key = rng.choice(list(value))
        return rng.choice([{k: v for k, v in value.items() if k != key}, {**value, key + "x": value[key]}])
    return rng.choice(VALUES)


def mutate(rng: random.Random, text: str) -> tuple[bytes, str]:
    op = rng.random()
    if op < 0.75:
        tree = json.loads(text)
        where = rng.choice(locations(tree))
        if not where:
            return json.dumps(rng.choice(VALUES)).encode(), "the whole file replaced"
        parent = tree
        for step in where[:-1]:
            parent = parent[step]
        last = where[-1]
        pick = rng.random()
        if pick < 0.15 and isinstance(parent, dict):
            del parent[last]
            what = f"delete {where}"
        elif pick < 0.25 and isinstance(parent, dict):
            parent["extra"] = rng.choice(VALUES)
            what = f"an extra entry beside {where}"
        else:
            parent[last] = nearby(rng, parent[last]) if pick < 0.65 else rng.choice(VALUES)
            what = f"{where} := {str(parent[last])[:40]}"
        return json.dumps(tree, allow_nan=True).encode(), what
    raw = bytearray(text.encode())
    if op < 0.85:
        cut = rng.randrange(len(raw))
        return bytes(raw[:cut]), f"truncated to {cut} bytes"
    if op < 0.95:
        flips = [rng.randrange(len(raw) * 8) for _ in range(rng.randint(1, 4))]
        for bit in flips:
            raw[bit // 8] ^= 1 << (bit % 8)
        return bytes(raw), f"bits {flips} flipped"
    return bytes(raw) + bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))), "bytes appended"


def check_sound(report: EvaluationReport, scratch: Path) -> None:
    """What a loaded report must give: its tables, every number within its rules, and a round trip."""
    report.table()
    report.rows()
    for v in report.variants:
        for name, value in report.measures[v].items():
            assert number_allowed(report, ("measures", v, name), value), (v, name, value)
        assert number_allowed(report, ("kv_bytes_per_token", v), report.kv_bytes_per_token[v])
    for v, values in (report.per_layer or {}).items():
        assert len(values) == len(report.layers) and v in report.variants
    again = EvaluationReport.load(report.save(scratch / "again.json"))
    assert as_text(again) == as_text(report)


CASES = 500


def test_damaged_files_load_soundly_or_raise_report_file_error(tmp_path: Path) -> None:
    bases = [json.dumps(build().to_json(), indent=1, allow_nan=True) for build in BUILDERS.values()]
    path = tmp_path / "damaged.json"
    failures, outcomes = [], {"loaded": 0, "refused": 0}
    for case in range(CASES):
        seed = f"report-{case}"
        rng = random.Random(seed)
        raw, what = mutate(rng, bases[case % len(bases)])
        path.write_bytes(raw)
        try:
            report = EvaluationReport.load(path)
        except ReportFileError as err:
            outcomes["refused"] += 1
            if str(path) not in str(err):
                failures.append(f"{seed} ({what}): the message does not name the file: {err}")
            continue
        except BaseException as err:  # anything else is what this test looks for
            failures.append(f"{seed} ({what}): {type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}")
            continue
        outcomes["loaded"] += 1
        try:
            check_sound(report, tmp_path)
        except BaseException as err:
            failures.append(f"{seed} ({what}) loaded, but: {type(err).__name__}: {err}")
    assert not failures, f"{len(failures)} of {CASES} cases:\n" + "\n".join(failures[:12])
    assert outcomes["refused"] >= CASES // 3 and outcomes["loaded"] >= 20, outcomes
    assert partial_leftovers(tmp_path) == []


# ---------------------------------------------------------------------- saving
@pytest.mark.parametrize("name", ["r.png", "r.txt", "r", "r.json.bak", "r.jsonl", "r.markdown", ".json"])
def test_save_refuses_a_suffix_it_does_not_write_before_anything_is_written(
    name: str, tmp_path: Path
) -> None:
    (tmp_path / "old.png").write_bytes(b"\x89PNG old")
    before = snapshot(tmp_path)
    with pytest.raises(ReportFileError) as info:
        lm_report().save(tmp_path / name)
    message = str(info.value)
    assert repr(name) in message and ".json" in message and ".md" in message, message
    with pytest.raises(ReportFileError):
        lm_report().save(tmp_path / "old.png")
    assert snapshot(tmp_path) == before


def test_save_takes_the_two_suffixes_in_any_case(tmp_path: Path) -> None:
    report = lm_report()
    assert EvaluationReport.load(report.save(tmp_path / "a.JSON")) == report
    markdown = report.save(tmp_path / "b.Md").read_text(encoding="utf-8")
    assert markdown.startswith("model: tiny-llama; 100 evaluation tokens in 4 sequences")
    assert report.table() in markdown
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.JSON", "b.Md"]


@pytest.mark.parametrize("suffix", [".json", ".md"])
def test_a_write_that_fails_midway_keeps_the_previous_report(suffix: str, tmp_path: Path) -> None:
    check_the_limit_works(tmp_path)
    path = lm_report(per_layer=False, constant=False).save(tmp_path / f"report{suffix}")
    before = snapshot(tmp_path)
    bigger = lm_report()  # with per-layer numbers: longer than the file there, which fills the disk
    with disk_full_after(path.stat().st_size), pytest.raises(ReportFileError) as info:
        bigger.save(path)
    assert str(path) in str(info.value) and "File too large" in str(info.value)
    assert snapshot(tmp_path) == before
    assert partial_leftovers(tmp_path) == []
    if suffix == ".json":
        assert EvaluationReport.load(path) == lm_report(per_layer=False, constant=False)


def test_save_names_the_path_when_it_cannot_write(tmp_path: Path) -> None:
    report = lm_report()
    folder = tmp_path / "folder.json"
    folder.mkdir()
    with pytest.raises(ReportFileError, match="is a directory"):
        report.save(folder)
    missing = tmp_path / "missing" / "r.json"
    with pytest.raises(ReportFileError) as info:
        report.save(missing)
    assert str(missing) in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.json"]


def test_save_refuses_a_report_that_load_would_refuse(tmp_path: Path) -> None:
    path = lm_report().save(tmp_path / "r.json")
    before = snapshot(tmp_path)
    cases = [
        (
            {"measures": {**lm_report().measures, "mqa": {**lm_report().measures["mqa"], "nll": NAN}}},
            'measures["mqa"]["nll"]',
        ),
        ({"tokens": 2.5}, "tokens"),
        ({"variants": ["model", "mqa"]}, 'measures["kv:cq4c8b"]'),
        ({"kind": "seq2seq"}, "kind"),
        ({"per_layer": {"model": [0.0], "mqa": [0.1], "kv:cq4c8b": [0.2]}}, 'per_layer["model"]'),
    ]
    for change, named in cases:
        for suffix in (".json", ".md"):
            broken = EvaluationReport(**{**lm_report().__dict__, **change})
            with pytest.raises(ReportFileError) as info:
                broken.save(path.with_suffix(suffix))
            assert named in str(info.value) and "nothing was written" in str(info.value), str(info.value)
    with pytest.raises(ReportFileError, match="JSON"):
        EvaluationReport(**{**lm_report().__dict__, "calibration": {"tokens": object()}}).save(path)
    assert snapshot(tmp_path) == before
