"""Mixed specs (``spec@layers`` parts joined by ``;``): one grammar, and every number against a model
converted layer by layer by hand (float64)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import cross_entropy, kl_div, log_softmax

from headwidget.analysis.variants import MixedSpec, VariantSpec, parse_variant
from headwidget.cli._errors import UsageError
from headwidget.cli._variants import check_variants, variant_specs
from headwidget.errors import ArgumentError, MechanismSpecError
from headwidget.evaluation import apply, evaluate, fit_quantizer
from tiny_models import make_model, ragged_batches, three_layer_llama

F64 = torch.float64


@pytest.fixture(scope="module")
def llama():
    return three_layer_llama(seed=0)


@pytest.fixture(scope="module")
def batches():
    return ragged_batches(seed=3)


def rows(model, batches, quantizer=None):
    """Every predicted position's logits and target, by hand (right-padded batches)."""
    logits, targets = [], []
    with torch.no_grad():
        for b in batches:
            if quantizer is None:
                out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            else:
                with quantizer.active(model):
                    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            m = b["attention_mask"].bool()
            keep = m[:, :-1] & m[:, 1:]
            logits.append(out[:, :-1][keep])
            targets.append(b["input_ids"][:, 1:][keep])
    return torch.cat(logits), torch.cat(targets)


# ------------------------------------------------------------------------------------------ grammar
def test_canonical_form_orders_parts_merges_repeats_and_writes_ranges() -> None:
    mixed = parse_variant(" MLA:8@ 5 ; mqa+align@2-3,0 ; mla:8@4 ")
    assert isinstance(mixed, MixedSpec)
    assert mixed.text == "mqa+align@0,2-3;mla:8@4-5"
    assert [(p.text, ls) for p, ls in mixed.parts] == [("mqa+align", (0, 2, 3)), ("mla:8", (4, 5))]
    assert mixed.spec_at(1).text == "model" and mixed.spec_at(4).text == "mla:8"
    assert parse_variant(mixed.text) == mixed  # the canonical form reads back as itself
    assert isinstance(parse_variant("mqa"), VariantSpec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mqa@0-2;mla:8@2", r"layer 2 is named twice"),
        ("mqa@3-1", r"runs backwards; write it 1-3"),
        ("mqa@", r"cannot read the layers ''"),
        ("mqa@0;;mla:8@1", r"an empty part"),
        ("mqa;mla:8@1", r"part 'mqa' is not spec@layers"),
        ("mqa@0@1", r"is not spec@layers"),
        ("mqa@1.5", r"cannot read the layers '1.5'"),
        ("mqa@２", r"'２' is not one"),
        ("mqa@0-99999999999", r"a layer index takes 0 ≤ layer ≤ 65535"),
        ("banana@0", r"cannot read variant spec 'banana'"),
        ("kv:int4+align@0", r"combines with nothing"),
    ],
)
def test_unreadable_mixed_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(MechanismSpecError, match=message):
        parse_variant(spec)


def test_layers_outside_the_model_and_layers_beside_a_mixed_spec_are_refused(llama, batches) -> None:
    with pytest.raises(MechanismSpecError, match=r"layers 3, 4 are not in the model, which has 3 layers"):
        apply(llama, "mqa@0;mla:8@3-4")
    with pytest.raises(MechanismSpecError, match=r"layer 7 is not in the model"):
        evaluate(llama, batches, ["mqa@7"], dtype=F64, progress=False)
    with pytest.raises(ArgumentError, match=r"names its own layers"):
        evaluate(llama, batches, ["mqa", "mqa@0"], layers=[0], dtype=F64, progress=False)
    with pytest.raises(ArgumentError, match=r"names its own layers"):
        apply(llama, "mqa@0", layers=[0])
    with pytest.raises(MechanismSpecError, match=r"layer 3 is not in the model"):
        apply(llama, "mqa@0;kv:int4@3")
    with pytest.raises(MechanismSpecError, match=r"fit_quantizer takes one spec for every layer"):
        fit_quantizer(llama, "kv:int4@0")


# ------------------------------------------------------------------------------------------ numbers
def test_apply_of_a_mixed_spec_is_the_model_converted_layer_by_layer(llama, batches) -> None:
    mixed = apply(llama, "lrkv:4@2;mqa@0")
    by_hand = apply(apply(llama, "mqa", layers=[0]), "lrkv:4", layers=[2])
    got, _ = rows(mixed, batches)
    want, _ = rows(by_hand, batches)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    info = mixed.headwidget_variant
    assert info.spec == "mqa@0;lrkv:4@2" and info.layers == [0, 2]
    assert info.kv_elements == {0: 32, 1: 64, 2: by_hand.headwidget_variant.kv_elements[2]}
    assert llama.model.layers[0].self_attn.k_proj.weight.shape[0] == 32  # the model is untouched


def test_evaluate_of_a_mixed_spec_equals_the_hand_built_model(llama, batches) -> None:
    spec = "mqa@0;kv:int4@1;mla:8@2"
    report = evaluate(llama, batches, ["model", spec], dtype=F64, progress=False)
    converted = apply(apply(llama, "mqa", layers=[0]), "mla:8", layers=[2])
    quantizer = fit_quantizer(llama, "kv:int4", layers=[1])  # run on the converted copy
    ref_logits, targets = rows(llama, batches)
    var_logits, _ = rows(converted, batches, quantizer)
    nll = float(cross_entropy(var_logits, targets))
    p, q = log_softmax(ref_logits, -1), log_softmax(var_logits, -1)
    kl = float(kl_div(q, p, log_target=True, reduction="sum")) / len(targets)
    top1 = float((ref_logits.argmax(-1) == var_logits.argmax(-1)).double().mean())
    assert report.nll[spec] == pytest.approx(nll, rel=1e-10)
    assert report.kl[spec] == pytest.approx(kl, rel=1e-8, abs=1e-12)
    assert report.top1[spec] == pytest.approx(top1, abs=1e-12)
    # bytes: the sum of each layer's own (float64: 8 bytes an element)
    c = 2 * 16  # channels per kind of an unconverted layer: 2 KV heads × head dim 16
    mqa = 2 * 16 * 8  # one KV head, K and V
    int4 = 2 * (c * 4 / 8 + 4 * c / 32)  # keys and values, 4 bits, a float32 scale+zero per 32
    mla = 8 * converted.headwidget_variant.kv_elements[2]  # MLA's cached elements (tested apart)
    assert report.kv_bytes_per_token[spec] == mqa + int4 + mla
    assert report.kv_bytes_per_token["model"] == 3 * 2 * c * 8


def test_per_layer_of_a_mixed_spec_is_each_part_at_its_own_layers(llama, batches) -> None:
    spec = "mqa@0;kv:int4@2"
    report = evaluate(llama, batches, ["mqa", "kv:int4", spec], dtype=F64, per_layer=True, progress=False)
    assert report.per_layer is not None
    row = report.per_layer[spec]
    assert row[0] == pytest.approx(report.per_layer["mqa"][0], rel=1e-12)
    assert row[1] == 0.0  # layer 1 is left as the model has it: nothing run, no damage
    assert row[2] == pytest.approx(report.per_layer["kv:int4"][2], rel=1e-12)


def test_the_cli_takes_mixed_specs_one_per_flag(llama) -> None:
    assert variant_specs(None, ["mla:8@0,1;mqa@2"]) == ["model", "mla:8@0-1;mqa@2"]
    with pytest.raises(UsageError, match=r"give it with --variant SPEC instead"):
        variant_specs("mla:8@0,1;mqa@2")
    with pytest.raises(UsageError, match=r"give --variants .* or one --variant SPEC"):
        variant_specs(None, [])
    ids = torch.arange(60).reshape(3, 20) % 96
    check_variants(llama, None, ["model", "mqa@0;kv:int4@1"], 0, ids)
    with pytest.raises(Exception, match=r"--variants: 'mqa@5': layer 5 is not in the model"):
        check_variants(llama, None, ["mqa@5"], 0, ids)


def test_a_gpt2_mixed_spec_keeps_its_heads_as_copies() -> None:
    gpt2 = make_model("gpt2")
    batches = ragged_batches(seed=4)
    spec = "mqa@1"
    report = evaluate(gpt2, batches, [spec], dtype=F64, progress=False)
    by_hand = apply(gpt2, "mqa", layers=[1])
    logits, targets = rows(by_hand, batches)
    assert report.nll[spec] == pytest.approx(float(cross_entropy(logits, targets)), rel=1e-10)


def test_the_consequence_view_draws_mixed_specs_as_their_own_series(llama, batches) -> None:
    from headwidget.views import ConsequenceView

    spec, dearer, long = "mqa@0;kv:int4@2", "kv:int8@0", "kv:int2@0;kv:int4/g16@1;kv:int8@2"
    report = evaluate(
        llama,
        batches,
        ["model", "mqa", dearer, "kv:int4", spec, long],
        dtype=F64,
        per_layer=True,
        progress=False,
    )
    view = ConsequenceView(report, layer=2)
    chart = view.grid.charts[0]
    mixed = next(s for s in chart.series if s.name == "mixed")
    bytes_of = report.kv_bytes_per_token
    assert bytes_of[long] < bytes_of[spec] < bytes_of[dearer]
    assert mixed.x == [bytes_of[long], bytes_of[spec], bytes_of[dearer]]  # joined in order of bytes
    nll = report.measures
    assert mixed.y == [nll[v]["nll"] - nll["model"]["nll"] for v in (long, spec, dearer)]
    assert mixed.style == "points+line"
    assert [s.name for s in chart.series][:3] == ["mechanisms", "quantizers", "mixed"]
    panel = view.grid.panels[0]
    short = f"mixed {bytes_of[long]:,g} B"  # a long mixed spec's row label: its bytes
    assert panel.row_labels == ["mqa", dearer, "kv:int4", spec, short]
    assert f"{spec} (kv:int4 here) {report.per_layer[spec][2]:+.4f}" in panel.note
    assert f"{short} (kv:int8 here) {report.per_layer[long][2]:+.4f}" in panel.note
    assert f"{short} = {long}" in panel.note  # the full spec, once
    assert mixed.labels[0].split("\n")[:2] == [short, long]  # drawn beside its point; hover adds the spec
    assert mixed.labels[1].split("\n")[0] == spec


# ------------------------------------------------------------------------------------------ protocols
def test_the_chunks_protocol_equals_a_brute_force_loop_over_windows(llama, batches, tmp_path) -> None:
    from headwidget.evaluation import EvaluationReport

    stream = torch.cat(
        [
            b["input_ids"][i][b["attention_mask"][i].bool()]
            for b in batches
            for i in range(b["input_ids"].shape[0])
        ]
    )
    window = 7
    report = evaluate(
        llama, batches, ["model", "mqa"], dtype=F64, protocol="chunks:7", batch_size=3, progress=False
    )
    mqa = apply(llama, "mqa")
    total = {"model": 0.0, "mqa": 0.0}
    count = 0
    with torch.no_grad():
        for start in range(0, stream.numel() - window + 1, window):
            ids = stream[start : start + window].reshape(1, -1)
            for name, m in (("model", llama), ("mqa", mqa)):
                logits = m(input_ids=ids).logits[0, :-1].to(F64)
                total[name] += float(cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += window - 1
    assert report.tokens == count == (stream.numel() // window) * (window - 1)
    assert report.nll["model"] == pytest.approx(total["model"] / count, rel=1e-10)
    assert report.nll["mqa"] == pytest.approx(total["mqa"] / count, rel=1e-10)
    assert report.protocol == "chunks:7"
    report.save(tmp_path / "r.json")
    assert EvaluationReport.load(tmp_path / "r.json").protocol == "chunks:7"
    assert evaluate(llama, batches, ["model"], dtype=F64, progress=False).protocol == "documents"


def test_the_stride_protocol_equals_the_perplexity_guide_loop(llama, batches, tmp_path) -> None:
    """stride:W/S against the sliding-window loop of the transformers perplexity guide, summed per token
    in float64: NLL, KL and top-1 of a variant, the per-layer ΔNLL, and the report file."""
    from headwidget.evaluation import EvaluationReport

    stream = torch.cat(
        [
            b["input_ids"][i][b["attention_mask"][i].bool()]
            for b in batches
            for i in range(b["input_ids"].shape[0])
        ]
    )
    window, stride = 9, 4
    protocol = f"stride:{window}/{stride}"
    report = evaluate(
        llama,
        batches,
        ["model", "mqa"],
        dtype=F64,
        protocol=protocol,
        batch_size=2,
        per_layer=True,
        progress=False,
    )
    mqa = apply(llama, "mqa")
    nll = {"model": 0.0, "mqa": 0.0}
    kl, agree, count, scored = 0.0, 0, 0, set()
    prev_end = 0
    with torch.no_grad():
        for begin in range(0, stream.numel(), stride):
            end = min(begin + window, stream.numel())
            trg_len = end - prev_end  # the guide: only the last trg_len tokens of the window are targets
            ids = stream[begin:end].reshape(1, -1)
            first = max(ids.shape[1] - trg_len, 1)  # the window's first token has no prediction
            logits = {
                name: m(input_ids=ids).logits[0].to(F64) for name, m in (("model", llama), ("mqa", mqa))
            }
            rows = slice(first - 1, ids.shape[1] - 1)
            for name, values in logits.items():
                nll[name] += float(cross_entropy(values[rows], ids[0, first:], reduction="sum"))
            ref, var = logits["model"][rows].log_softmax(-1), logits["mqa"][rows].log_softmax(-1)
            kl += float((ref.exp() * (ref - var)).sum())
            agree += int((ref.argmax(-1) == var.argmax(-1)).sum())
            count += ids.shape[1] - first
            scored |= set(range(begin + first, end))
            prev_end = end
            if end == stream.numel():
                break
    assert scored == set(range(1, stream.numel())) and count == stream.numel() - 1  # each token once
    assert report.tokens == count
    assert report.nll["model"] == pytest.approx(nll["model"] / count, rel=1e-10)
    assert report.nll["mqa"] == pytest.approx(nll["mqa"] / count, rel=1e-10)
    assert report.kl["mqa"] == pytest.approx(kl / count, rel=1e-9)
    assert report.measures["mqa"]["top1"] == agree / count
    alone = evaluate(llama, batches, ["model", "mqa@1"], dtype=F64, protocol=protocol, progress=False)
    assert report.per_layer["mqa"][1] == pytest.approx(alone.nll["mqa@1"] - alone.nll["model"], rel=1e-9)
    assert report.protocol == protocol
    report.save(tmp_path / "r.json")
    assert EvaluationReport.load(tmp_path / "r.json").protocol == protocol


def test_bad_protocols_are_refused(llama, batches) -> None:
    from headwidget.errors import EvaluationInputError

    for protocol in [
        "chunks:1",
        "chunk:8",
        "chunks:x",
        8,
        "stride:8",
        "chunks:９",
        "stride:8/",
        "stride:-8/4",
    ]:
        with pytest.raises(
            ArgumentError, match=r"protocol must be 'documents', 'chunks:W' .* or 'stride:W/S'"
        ):
            evaluate(llama, batches, ["model"], dtype=F64, protocol=protocol, progress=False)
    for protocol in ["stride:8/0", "stride:8/9", "stride:1/1"]:
        with pytest.raises(ArgumentError, match=r"needs W ≥ 2 and 1 ≤ S ≤ W"):
            evaluate(llama, batches, ["model"], dtype=F64, protocol=protocol, progress=False)
    context = llama.config.max_position_embeddings
    with pytest.raises(EvaluationInputError, match=rf"longer than the model's context of {context}"):
        evaluate(llama, batches, ["model"], dtype=F64, protocol=f"chunks:{context + 1}", progress=False)
    from tiny_models import make_model

    with pytest.raises(ArgumentError, match=r"scores next-token predictions, and BertModel makes none"):
        evaluate(make_model("bert"), batches, ["model"], dtype=F64, protocol="stride:8/4", progress=False)
    with pytest.raises(EvaluationInputError, match=rf"use stride:{context}/{context // 2} or less"):
        evaluate(
            llama,
            batches,
            ["model"],
            dtype=F64,
            protocol=f"stride:{context + 1}/{context // 2}",
            progress=False,
        )
    with pytest.raises(EvaluationInputError, match=r"give 50 tokens, not one whole window of 64"):
        evaluate(llama, batches, ["model"], dtype=F64, protocol="chunks:64", max_tokens=50, progress=False)
