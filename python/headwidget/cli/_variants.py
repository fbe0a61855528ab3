"""``--variants`` of ``headwidget evaluate``: the specs, the statistics they need, and a check of each
against the model before any statistics are captured.

- ``+align`` (``mqa+align``, ``gqa:G+align``) needs key and value statistics;
- ``lrkv:r`` and ``mla:d_c`` are fitted data-aware from the attention input's statistics, and
  ``rope:r`` / ``mla:d_c+rope:r`` rank the rotary pairs by the query/key pair norms recorded with them
  (both ``inputs=True``);
- ``kv:cq{c}c{b}b`` fits its codebooks on token samples of the post-RoPE keys and the values
  (``samples=R``, ``rope="both"``); ``kv:int{b}`` quantizes each group by its own range and needs none;
- ``model``, ``mha``, ``gqa:G`` and ``mqa`` need none.

Example:
    >>> specs = variant_specs("mqa, lrkv:16,MQA+align")
    >>> specs
    ['model', 'mqa', 'lrkv:16', 'mqa+align']
    >>> needs_statistics(specs), needs_inputs(specs), needs_inputs(["model", "mqa+align"])
    (True, True, False)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headwidget.analysis.variants import VARIANT_FORMS, MixedSpec, VariantSpec, parse_variant, uniform_parts
from headwidget.cli._errors import UsageError, VariantError
from headwidget.errors import HeadwidgetError, MechanismSpecError, MissingStatisticsError

__all__ = [
    "CALIBRATION_SAMPLES",
    "check_variants",
    "check_variants_statistics",
    "needs_inputs",
    "needs_samples",
    "needs_statistics",
    "samples_needed",
    "variant_specs",
]

#: Tokens of the probe capture that :func:`check_variants` fits one layer of every variant on.
PROBE_TOKENS = 32
#: Token samples per layer and kind kept for coupled-quantization codebooks (``kv:cq``).
CALIBRATION_SAMPLES = 4096


def variant_specs(text: str | None, single: Sequence[str] = ()) -> list[str]:
    """The canonical specs of ``--variants`` (comma-separated) and of each ``--variant`` (one spec each,
    so a mixed spec's layer lists may hold commas), ``model`` first, each once.

    An unreadable spec is a :class:`UsageError` naming it and the forms there are.

    Example:
        >>> variant_specs("mla:96+rope:8,model")
        ['model', 'mla:96+rope:8']
        >>> variant_specs("mqa", ["mla:8@0,1;mqa@2"])
        ['model', 'mqa', 'mla:8@0-1;mqa@2']
        >>> try:
        ...     variant_specs("mqa,banana")
        ... except UsageError as err:
        ...     print(str(err).split(";")[0])
        --variants: cannot read variant spec 'banana'
    """
    items = [item for item in (text or "").split(",") if item.strip()]
    if not items and not single:
        raise UsageError(
            f"give --variants (comma-separated variant specs, e.g. mqa,lrkv:16) or one --variant SPEC per "
            f"spec ({VARIANT_FORMS})"
        )
    specs = ["model"]
    for item in items:
        try:
            specs.append(parse_variant(item).text)
        except MechanismSpecError as err:
            hint = ""
            if "@" in (text or ""):
                hint = " (a mixed spec's layer list holds commas: give it with --variant SPEC instead)"
            raise UsageError(f"--variants: {err}{hint}") from err
    for item in single:
        try:
            specs.append(parse_variant(item).text)
        except MechanismSpecError as err:
            raise UsageError(f"--variant: {err}") from err
    return list(dict.fromkeys(specs))


def needs_statistics(specs: Sequence[str]) -> bool:
    """Whether any of ``specs`` is fitted from statistics (see the module docstring).

    Example:
        >>> needs_statistics(["model", "mqa", "gqa:3"]), needs_statistics(["mqa+align"])
        (False, True)
    """
    return any(_needs_keys(s) or _needs_input(s) or _needs_samples(s) for s in specs)


def needs_samples(specs: Sequence[str]) -> bool:
    """Whether any of ``specs`` is fitted on token samples (coupled quantization's codebooks).

    Example:
        >>> needs_samples(["kv:cq4c8b"]), needs_samples(["kv:int4", "mqa+align"])
        (True, False)
    """
    return any(_needs_samples(s) for s in specs)


def samples_needed(specs: Sequence[str]) -> int:
    """The fewest token samples per layer the codebooks of ``specs`` can be fitted on: ``2**b`` for
    ``kv:cq{c}c{b}b`` (one per centroid), 0 when no spec fits codebooks.

    Example:
        >>> samples_needed(["kv:cq4c8b", "kv:cq2c4b", "mqa"]), samples_needed(["kv:int4"])
        (256, 0)
    """
    return max((2 ** int(p.bits or 0) for s in specs for p in _parts(s) if p.mechanism == "kv:cq"), default=0)


def needs_inputs(specs: Sequence[str]) -> bool:
    """Whether any of ``specs`` needs the attention input's statistics (``inputs=True``).

    Example:
        >>> needs_inputs(["rope:8"]), needs_inputs(["mqa+align"])
        (True, False)
    """
    return any(_needs_input(s) for s in specs)


def _parts(spec: str) -> list[VariantSpec]:
    return uniform_parts(parse_variant(spec))


def _needs_keys(spec: str) -> bool:
    return any(p.align for p in _parts(spec))


def _needs_input(spec: str) -> bool:
    return any(p.mechanism in ("lrkv", "mla", "rope") or p.rope_pairs is not None for p in _parts(spec))


def _needs_samples(spec: str) -> bool:
    return any(p.mechanism == "kv:cq" for p in _parts(spec))


def check_variants_statistics(specs: Sequence[str], kinds: Sequence[str], source: str) -> None:
    """Refuse statistics (of ``kinds``, read from ``source``) that lack what ``specs`` need.

    Example:
        >>> check_variants_statistics(["model", "mqa+align"], ["key", "value"], "stats.safetensors")
        >>> try:
        ...     check_variants_statistics(["lrkv:16"], ["key", "value"], "stats.safetensors")
        ... except MissingStatisticsError as err:
        ...     print(str(err).split(";")[0])
        --stats stats.safetensors: lrkv:16 needs the attention input's statistics (kind 'input')
    """
    for spec in specs:
        missing = [k for k in (("key", "value") if _needs_keys(spec) else ()) if k not in kinds]
        if _needs_input(spec) and "input" not in kinds:
            missing.append("input")
        if missing:
            what = "the attention input's statistics" if missing == ["input"] else "statistics"
            raise MissingStatisticsError(
                f"--stats {source}: {spec} needs {what} (kind {', '.join(repr(k) for k in missing)}); "
                "capture them with `headwidget capture --inputs`, or leave --stats out to capture "
                "calibration statistics here"
            )


def check_variants(model: Any, tokenizer: Any, specs: Sequence[str], layer: int, texts: Any) -> None:
    """Fit every spec on one ``layer`` of ``model`` from a capture of a few tokens of ``texts``: a spec
    the model cannot take (``gqa:2`` with 3 KV heads, ``lrkv:999``, partial RoPE without RoPE...) fails
    here, before the calibration capture, as a :class:`VariantError` whose message starts with
    ``--variants:`` and names the spec and what is possible. ``texts``: what :func:`headwidget.capture`
    takes.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
        >>> ids = torch.arange(40).reshape(2, 20)
        >>> check_variants(model, None, ["model", "mqa+align", "lrkv:4", "rope:2"], 0, ids)
        >>> try:
        ...     check_variants(model, None, ["gqa:3"], 0, ids)
        ... except VariantError as err:
        ...     print(err)
        --variants: gqa:3 needs a divisor of the 4 query heads: 1, 2, 4
    """
    from headwidget.adapters import adapter_for
    from headwidget.capture import capture
    from headwidget.evaluation import fit_quantizer, fit_variant

    probe = None
    if needs_statistics(specs):
        sampled = needs_samples(specs)
        tokens = max(PROBE_TOKENS, samples_needed(specs))  # a k-means needs a sample per centroid
        probe = capture(
            model,
            texts,
            tokenizer=tokenizer,
            layers=[layer],
            inputs=needs_inputs(specs),
            max_tokens=tokens,
            samples=tokens if sampled else 0,
            rope="both" if sampled else "pre",
            progress=False,
        )
    for spec in specs:
        try:
            parsed = parse_variant(spec)
            if isinstance(parsed, MixedSpec):
                parsed.check_layers(adapter_for(model).layout().num_layers)
            for part in uniform_parts(parsed):  # a mixed spec's parts, each checked on ``layer``
                if part.quantizer:  # no converted model: fit the quantizer of one layer
                    fit_quantizer(model, part, probe, [layer], iters=1)
                elif part.mechanism != "model":
                    fit_variant(model, part, probe, [layer])
        except HeadwidgetError as err:
            raise VariantError(f"--variants: {err}") from err
