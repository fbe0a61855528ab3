"""``align_model``: rotated Llama copies compute the same logits while grouped heads become more similar."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import headwidget
from headwidget.analysis.align_model import align_model
from headwidget.analysis.alignment import align
from headwidget.analysis.grouping import group_heads
from headwidget.errors import GroupCountError, UnsupportedAlignmentError


def tiny_llama(kv_heads: int, bias: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv_heads, attention_bias=bias)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def within_sum(sim: np.ndarray, groups: list[list[int]]) -> float:
    return sum(sim[i, j] for g in groups for a, i in enumerate(g) for j in g[a + 1 :])


@pytest.mark.parametrize(("kv_heads", "bias"), [(4, False), (4, True), (2, False)])
def test_logits_unchanged_and_groups_more_similar(kv_heads: int, bias: bool) -> None:
    model = tiny_llama(kv_heads, bias)
    ids = torch.randint(0, 64, (4, 48), generator=torch.Generator().manual_seed(1))
    stats = headwidget.capture(model, ids, progress=False)
    groups = {layer: group_heads(align(stats, layer, "key").after, kv_heads // 2) for layer in (0, 1)}
    original = {k: v.clone() for k, v in model.state_dict().items()}
    aligned = align_model(model, stats, groups)
    with torch.no_grad():
        torch.testing.assert_close(aligned(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
    for k, v in model.state_dict().items():
        assert torch.equal(v, original[k]), f"{k} of the input model changed"
    after = headwidget.capture(aligned, ids, progress=False)
    gained = 0.0
    for layer in (0, 1):
        for kind in ("key", "value"):
            b = within_sum(stats.head_similarity(layer, kind), groups[layer])
            a = within_sum(after.head_similarity(layer, kind), groups[layer])
            assert a >= b - 1e-6
            gained += a - b
    assert gained > 0.1


def test_rotations_act_on_the_captured_keys() -> None:
    """Re-captured keys of the aligned model are the old keys times the fitted rotations."""
    model = tiny_llama(4)
    ids = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(2))
    keys: list[torch.Tensor] = []
    stats = headwidget.capture(model, ids, progress=False)
    aligned = align_model(model, stats, {0: [[0, 1, 2, 3]]})
    for m in (model, aligned):
        hook = m.model.layers[0].self_attn.k_proj.register_forward_hook(
            lambda mod, a, out: keys.append(out.detach().double().reshape(-1, 4, 16))
        )
        with torch.no_grad():
            m(ids)
        hook.remove()
    old, new = keys
    for h in range(4):
        q = torch.linalg.lstsq(old[:, h], new[:, h]).solution
        torch.testing.assert_close(q @ q.T, torch.eye(16, dtype=torch.float64), atol=1e-4, rtol=0)
        torch.testing.assert_close(old[:, h] @ q, new[:, h], atol=1e-4, rtol=0)
        torch.testing.assert_close(q[:8, :8], q[8:, 8:], atol=1e-4, rtol=0)  # 2×2 plane rotations
        torch.testing.assert_close(q[:8, 8:], -q[8:, :8], atol=1e-4, rtol=0)
    torch.testing.assert_close(aligned.model.layers[1].self_attn.k_proj.weight,
                               model.model.layers[1].self_attn.k_proj.weight)  # fmt: skip


def test_refuses_models_it_cannot_rotate_exactly() -> None:
    ids = torch.randint(0, 64, (2, 16))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=64)).eval()
    with pytest.raises(UnsupportedAlignmentError, match="align\\(\\)"):
        align_model(gpt2, headwidget.capture(gpt2, ids, progress=False), [[0, 1], [2, 3]])
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=8)  # fmt: skip
    qwen = Qwen3ForCausalLM(cfg).eval()
    with pytest.raises(UnsupportedAlignmentError, match="k_norm"):
        align_model(qwen, headwidget.capture(qwen, ids, progress=False), [[0, 1], [2, 3]])
    llama = tiny_llama(4)
    stats = headwidget.capture(llama, ids, progress=False)
    with pytest.raises(GroupCountError, match="disjoint"):
        align_model(llama, stats, [[0, 1], [1, 2]])
