"""Seeded random damage to valid statistics files: each loads as sound statistics or raises StatsFileError.

Three kinds of damage, each case from its own seed so a failure can be replayed alone:

- header: edits of the JSON metadata (every field and list element, with values of every JSON type,
  deletions, unknown keys, duplicate keys, broken or deeply nested text) and of the safetensors
  metadata around it (format, format_version);
- tensors: element values (NaN, inf, huge, negative...), whole-tensor scaling, asymmetric edits,
  swaps between tensors, dtype and shape changes, missing, renamed and extra tensors, counts;
- bytes: truncation, bit flips (anywhere or in the header), overwritten ranges, appended bytes, a
  damaged header length.

A file that loads must give derived numbers in range: channel correlations in [-1, 1], head
similarities in [-1, 1] (CKA in [0, 1]) up to the rounding slack the checks allow, and it must save
and load again. Anything other than that or ``StatsFileError`` fails the test with the case's seed.
"""

from __future__ import annotations

import json
import random
import struct
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import headwidget
from headwidget import KVStats, StatsFileError
from headwidget.moments import HEAD_METRICS
from tiny_models import make_model, ragged_batches

CASES = {"header": 320, "tensors": 320, "bytes": 260}
#: Head similarities may exceed 1 by the load checks' rounding slack, (1 + 1e-3)² − 1, rounded up.
SLACK = 3e-3

CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


# ---------------------------------------------------------------------- a plain safetensors codec
def decode(raw: bytes) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The ``__metadata__`` and tensors of a safetensors file (independent of the loader under test)."""
    from safetensors.torch import load

    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + size])
    return header.get("__metadata__", {}), dict(load(raw))


def encode(metadata: object, tensors: dict[str, torch.Tensor]) -> bytes:
    """A safetensors file whose ``__metadata__`` may be any JSON value (the library only writes strings)."""
    header: dict[str, Any] = {"__metadata__": metadata}
    chunks, offset = [], 0
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = {
            "dtype": CODES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


# ---------------------------------------------------------------------- mutations
VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    3,
    7,
    8,
    16,
    2**31,
    2**63,
    -(2**63),
    10**30,
    0.5,
    1.0,
    -0.0,
    12.5,
    1e308,
    "",
    "0",
    "12",
    "key",
    "value",
    "key_post",
    "input",
    "latent",
    "query",
    "mha",
    "gqa",
    "mla",
    "half",
    "interleaved",
    "none",
    "float32",
    "Tensor",
    "x" * 300,
    [],
    [0],
    [0, 0],
    [0, 1],
    [1, 0],
    [0, 1, 2],
    [-1],
    [1.5],
    ["key"],
    ["key", "key"],
    [[0]],
    {},
    {"a": 1},
    {"pairing": "half"},
]


def locations(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON tree (dict keys and list indices), the root included."""
    out = [here]
    if isinstance(node, dict):
        for key, value in node.items():
            out += locations(value, (*here, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += locations(value, (*here, i))
    return out


def nearby(rng: random.Random, value: Any) -> Any:
    """A value close to ``value``: off by one, negated, a list with an element dropped or doubled..."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, -value, 2 * value, 0, value // 2, float(value), str(value)])
    if isinstance(value, str):
        return rng.choice(["", value.upper(), value + "x", value[:-1], f" {value}"])
    if isinstance(value, list):
        if not value:
            return [0]
        i = rng.randrange(len(value))
        return rng.choice([value[:i] + value[i + 1 :], [*value, value[i]], value[::-1], [*value, len(value)]])
    if isinstance(value, dict) and value:
        key = rng.choice(list(value))
        return {k: v for k, v in value.items() if k != key}
    return rng.choice(VALUES)


def edit_tree(rng: random.Random, tree: Any) -> tuple[Any, str]:
    where = rng.choice(locations(tree))
    if not where:
        new = rng.choice(VALUES)
        return new, f"meta := {new!r}"
    parent = tree
    for step in where[:-1]:
        parent = parent[step]
    last, name = where[-1], ".".join(map(str, where))
    op = rng.random()
    if op < 0.12 and isinstance(parent, dict):
        del parent[last]
        return tree, f"delete meta.{name}"
    if op < 0.2 and isinstance(parent, dict):
        parent["extra_field"] = rng.choice(VALUES)
        return tree, f"add an unknown field beside meta.{name}"
    new = nearby(rng, parent[last]) if op < 0.6 else rng.choice(VALUES)
    parent[last] = new
    return tree, f"meta.{name} := {str(new)[:40]}"


def mutate_header(rng: random.Random, raw: bytes) -> tuple[bytes, str]:
    metadata, tensors = decode(raw)
    meta_text = metadata["meta"]
    op = rng.random()
    if op < 0.7:
        tree, what = edit_tree(rng, json.loads(meta_text))
        metadata["meta"] = json.dumps(tree)
    elif op < 0.82:
        key = rng.choice(["format", "format_version", "meta", "other"])
        value = rng.choice(
            [None, "", "1", "2", "0", "1.0", "headwidget-stats", 1, "{}", "[]", ["x"], {"a": "b"}]
        )
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
        what = f"header {key} := {value!r}"
    else:
        cut = rng.randrange(len(meta_text))
        texts = {
            "truncated": meta_text[:cut],
            "duplicate key": meta_text[:-1] + ', "tokens": 1}',
            "deep nesting": "[" * 100_000 + "]" * 100_000,
            "garbage": meta_text[:cut] + "\x00}{" + meta_text[cut:],
            "NaN": meta_text.replace('"tokens": ', '"tokens": NaN, "_t": '),
            "huge int": meta_text.replace('"tokens": ', '"tokens": 1' + "0" * 5000 + ', "_t": '),
        }
        kind = rng.choice(list(texts))
        metadata["meta"] = texts[kind]
        what = f"meta text: {kind}"
    return encode(metadata, tensors), what


SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -1.0, 1e300, -1e300, 1e-300, 40.0, -40.0]


def mutate_tensors(rng: random.Random, raw: bytes) -> tuple[bytes, str]:
    metadata, tensors = decode(raw)
    names = sorted(tensors)
    name = rng.choice(names)
    t = tensors[name].clone()
    op = rng.randrange(11)
    what = ""
    if op == 0:  # one element
        flat = t.reshape(-1)
        i = rng.randrange(flat.numel())
        value = rng.choice(SPECIAL) if t.is_floating_point() else rng.choice([-1, 0, 1, 2**40, -(2**62), 7])
        flat[i] = value
        what = f"{name}[{i}] := {value}"
    elif op == 1:  # the whole tensor scaled
        factor = rng.choice([-1.0, 0.0, 0.5, 2.0, 40.0, 1e-9, 1e9, 1e300])
        t = (t * factor).to(t.dtype) if t.is_floating_point() else t * int(min(factor, 2**20))
        what = f"{name} *= {factor}"
    elif op == 2 and t.ndim >= 2:  # one off-diagonal entry: breaks symmetry, maybe Cauchy–Schwarz
        a, b = rng.randrange(t.shape[-1]), rng.randrange(t.shape[-1])
        t[..., a, b] += rng.choice([1e-3, 1.0, 100.0, -1e6]) * (1 + float(t[..., a, a].abs().max()))
        what = f"{name}[..., {a}, {b}] perturbed"
    elif op == 3:  # values of another tensor of the same shape
        same = [n for n in names if n != name and tensors[n].shape == t.shape]
        if same:
            other = rng.choice(same)
            t = tensors[other].clone()
            what = f"{name} := {other}"
    elif op == 4:
        dtype = rng.choice([d for d in CODES if d != t.dtype])
        t = t.to(dtype)
        what = f"{name} as {dtype}"
    elif op == 5:
        shapes: list[Callable[[torch.Tensor], torch.Tensor]] = [
            lambda x: x[:-1],
            lambda x: torch.cat([x, x[:1]]),
            lambda x: x.reshape(-1),
            lambda x: x[None],
            lambda x: x.transpose(0, -1).contiguous(),
            lambda x: x[..., :-1],
        ]
        t = rng.choice(shapes)(t)
        what = f"{name} reshaped to {tuple(t.shape)}"
    elif op == 6:
        del tensors[name]
        return encode(metadata, tensors), f"delete {name}"
    elif op == 7:
        new = rng.choice(
            [
                "layer9.key.m2",
                "layer0.query.mean",
                "cross.input.mean",
                "layer1.latent.count",
                name.replace("layer0", "layer1"),
                name + "x",
                "layer-1.key.mean",
            ]
        )
        tensors[new] = tensors.pop(name)
        return encode(metadata, tensors), f"rename {name} to {new}"
    elif op == 8:
        tensors[rng.choice(["layer5.key.mean", "extra", "cross.latent.mean"])] = t
        return encode(metadata, tensors), f"extra copy of {name}"
    elif op == 9:  # a count or token split
        counts = [n for n in names if n.endswith(("count", "split_count"))]
        name = rng.choice(counts)
        t = tensors[name].clone()
        t[rng.randrange(t.numel())] = rng.choice([-5, 0, 1, 2, 3, 10**6, 2**62, int(t[0]) + 1, int(t[0]) - 1])
        what = f"{name} := {t.tolist()}"
    if not what:  # a mean shifted: still sound statistics (the loader must accept it)
        name = rng.choice([n for n in names if n.endswith(".mean")])
        t = tensors[name] + rng.choice([-3.0, 0.25, 1e3])
        what = f"{name} shifted"
    tensors[name] = t
    return encode(metadata, tensors), what


def mutate_bytes(rng: random.Random, raw: bytes) -> tuple[bytes, str]:
    data = bytearray(raw)
    header_end = 8 + struct.unpack("<Q", raw[:8])[0]
    op = rng.randrange(6)
    if op == 0:
        cut = rng.choice([0, 1, 7, 8, 9, rng.randrange(header_end), rng.randrange(len(data))])
        return bytes(data[:cut]), f"truncated to {cut} bytes"
    if op in (1, 2):
        span = header_end if op == 1 else len(data)
        flips = [rng.randrange(span * 8) for _ in range(rng.randint(1, 8))]
        for bit in flips:
            data[bit // 8] ^= 1 << (bit % 8)
        return bytes(data), f"bits {flips} flipped"
    if op == 3:
        start = rng.randrange(len(data))
        length = rng.randint(1, 64)
        data[start : start + length] = bytes(rng.randrange(256) for _ in range(length))
        return bytes(data), f"bytes {start}..{start + length} overwritten"
    if op == 4:
        return bytes(data) + bytes(rng.randrange(256) for _ in range(rng.randint(1, 100))), "bytes appended"
    size = rng.choice([0, 1, header_end - 9, header_end + 1, len(data), 2**40, 2**64 - 1])
    return struct.pack("<Q", size) + bytes(data[8:]), f"header length := {size}"


MUTATORS = {"header": mutate_header, "tensors": mutate_tensors, "bytes": mutate_bytes}


# ---------------------------------------------------------------------- what a loaded file must give
def in_range(values: np.ndarray, low: float, high: float) -> bool:
    finite = values[~np.isnan(values)]
    return bool(np.isfinite(finite).all() and (finite >= low).all() and (finite <= high).all())


def check_sound(stats: KVStats, scratch: Path) -> None:
    """Every derived number of ``stats`` in range, and the statistics save and load again."""
    assert isinstance(stats.tokens, int) and not isinstance(stats.tokens, bool) and stats.tokens >= 0
    layout = stats.meta.layout
    for layer in stats.layers:
        for kind in stats.kinds:
            assert in_range(stats.channel_corr(layer, kind), -1.0, 1.0), (layer, kind, "corr")
            assert not np.isinf(stats.covariance(layer, kind)).any()
            if layout.head_dim_of(kind) is None:
                continue
            for metric in HEAD_METRICS:
                low = 0.0 if metric == "cka" else -1.0 - SLACK
                sim = stats.head_similarity(layer, kind, metric)
                assert in_range(sim, low, 1.0 + SLACK), (layer, kind, metric, np.nanmax(np.abs(sim)))
    if stats.meta.cross_layers:
        for kind in stats._cross:
            sim = stats.head_similarity(stats.meta.cross_layers, kind, "token_cosine")
            assert in_range(sim, -1.0 - SLACK, 1.0 + SLACK), (kind, "cross")
    for layer, norms in stats._plane_norms.items():  # what partial RoPE ranks by: finite, never negative
        for means in (norms.query_mean(), norms.key_mean()):
            assert bool(torch.isfinite(means).all()) and bool((means >= 0).all()), (layer, "plane norms")
    stats.summary()
    repr(stats)
    KVStats.load(stats.save(scratch / "again.safetensors"))


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """Two valid files: Llama GQA with post-RoPE keys, inputs and cross-layer moments; DeepSeek MLA."""
    folder = tmp_path_factory.mktemp("bases")
    out = []
    for name, options in (
        ("llama_gqa", {"rope": "both", "inputs": True, "cross_layer": True}),
        ("deepseek_v2", {"cross_layer": True}),
    ):
        stats = headwidget.capture(
            make_model(name, dtype=torch.float32), ragged_batches(), progress=False, **options
        )
        out.append(stats.save(folder / f"{name}.safetensors").read_bytes())
    return out


def test_the_codec_reproduces_a_valid_file(bases: list[bytes], tmp_path: Path) -> None:
    for raw in bases:
        path = tmp_path / "copy.safetensors"
        path.write_bytes(encode(*decode(raw)))
        check_sound(KVStats.load(path), tmp_path)


@pytest.mark.parametrize("category", list(CASES))
def test_damaged_files_load_soundly_or_raise_stats_file_error(
    category: str, bases: list[bytes], tmp_path: Path
) -> None:
    mutate = MUTATORS[category]
    failures, outcomes = [], {"loaded": 0, "refused": 0}
    path = tmp_path / "damaged.safetensors"
    for case in range(CASES[category]):
        seed = f"{category}-{case}"
        rng = random.Random(seed)
        raw, what = mutate(rng, bases[case % len(bases)])
        path.write_bytes(raw)
        try:
            stats = KVStats.load(path)
        except StatsFileError as err:
            outcomes["refused"] += 1
            if str(path) not in str(err):
                failures.append(f"{seed} ({what}): the message does not name the file: {err}")
            continue
        except BaseException as err:  # anything else is what this test looks for
            failures.append(f"{seed} ({what}): {type(err).__name__}: {err}\n{traceback.format_exc(limit=-3)}")
            continue
        outcomes["loaded"] += 1
        try:
            check_sound(stats, tmp_path)
        except BaseException as err:
            failures.append(f"{seed} ({what}) loaded, but: {type(err).__name__}: {err}")
    assert not failures, f"{len(failures)} of {CASES[category]} cases:\n" + "\n".join(failures[:12])
    # Damage that the checks never notice, or never lets a file through, would make this test toothless.
    assert outcomes["refused"] >= CASES[category] // 3, outcomes
    if category != "bytes":
        assert outcomes["loaded"] >= 5, outcomes
