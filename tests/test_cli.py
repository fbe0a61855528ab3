"""The command line, run as a user would (a subprocess of the installed console script)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from headwidget import KVStats
from headwidget.cli import main


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--out",
        "--max-tokens",
        "--max-length",
        "--batch-size",
        "--device",
        "--models",
        "--no-progress",
    ):
        assert option in out


def test_unknown_model_is_a_usage_error(capsys):
    assert main(["demo", "--models", "gpt-17"]) == 2
    assert "unknown model" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_writes_readable_statistics(tmp_path):
    exe = shutil.which("headwidget") or f"{sys.prefix}/bin/headwidget"
    result = subprocess.run(
        [exe, "demo", "--out", str(tmp_path), "--max-tokens", "300", "--max-length", "64", "--no-progress"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "pydoc_data.topics" in result.stdout
    assert "llama/gqa, 30 layers, H=9 G=3 d_h=64" in result.stdout
    assert "bert/mha, 6 layers, H=12 G=12 d_h=32" in result.stdout
    smol = KVStats.load(tmp_path / "smollm2-135m.safetensors")
    mini = KVStats.load(tmp_path / "minilm-l6.safetensors")
    assert smol.tokens == 300 and mini.tokens == 300
    assert "key_post" in smol.kinds and "input" in mini.kinds
    # the printed table shows the saved numbers
    first_row = f"{0:>5d}  {smol.summary()[0]['key_abs_corr']:>10.3f}"
    assert first_row in result.stdout
