"""The ``headwidget`` command line: ``demo``, ``capture`` and ``figure``.

Exit codes: 0 success; 1 a headwidget error (bad statistics file, unsupported model, memory budget...),
with the reason on stderr; 2 a usage error (unknown option, missing file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headwidget.errors import HeadwidgetError

if TYPE_CHECKING:
    from headwidget.views import View

__all__ = ["main"]

EMBEDDED = ("smollm2-135m", "minilm-l6")


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
    cap.add_argument("--max-memory", type=float, default=None, help="GiB the statistics may use per device")
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
    fig.add_argument("--dpi", type=int, default=200, help="resolution of .png output (default: 200)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headwidget", description="How redundant are a transformer's attention heads and KV channels?"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _demo_parser(sub)
    _capture_parser(sub)
    _figure_parser(sub)
    return parser


class UsageError(Exception):
    """A command-line mistake: printed and exit code 2."""


def _int_list(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise UsageError(f"{option} takes comma-separated integers, got {text!r}") from err


def load_model(name: str, *, device: str | None = None, dtype: str = "float32") -> tuple[Any, Any]:
    """An embedded model by name, or a transformers model and tokenizer from a local directory."""
    import torch

    if name in EMBEDDED:
        from headwidget.embedded import load_minilm, load_smollm2

        return load_smollm2(device=device) if name == "smollm2-135m" else load_minilm(device=device)
    path = Path(name)
    if not (path / "config.json").is_file():
        raise UsageError(f"--model {name!r}: not a model directory (no config.json) nor one of {EMBEDDED}")
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    causal = any(a.endswith("ForCausalLM") for a in getattr(config, "architectures", None) or [])
    loader = AutoModelForCausalLM if causal else AutoModel
    model = loader.from_pretrained(path, local_files_only=True, dtype=getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer  # type: ignore[arg-type]


def read_texts(path: Path) -> list[str]:
    """Paragraphs of a UTF-8 text file (blank-line separated), whitespace-normalised."""
    if not path.is_file():
        raise UsageError(f"--texts {path}: no such file")
    paragraphs = [" ".join(p.split()) for p in path.read_text(encoding="utf-8").split("\n\n")]
    texts = [p for p in paragraphs if p]
    if not texts:
        raise UsageError(f"--texts {path}: the file holds no text")
    return texts


def _run_demo(args: argparse.Namespace) -> int:
    from headwidget.demo import MODELS, run_demo

    models = args.models.split(",") if args.models else None
    unknown = [m for m in models or [] if m not in MODELS]
    if unknown:
        raise UsageError(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
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
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
    stats = capture(
        model,
        texts,
        tokenizer=tokenizer,
        layers=_int_list(args.layers, "--layers"),
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
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
    stats = KVStats.load(args.stats)
    layers = _int_list(args.layers, "--layers") or stats.layers[:1]
    state = _figure_state(cls, args)
    model = load_model(args.model, device="cpu")[0] if cls.needs_model else None
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
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as err:
        print(f"headwidget {args.command}: {err}", file=sys.stderr)
        return 2
    except HeadwidgetError as err:
        print(f"headwidget {args.command}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
