"""heal() refuses what it cannot do right, each with a specific message, before any work; a damaged run
file is refused naming the field."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import headwidget
from headwidget.errors import ArgumentError, HealingInputError, ReportFileError
from healing_cases import family, llama, small_heal, stream

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    model = llama()
    return model, headwidget.apply(model, "mqa")


def test_a_variant_that_is_not_a_converted_copy_of_the_model(pair: tuple) -> None:
    model, _ = pair
    with pytest.raises(HealingInputError, match=r"variant is not a converted copy of model: build it with"):
        small_heal(model, model)
    with pytest.raises(HealingInputError, match=r"not a converted copy"):
        small_heal(llama(), model)  # a plain model as the variant
    other = headwidget.apply(family("llama_mha"), "mqa")
    with pytest.raises(HealingInputError, match=r"is a LlamaForCausalLM|differs from model's"):
        small_heal(other, model)
    changed = headwidget.apply(model, "mqa", layers=[0])
    with torch.no_grad():
        changed.model.layers[2].mlp.up_proj.weight.mul_(1.01)
    with pytest.raises(HealingInputError, match=r"variant's model\.layers\.2\.mlp\.up_proj\.weight differs"):
        small_heal(changed, model)


def test_a_quantized_variant_and_a_variant_that_converts_nothing(pair: tuple) -> None:
    model, _ = pair
    with pytest.raises(
        HealingInputError, match=r"a quantizer fits no weight, so healing has nothing to train"
    ):
        small_heal(headwidget.apply(model, "mqa@0;kv:int4@1-2"), model)
    with pytest.raises(HealingInputError, match=r"converts no layer"):
        small_heal(headwidget.apply(model, "model"), model)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"method": "distil"}, r"method='distil' is not one of 'kd' .* or 'lm'"),
        ({"trainable": "q"}, r"trainable='q' is not one of 'kv', 'attention', 'all' or 'lora:r'"),
        ({"trainable": "lora:0"}, r"trainable='lora:0' is not one of"),
        ({"tokens": "256"}, r"tokens must be"),
        ({"tokens": 10.5}, r"tokens must be"),
        ({"lr": math.nan}, r"lr must be a finite number"),
        ({"lr": -1e-3}, r"lr must be"),
        ({"batch_size": 0}, r"batch_size must be"),
        ({"eval_every": 2**70}, r"eval_every"),
        ({"per_layer": "yes"}, r"per_layer must be"),
        ({"callbacks": "tracker"}, r"callbacks must be a list"),
        ({"callbacks": [object()]}, r"has none of on_train_begin, on_step_end, on_log"),
        ({"dtype": "int8"}, r"dtype must be a floating torch dtype"),
    ],
)
def test_bad_arguments_name_what_to_pass(pair: tuple, options: dict, message: str) -> None:
    model, variant = pair
    with pytest.raises(ArgumentError, match=message):
        small_heal(variant, model, **options)


def test_tokens_below_one_batch_and_too_little_text(pair: tuple) -> None:
    model, variant = pair
    with pytest.raises(
        HealingInputError, match=r"tokens=63 is below one batch \(batch_size=4 × max_length=16 = 64"
    ):
        small_heal(variant, model, tokens=63)
    with pytest.raises(HealingInputError, match=r"fewer than one batch of batch_size=4"):
        small_heal(variant, model, texts=stream(1, tokens=60))


def test_overlapping_healing_and_evaluation_text(pair: tuple) -> None:
    model, variant = pair
    texts = stream(1, tokens=1024)
    held = texts[:, 300:340]  # 40 tokens of the healing text: 9 runs of 32
    with pytest.raises(
        HealingInputError, match=r"the healing and evaluation texts overlap: 9 run\(s\) of 32 tokens"
    ):
        small_heal(variant, model, texts=texts, eval_texts=held, max_length=64)
    short = texts[:, 500:520]  # a 20-token evaluation sequence found whole in the healing text
    with pytest.raises(
        HealingInputError, match=r"overlap: 1 run\(s\) of 32 tokens of the evaluation texts \(a text shorter"
    ):
        small_heal(variant, model, texts=texts, eval_texts=short, max_length=64)


def test_the_default_texts_need_a_tokenizer(pair: tuple) -> None:
    model, variant = pair
    with pytest.raises(ArgumentError, match=r"which are strings: pass tokenizer="):
        headwidget.heal(variant, model, stream(1), progress=False)


def test_lm_healing_of_an_encoder() -> None:
    bert = family("bert")
    with pytest.raises(
        HealingInputError, match=r"method='lm' needs next-token predictions, and BertModel has no"
    ):
        small_heal(headwidget.apply(bert, "mqa"), bert, method="lm")


def test_a_refusal_leaves_model_and_variant_as_they_were(pair: tuple) -> None:
    model, variant = pair
    before = {n: t.clone() for n, t in variant.state_dict().items()}
    grads = [p.requires_grad for p in variant.parameters()]
    with pytest.raises(HealingInputError):
        small_heal(variant, model, tokens=10)
    assert all(torch.equal(t, before[n]) for n, t in variant.state_dict().items())
    assert [p.requires_grad for p in variant.parameters()] == grads
    assert type(variant.model.layers[0].self_attn.k_proj) is torch.nn.Linear


def test_save_refuses_a_suffix_and_load_names_a_damaged_field(tmp_path: Path) -> None:
    model = llama()
    run = small_heal(headwidget.apply(model, "mqa"), model, tokens=64, eval_every=64)
    with pytest.raises(ReportFileError, match=r"the suffix must be one of \.json, \.md"):
        run.save(tmp_path / "heal.png")
    path = run.save(tmp_path / "heal.json")
    assert headwidget.HealingRun.load(path) == run
    assert "| tokens | step | nll |" in run.save(tmp_path / "heal.md").read_text(encoding="utf-8")
    data = json.loads(path.read_text(encoding="utf-8"))
    for field, value, message in [
        ("curve", [], r"curve is empty"),
        ("kind", "vision", r"kind is 'vision'"),
        ("losses", [1.0, 2.0], r"losses has 2 entries for 1 steps"),
        ("per_layer", [[0.1, 0.2]], r"per_layer has 1 rows for 2 curve points"),
        ("stopped_early", "no", r"stopped_early must be true or false"),
        ("format", "headwidget-evaluation-report", r"is not a headwidget healing run"),
    ]:
        broken = dict(data, **{field: value})
        bad = tmp_path / f"bad-{field}.json"
        bad.write_text(json.dumps(broken), encoding="utf-8")
        with pytest.raises(ReportFileError, match=message):
            headwidget.HealingRun.load(bad)
    with pytest.raises(ReportFileError, match=r"no healing run at"):
        headwidget.HealingRun.load(tmp_path / "missing.json")
