"""``--model`` and ``--device``: an embedded model by name, or a transformers model directory.

Example:
    >>> EMBEDDED
    ('smollm2-135m', 'minilm-l6')
    >>> check_device("cpu")
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from headwidget.cli._errors import ModelLoadError, UsageError, one_line
from headwidget.embedded import EMBEDDED_MODELS
from headwidget.errors import HeadwidgetError

__all__ = ["EMBEDDED", "Loader", "check_device", "load_model"]

EMBEDDED = tuple(EMBEDDED_MODELS)

#: What a command is handed to load ``--model`` with: :func:`load_model`'s signature.
Loader = Callable[..., tuple[Any, Any]]


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No progress bars or warnings from transformers while a model loads (the user's settings back)."""
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _load_step(path: Path, what: str, fix: str) -> Iterator[None]:
    """Turn any failure of transformers reading ``what`` from ``path`` into a :class:`ModelLoadError`."""
    try:
        yield
    except HeadwidgetError:
        raise
    except Exception as err:  # a third-party reader of a user's files: any failure is the files'
        raise ModelLoadError(
            f"--model {path}: cannot load its {what} ({type(err).__name__}: {one_line(err)}); {fix}"
        ) from err


def check_device(name: str | None) -> None:
    """Refuse a ``--device`` that torch does not know, or that this machine does not have (exit 2).

    Example:
        >>> check_device("cpu")
        >>> try:
        ...     check_device("banana")
        ... except UsageError as err:
        ...     print(str(err).split(";")[0])
        --device 'banana' is not a torch device
        >>> try:
        ...     check_device("meta")
        ... except UsageError as err:
        ...     print(str(err).split(";")[0])
        --device meta: meta tensors hold no values (a model there computes nothing)
    """
    if name is None:
        return
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError) as err:
        raise UsageError(
            f"--device {name!r} is not a torch device; use cpu, cuda, cuda:1, mps... ({one_line(err)})"
        ) from err
    if device.type == "meta":
        raise UsageError(
            f"--device {name}: meta tensors hold no values (a model there computes nothing); "
            "use --device cpu or cuda, or leave --device out"
        )
    try:
        torch.empty(1, device=device)
    except Exception as err:  # CUDA without a driver raises AssertionError, a bad index RuntimeError
        raise UsageError(
            f"--device {name}: this machine cannot allocate on it ({type(err).__name__}: {one_line(err)}); "
            "use --device cpu, or leave --device out (cuda when available, else cpu)"
        ) from err


def load_model(
    name: str, *, device: str | None = None, dtype: str = "float32", tokenizer: bool = True
) -> tuple[Any, Any]:
    """An embedded model by name, or a transformers model and tokenizer from a local directory.

    ``tokenizer=False`` loads no tokenizer (the second item is None). A directory that cannot be
    loaded raises :class:`ModelLoadError` naming the part (config, weights, tokenizer) and the fix.

    Example:
        >>> try:
        ...     load_model("/no/such/model")
        ... except UsageError as err:
        ...     print(str(err).split(":")[0])
        --model '/no/such/model'
    """
    import torch

    check_device(device)
    if name in EMBEDDED:
        from headwidget.embedded import load_embedded

        return load_embedded(name, device=device)
    path = Path(name)
    if not (path / "config.json").is_file():
        raise UsageError(f"--model {name!r}: not a model directory (no config.json) nor one of {EMBEDDED}")
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    saved = "save it with model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR)"
    with _quiet_transformers():
        with _load_step(path, "config.json", f"it must be the JSON config transformers writes; {saved}"):
            config = AutoConfig.from_pretrained(path, local_files_only=True)
        loader = _model_class(config, AutoModelForCausalLM, AutoModel)
        fix = f"it needs complete model.safetensors (or pytorch_model.bin) weights; {saved}"
        with _load_step(path, "weights", fix):
            model = loader.from_pretrained(path, local_files_only=True, dtype=getattr(torch, dtype))
        tok = _load_tokenizer(path, AutoTokenizer) if tokenizer else None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tok


def _model_class(config: Any, causal: Any, auto: Any) -> Any:
    """The class the model was saved as (``config.architectures``, so that statistics captured from
    it in Python match it here), else ``causal`` for a ``…ForCausalLM`` architecture, else ``auto``."""
    import transformers

    architectures = getattr(config, "architectures", None) or []
    for name in architectures:
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel):
            return cls
    return causal if any(a.endswith("ForCausalLM") for a in architectures) else auto


def _load_tokenizer(path: Path, auto: Any) -> Any:
    fix = "save the model's tokenizer there: tokenizer.save_pretrained(DIR)"
    with _load_step(path, "tokenizer", fix):
        tok = auto.from_pretrained(path, local_files_only=True)
        probe = tok("The quick brown fox.")["input_ids"]
    # Without tokenizer files transformers may build an empty one, which turns every text into nothing.
    if not probe:
        raise ModelLoadError(f"--model {path}: has no usable tokenizer (it encodes text as no tokens); {fix}")
    return tok
