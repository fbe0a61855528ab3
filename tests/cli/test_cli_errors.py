"""Every user mistake on the command line ends in one line on stderr and exit 1 (headwidget refuses) or
2 (usage), never a traceback; an output path that cannot be written fails before any model is loaded."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import headwidget
from headwidget import cli
from tiny_models import make_model, ragged_batches

TEXT = "The cat sat on the mat.\n\nA dog ran in the park, and the cat was not there.\n"


def word_tokenizer() -> Any:
    """A small word-level tokenizer built offline (ids < the tiny GPT-2's vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    text = "[UNK] [PAD] the a cat dog sat on mat ran in park and was not there . ,"
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(text.split())}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A complete model directory, broken copies of it, text files and statistics files."""
    root = tmp_path_factory.mktemp("cli")
    model = make_model("gpt2", dtype=torch.float32)
    good = root / "gpt2"
    model.save_pretrained(good)
    word_tokenizer().save_pretrained(good)
    paths = {"model": good}

    def broken(name: str, edit: Callable[[Path], object]) -> None:
        shutil.copytree(good, root / name)
        edit(root / name)
        paths[name] = root / name

    weights = (good / "model.safetensors").read_bytes()
    broken("no-config", lambda d: (d / "config.json").unlink())
    broken("config-not-json", lambda d: (d / "config.json").write_text("{not json"))
    broken("config-no-model-type", lambda d: (d / "config.json").write_text("{}"))
    broken("no-weights", lambda d: (d / "model.safetensors").unlink())
    broken("weights-garbage", lambda d: (d / "model.safetensors").write_bytes(b"\x00garbage" * 64))
    broken("weights-truncated", lambda d: (d / "model.safetensors").write_bytes(weights[: len(weights) // 2]))
    broken("no-tokenizer", lambda d: [(d / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")])
    broken("tokenizer-garbage", lambda d: (d / "tokenizer.json").write_text("{garbage"))

    paths["texts"] = root / "texts.txt"
    paths["texts"].write_text(TEXT, encoding="utf-8")
    paths["latin1"] = root / "latin1.txt"
    paths["latin1"].write_bytes("Un caf\xe9 cr\xe8me.".encode("latin-1"))
    paths["blank"] = root / "blank.txt"
    paths["blank"].write_text("\n\n  \n", encoding="utf-8")
    paths["stats"] = headwidget.capture(model, ragged_batches(), progress=False).save(
        root / "good.safetensors"
    )
    paths["a-file"] = paths["texts"]
    return paths


def read_only_dir(tmp_path: Path) -> Path:
    """A directory no file can be created in: mode 0555, or (as root, whom modes do not stop) /sys."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            (candidate / ".probe").touch()
        except OSError:
            return candidate
        (candidate / ".probe").unlink()
    pytest.skip("no directory here refuses new files (root without a read-only /sys)")


def rewrite_stats(good: Path, out: Path, edit: Callable[[dict, dict, dict], None]) -> Path:
    """A copy of a statistics file with ``edit(header, meta, tensors)`` applied."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(good), framework="pt") as fh:
        header = dict(fh.metadata())
    tensors = load_file(str(good))
    meta = json.loads(header["meta"])
    edit(header, meta, tensors)
    header["meta"] = json.dumps(meta)
    save_file(tensors, str(out), metadata=header)
    return out


def _set(key: str, value: Any) -> Callable[[dict, dict, dict], None]:
    def edit(header: dict, meta: dict, tensors: dict) -> None:
        meta[key] = value

    return edit


def _tensor(name: str, value: torch.Tensor) -> Callable[[dict, dict, dict], None]:
    def edit(header: dict, meta: dict, tensors: dict) -> None:
        tensors[name] = value

    return edit


def _header(key: str, value: str) -> Callable[[dict, dict, dict], None]:
    def edit(header: dict, meta: dict, tensors: dict) -> None:
        header[key] = value

    return edit


def _head_dim(header: dict, meta: dict, tensors: dict) -> None:
    meta["layout"]["head_dim"] = 5


def _other_safetensors(out: Path) -> None:
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(out))


def _nan_mean(header: dict, meta: dict, tensors: dict) -> None:
    tensors["layer0.key.mean"] = torch.full_like(tensors["layer0.key.mean"], float("nan"))


#: Corrupt statistics files: what ``figure`` is given instead of one ``capture`` wrote. Exit 1 each.
CORRUPT_STATS: dict[str, Callable[[Path, Path], object]] = {
    "empty file": lambda good, out: out.write_bytes(b""),
    "junk bytes": lambda good, out: out.write_bytes(b"junk" * 100),
    "truncated": lambda good, out: out.write_bytes(good.read_bytes()[: good.stat().st_size // 2]),
    "pickle renamed": lambda good, out: out.write_bytes(pickle.dumps({"layer0.key.mean": [0.0]})),
    "other safetensors": lambda good, out: _other_safetensors(out),
    "float token count": lambda good, out: rewrite_stats(good, out, _set("tokens", 12.5)),
    "negative token count": lambda good, out: rewrite_stats(good, out, _set("tokens", -3)),
    "string token count": lambda good, out: rewrite_stats(good, out, _set("tokens", "<b>many</b>")),
    "duplicate layers": lambda good, out: rewrite_stats(good, out, _set("layers", [0, 0])),
    "head_dim off the tensors": lambda good, out: rewrite_stats(good, out, _head_dim),
    "NaN tensor": lambda good, out: rewrite_stats(good, out, _nan_mean),
    "negative count tensor": lambda good, out: rewrite_stats(
        good, out, _tensor("layer0.key.count", torch.tensor([-1]))
    ),
    "unknown format version": lambda good, out: rewrite_stats(good, out, _header("format_version", "99")),
}


def run(capfd: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    """``main(argv)``'s exit code (argparse's too) and what reached stderr (file descriptor 2)."""
    capfd.readouterr()
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 2
    return code, capfd.readouterr().err


def assert_one_line(err: str, command: str) -> None:
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith(f"headwidget {command}: "), err


def capture_argv(files: dict[str, Path], tmp_path: Path, **changes: str) -> list[str]:
    options = {
        "--model": str(files["model"]),
        "--texts": str(files["texts"]),
        "--out": str(tmp_path / "stats.safetensors"),
        "--max-tokens": "16",
    }
    options.update({f"--{k.replace('_', '-')}": v for k, v in changes.items()})
    return ["capture", *[x for kv in options.items() for x in kv], "--no-progress"]


CUDA = torch.cuda.is_available()

#: (case, changed capture options, exit code, a phrase of the message)
CAPTURE_CASES: list[tuple[str, dict[str, str], int, str]] = [
    ("model: directory without config.json", {"model": "no-config"}, 2, "no config.json"),
    ("model: config.json is not JSON", {"model": "config-not-json"}, 1, "cannot load its config.json"),
    ("model: config.json without model_type", {"model": "config-no-model-type"}, 1, "config.json"),
    ("model: no weights", {"model": "no-weights"}, 1, "cannot load its weights"),
    ("model: garbage weights", {"model": "weights-garbage"}, 1, "cannot load its weights"),
    ("model: truncated weights", {"model": "weights-truncated"}, 1, "cannot load its weights"),
    ("model: no tokenizer", {"model": "no-tokenizer"}, 1, "tokenizer"),
    ("model: garbage tokenizer", {"model": "tokenizer-garbage"}, 1, "tokenizer"),
    ("model: no such directory or name", {"model": "/no/such/model"}, 2, "not a model directory"),
    ("texts: no such file", {"texts": "/no/such/texts.txt"}, 2, "no such file"),
    ("texts: not UTF-8", {"texts": "latin1"}, 2, "not UTF-8 text (byte 0xe9 at offset 6)"),
    ("texts: a directory", {"texts": "/"}, 2, "--texts /: is a directory; give a UTF-8 text file"),
    ("texts: no text", {"texts": "blank"}, 2, "holds no text"),
    ("texts: /dev/null", {"texts": "/dev/null"}, 2, "--texts /dev/null: the file holds no text (it is empty"),
    ("max-memory nan", {"max_memory": "nan"}, 2, "finite number of GiB"),
    ("max-memory inf", {"max_memory": "inf"}, 2, "finite number of GiB"),
    ("max-memory -inf", {"max_memory": "-inf"}, 2, "argument --max-memory"),  # argparse: an option?
    ("max-memory 0", {"max_memory": "0"}, 2, "> 0"),
    ("max-memory negative", {"max_memory": "-2"}, 2, "> 0"),
    ("max-memory not a number", {"max_memory": "lots"}, 2, "finite number of GiB"),
    ("max-memory fullwidth", {"max_memory": "４"}, 2, "finite number of GiB"),
    ("max-memory with a digit separator", {"max_memory": "1_0"}, 2, "finite number of GiB"),
    ("device banana", {"device": "banana"}, 2, "'banana' is not a torch device"),
    ("device cuda:99", {"device": "cuda:99"}, 2, "cannot allocate on it"),
    ("device meta", {"device": "meta"}, 2, "--device meta: meta tensors hold no values"),
    ("layers not integers", {"layers": "a,b"}, 2, "comma-separated integers"),
    ("layers empty", {"layers": ""}, 2, "--layers is empty; give comma-separated integers"),
    ("layers with an empty item", {"layers": "0,,1"}, 2, "comma-separated integers"),
    ("layers in fullwidth digits", {"layers": "０"}, 2, "comma-separated integers"),
    ("cross-layer empty", {"cross_layer": ""}, 2, "--cross-layer is empty"),
    ("layers out of range", {"layers": "9"}, 1, "layer 9 is out of range"),
    ("max-tokens 0", {"max_tokens": "0"}, 2, "--max-tokens: takes a whole number ≥ 1"),
    ("max-tokens a float", {"max_tokens": "1.5"}, 2, "--max-tokens: takes a whole number ≥ 1"),
    ("max-tokens fullwidth", {"max_tokens": "１０"}, 2, "--max-tokens: takes a whole number ≥ 1 in ASCII"),
    ("max-tokens huge", {"max_tokens": "1" + "0" * 30}, 2, "at most 9007199254740992"),
    ("batch-size 0", {"batch_size": "0"}, 2, "--batch-size: takes a whole number ≥ 1"),
    ("batch-size negative", {"batch_size": "-4"}, 2, "--batch-size"),
    ("max-length not an integer", {"max_length": "long"}, 2, "--max-length: takes a whole number ≥ 1"),
    ("max-memory huge", {"max_memory": "1e30"}, 2, "at most 8388608"),
    ("rope not a choice", {"rope": "sideways"}, 2, "invalid choice"),
]
if not CUDA:
    CAPTURE_CASES.append(("device cuda without CUDA", {"device": "cuda"}, 2, "cannot allocate on it"))


@pytest.mark.parametrize(
    ("case", "changes", "code", "phrase"), CAPTURE_CASES, ids=[c[0] for c in CAPTURE_CASES]
)
def test_capture_user_errors(files, tmp_path, capfd, case, changes, code, phrase):
    changes = {k: str(files.get(v, v)) for k, v in changes.items()}
    exit_code, err = run(capfd, capture_argv(files, tmp_path, **changes))
    assert exit_code == code, err
    assert_one_line(err, "capture")
    assert phrase in err
    assert not (tmp_path / "stats.safetensors").exists()


def unwritable(kind: str, tmp_path: Path, files: dict[str, Path], name: str) -> Path:
    """An output path that cannot be written, of ``kind``."""
    if kind == "missing directory":
        return tmp_path / "no" / "such" / name
    if kind == "read-only directory":
        return read_only_dir(tmp_path) / name
    if kind == "under a file":
        return files["a-file"] / name
    assert kind == "is a directory"
    return tmp_path


OUT_KINDS = ["missing directory", "read-only directory", "under a file", "is a directory"]


@pytest.mark.parametrize("kind", OUT_KINDS)
def test_capture_refuses_an_unwritable_out_before_loading_the_model(
    files, tmp_path, capfd, monkeypatch, kind
):
    def no_loading(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(cli, "load_model", no_loading)
    out = unwritable(kind, tmp_path, files, "stats.safetensors")
    code, err = run(capfd, capture_argv(files, tmp_path, out=str(out)))
    assert code == 2, err
    assert_one_line(err, "capture")
    assert f"--out {out}" in err


def test_capture_writes_where_it_checked(files, tmp_path, capfd):
    # The check leaves nothing behind, and a writable --out works (the cases above fail for their reason).
    code, err = run(capfd, capture_argv(files, tmp_path))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.safetensors"]
    assert headwidget.KVStats.load(tmp_path / "stats.safetensors").tokens == 16


@pytest.mark.parametrize("case", list(CORRUPT_STATS))
def test_figure_exits_1_on_every_corrupt_statistics_file(files, tmp_path, capfd, case):
    bad = tmp_path / "bad.safetensors"
    CORRUPT_STATS[case](files["stats"], bad)
    code, err = run(capfd, ["figure", str(bad), "--out", str(tmp_path / "fig.png")])
    assert code == 1, err
    assert_one_line(err, "figure")
    assert not (tmp_path / "fig.png").exists()


FIGURE_CASES: list[tuple[str, list[str], int, str]] = [
    ("dpi 0", ["--dpi", "0"], 2, "dots per inch in 1..1200"),
    ("dpi negative", ["--dpi", "-300"], 2, "dots per inch in 1..1200"),
    ("dpi huge", ["--dpi", "1000000"], 2, "dots per inch in 1..1200"),
    ("dpi not a number", ["--dpi", "high"], 2, "dots per inch"),
    ("view unknown", ["--view", "attention"], 2, "invalid choice"),
    ("view needs --model", ["--view", "mechanisms"], 2, "needs --model"),
    ("model weights garbage", ["--view", "mechanisms", "--model", "weights-garbage"], 1, "weights"),
    ("model without config", ["--view", "mechanisms", "--model", "no-config"], 2, "no config.json"),
    ("layers not captured", ["--layers", "7"], 1, "layer 7 is out of range"),
    ("layers not integers", ["--layers", "one"], 2, "comma-separated integers"),
    ("layers empty", ["--layers", ""], 2, "--layers is empty"),
    ("dpi fullwidth", ["--dpi", "２００"], 2, "dots per inch in 1..1200"),
    ("dpi a float", ["--dpi", "150.5"], 2, "dots per inch in 1..1200"),
    ("channels fullwidth", ["--channels", "0:１６"], 2, "START:STOP"),
    ("channels not START:STOP", ["--channels", "5"], 2, "START:STOP"),
    ("channels empty window", ["--channels", "10:5"], 2, "START < STOP"),
    ("kind not captured", ["--kind", "key_post"], 1, "key_post"),
    ("out extension", ["--out", "fig.jpg"], 2, "extension must be"),
    ("statistics file missing", ["--stats", "/no/such.safetensors"], 2, "no such statistics file"),
]


@pytest.mark.parametrize(("case", "extra", "code", "phrase"), FIGURE_CASES, ids=[c[0] for c in FIGURE_CASES])
def test_figure_user_errors(files, tmp_path, capfd, case, extra, code, phrase):
    extra = [str(files.get(x, x)) for x in extra]
    stats = str(files["stats"])
    if extra[:1] == ["--stats"]:
        stats, extra = extra[1], extra[2:]
    out = ["--out", str(tmp_path / "fig.png")] if "--out" not in extra else []
    exit_code, err = run(capfd, ["figure", stats, *out, *extra])
    assert exit_code == code, err
    assert_one_line(err, "figure")
    assert phrase in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", OUT_KINDS)
def test_figure_refuses_an_unwritable_out_before_reading_anything(files, tmp_path, capfd, monkeypatch, kind):
    def no_loading(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the statistics were read before --out was checked")

    monkeypatch.setattr(headwidget.KVStats, "load", no_loading)
    out = unwritable(kind, tmp_path, files, "fig.png")
    if kind == "is a directory":
        out = tmp_path / "folder.png"
        out.mkdir()
    code, err = run(capfd, ["figure", str(files["stats"]), "--out", str(out)])
    assert code == 2, err
    assert_one_line(err, "figure")


DEMO_CASES: list[tuple[str, list[str], str]] = [
    ("device banana", ["--device", "banana"], "'banana' is not a torch device"),
    ("device cuda:99", ["--device", "cuda:99"], "cannot allocate on it"),
    ("out is a file", ["--out", "a-file"], "is a file"),
    ("out under a file", ["--out", "a-file/demo"], "not a directory"),
    ("models unknown", ["--models", "gpt-17"], "unknown model"),
    ("max-tokens not an integer", ["--max-tokens", "many"], "--max-tokens: takes a whole number ≥ 1"),
    ("max-tokens 0", ["--max-tokens", "0"], "--max-tokens: takes a whole number ≥ 1"),
    ("batch-size a float", ["--batch-size", "2.0"], "--batch-size: takes a whole number ≥ 1"),
    ("device meta", ["--device", "meta"], "--device meta: meta tensors hold no values"),
    ("models empty", ["--models", ""], "--models is empty"),
]


@pytest.mark.parametrize(("case", "extra", "phrase"), DEMO_CASES, ids=[c[0] for c in DEMO_CASES])
def test_demo_user_errors_fail_before_any_capture(files, tmp_path, capfd, monkeypatch, case, extra, phrase):
    import headwidget.demo

    def no_demo(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the demo started")

    monkeypatch.setattr(headwidget.demo, "run_demo", no_demo)
    extra = [x.replace("a-file", str(files["a-file"])) for x in extra]
    out = [] if "--out" in extra else ["--out", str(tmp_path / "demo")]
    code, err = run(capfd, ["demo", "--no-progress", *out, *extra])
    assert code == 2, err
    assert_one_line(err, "demo")
    assert phrase in err


def test_demo_refuses_a_read_only_out_before_any_capture(tmp_path, capfd, monkeypatch):
    import headwidget.demo

    monkeypatch.setattr(headwidget.demo, "run_demo", lambda *a, **k: pytest.fail("the demo started"))
    code, err = run(capfd, ["demo", "--out", str(read_only_dir(tmp_path) / "demo")])
    assert code == 2, err
    assert_one_line(err, "demo")
    assert "cannot write in" in err


def test_the_console_script_prints_one_line_too(files, tmp_path):
    """The same in a real process: nothing on stderr but the message, whatever the libraries log."""
    exe = shutil.which("headwidget") or f"{sys.prefix}/bin/headwidget"
    bad = tmp_path / "bad.safetensors"
    CORRUPT_STATS["NaN tensor"](files["stats"], bad)
    runs = {
        "capture": capture_argv(files, tmp_path, model=str(files["weights-garbage"])),
        "figure": ["figure", str(bad), "--out", str(tmp_path / "fig.png")],
    }
    for command, argv in runs.items():
        result = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 1, result.stderr
        assert_one_line(result.stderr, command)
