"""evaluate's memory: the estimate bounds the measured peak, a budget is refused before any work, and the
measures are computed in chunks (the same numbers as in one piece)."""

from __future__ import annotations

import pytest
import torch

import headwidget
import headwidget.evaluation.measures as measures
from headwidget.errors import MemoryBudgetError
from headwidget.evaluation import evaluate
from memory_peak import allocated_peak
from tiny_models import VOCAB, make_model, ragged_batches

CASES = [
    ("llama_gqa", torch.float64, torch.float64, ["model", "mqa", "lrkv:2"], True),
    ("llama_gqa", torch.float64, torch.float32, ["model", "mqa", "kv:int4"], True),
    ("gpt2", torch.float32, torch.float32, ["model", "mqa"], False),
    ("bert", torch.float64, torch.float64, ["model", "mqa"], True),
]


def texts(batch_size: int, max_length: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(1, VOCAB, (3 * batch_size, max_length), generator=gen)


@pytest.mark.parametrize(("name", "model_dtype", "dtype", "variants", "per_layer"), CASES)
def test_estimate_covers_the_measured_peak(name, model_dtype, dtype, variants, per_layer) -> None:
    model = make_model(name, dtype=model_dtype)
    batch_size, max_length = 4, 64
    ids = texts(batch_size, max_length)
    need = headwidget.estimate_evaluation(
        model, variants, per_layer=per_layer, dtype=dtype, batch_size=batch_size, max_length=max_length
    )
    peak = allocated_peak(
        lambda: evaluate(
            model,
            ids,
            variants,
            per_layer=per_layer,
            dtype=dtype,
            batch_size=batch_size,
            max_length=max_length,
            progress=False,
        )
    )
    print(
        f"\n{name} {model_dtype}→{dtype} {variants}: estimate {need / 2**20:.2f} MiB, measured peak "
        f"{peak / 2**20:.2f} MiB ({peak / need:.2f} of the estimate)"
    )
    assert peak <= need
    assert need < 10 * peak  # an upper bound, but not a useless one


def test_the_logits_of_a_large_vocabulary_are_counted() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_embd=32, n_layer=2, n_head=4)).eval()
    batch_size, max_length = 8, 64
    ids = torch.randint(1, 8192, (2 * batch_size, max_length), generator=torch.Generator().manual_seed(1))
    need = headwidget.estimate_evaluation(
        model, ["model", "mqa"], dtype=torch.float32, batch_size=batch_size, max_length=max_length
    )
    peak = allocated_peak(
        lambda: evaluate(
            model,
            ids,
            ["model", "mqa"],
            dtype=torch.float32,
            batch_size=batch_size,
            max_length=max_length,
            progress=False,
        )
    )
    assert batch_size * max_length * 8192 * 4 < peak <= need < 10 * peak


def test_a_budget_too_small_is_refused_before_any_forward() -> None:
    model = make_model("llama_gqa", dtype=torch.float32)
    forwards = []
    handle = model.register_forward_pre_hook(lambda *_: forwards.append(1))  # copies carry it too
    try:
        with pytest.raises(MemoryBudgetError, match=r"batch_size or max_length.*raise max_memory"):
            evaluate(
                model,
                texts(4, 64),
                ["model", "mqa"],
                dtype=torch.float32,
                batch_size=4,
                max_length=64,
                max_memory=1024,
                progress=False,
            )
        assert forwards == []
        report = evaluate(
            model,
            texts(4, 64),
            ["model", "mqa"],
            dtype=torch.float32,
            batch_size=4,
            max_length=64,
            max_memory=2**30,
            progress=False,
        )
        assert forwards and report.tokens == 12 * 63
    finally:
        handle.remove()


def test_the_default_budget_is_half_the_free_memory(monkeypatch) -> None:
    import headwidget.evaluation._memory as memory

    model = make_model("gpt2", dtype=torch.float32)
    need = headwidget.estimate_evaluation(model, ["model"], dtype=torch.float32, batch_size=2, max_length=32)
    monkeypatch.setattr(memory, "default_budget", lambda device: need - 1)
    with pytest.raises(MemoryBudgetError, match="half the free memory"):
        evaluate(
            model, texts(2, 32), ["model"], dtype=torch.float32, batch_size=2, max_length=32, progress=False
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_measures_in_chunks_equal_one_piece(monkeypatch, dtype) -> None:
    model = make_model("llama_gqa", dtype=dtype)
    batches = ragged_batches(seed=5)
    whole = evaluate(model, batches, ["model", "mqa"], per_layer=True, dtype=dtype, progress=False)
    monkeypatch.setattr(measures, "CHUNK_BYTES", 4 * VOCAB * 3)  # 3 rows a chunk
    assert measures.chunk_rows(VOCAB) == 3
    chunked = evaluate(model, batches, ["model", "mqa"], per_layer=True, dtype=dtype, progress=False)
    tol = 1e-13 if dtype == torch.float64 else 1e-6
    for spec in ("model", "mqa"):
        for name in ("nll", "kl", "top1"):
            assert chunked.measures[spec][name] == pytest.approx(whole.measures[spec][name], rel=tol, abs=tol)
        assert chunked.per_layer is not None and whole.per_layer is not None
        assert chunked.per_layer[spec] == pytest.approx(whole.per_layer[spec], abs=tol)


@pytest.mark.parametrize("bad", [0, -1, 0.5, "1024", float("nan"), True, 10**30])
def test_max_memory_must_be_a_positive_byte_count(bad) -> None:
    model = make_model("gpt2", dtype=torch.float32)
    with pytest.raises(headwidget.ArgumentError, match="max_memory"):
        evaluate(model, texts(2, 16), ["model"], dtype=torch.float32, max_memory=bad, progress=False)


def test_the_estimate_checks_its_arguments() -> None:
    model = make_model("gpt2", dtype=torch.float32)
    with pytest.raises(headwidget.ArgumentError, match="batch_size"):
        headwidget.estimate_evaluation(model, ["model"], batch_size="8")
    with pytest.raises(headwidget.ArgumentError, match="variants"):
        headwidget.estimate_evaluation(model, "mqa")


def test_the_prefill_s_kv_cache_is_counted() -> None:
    """Under prefill:P the KV cache (every layer at max_length tokens) is most of the peak: a model whose
    cache dominates has a peak within 0.8–1.2 of the estimate (the model and a merge of its prefill)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=128,
    )
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    batch_size, max_length = 4, 128
    ids = torch.randint(1, 32, (batch_size, max_length), generator=torch.Generator().manual_seed(1))
    cache = batch_size * max_length * 64 * 2 * 2 * 128 * 8
    variants = ["model", "merge:2"]
    options = {"dtype": torch.float64, "batch_size": batch_size, "max_length": max_length}
    need = headwidget.estimate_evaluation(model, variants, protocol="prefill:64", **options)
    documents = headwidget.estimate_evaluation(model, variants, **options)
    peak = allocated_peak(
        lambda: evaluate(model, ids, variants, protocol="prefill:64", progress=False, **options)
    )
    print(f"\n{variants} under prefill:64: estimate {need / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB")
    assert need - documents > cache
    assert peak <= need and 0.8 <= peak / need <= 1.2
    with pytest.raises(MemoryBudgetError, match=r"cache \d"):  # evaluate checks the same bound
        evaluate(model, ids, variants, protocol="prefill:64", max_memory=documents + cache // 2, **options)
