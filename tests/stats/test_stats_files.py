"""Statistics files: loading refuses impossible contents by name; saving never loses the user's file."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import headwidget
from headwidget import KVStats, StatsFileError
from tiny_models import FACTORIES, make_model, ragged_batches

Edit = Callable[[dict[str, str], dict[str, Any], dict[str, torch.Tensor]], None]


@pytest.fixture(scope="module")
def stats() -> KVStats:
    """Llama GQA (6 heads over 2 KV heads of 8 dims) with post-RoPE keys, inputs and cross-layer moments."""
    model = make_model("llama_gqa", dtype=torch.float32)
    return headwidget.capture(
        model, ragged_batches(), rope="both", inputs=True, cross_layer=True, progress=False
    )


@pytest.fixture(scope="module")
def good(stats: KVStats, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stats.save(tmp_path_factory.mktemp("good") / "good.safetensors")


def rewrite(good: Path, out: Path, edit: Edit) -> Path:
    """A copy of ``good`` with ``edit(header, meta, tensors)`` applied (``meta`` is the parsed JSON)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(good), framework="pt") as fh:
        header = dict(fh.metadata())
    tensors = load_file(str(good))
    meta = json.loads(header["meta"])
    text = header["meta"]
    edit(header, meta, tensors)
    if header.get("meta") == text:  # the edit changed the parsed metadata, not the text itself
        header["meta"] = json.dumps(meta)
    save_file(tensors, str(out), metadata=header)
    return out


def set_meta(*path: Any, value: Any) -> Edit:
    def edit(header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        node = meta
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value

    return edit


def set_header(key: str, value: str | None) -> Edit:
    def edit(header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        if value is None:
            del header[key]
        else:
            header[key] = value

    return edit


def edit_tensor(name: str, change: Callable[[torch.Tensor], torch.Tensor | None]) -> Edit:
    def edit(header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        t = tensors[name].clone()
        out = change(t)
        tensors[name] = t if out is None else out

    return edit


def all_counts(value: int) -> Edit:
    def edit(header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        meta["tokens"] = value
        for name in tensors:
            if name.endswith(".count"):
                tensors[name] = torch.tensor([value])
            elif name.endswith(".split_count"):
                tensors[name] = torch.tensor([value, 0])

    return edit


def drop_layer_one(header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    meta["layers"] = [0]
    for name in [n for n in tensors if n.startswith("layer1.")]:
        del tensors[name]


def drop_cross_value(header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    for name in [n for n in tensors if n.startswith("cross.value.")]:
        del tensors[name]


def add_tensor(header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    tensors["layer1.latent.mean"] = torch.zeros(4, dtype=torch.float64)


def drop_plane_norms_of_layer_one(
    header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    for name in [n for n in tensors if n.startswith("layer1.plane_norms.")]:
        del tensors[name]


def plane_norms_of_no_layer(
    header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    tensors["layer7.plane_norms.count"] = tensors["layer0.plane_norms.count"].clone()


def no_rope(header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    meta["layout"]["rope"] = {"pairing": "none", "rotary_dim": 0, "offset": 0, "post_pairing": None}


def duplicate_json_key(
    header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    header["meta"] = header["meta"][:-1] + ', "tokens": 1}'


def deep_nesting(header: dict[str, str], meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    header["meta"] = "[" * 100_000 + "]" * 100_000


def set_entry(a: int, b: int, value: float) -> Callable[[torch.Tensor], None]:
    def change(t: torch.Tensor) -> None:
        t[a, b] = value

    return change


def skew(t: torch.Tensor) -> None:
    t[0, 1] = 0.5 * math.sqrt(float(t[0, 0] * t[1, 1]))
    t[1, 0] = -t[0, 1]


def beyond_cauchy_schwarz(t: torch.Tensor) -> None:
    t[0, 1] = t[1, 0] = 10 * math.sqrt(float(t[0, 0] * t[1, 1]))


# Each case: what is edited, and the message naming the field. Every one loaded (or failed later with
# an IndexError, ZeroDivisionError or RecursionError) before loading checked meaning.
LOAD_CASES: list[tuple[str, Edit, str]] = [
    (
        "float tokens",
        set_meta("tokens", value=12.5),
        r"meta\.tokens must be an integer, not the number 12\.5",
    ),
    (
        "string tokens",
        set_meta("tokens", value="94"),
        r'meta\.tokens must be an integer, not the string "94"',
    ),
    ("negative tokens and counts", all_counts(-4), r"meta\.tokens is -4, outside the allowed >= 0"),
    (
        "negative count",
        edit_tensor("layer0.key.count", lambda t: t.fill_(-3)),
        r"tensor layer0\.key\.count is -3, but meta\.tokens is \d+",
    ),
    (
        "float count",
        edit_tensor("layer1.value.count", lambda t: t.double() + 0.7),
        r"tensor layer1\.value\.count must be int64 of shape \(1,\), but is float64",
    ),
    (
        "empty count",
        edit_tensor("layer0.key.count", lambda t: t[:0]),
        r"tensor layer0\.key\.count must be int64 of shape \(1,\), but is int64 of shape \(0,\)",
    ),
    (
        "split counts over the total",
        edit_tensor("layer0.value.split_count", lambda t: t * 2),
        r"tensor layer0\.value\.split_count is \(\d+, \d+\), which are not two non-negative parts",
    ),
    (
        "negative split",
        edit_tensor("cross.key.split_count", lambda t: torch.tensor([-1, int(t.sum()) + 1])),
        r"tensor cross\.key\.split_count is \(-1, \d+\)",
    ),
    (
        "head_dim against the tensors",
        set_meta("layout", "head_dim", value=16),
        r"tensor layer0\.key\.mean must be float64 of shape \(32,\) \(the channels that meta\.layout "
        r"gives this kind\), but is float64 of shape \(16,\)",
    ),
    ("zero head_dim", set_meta("layout", "head_dim", value=0), r"meta\.layout\.head_dim is 0, outside"),
    (
        "boolean layer count",
        set_meta("layout", "num_layers", value=True),
        r"meta\.layout\.num_layers must be an integer, not true",
    ),
    (
        "KV heads not dividing heads",
        set_meta("layout", "num_kv_heads", value=4),
        r"meta\.layout\.num_kv_heads is 4, which does not divide num_heads \(6\)",
    ),
    (
        "mechanism against the heads",
        set_meta("layout", "mechanism", value="mha"),
        r"meta\.layout\.mechanism is 'mha', but 6 heads over 2 KV heads make it 'gqa'",
    ),
    (
        "unknown mechanism",
        set_meta("layout", "mechanism", value="banana"),
        r"meta\.layout\.mechanism is 'banana'",
    ),
    (
        "latent without MLA",
        set_meta("layout", "latent_dim", value=16),
        r"meta\.layout\.latent_dim is the number 16",
    ),
    (
        "RoPE beyond the head",
        set_meta("layout", "rope", "offset", value=4),
        r"meta\.layout\.rope\.offset is 4, outside the allowed 0\.\.0",
    ),
    (
        "unknown RoPE pairing",
        set_meta("layout", "rope", "pairing", value="spiral"),
        r"meta\.layout\.rope\.pairing is 'spiral'",
    ),
    (
        "NaN in a co-moment",
        edit_tensor("layer0.key.m2", set_entry(0, 1, math.nan)),
        r"tensor layer0\.key\.m2 holds NaN or infinite values \(at \(0, 1\)\)",
    ),
    (
        "infinite mean",
        edit_tensor("layer1.input.mean", lambda t: t.index_fill_(0, torch.tensor([3]), math.inf)),
        r"tensor layer1\.input\.mean holds NaN or infinite values \(at \(3,\)\)",
    ),
    (
        "float32 co-moment",
        edit_tensor("layer0.value.m2", lambda t: t.float()),
        r"tensor layer0\.value\.m2 must be float64 of shape \(16, 16\).*but is float32",
    ),
    (
        "asymmetric co-moment",
        edit_tensor("layer0.key.m2", skew),
        r"tensor layer0\.key\.m2 is not symmetric: entry \(0, 1\) = [\d.]+ but \(1, 0\) = -[\d.]+",
    ),
    (
        "negative variance",
        edit_tensor("layer1.key_post.m2", set_entry(2, 2, -1.0)),
        r"tensor layer1\.key_post\.m2 has the negative variance -1 on channel 2",
    ),
    (
        "covariance beyond Cauchy-Schwarz",
        edit_tensor("layer0.value.m2", beyond_cauchy_schwarz),
        r"tensor layer0\.value\.m2 entry \(0, 1\) = .* exceeds the geometric mean of its diagonal entries",
    ),
    (
        "head similarity of 40",
        edit_tensor("layer0.key.norm_gram", lambda t: t * 40),
        r"tensor layer0\.key\.norm_gram split 0: head 0 sums to .* over \d+ tokens",
    ),
    (
        "cross-layer block against its layer",
        edit_tensor("cross.key.mean", lambda t: t * 2),
        r"tensor cross\.key\.mean differs from layer0\.key in its block of layer 0",
    ),
    (
        "negative plane norm",
        edit_tensor("layer0.plane_norms.query", set_entry(4, 1, -1.0)),
        r"tensor layer0\.plane_norms\.query has the negative entry -1 at \(4, 1\); a sum of norms is never",
    ),
    (
        "NaN plane norm",
        edit_tensor("layer1.plane_norms.key", set_entry(1, 3, math.nan)),
        r"tensor layer1\.plane_norms\.key holds NaN or infinite values \(at \(1, 3\)\)",
    ),
    (
        "plane norms of fewer planes",
        edit_tensor("layer0.plane_norms.key", lambda t: t[:, :3].contiguous()),
        r"tensor layer0\.plane_norms\.key must be float64 of shape \(2, 4\) \(KV heads × the rotary "
        r"planes of meta\.layout\.rope\), but is float64 of shape \(2, 3\)",
    ),
    (
        "float32 plane norms",
        edit_tensor("layer1.plane_norms.query", lambda t: t.float()),
        r"tensor layer1\.plane_norms\.query must be float64 of shape \(6, 4\)",
    ),
    (
        "plane-norm count",
        edit_tensor("layer1.plane_norms.count", lambda t: t.fill_(3)),
        r"tensor layer1\.plane_norms\.count is 3, but meta\.tokens is \d+",
    ),
    (
        "key norms above what the key moments allow",
        edit_tensor("layer0.plane_norms.key", lambda t: t * 8),
        r"tensor layer0\.plane_norms\.key KV head 0, plane 0: the sum of norms [\d.]+ lies above",
    ),
    (
        "key norms below what the key moments allow",
        edit_tensor("layer1.plane_norms.key", lambda t: t.index_fill_(1, torch.tensor([2]), 1e-3)),
        r"tensor layer1\.plane_norms\.key KV head 0, plane 2: the sum of norms 0\.001 lies below",
    ),
    (
        "plane norms of one layer only",
        drop_plane_norms_of_layer_one,
        r"tensor layer1\.plane_norms\.count is missing \(and 2 more\); a capture keeps rotary-pair norms "
        r"for every captured layer or for none",
    ),
    (
        "plane norms of a layer not captured",
        plane_norms_of_no_layer,
        r"tensor layer7\.plane_norms\.count does not belong to meta\.layers \[0, 1\]",
    ),
    (
        "plane norms without RoPE",
        no_rope,
        r"tensor layer0\.plane_norms\.count holds rotary-pair norms, but meta\.layout\.rope says the "
        r"model has no rotary planes",
    ),
    ("duplicate layers", set_meta("layers", value=[0, 1, 1]), r"meta\.layers lists layer 1 twice"),
    (
        "layer outside the model",
        set_meta("layers", value=[0, 2]),
        r"meta\.layers\[1\] is 2, outside the allowed 0\.\.1",
    ),
    ("no layers", set_meta("layers", value=[]), r"meta\.layers lists 0 layers; it needs at least 1"),
    (
        "unknown kind",
        set_meta("kinds", value=["key", "query"]),
        r"meta\.kinds\[1\] is 'query'; it must be one of",
    ),
    ("duplicate kinds", set_meta("kinds", value=["key", "value", "key"]), r"meta\.kinds lists 'key' twice"),
    (
        "cross layers outside the layers",
        drop_layer_one,
        r"meta\.cross_layers names layers \[1\] that are not in meta\.layers \[0\]",
    ),
    (
        "cross layers repeated",
        set_meta("cross_layers", value=[0, 0]),
        r"meta\.cross_layers lists layer 0 twice",
    ),
    (
        "missing cross-layer tensors",
        drop_cross_value,
        r"tensor cross\.value\.count is missing \(and 4 more\)",
    ),
    (
        "a tensor of no captured layer",
        add_tensor,
        r"tensor layer1\.latent\.mean does not belong to meta\.layers",
    ),
    ("unknown field", set_meta("colour", value="red"), r'meta has unknown fields "colour" \(known: '),
    (
        "not a torch dtype",
        set_meta("dtype", value="banana"),
        r"meta\.dtype is 'banana', which is not a torch dtype",
    ),
    (
        "versions not strings",
        set_meta("versions", value={"torch": 2}),
        r"meta\.versions must map package names",
    ),
    (
        "duplicate JSON key",
        duplicate_json_key,
        r"header field meta is not valid JSON \(the key 'tokens' appears twice\)",
    ),
    ("deeply nested JSON", deep_nesting, r"header field meta is JSON nested too deeply"),
    ("missing format version", set_header("format_version", None), r"header field format_version is missing"),
]


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in LOAD_CASES], ids=[c[0] for c in LOAD_CASES])
def test_load_refuses_impossible_contents_naming_the_field(
    good: Path, tmp_path: Path, edit: Edit, message: str
) -> None:
    bad = rewrite(good, tmp_path / "bad.safetensors", edit)
    with pytest.raises(StatsFileError) as info:
        KVStats.load(bad)
    text = str(info.value)
    assert re.search(message, text), text
    assert text.startswith(f"{bad} is corrupt or incomplete: ")
    assert text.endswith("capture the statistics again or restore the file from a copy")


@pytest.mark.parametrize("version", ["2", "0", "1.0", ""])
def test_load_refuses_other_format_versions(good: Path, tmp_path: Path, version: str) -> None:
    bad = rewrite(good, tmp_path / "future.safetensors", set_header("format_version", version))
    with pytest.raises(
        StatsFileError,
        match=rf"{re.escape(str(bad))}: header field format_version is "
        rf"'{re.escape(version)}', .* reads statistics format version '1' only; .*upgrade",
    ):
        KVStats.load(bad)


def test_untouched_file_still_loads_with_sound_numbers(stats: KVStats, good: Path) -> None:
    loaded = KVStats.load(good)
    for metric in ("token_cosine", "cosine", "pearson", "cka"):
        sim = loaded.head_similarity([0, 1], "key", metric)
        np.testing.assert_array_equal(sim, stats.head_similarity([0, 1], "key", metric))
        assert sim.shape == (4, 4) and np.abs(sim).max() <= 1  # clamped: float32 Grams may round past 1


def test_load_names_a_directory_and_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    for path, what in ((tmp_path, "a directory"), (fifo, r"a FIFO \(named pipe\)")):
        # opening the FIFO would block: it must be refused before
        with pytest.raises(StatsFileError, match=rf"{re.escape(str(path))} is {what}, not a regular file"):
            KVStats.load(path)


def test_load_refuses_a_symlink_even_to_a_good_file(good: Path, tmp_path: Path) -> None:
    """A statistics file planted as a link (to statistics elsewhere, another run's) is not read."""
    folder = tmp_path / "shared"
    folder.mkdir()
    link = folder / "stats.safetensors"
    link.symlink_to(good)
    with pytest.raises(
        StatsFileError, match=rf"cannot load statistics: {re.escape(str(link))} is a symlink \(to .*\)"
    ):
        KVStats.load(link)
    assert KVStats.load(good).tokens > 0


def test_a_nul_byte_in_a_path_is_a_statistics_error(stats: KVStats, tmp_path: Path) -> None:
    bad = str(tmp_path / "a\x00b.safetensors")
    for attempt in (lambda: stats.save(bad), lambda: KVStats.load(bad)):
        with pytest.raises(StatsFileError, match=r"holds a NUL byte, which no file name may; remove it"):
            attempt()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- saving
@pytest.mark.parametrize("dangling", [False, True])
def test_save_refuses_a_symlink_and_leaves_what_it_leads_to(
    stats: KVStats, tmp_path: Path, dangling: bool
) -> None:
    """A link planted where statistics are saved (a shared folder) would make the save overwrite, or create,
    a file elsewhere that its user may write: it is refused, the link and its target untouched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    if not dangling:
        victim.write_bytes(b"precious")
    link = tmp_path / "link.safetensors"
    link.symlink_to(victim)
    with pytest.raises(
        StatsFileError, match=rf"cannot save statistics: {re.escape(str(link))} is a symlink \(to .*victim"
    ):
        stats.save(link)
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["link.safetensors", "outside"]
    assert [p.name for p in outside.iterdir()] == ([] if dangling else ["victim.txt"])
    assert dangling or victim.read_bytes() == b"precious"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o600])
def test_save_keeps_an_existing_files_mode(stats: KVStats, tmp_path: Path, mode: int) -> None:
    path = tmp_path / "s.safetensors"
    path.write_bytes(b"old")
    path.chmod(mode)
    stats.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == mode


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_umasks_default_mode(
    stats: KVStats, tmp_path: Path, umask: int, mode: int
) -> None:
    old = os.umask(umask)
    try:
        stats.save(tmp_path / "new.safetensors")
        with open(tmp_path / "by_open", "w"):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.safetensors").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "by_open").stat().st_mode) == mode


def _device_node(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root")
    node = tmp_path / "null.safetensors"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # the same device as /dev/null
    except PermissionError:
        pytest.skip("this container may not create device nodes")
    return node


@pytest.mark.parametrize("target", ["directory", "fifo", "symlink to /dev/null", "device node"])
def test_save_refuses_targets_that_are_not_regular_files(stats: KVStats, tmp_path: Path, target: str) -> None:
    if target == "directory":
        path = tmp_path / "folder.safetensors"
        path.mkdir()
        check, what = path.is_dir, "a directory"
    elif target == "fifo":
        path = tmp_path / "pipe.safetensors"
        os.mkfifo(path)
        check, what = (lambda: stat.S_ISFIFO(path.lstat().st_mode)), "a FIFO"
    elif target == "symlink to /dev/null":
        path = tmp_path / "null.safetensors"
        path.symlink_to("/dev/null")
        check, what = path.is_symlink, r"a symlink \(to /dev/null\)"
    else:
        path = _device_node(tmp_path)
        check, what = path.is_char_device, "a character device"
    before = sorted(tmp_path.iterdir())
    with pytest.raises(StatsFileError, match=rf"cannot save statistics: {re.escape(str(path))}.* is {what}"):
        stats.save(path)
    assert check() and sorted(tmp_path.iterdir()) == before


def test_save_into_a_missing_directory_names_the_path(stats: KVStats, tmp_path: Path) -> None:
    path = tmp_path / "missing" / "s.safetensors"
    with pytest.raises(
        StatsFileError,
        match=rf"cannot save statistics to {re.escape(str(path))}: No such file "
        "or directory; create the directory first",
    ):
        stats.save(path)


def test_save_into_a_read_only_directory_names_the_path(stats: KVStats, tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "s.safetensors"
    if os.geteuid() == 0:  # root ignores permission bits; an immutable directory stops root too
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("running as root and chattr +i is not available here")
        undo = ["chattr", "-i", str(folder)]
    else:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    try:
        with pytest.raises(
            StatsFileError,
            match=rf"cannot save statistics to {re.escape(str(path))}: "
            r"(Permission denied|Operation not permitted); choose a directory you may write to",
        ):
            stats.save(path)
    finally:
        subprocess.run(undo, check=True)
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_save_keeps_the_old_file_and_leaves_nothing(
    stats: KVStats, good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    import safetensors.torch

    path = tmp_path / "s.safetensors"
    path.write_bytes(good.read_bytes())

    def half_then_fail(tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str]) -> None:
        Path(filename).write_bytes(b"half a file")
        raise failure

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_fail)
    expected = StatsFileError if isinstance(failure, OSError) else KeyboardInterrupt
    with pytest.raises(expected) as info:
        stats.save(path)
    if expected is StatsFileError:
        assert str(info.value) == f"cannot save statistics to {path}: No space left on device"
    assert path.read_bytes() == good.read_bytes()
    assert list(tmp_path.iterdir()) == [path]


# A child process that saves over a file and is killed after the new content is written but before it
# replaces the old file: the moment it flushes the temporary file to disk.
KILLED_CHILD = """
import os, sys
from headwidget import KVStats

stats = KVStats.load(sys.argv[1])

def stop_here(fd):
    print("writing", flush=True)
    sys.stdin.readline()  # never answered: the parent kills this process here

os.fsync = stop_here
stats.save(sys.argv[2])
print("saved", flush=True)
"""


def test_a_killed_save_keeps_the_old_file_and_leaves_a_recognisable_folder(
    stats: KVStats, good: Path, tmp_path: Path
) -> None:
    path = tmp_path / "s.safetensors"
    path.write_bytes(b"the user's old file")
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_CHILD, str(good), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "writing\n"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert path.read_bytes() == b"the user's old file"
    (leftover,) = [p for p in tmp_path.iterdir() if p != path]
    assert re.fullmatch(r"\.s\.safetensors\.\w+\.headwidget-partial", leftover.name) and leftover.is_dir()
    from headwidget.files import partial_leftovers

    assert partial_leftovers(tmp_path) == [leftover]
    assert list(tmp_path.glob("*.safetensors")) == [path]  # the leftover is not taken for statistics
    inside = sorted(p.name for p in leftover.iterdir())
    stats.save(path)  # a later save neither trips over the leftover nor touches it
    assert KVStats.load(path).tokens == stats.tokens
    assert partial_leftovers(tmp_path) == [leftover] and sorted(p.name for p in leftover.iterdir()) == inside


# ---------------------------------------------------------------------- sound files still load
@pytest.mark.parametrize("family", sorted(FACTORIES))
def test_every_familys_capture_saves_and_loads(family: str, tmp_path: Path) -> None:
    """The checks' rounding slack holds for real captures: every layout, kind and cross-layer set."""
    model = make_model(family, dtype=torch.float32)
    try:
        stats = headwidget.capture(
            model, ragged_batches(), rope="both", inputs=True, cross_layer=True, progress=False
        )
    except headwidget.RopeCaptureError:  # no post-RoPE keys for this family
        stats = headwidget.capture(model, ragged_batches(), inputs=True, cross_layer=True, progress=False)
    first, second = ragged_batches()
    halves = [headwidget.capture(model, [b], inputs=True, progress=False) for b in (first, second)]
    for saved in (stats, halves[0] + halves[1]):
        loaded = KVStats.load(saved.save(tmp_path / "s.safetensors"))
        assert loaded.meta.to_json() == saved.meta.to_json()


def synthetic(rows: Callable[[int], torch.Tensor]) -> KVStats:
    """Statistics of 4 heads of 16 channels, fed in uneven float32 batches drawn by ``rows(n)``."""
    from headwidget.core.layout import AttentionLayout
    from headwidget.moments import Moments
    from headwidget.stats import StatsMeta

    layout = AttentionLayout("synthetic", "gqa", 1, 8, 4, 16, 16, 64)
    moments = {}
    for kind in ("key", "value"):
        m = Moments.empty(64, head_dim=16)
        for n in (1, 7, 5000, 20000, 3):
            m.update(rows(n).float(), n // 2)
        moments[(0, kind)] = m
    meta = StatsMeta("synthetic", "Synthetic", layout, [0], ["key", "value"], tokens=25011)
    return KVStats(meta, moments)


ROUNDING_CASES: dict[str, Callable[[int], torch.Tensor]] = {
    "large mean, tiny spread": lambda n: 1e4 + 1e-3 * torch.randn(n, 64),
    "huge mean": lambda n: 3e6 + torch.randn(n, 64),
    "identical channels": lambda n: torch.randn(n, 1).repeat(1, 64) * 5 + 7,
    "constant and zero channels": lambda n: torch.cat([torch.zeros(n, 32), torch.full((n, 32), 3.3)], 1),
    "bfloat16 values": lambda n: (torch.randn(n, 64) * 50 + 300).bfloat16().float(),
    "rare massive activations": lambda n: torch.where(torch.rand(n, 64) < 1e-3, 1e4, torch.randn(n, 64)),
    "nearly collinear": lambda n: (lambda z: torch.cat([z, z + 1e-6 * torch.randn(n, 32)], 1))(
        torch.randn(n, 32)
    ),
}


@pytest.mark.parametrize("rows", list(ROUNDING_CASES.values()), ids=list(ROUNDING_CASES))
def test_float32_rounding_is_not_taken_for_damage(
    rows: Callable[[int], torch.Tensor], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    stats = synthetic(rows)
    loaded = KVStats.load(stats.save(tmp_path / "s.safetensors"))
    assert abs(loaded.head_similarity(0, "key")).max() <= 1 + 1e-6
