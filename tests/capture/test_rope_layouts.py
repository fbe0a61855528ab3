"""The declared RoPE layout of every RoPE family matches what the model's own rotation does.

A rotation acts inside each rotary plane, so for every token the squared norm of a plane is the same
before and after RoPE, and dims outside the rotary planes do not change at all. Summed over tokens,
``G[i,i] + G[j,j]`` of the pre-RoPE key Gram equals that of the post-RoPE Gram for each declared plane
(i, j), and ``G[k,k]`` is unchanged for every other dim. A wrong pairing (half-split declared for an
interleaved model, say) or a wrong rotary width breaks these equalities.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import headwidget
from headwidget.adapters.llama import LlamaAdapter
from tiny_models import FACTORIES, ROPE_FAMILIES, make_model


def tiny_llama_family(model_type: str) -> torch.nn.Module:
    config = AutoConfig.for_model(
        model_type,
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).double().eval()


CASES = [(t, lambda t=t: tiny_llama_family(t)) for t in LlamaAdapter.model_types]
CASES += [(n, lambda n=n: make_model(n)) for n in ROPE_FAMILIES]


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_rope_families_are_the_ones_whose_adapters_declare_capturable_rope(name):
    """``ROPE_FAMILIES`` (written by hand) and the adapters' declarations agree for every tiny model."""
    adapter = headwidget.adapters.adapter_for(make_model(name))
    declared = adapter.layout().rope.uses_rope and adapter.routes_through_interface
    assert declared == (name in ROPE_FAMILIES)


@pytest.mark.parametrize(("name", "factory"), CASES, ids=[c[0] for c in CASES])
def test_declared_planes_are_the_models_rotation_planes(name, factory):
    model = factory()
    stats = headwidget.capture(model, torch.randint(1, 64, (2, 40)), rope="both", layers=[0], progress=False)
    rope = stats.meta.layout.rope
    pre, post = stats.moments(0, "key").gram(), stats.moments(0, "key_post").gram()
    d = stats.meta.layout.head_dim
    planes = list(zip(rope.planes(), rope.planes(post=True), strict=True))
    assert planes, f"{name} uses RoPE but declares no rotary planes"
    rotated = set()
    for head in range(stats.meta.layout.num_kv_heads):
        o = head * d
        for (i, j), (pi, pj) in planes:
            before = pre[o + i, o + i] + pre[o + j, o + j]
            after = post[o + pi, o + pi] + post[o + pj, o + pj]
            assert float(abs(before - after) / before) < 1e-6, (
                f"{name}: plane ({i}, {j}) is not a rotation plane"
            )
            rotated |= {i, j}
        for k in set(range(d)) - rotated:
            assert float(abs(pre[o + k, o + k] - post[o + k, o + k])) <= 1e-9 * float(pre[o + k, o + k]), (
                f"{name}: dim {k} is declared non-rotary but changes under RoPE"
            )


@pytest.mark.parametrize("model_type", ["cohere", "helium", "glm"])
def test_align_model_keeps_logits_for_interleaved_rope(model_type):
    model = tiny_llama_family(model_type)
    ids = torch.randint(1, 64, (2, 40))
    stats = headwidget.capture(model, ids, progress=False)
    aligned = headwidget.align_model(model, stats, {0: [[0, 1]]})
    with torch.no_grad():
        before, after = model(ids).logits, aligned(ids).logits
    assert float((before - after).abs().max()) < 1e-6
    assert not torch.equal(
        model.model.layers[0].self_attn.k_proj.weight, aligned.model.layers[0].self_attn.k_proj.weight
    )
