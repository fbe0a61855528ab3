"""The ``headwidget`` command line: ``demo``, ``capture`` and ``figure``.

Exit codes: 0 success; 1 a headwidget error (bad statistics file, unsupported model, a model directory
that cannot be loaded, memory budget...); 2 a usage error (unknown option, bad option value, missing
or unreadable input file, output path that cannot be written). Every failure is one line on stderr,
``headwidget COMMAND: what was wrong and what to do``. Output paths are checked before any work, so a
capture is never thrown away for want of a place to save it.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from headwidget.embedded import EMBEDDED_MODELS
from headwidget.errors import HeadwidgetError

if TYPE_CHECKING:
    from headwidget.views import View

__all__ = ["main"]

EMBEDDED = tuple(EMBEDDED_MODELS)
#: ``--dpi`` range of ``figure``: beyond it a page-sized PNG needs gigabytes of memory.
DPI_RANGE = (1, 1200)


class UsageError(Exception):
    """A command-line mistake: printed and exit code 2."""


class ModelLoadError(HeadwidgetError, OSError):
    """A model directory whose config, weights or tokenizer cannot be loaded."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (and exit code 2), pointing at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(message: object) -> str:
    """``message`` with its whitespace (newlines too) collapsed: one line of text."""
    return " ".join(str(message).split())


def _gib(text: str) -> float:
    """``--max-memory``: a finite number of GiB > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"takes a finite number of GiB > 0 (like 4 or 0.5), got {text!r}")
    return value


def _dpi(text: str) -> int:
    """``--dpi``: a whole number of dots per inch in :data:`DPI_RANGE`."""
    low, high = DPI_RANGE
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"takes a whole number of dots per inch in {low}..{high}, got {text!r}"
        )
    return value


def _demo_parser(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="capture the embedded real models over English text, print summaries, save stats",
        description="Load SmolLM2-135M (GQA) and all-MiniLM-L6-v2 (BERT) from their PyPI packages, "
        "capture K/V statistics over English prose shipped with Python, print a per-layer summary "
        "and save the statistics (safetensors) under --out.",
    )
    demo.add_argument("--out", type=Path, default=Path("headwidget-demo"), help="output directory")
    demo.add_argument("--max-tokens", type=int, default=4096, help="tokens per model (default: 4096)")
    demo.add_argument("--no-figures", action="store_true", help="only capture, print and save statistics")
    demo.add_argument("--max-length", type=int, default=256, help="tokens per text (default: 256)")
    demo.add_argument("--batch-size", type=int, default=8, help="texts per forward pass (default: 8)")
    demo.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    demo.add_argument("--models", default=None, help=f"comma-separated subset of: {', '.join(EMBEDDED)}")
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _capture_parser(sub: Any) -> None:
    cap = sub.add_parser(
        "capture",
        help="capture K/V statistics of a local model over a text file",
        description="Load a transformers model from a local directory (or an embedded model by name), "
        "stream its key/value statistics over the texts in --texts and save them as safetensors.",
    )
    cap.add_argument("--model", required=True, help=f"model directory, or one of: {', '.join(EMBEDDED)}")
    cap.add_argument(
        "--texts",
        required=True,
        type=Path,
        help="UTF-8 text file: one text per paragraph (separated by blank lines)",
    )
    cap.add_argument("--out", required=True, type=Path, help="statistics file to write (.safetensors)")
    cap.add_argument("--layers", default=None, help="comma-separated layer indices (default: all)")
    cap.add_argument("--rope", default="pre", choices=("pre", "post", "both"), help="which keys to capture")
    cap.add_argument("--inputs", action="store_true", help="also capture the attention input's moments")
    cap.add_argument(
        "--cross-layer",
        default=None,
        help="comma-separated layers whose heads get joint statistics, or 'all'",
    )
    cap.add_argument("--skip-first-token", action="store_true", help="drop each text's first token")
    cap.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens")
    cap.add_argument("--max-length", type=int, default=512, help="tokens per text (default: 512)")
    cap.add_argument("--batch-size", type=int, default=8, help="texts per forward pass (default: 8)")
    cap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    cap.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="model weights dtype (default: float32)",
    )
    cap.add_argument("--max-memory", type=_gib, default=None, help="GiB the statistics may use per device")
    cap.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _figure_parser(sub: Any) -> None:
    from headwidget.views import view_names

    names = view_names()
    fig = sub.add_parser(
        "figure",
        help="draw a reference-style figure from saved statistics",
        description=f"Draw a view's figure ({', '.join(names)}) from a statistics file and save it as "
        ".png, .svg, .pdf or a standalone .html.",
    )
    fig.add_argument("stats", type=Path, help="statistics file written by `headwidget capture`")
    fig.add_argument("--view", default=names[0], choices=names, help=f"which view (default: {names[0]})")
    fig.add_argument(
        "--layers",
        default=None,
        help="comma-separated layers: the first is selected; the rest are the view's (channels: one "
        "column each; alignment: one flattened set of heads)",
    )
    fig.add_argument(
        "--kind",
        default="key",
        choices=("key", "key_post"),
        help="pre- or post-RoPE keys (views with a kind)",
    )
    fig.add_argument("--channels", default=None, help="channel window START:STOP (views with a window)")
    fig.add_argument("--model", default=None, help="model directory or embedded name (views of weights)")
    fig.add_argument("--out", required=True, type=Path, help="output file: .png, .svg, .pdf or .html")
    fig.add_argument(
        "--dpi",
        type=_dpi,
        default=200,
        help=f"resolution of .png output, {DPI_RANGE[0]}..{DPI_RANGE[1]} (default: 200)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="headwidget", description="How redundant are a transformer's attention heads and KV channels?"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _demo_parser(sub)
    _capture_parser(sub)
    _figure_parser(sub)
    return parser


def _int_list(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise UsageError(f"{option} takes comma-separated integers, got {text!r}") from err


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
            f"--model {path}: cannot load its {what} ({type(err).__name__}: {_one_line(err)}); {fix}"
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
    """
    if name is None:
        return
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError) as err:
        raise UsageError(
            f"--device {name!r} is not a torch device; use cpu, cuda, cuda:1, mps... ({_one_line(err)})"
        ) from err
    try:
        torch.empty(1, device=device)
    except Exception as err:  # CUDA without a driver raises AssertionError, a bad index RuntimeError
        raise UsageError(
            f"--device {name}: this machine cannot allocate on it ({type(err).__name__}: {_one_line(err)}); "
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


def read_texts(path: Path) -> list[str]:
    """Paragraphs of a UTF-8 text file (blank-line separated), whitespace-normalised.

    A missing, unreadable, non-UTF-8 or empty file is a :class:`UsageError` (exit 2).

    Example:
        >>> import pathlib, tempfile
        >>> file = pathlib.Path(tempfile.mkdtemp()) / "texts.txt"
        >>> _ = file.write_text("First  text,\\non two lines.\\n\\nSecond text.", encoding="utf-8")
        >>> read_texts(file)
        ['First text, on two lines.', 'Second text.']
    """
    if not path.is_file():
        raise UsageError(f"--texts {path}: no such file")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UsageError(f"--texts {path}: cannot read it ({err.strerror or err})") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(
            f"--texts {path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
            "save it as UTF-8 (iconv -f latin1 -t utf-8, or your editor's 'save with encoding')"
        ) from err
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    texts = [p for p in paragraphs if p]
    if not texts:
        raise UsageError(f"--texts {path}: the file holds no text")
    return texts


def _probe_directory(directory: Path, option: str, path: Path) -> None:
    """Create and remove a file in ``directory``: the one test of writability that also holds for root
    (whom permission bits do not stop) and for read-only file systems."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".headwidget-write-test-")
    except OSError as err:
        raise UsageError(
            f"{option} {path}: cannot write in {directory} ({err.strerror or err}); "
            "choose a directory you may write to"
        ) from err
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: Path, option: str = "--out") -> None:
    """Refuse, before any work, an output file that cannot be written (a :class:`UsageError`).

    Its directory must exist and be writable; an existing target (followed through symlinks) must be
    a regular file we may write.

    Example:
        >>> import pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> check_output_file(folder / "stats.safetensors")
        >>> try:
        ...     check_output_file(folder / "missing" / "stats.safetensors")
        ... except UsageError as err:
        ...     print(str(err).split(";")[1].strip())
        create it first
    """
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise UsageError(f"{option} {path}: is a directory; give the path of a file in it")
    if target.exists() and not target.is_file():
        raise UsageError(f"{option} {path}: exists and is not a regular file; give the path of a file")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{option} {path}: exists and is read-only; choose another path or make it writable")
    directory = target.parent
    if not directory.exists():
        raise UsageError(f"{option} {path}: the directory {path.parent} does not exist; create it first")
    if not directory.is_dir():
        raise UsageError(f"{option} {path}: {path.parent} is not a directory")
    _probe_directory(directory, option, path)


def check_output_dir(path: Path, option: str = "--out") -> None:
    """Refuse, before any work, an output directory that cannot be created or written (UsageError).

    A missing directory is fine when it can be created: its nearest existing parent must be a
    writable directory.

    Example:
        >>> import pathlib, tempfile
        >>> check_output_dir(pathlib.Path(tempfile.mkdtemp()) / "new" / "demo")
    """
    target = Path(os.path.realpath(path))
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == target else f"lies under {existing}, which is not a directory"
        raise UsageError(f"{option} {path}: {what}; give a directory")
    _probe_directory(existing, option, path)


def _run_demo(args: argparse.Namespace) -> int:
    from headwidget.demo import MODELS, run_demo

    models = args.models.split(",") if args.models else None
    unknown = [m for m in models or [] if m not in MODELS]
    if unknown:
        raise UsageError(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    check_device(args.device)
    check_output_dir(args.out)
    run_demo(
        args.out,
        max_tokens=args.max_tokens,
        max_length=args.max_length,
        batch_size=args.batch_size,
        device=args.device,
        models=models,
        progress=not args.no_progress,
        figures=not args.no_figures,
    )
    return 0


def _run_capture(args: argparse.Namespace) -> int:
    from headwidget.capture import capture
    from headwidget.report import summary_table

    texts = read_texts(args.texts)
    cross: list[int] | bool | None = True if args.cross_layer == "all" else None
    if args.cross_layer not in (None, "all"):
        cross = _int_list(args.cross_layer, "--cross-layer")
    layers = _int_list(args.layers, "--layers")
    check_output_file(args.out)  # before loading and capturing: a capture is never lost for want of a file
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
    stats = capture(
        model,
        texts,
        tokenizer=tokenizer,
        layers=layers,
        rope=args.rope,
        inputs=args.inputs,
        cross_layer=cross,
        skip_first_token=args.skip_first_token,
        max_tokens=args.max_tokens,
        max_length=args.max_length,
        batch_size=args.batch_size,
        max_memory=None if args.max_memory is None else int(args.max_memory * 2**30),
        progress=not args.no_progress,
    )
    stats.save(args.out)
    print(summary_table(stats))
    print(f"saved {stats!r} to {args.out}")
    return 0


def _figure_state(view: type[View], args: argparse.Namespace) -> dict[str, Any]:
    """Initial state from --kind and --channels, for the views that have a kind and a window."""
    state: dict[str, Any] = {}
    if "kind" in view.state_traits():
        state["kind"] = args.kind
    window = next((c for c in view.view_controls() if c.type == "window"), None)
    if args.channels and window is not None:
        try:
            start, stop = (int(x) for x in args.channels.split(":"))
        except ValueError as err:
            raise UsageError(f"--channels takes START:STOP, got {args.channels!r}") from err
        if not 0 <= start < stop:
            raise UsageError(f"--channels takes START:STOP with 0 ≤ START < STOP, got {args.channels!r}")
        state.update({window.trait: start, window.width: stop - start})
    return state


def _run_figure(args: argparse.Namespace) -> int:
    from headwidget.export import save
    from headwidget.stats import KVStats
    from headwidget.views import view_class

    if not args.stats.is_file():
        raise UsageError(f"{args.stats}: no such statistics file")
    if args.out.suffix.lower() not in (".png", ".svg", ".pdf", ".html"):
        raise UsageError(f"--out {args.out}: the extension must be .png, .svg, .pdf or .html")
    cls = view_class(args.view)
    if cls.needs_model and args.model is None:
        raise UsageError(f"--view {args.view} needs --model (the weights of the model the stats come from)")
    layers = _int_list(args.layers, "--layers")
    state = _figure_state(cls, args)
    check_output_file(args.out)
    stats = KVStats.load(args.stats)
    layers = layers or stats.layers[:1]
    model = load_model(args.model, device="cpu", tokenizer=False)[0] if cls.needs_model else None
    view = cls.create(stats, model, layers=layers, interactive=False, **state)
    if view.error:
        raise _ViewError(view.error)
    save(view, args.out, dpi=args.dpi)
    print(f"saved {args.out}")
    return 0


class _ViewError(HeadwidgetError, ValueError):
    """The requested figure cannot be drawn from these statistics."""


COMMANDS = {"demo": _run_demo, "capture": _run_capture, "figure": _run_figure}


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit code.

    A user error prints one line, ``headwidget COMMAND: …``, on stderr and returns 1 or 2 (argparse's
    own errors exit with 2 by ``SystemExit``).

    Example:
        >>> main(["figure", "/no/such/stats.safetensors", "--out", "figure.png"])
        2
    """
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as err:
        print(f"headwidget {args.command}: {_one_line(err)}", file=sys.stderr)
        return 2
    except HeadwidgetError as err:
        print(f"headwidget {args.command}: {_one_line(err)}", file=sys.stderr)
        return 1
    except OSError as err:  # the disk, not headwidget: full, gone, permissions changed mid-run
        print(f"headwidget {args.command}: {_one_line(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
