"""evaluate's memory: the estimate bounds the measured peak, a budget is refused before any work, and the
measures are computed in chunks (the same numbers as in one piece)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

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
    # held to the estimate: nothing is kept beyond it (the original's logits between variants, more
    # recorded batches for the sweep), which a larger budget would allow
    peak = measured_peak(
        model,
        ids,
        variants,
        need,
        per_layer=per_layer,
        dtype=dtype,
        batch_size=batch_size,
        max_length=max_length,
    )
    print(
        f"\n{name} {model_dtype}→{dtype} {variants}: estimate {need / 2**20:.2f} MiB, measured peak "
        f"{peak / 2**20:.2f} MiB ({peak / need:.2f} of the estimate)"
    )
    assert peak <= need
    assert need < 10 * peak  # an upper bound, but not a useless one


def measured_peak(model, ids, variants, max_memory: int, **kwargs) -> int:
    gc.collect()  # garbage of earlier tests is not freed inside the measurement
    return allocated_peak(
        lambda: evaluate(model, ids, variants, max_memory=max_memory, progress=False, **kwargs)
    )


def large_vocabulary_llama(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=LARGE_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).eval().to(dtype)


LARGE_VOCAB = 16384
LOGITS_CASES = {
    "float32": (torch.float32, torch.float32, ["model", "mqa"], {}),
    "float64": (torch.float64, torch.float64, ["model", "mqa"], {}),
    "bfloat16 copy": (torch.float32, torch.bfloat16, ["model", "mqa"], {}),
    "per-layer sweep": (torch.float32, torch.float32, ["model", "mqa"], {"per_layer": True}),
    "kv:int4": (torch.float32, torch.float32, ["model", "kv:int4"], {}),
    "stride": (torch.float32, torch.float32, ["model", "mqa"], {"protocol": "stride:64/8"}),
    "chunks": (torch.float32, torch.float32, ["model", "mqa"], {"protocol": "chunks:128"}),  # > max_length
    "prefill": (torch.float32, torch.float32, ["model", "mqa"], {"protocol": "prefill:16"}),
}


@pytest.mark.parametrize("case", list(LOGITS_CASES))
def test_the_estimate_is_the_peak_where_the_logits_dominate(case: str) -> None:
    """Where the logits dominate (a 16,384-token vocabulary on a tiny model), the estimate is within 20 % of
    the peak of a run held to it, under every protocol (a window's length, not max_length, sizes it)."""
    model_dtype, dtype, variants, kwargs = LOGITS_CASES[case]
    model = large_vocabulary_llama(model_dtype)
    batch_size, max_length = 4, 64
    ids = torch.randint(
        1, LARGE_VOCAB, (3 * batch_size, max_length), generator=torch.Generator().manual_seed(1)
    )
    need = headwidget.estimate_evaluation(
        model, variants, dtype=dtype, batch_size=batch_size, max_length=max_length, **kwargs
    )
    peak = measured_peak(
        model, ids, variants, need, dtype=dtype, batch_size=batch_size, max_length=max_length, **kwargs
    )
    print(f"\n{case}: estimate {need / 2**20:.2f} MiB, peak {peak / 2**20:.2f} MiB ({peak / need:.3f})")
    assert 0.8 * need <= peak <= need


def test_the_logits_of_a_whole_batch_are_never_made() -> None:
    """Under stride:64/2 a window of 64 tokens scores 2: the head computes those rows, never the (B, T, V)
    logits of the batch (today's and the original's rows, and one chunk's work, are less)."""
    model = large_vocabulary_llama()
    batch_size, window = 16, 64
    ids = torch.randint(1, LARGE_VOCAB, (1, 64 + 31 * 2), generator=torch.Generator().manual_seed(2))
    peak = measured_peak(
        model,
        ids,
        ["model", "mqa"],
        2**30,
        dtype=torch.float32,
        batch_size=batch_size,
        protocol=f"stride:{window}/2",
    )
    assert peak < batch_size * window * LARGE_VOCAB * 4 / 2


def test_the_logits_of_a_large_vocabulary_are_counted() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_embd=32, n_layer=2, n_head=4)).eval()
    batch_size, max_length = 8, 64
    ids = torch.randint(1, 8192, (2 * batch_size, max_length), generator=torch.Generator().manual_seed(1))
    need = headwidget.estimate_evaluation(
        model, ["model", "mqa"], dtype=torch.float32, batch_size=batch_size, max_length=max_length
    )
    kwargs = {"dtype": torch.float32, "batch_size": batch_size, "max_length": max_length}
    peak = measured_peak(model, ids, ["model", "mqa"], need, **kwargs)
    assert batch_size * max_length * 8192 * 4 < peak <= need < 10 * peak
    # with room beyond the estimate, the original's rows of both batches are kept between variants
    # (computed once), and the peak stays within the budget
    rows = 2 * batch_size * (max_length - 1) * 8192 * 4
    roomy = measured_peak(model, ids, ["model", "mqa"], need + rows, **kwargs)
    assert need < roomy <= need + rows


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


@pytest.mark.parametrize("limit", [None, "RLIMIT_DATA"])
def test_the_default_budget_is_half_the_free_memory(monkeypatch, limit) -> None:
    from headwidget.capture import memory

    model = make_model("gpt2", dtype=torch.float32)
    need = headwidget.estimate_evaluation(model, ["model"], dtype=torch.float32, batch_size=2, max_length=32)
    monkeypatch.setattr(memory, "free_memory", lambda device: memory.FreeMemory(2 * (need - 1), limit))
    said = "half the free memory" + (f" under {limit}" if limit else "")
    with pytest.raises(MemoryBudgetError, match=rf"over the .* allowed \({said}\)"):
        evaluate(
            model, texts(2, 32), ["model"], dtype=torch.float32, batch_size=2, max_length=32, progress=False
        )
    monkeypatch.setattr(memory, "free_memory", lambda device: memory.FreeMemory(2 * need, limit))
    evaluate(model, texts(2, 32), ["model"], dtype=torch.float32, batch_size=2, max_length=32, progress=False)


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc/self/status")
def test_an_address_space_limit_is_refused_before_any_forward() -> None:
    """Under a 3 GB RLIMIT_AS, a 16 × 512 batch of a 49,152-token vocabulary (1.6 GB of float32 logits)
    is refused by the default budget with MemoryBudgetError naming the limit, not left to the allocator."""
    code = """
        import resource, torch
        from transformers import LlamaConfig, LlamaForCausalLM
        import headwidget
        from headwidget.errors import MemoryBudgetError
        model = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
        forwards = []
        model.register_forward_pre_hook(lambda *_: forwards.append(1))
        ids = torch.randint(0, 49152, (16, 512), generator=torch.Generator().manual_seed(0))
        size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        limit = max(3 * 10**9, size + 2**30)  # 3 GB here; more where the libraries alone take more
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        try:
            headwidget.evaluate(model, ids, ["model", "mqa"], dtype=torch.float32, batch_size=16,
                                max_length=512, progress=False)
        except MemoryBudgetError as err:
            print("refused", len(forwards), err)
        """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused 0 "), done.stdout
    assert "half the free memory under RLIMIT_AS" in done.stdout
    assert "batch_size or max_length" in done.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_kl_in_the_chunks_own_memory_is_the_textbook_sum(monkeypatch, dtype) -> None:
    """The KL is computed in the memory of the two log-softmaxes; its sums are bit for bit those of
    ``exp(ref) * (ref - var)`` (and NLL and top-1 those of the log-softmaxes), chunk by chunk."""
    monkeypatch.setattr(measures, "CHUNK_BYTES", 4 * 50 * 7)  # 7 rows a chunk
    gen = torch.Generator().manual_seed(8)
    ref = (torch.randn(40, 50, generator=gen, dtype=torch.float64) * 4).to(dtype)
    var = (ref.to(torch.float64) + torch.randn(40, 50, generator=gen, dtype=torch.float64)).to(dtype)
    targets = torch.randint(0, 50, (40,), generator=gen)
    totals = measures.PredictionTotals()
    totals.add_rows(ref, var, targets)
    work = measures.work_dtype(ref)
    kl = nll = 0.0
    hits = 0
    for start in range(0, 40, 7):
        r = torch.log_softmax(ref[start : start + 7].to(work), dim=-1)
        v = torch.log_softmax(var[start : start + 7].to(work), dim=-1)
        kl += float((r.exp() * (r - v)).sum(-1).to(torch.float64).sum())
        nll += float((-v.gather(1, targets[start : start + 7, None]).squeeze(1)).to(torch.float64).sum())
        hits += int((r.argmax(-1) == v.argmax(-1)).sum())
    assert (totals.kl_sum, totals.nll_sum, totals.top1_hits, totals.tokens) == (kl, nll, hits, 40)
    assert kl > 0.1


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


def _llama(hidden: int, heads: int, kv_heads: int, vocab: int, layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
    )
    return LlamaForCausalLM(config).eval()


# (hidden, heads, KV heads, vocabulary, layers): the phase the peak is in
PHASES = {
    "fitting, MHA": (512, 8, 8, VOCAB, 2),  # mqa's float64 fits and the work of fitting one layer
    "fitting, GQA": (512, 8, 2, VOCAB, 6),  # the float64 fits of every layer and their cast
    "running, GQA": (256, 8, 2, 8192, 2),  # the converted copy, the logits and the measures
}


@pytest.mark.parametrize("case", list(PHASES))
def test_the_estimate_is_the_peak_of_the_larger_phase(case: str) -> None:
    """Fitting mqa, then running it: the peak is the larger of the two phases, each counted with the
    variant's own shapes (one KV head's key and value rows, not the model's), within 0.8–1.2 (the 0.51 and
    0.57 of SmolLM2's and Llama-3.2-1B's ladder rungs came from summing the phases)."""
    hidden, heads, kv_heads, vocab, layers = PHASES[case]
    model = _llama(hidden, heads, kv_heads, vocab, layers)
    options = {"per_layer": True, "dtype": torch.float32, "batch_size": 2, "max_length": 32}
    ids = torch.randint(1, vocab, (2, 32), generator=torch.Generator().manual_seed(3))
    need = headwidget.estimate_evaluation(model, ["mqa"], **options)
    peak = measured_peak(model, ids, ["mqa"], 2**34, **options)
    print(f"\n{case}: estimate {need / 2**20:.2f} MiB, peak {peak / 2**20:.2f} MiB ({peak / need:.3f})")
    assert 0.8 <= peak / need <= 1.2


def test_fits_held_on_the_host_are_refused_over_the_host_s_budget() -> None:
    """A model on another device than the CPU keeps its fits in the host's memory: they are refused over
    the host's own budget (the process's real limit), whatever the device's allows, naming them."""
    from headwidget.evaluation._allocate import AllocationMemory, check_allocation_budget
    from headwidget.evaluation._memory import EvaluationMemory, check_evaluation_budget

    meta = torch.device("meta")
    host = {"fits": 2**30, "fitting": 2**62}
    for call, need, check in (
        ("evaluate", EvaluationMemory({"forward": 2**20}, meta, host=host), check_evaluation_budget),
        ("allocate", AllocationMemory({"work": 2**20}, meta, host), check_allocation_budget),
    ):
        with pytest.raises(
            MemoryBudgetError,
            match=rf"^{call} would allocate \S+ TiB on cpu \(fits 1\.00 GiB, fitting 4194304\.00 TiB\), "
            r"over the .* The fits are made in float64 in the host's memory",
        ):
            check(need, 2**40)
        within = type(need)({"work": 2**20}, meta, host={"fits": 1024})  # (the device's budget alone then)
        assert check(within, 2**21) in (None, 2**20)
        with pytest.raises(MemoryBudgetError, match=rf"^{call} would allocate 1\.00 MiB on meta"):
            check(within, 2**19)


def test_the_host_s_fits_are_counted_for_every_process_torchrun_starts_on_it(monkeypatch) -> None:
    """Each rank fits every variant itself: what one rank's fits need, times the processes on the host
    (``LOCAL_WORLD_SIZE``), is checked against the host's budget."""
    from headwidget.capture.memory import default_budget
    from headwidget.evaluation._memory import EvaluationMemory, check_evaluation_budget

    third = default_budget(torch.device("cpu")) // 3
    need = EvaluationMemory({"forward": 1}, torch.device("meta"), host={"fits": third})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    check_evaluation_budget(need, 2**20)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(
        MemoryBudgetError, match=r"on cpu \(fits .*, for the 4 processes on this host\), over"
    ):
        check_evaluation_budget(need, 2**20)
