"""``apply`` of specs with ``kv:`` parts: a copy whose every forward fake-quantizes its K/V, equal to the
hand-built conversion run inside the quantizers evaluate runs (float64), in any thread, never saved."""

from __future__ import annotations

import copy
import threading
from contextlib import ExitStack

import pytest
import torch
from torch.nn.functional import cross_entropy

import headwidget
from headwidget.errors import MissingStatisticsError, UnsupportedConversionError, VariantSaveError
from headwidget.evaluation import apply, evaluate, fit_quantizer
from headwidget.evaluation._apply import save_blocker
from tiny_models import ragged_batches, three_layer_llama

F64 = torch.float64


@pytest.fixture(scope="module")
def llama():
    return three_layer_llama(seed=0)


@pytest.fixture(scope="module")
def batches():
    return ragged_batches(seed=3)


@pytest.fixture(scope="module")
def calibration(llama):
    return headwidget.capture(
        llama,
        ragged_batches(seed=5, lengths=((40, 33, 38), (35, 40))),
        rope="post",
        samples=150,
        inputs=True,
        progress=False,
    )


def logits_of(model, batches, quantizers=()):
    """Each batch's logits, run inside ``quantizers``' :meth:`active` (the path evaluate takes)."""
    out = []
    with torch.no_grad():
        for b in batches:
            with ExitStack() as stack:
                for q in quantizers:
                    stack.enter_context(q.active(model))
                out.append(model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits)
    return out


def predicted(logits, batches):
    """The logits and targets of every predicted position (right-padded batches)."""
    rows, targets = [], []
    for out, b in zip(logits, batches, strict=True):
        m = b["attention_mask"].bool()
        keep = m[:, :-1] & m[:, 1:]
        rows.append(out[:, :-1][keep])
        targets.append(b["input_ids"][:, 1:][keep])
    return torch.cat(rows), torch.cat(targets)


#: spec → (the hand-built conversion and its quantizers, from the model and the statistics)
CASES = {
    "mqa@0;kv:int4@1;kv:int2/g8@2": lambda m, s: (
        apply(m, "mqa", layers=[0]),
        [fit_quantizer(m, "kv:int4", layers=[1]), fit_quantizer(m, "kv:int2/g8", layers=[2])],
    ),
    "kv:cq2c4b": lambda m, s: (copy.deepcopy(m), [fit_quantizer(m, "kv:cq2c4b", s)]),
    "lrkv:4@0;kv:cq4c6b@2": lambda m, s: (
        apply(m, "lrkv:4", s, layers=[0]),
        [fit_quantizer(m, "kv:cq4c6b", s, layers=[2])],
    ),
}


@pytest.mark.parametrize("spec", list(CASES))
def test_an_applied_kv_spec_is_the_hand_built_model_inside_its_quantizers(spec, llama, batches, calibration):
    before = logits_of(llama, batches)
    variant = apply(llama, spec, calibration)
    by_hand, quantizers = CASES[spec](llama, calibration)
    got = logits_of(variant, batches)
    want = logits_of(by_hand, batches, quantizers)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)
    unquantized = logits_of(by_hand, batches)
    assert max(float((g - u).abs().max()) for g, u in zip(got, unquantized, strict=True)) > 1e-6
    # evaluate's NLL of the spec is the variant's own (float64 cross-entropy of its logits)
    report = evaluate(llama, batches, [spec], stats=calibration, dtype=F64, progress=False)
    rows, targets = predicted(got, batches)
    assert report.nll[spec] == pytest.approx(float(cross_entropy(rows, targets)), rel=1e-10)
    info = variant.headwidget_variant
    assert info.kv_bytes_per_token(F64) == report.kv_bytes_per_token[spec]
    assert info.layers == ([0, 2] if spec.startswith("lrkv") else [0, 1, 2])
    assert [q.layers for q in info.quantizers] == [q.layers for q in quantizers]
    # the original model is untouched and runs unquantized
    for b, w in zip(logits_of(llama, batches), before, strict=True):
        torch.testing.assert_close(b, w, rtol=0, atol=0)


def test_layer_bytes_are_each_layers_own(llama) -> None:
    variant = apply(llama, "mqa@0;kv:int4@1")
    c = 2 * 16  # an unconverted layer: 2 KV heads of 16 dims, keys and values each
    mqa, int4, kept = 8 * 2 * 16, 2 * (c * 4 / 8 + 4 * c / 32), 8 * 2 * c
    assert variant.headwidget_variant.layer_bytes(F64) == [mqa, int4, kept]
    assert variant.headwidget_variant.kv_bytes_per_token(F64) == 256 + 40 + 512
    assert variant.headwidget_variant.layers == [0, 1]


def test_the_quantized_variant_and_the_original_run_side_by_side_in_threads(llama, batches) -> None:
    variant = apply(llama, "kv:int2")
    want_variant, want_model = logits_of(variant, batches), logits_of(llama, batches)
    start = threading.Barrier(2)
    results: dict[str, list[list[torch.Tensor]]] = {"variant": [], "model": []}
    errors: list[BaseException] = []

    def run(name, model):
        try:
            start.wait()
            for _ in range(15):
                results[name].append(logits_of(model, batches))
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [
        threading.Thread(target=run, args=("variant", variant)),
        threading.Thread(target=run, args=("model", llama)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for name, want in (("variant", want_variant), ("model", want_model)):
        assert len(results[name]) == 15
        for got in results[name]:
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_a_copy_quantizes_its_own_attention(llama, batches) -> None:
    variant = apply(llama, "mqa@1;kv:int3@0")
    logits_of(variant, batches)  # its quantizers prepared for it: the copy must prepare its own
    twin = copy.deepcopy(variant)
    assert twin.forward.model is twin
    for g, w in zip(logits_of(twin, batches), logits_of(variant, batches), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_kv_int_without_a_mask_runs_one_row_and_refuses_several(llama, batches) -> None:
    variant = apply(llama, "kv:int4")
    ids = batches[1]["input_ids"][:1, :9]  # the first row of that batch has 9 real tokens
    with torch.no_grad():
        alone = variant(input_ids=ids).logits
        masked = variant(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        torch.testing.assert_close(alone, masked, rtol=0, atol=0)
        refused = r"2 rows came without an attention_mask.*batch_size=1"
        with pytest.raises(UnsupportedConversionError, match=refused):
            variant(input_ids=torch.cat([ids, ids]))
        variant(input_ids=torch.cat([ids, ids]), attention_mask=torch.ones(2, 9, dtype=torch.long))


def test_codebook_quantizers_need_no_mask(llama, batches, calibration) -> None:
    variant = apply(llama, "kv:cq2c4b", calibration)  # each token's K/V alone: padding cannot reach it
    ids = batches[0]["input_ids"][:, :7]  # every row is real for 7 tokens
    with torch.no_grad():
        without = variant(input_ids=ids).logits
        with_mask = variant(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(without, with_mask, rtol=0, atol=0)


def test_generate_runs_the_quantized_model(llama) -> None:
    variant = apply(llama, "kv:int2/g4")
    ids = torch.tensor([[5, 9, 3, 12, 7, 1, 8]])
    with torch.no_grad():
        first = variant(input_ids=ids).logits[0, -1].argmax()
        out = variant.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False, pad_token_id=0
        )
    assert int(out[0, ids.shape[1]]) == int(first)


def test_a_batch_of_unpadded_rows_generates_as_each_row_alone(llama) -> None:
    """``generate`` drops an attention_mask of all ones and passes its cache: a forward with a cache and
    no mask has no padding, so a batch of rows generates (it was refused as a batch without a mask),
    each row as it does alone."""
    variant = apply(llama, "kv:int2/g4")
    ids = torch.randint(1, 96, (3, 9), generator=torch.Generator().manual_seed(2))
    options = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        together = variant.generate(ids, attention_mask=torch.ones_like(ids), **options)
        for row in range(3):
            alone = variant.generate(ids[row : row + 1], attention_mask=torch.ones_like(ids[:1]), **options)
            assert together[row].tolist() == alone[0].tolist()


def test_saving_a_quantized_variant_is_refused_and_writes_nothing(llama, tmp_path) -> None:
    variant = apply(llama, "lrkv:4@0;kv:int4@1-2")
    assert "fake-quantizes its K/V while it runs (kv:int4 on layers 1, 2)" in save_blocker(variant)
    refused = r"no checkpoint holds.*without its kv: parts, then apply the kv: parts"
    with pytest.raises(VariantSaveError, match=refused) as err:
        variant.save_pretrained(tmp_path / "out")
    assert "apply(model, 'lrkv:4@0;kv:int4@1-2', stats=stats)" in str(err.value)  # no layers= beside it
    assert not (tmp_path / "out").exists()
    apply(llama, "lrkv:4@0").save_pretrained(tmp_path / "plain")  # its conversion alone saves
    assert (tmp_path / "plain" / "config.json").exists()


def test_a_wrapped_forward_still_refuses_to_save_and_a_quantized_model_is_not_applied_again(llama, tmp_path):
    from accelerate.hooks import ModelHook, add_hook_to_module

    variant = apply(llama, "kv:int4")
    add_hook_to_module(variant, ModelHook())  # accelerate wraps the forward that quantizes
    with pytest.raises(VariantSaveError, match=r"no checkpoint holds.*holds no converted weight"):
        variant.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UnsupportedConversionError, match=r"already fake-quantizes its K/V \(kv:int4\)"):
        apply(variant, "mqa")


def test_codebooks_without_samples_are_refused(llama) -> None:
    with pytest.raises(MissingStatisticsError, match=r"rope='post' and samples=R"):
        apply(llama, "mqa@0;kv:cq2c4b@1")


def test_a_mixed_spec_that_cannot_save_is_told_how_to_rebuild_it(llama, tmp_path) -> None:
    with pytest.raises(VariantSaveError, match=r"'mqa@0', stats=stats\); a spec that gives every layer"):
        apply(llama, "mqa@0").save_pretrained(tmp_path / "out")  # layer 0: 1 KV head, the others 2
    assert not (tmp_path / "out").exists()
