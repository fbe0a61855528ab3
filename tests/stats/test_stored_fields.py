"""A statistics file's metadata is checked from the dataclasses' own field types and bounds
(:mod:`headwidget.core.stored`): a new field needs no second list in the reader."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from headwidget.core.layout import AttentionLayout, RopeLayout
from headwidget.core.stored import stored
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


def read(value: object) -> Record:
    return Record(**_FileCheck(Path("x.safetensors")).fields(value, Record, "meta"))


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
        ({"name": "a", "count": 1, "colour": 1}, r"meta has unknown fields \['colour'\]"),
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
