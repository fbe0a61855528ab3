"""Stored files are checked from the dataclasses' own field types and rules by one reader
(:mod:`headwidget.core.stored`): a new field needs no second list in the reader. Statistics metadata,
reports, healing runs and timeline indexes all go through it."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from headwidget.core.layout import AttentionLayout, RopeLayout
from headwidget.core.stored import StoredReader, parse_json, stored
from headwidget.errors import StatsFileError
from headwidget.stats._file import _FileCheck
from headwidget.stats._meta import StatsMeta


@dataclass(frozen=True)
class Inner:
    pairing: Literal["half", "none"] = "none"
    width: int = stored(default=0, minimum=0, maximum=8)


@dataclass
class Record:
    """One field of every kind a stored dataclass may have."""

    name: str
    count: int = stored(minimum=1)
    flag: bool = False
    layers: list[int] = stored(default_factory=list, expects="must be a list of layer indices")
    limit: int | None = stored(default=None, minimum=2)
    versions: dict[str, str] = stored(default_factory=dict, expects="must map names to version strings")
    inner: Inner = field(default_factory=Inner)


@dataclass
class Measured:
    """The number rules: bounds on floats (finite then), on the items of lists and mappings, uniqueness."""

    rate: float = stored(default=1.0, minimum=0.0)
    finite: float = stored(default=0.0, finite=True)
    anything: float = 0.0
    steps: list[int] = stored(default_factory=list, minimum=0, unique="step")
    names: list[str] = stored(default_factory=list, unique=True)
    costs: dict[str, float] = stored(default_factory=dict, minimum=0.0)
    rows: list[Inner] = field(default_factory=list)


def read(value: object) -> Record:
    return StoredReader(StatsFileError, "x.safetensors", "repair").read(value, Record, "meta")


def measured(value: object) -> Measured:
    return StoredReader(ValueError, "m.json", "repair").read(value, Measured)


def test_every_field_is_read_with_its_type_and_the_defaults_fill_the_rest() -> None:
    got = read({"name": "a", "count": 3, "layers": [0, 2], "limit": None, "inner": {"width": 8}})
    assert got == Record("a", 3, False, [0, 2], None, {}, Inner("none", 8))
    full = {
        "name": "b",
        "count": 1,
        "flag": True,
        "layers": [],
        "limit": 2,
        "versions": {"torch": "2"},
        "inner": {"pairing": "half", "width": 0},
    }
    assert dataclasses.asdict(read(full)) == full


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"count": 1}, r"meta\.name is missing"),
        ({"name": "a", "count": 1, "colour": 1}, r'meta has unknown fields "colour" \(known: name, count'),
        ({"name": 3, "count": 1}, r"meta\.name must be a string, not the number 3"),
        ({"name": "a", "count": 0}, r"meta\.count is 0, outside the allowed >= 1"),
        ({"name": "a", "count": True}, r"meta\.count must be an integer, not true"),
        ({"name": "a", "count": 1.0}, r"meta\.count must be an integer, not the number 1\.0"),
        ({"name": "a", "count": 1, "flag": 1}, r"meta\.flag must be true or false, not the number 1"),
        (
            {"name": "a", "count": 1, "layers": "0"},
            r"meta\.layers must be a list of layer indices, not",
        ),
        ({"name": "a", "count": 1, "layers": [0, "1"]}, r"meta\.layers\[1\] must be an integer"),
        ({"name": "a", "count": 1, "limit": 1}, r"meta\.limit is 1, outside the allowed >= 2"),
        ({"name": "a", "count": 1, "versions": {"t": 2}}, r"meta\.versions must map names to version str"),
        ({"name": "a", "count": 1, "inner": []}, r"meta\.inner must be an object, not a list of 0"),
        (
            {"name": "a", "count": 1, "inner": {"width": 9}},
            r"meta\.inner\.width is 9, outside the allowed 0\.\.",
        ),
        (
            {"name": "a", "count": 1, "inner": {"pairing": "x"}},
            r"meta\.inner\.pairing is 'x'; it must",
        ),
    ],
)
def test_a_value_of_the_wrong_type_or_out_of_bounds_names_its_field(value: object, message: str) -> None:
    with pytest.raises(StatsFileError, match=message):
        read(value)


def test_the_metadata_classes_are_read_from_their_own_fields() -> None:
    """Every field of the stored classes has a type the reader knows, and a saved meta reads back whole."""
    meta = StatsMeta(
        "m",
        "M",
        AttentionLayout("llama", "gqa", 2, 4, 2, 8, 8, 32, RopeLayout("half", 8)),
        [0, 1],
        ["key", "value"],
        tokens=5,
        cross_layers=[0, 1],
        weights_fingerprint="0" * 16,
        versions={"torch": "2.13"},
        sample_size=4,
        sample_seed=7,
    )
    assert _FileCheck(Path("x.safetensors")).meta(meta.to_json()) == meta
    names = {f.name for f in dataclasses.fields(StatsMeta)}
    assert set(meta.to_json()) == names  # what is written is what is read: one list, the class's


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"rate": -0.5},
            r"^m\.json is corrupt or incomplete: rate is -0\.5, outside the allowed >= 0; repair$",
        ),
        ({"rate": math.nan}, r"rate is nan; it must be a finite number >= 0"),
        ({"rate": math.inf}, r"rate is inf; it must be a finite number >= 0"),
        ({"rate": "1"}, r'rate must be a number, not the string "1"'),
        ({"rate": True}, r"rate must be a number, not true"),
        ({"finite": -math.inf}, r"finite is -inf; it must be a finite number;"),
        ({"steps": [0, -1]}, r"steps\[1\] is -1, outside the allowed >= 0"),
        ({"steps": [0, 3, 3]}, r"steps lists step 3 twice"),
        ({"names": ["a", "b", "a"]}, r"names lists 'a' twice"),
        ({"costs": {"mqa": 1, "gqa:2": -1.0}}, r'costs\["gqa:2"\] is -1\.0, outside the allowed >= 0'),
        ({"costs": {'a"b': math.nan}}, r'costs\["a\\"b"\] is nan; it must be a finite number >= 0'),
        ({"rows": [{"width": 1}, {"width": 1, "extra": 0}]}, r'rows\[1\] has unknown fields "extra"'),
        ({"rows": [{}, {"pairing": 3}]}, r"rows\[1\]\.pairing is 3; it must be one of 'half', 'none'"),
    ],
)
def test_number_rules_name_the_value_and_its_place(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        measured(value)


def test_numbers_the_rules_allow_load_as_written() -> None:
    value = {
        "rate": 0,
        "finite": -1e300,
        "anything": math.nan,
        "steps": [2, 0],
        "names": [],
        "costs": {"mqa": 0.5},
        "rows": [{"pairing": "half", "width": 3}],
    }
    got = measured(value)
    assert got.rate == 0 and type(got.rate) is int and math.isnan(got.anything)
    assert got.rows == [Inner("half", 3)] and got.steps == [2, 0] and got.costs == {"mqa": 0.5}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b'{"a": 1, "a": 2}', "is not valid JSON (the key 'a' appears twice)"),
        (b"[" * 100_000 + b"]" * 100_000, "is JSON nested too deeply to be read"),
        (b'{"a": "\xff"}', "is not UTF-8 text (byte 0xff at offset 7)"),
        (b"", "is not valid JSON (Expecting value"),
    ],
)
def test_json_text_that_cannot_be_read_is_refused_whole(text: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=r"^m\.json " + re.escape(problem)):
        parse_json(text, StoredReader(ValueError, "m.json", "repair").fail_whole)


def test_an_integer_of_a_hundred_digits_is_refused_by_name_unconverted() -> None:
    reader = StoredReader(StatsFileError, "x.safetensors", "repair")
    value = parse_json('{"name": "a", "count": 1' + "0" * 200 + "}", reader.fail_whole)
    with pytest.raises(StatsFileError, match=r"meta\.count is a number of 201 digits, beyond any number"):
        reader.read(value, Record, "meta")
