"""A converted (or mixed, or K/V-quantized) variant runs through lm-eval's ``HFLM(pretrained=variant)`` on a
local task: the log-likelihoods lm-eval reports equal a float64 loop's on the same variant, and so does its
accuracy."""

from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest
import torch

from cli_runs import char_tokenizer
from headwidget.evaluation import apply
from tiny_models import make_model

if importlib.util.find_spec("lm_eval") is None:
    if os.environ.get("CI"):
        pytest.fail("lm-eval is not installed (pip install -e '.[dev]' installs it)", pytrace=False)
    pytest.skip("lm-eval is not installed (pip install 'headwidget[lm-eval]')", allow_module_level=True)

DOCS = [
    {"question": "ab", "choices": ["cd", "ef", "gh"], "answer": 1},
    {"question": "The cat", "choices": [" sat", "xyz", "q"], "answer": 0},
    {"question": "1 2 3", "choices": ["4", "5 6", "zz"], "answer": 2},
    {"question": "hello", "choices": ["world", "there"], "answer": 0},
]
TASK = """task: headwidget_tiny
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def _loglikelihood(model: torch.nn.Module, tok, context: str, continuation: str) -> float:
    """log p(continuation | context) in float64, the continuation's tokens after the context's.

    The input is what lm-eval feeds the model: the context and the continuation without its last token
    (only a target). A causal model's logits do not depend on it; fake-quantized ``kv:int`` keys do, as
    a key's token group takes its range from every token of the group in the forward."""
    ctx, cont = tok(context)["input_ids"], tok(continuation)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([(ctx + cont)[:-1]])).logits[0].to(torch.float64)
    logp = logits.log_softmax(-1)
    return math.fsum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))


@pytest.mark.parametrize("spec", ["mqa", "mqa@0;lrkv:2@1", "mqa@0;kv:int2/g4@1"])
def test_a_variant_runs_through_lm_eval_with_the_loglikelihoods_of_a_loop(spec, tmp_path, monkeypatch):
    for name, value in {
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(name, value)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
    (tmp_path / "task.yaml").write_text(TASK.format(data=data), encoding="utf-8")
    tok = char_tokenizer()
    tok.eos_token = "[UNK]"  # lm-eval reads the prefix token (BOS, else EOS) even where no context is empty
    variant = apply(make_model("llama_gqa", dtype=torch.float64), spec)
    lm = HFLM(pretrained=variant, tokenizer=tok, batch_size=1, device="cpu")
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)  # not lm-eval's own thousands
    out = simple_evaluate(
        model=lm, tasks=["headwidget_tiny"], task_manager=tasks, log_samples=True, bootstrap_iters=0
    )
    assert out is not None
    samples = sorted(out["samples"]["headwidget_tiny"], key=lambda s: s["doc_id"])
    assert len(samples) == len(DOCS)
    hits = 0
    for doc, sample in zip(DOCS, samples, strict=True):
        got = [float(r[0]) for r in sample["filtered_resps"]]
        want = [_loglikelihood(variant, tok, doc["question"], " " + c) for c in doc["choices"]]
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), doc
        hits += max(range(len(want)), key=want.__getitem__) == doc["answer"]
    assert out["results"]["headwidget_tiny"]["acc,none"] == hits / len(DOCS)
    # the variant is the converted model: its layer 0 has one KV head (mqa), unlike the original's two
    assert variant.model.layers[0].self_attn.k_proj.out_features == 8
    if "kv:" in spec:  # and lm-eval ran it quantized: the conversion alone scores otherwise
        plain = apply(make_model("llama_gqa", dtype=torch.float64), spec.split(";")[0])
        got = [float(r[0]) for s in samples for r in s["filtered_resps"]]
        unquantized = [_loglikelihood(plain, tok, d["question"], " " + c) for d in DOCS for c in d["choices"]]
        assert max(abs(a - b) for a, b in zip(got, unquantized, strict=True)) > 1e-6
