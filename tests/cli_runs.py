"""What the command-line tests share: small run options, a character tokenizer for the tiny models,
and running ``headwidget``'s ``main`` as the shell would."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from headwidget import cli
from tiny_models import VOCAB

#: Options that keep a command-line run on a tiny model short.
TINY = [
    "--calibration-tokens",
    "256",
    "--evaluation-tokens",
    "128",
    "--max-length",
    "64",
    "--batch-size",
    "4",
]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (95 of them, and [UNK]): the tiny models' 96 ids."""
    from tokenizers import Tokenizer, models

    vocab = {"[UNK]": 0, **{chr(c): c - 31 for c in range(32, 127)}}
    assert len(vocab) == VOCAB
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[UNK]")


def run(capfd: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)``'s exit code (argparse's too), stdout and stderr (file descriptors 1 and 2)."""
    capfd.readouterr()
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 2
    out, err = capfd.readouterr()
    return code, out, err
