"""Saving a variant built by ``apply``: a checkpoint that reloads with the same logits, or a refusal.

For every variant kind and tiny family, ``variant.save_pretrained(dir)`` followed by the family's own
``from_pretrained(dir)`` either gives bit-identical weights and the same logits (float64, to rounding:
loaded tensors sit at other addresses, so BLAS may round the last bit apart), or raises
``VariantSaveError`` before anything is written. What a checkpoint cannot hold, decided here from the
tiny models' configs by hand: a partial-RoPE mask (no config field, no code for it in transformers),
and Llama layers with different KV-head counts (one ``num_key_value_heads`` for every layer).
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from transformers import PreTrainedModel

import headwidget
from headwidget.errors import HeadwidgetError, VariantSaveError
from headwidget.evaluation import apply
from tiny_models import FACTORIES, HEADS, make_model, ragged_batches

F64 = torch.float64
IDS = torch.randint(1, 96, (2, 9), generator=torch.Generator().manual_seed(11))
#: Float64 rounding of the tiny models' logits (the partial-RoPE masks move them by ~1e-3).
ROUNDING = 1e-12

FAMILIES = [name for name in FACTORIES if not name.startswith("deepseek")]
LLAMAS = [name for name in FAMILIES if name.startswith("llama")]
PLAIN_SPECS = ["mha", "gqa:2", "mqa", "mqa+align", "lrkv:2", "mla:16"]
ROPE_SPECS = ["rope:2", "mla:16+rope:2"]


def cases() -> list[tuple[str, str, list[int] | None]]:
    out: list[tuple[str, str, list[int] | None]] = []
    for name in FACTORIES:
        out.append((name, "model", None))
    for name in FAMILIES:  # one layer converted: where the KV-head counts can differ between layers
        partial = PLAIN_SPECS if name in LLAMAS else ["mqa"]
        out += [(name, spec, None) for spec in PLAIN_SPECS] + [(name, spec, [1]) for spec in partial]
    for name in LLAMAS:
        out += [(name, spec, layers) for spec in ROPE_SPECS for layers in (None, [1])]
    return out


def refusal(name: str, spec: str, layers: list[int] | None) -> str | None:
    """What the refusal must say, or None where the checkpoint must round-trip."""
    if "rope" in spec:
        return "partial RoPE"
    if name.startswith("llama") and layers is not None:
        _, heads, kv = HEADS[name]
        after = {"mha": heads, "gqa:2": 2, "mqa": 1, "mqa+align": 1}.get(spec, kv)
        if after != kv:
            return "different numbers of KV heads"
    return None


_STATS: dict[str, headwidget.KVStats] = {}


def stats_of(name: str, model: torch.nn.Module) -> headwidget.KVStats | None:
    if name.startswith("deepseek"):
        return None
    if name not in _STATS:
        _STATS[name] = headwidget.capture(model, ragged_batches(seed=3), progress=False, inputs=True)
    return _STATS[name]


_MODELS: dict[str, torch.nn.Module] = {}


def model_of(name: str) -> torch.nn.Module:
    if name not in _MODELS:
        _MODELS[name] = make_model(name)
    return _MODELS[name]


def outputs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model(IDS)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def reload(model: torch.nn.Module, folder) -> torch.nn.Module:
    return type(model).from_pretrained(folder, dtype=F64).eval()


@pytest.mark.parametrize(("name", "spec", "layers"), cases(), ids=lambda v: str(v).replace(" ", ""))
def test_save_round_trips_or_refuses_before_writing(name, spec, layers, tmp_path) -> None:
    model = model_of(name)
    variant = apply(model, spec, stats=stats_of(name, model), layers=layers)
    folder = tmp_path / "saved"
    reason = refusal(name, spec, layers)
    if reason is None:
        variant.save_pretrained(folder)
        loaded = reload(model, folder)
        saved = variant.state_dict()
        assert sorted(loaded.state_dict()) == sorted(saved)
        assert all(torch.equal(t, saved[n]) for n, t in loaded.state_dict().items())
        torch.testing.assert_close(outputs(loaded), outputs(variant), atol=ROUNDING, rtol=0)
        return
    before = outputs(variant)
    with pytest.raises(VariantSaveError, match=reason) as err:
        variant.save_pretrained(folder)
    assert not folder.exists()
    message = str(err.value)
    assert repr(spec) in message and "headwidget.apply(" in message and "Nothing was written" in message
    assert torch.equal(outputs(variant), before)  # the variant is left as it was


@pytest.mark.parametrize("name", LLAMAS)
def test_partial_rope_does_not_reload_silently(name, tmp_path) -> None:
    """The reported defect: rope:r saved, reloaded as plain RoPE, logits off by ~1e-3, no word."""
    model = model_of(name)
    variant = apply(model, "rope:2", stats=stats_of(name, model))
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(VariantSaveError, match=r"'rope:2'.*partial RoPE.*rotate every dim"):
        variant.save_pretrained(folder)
    assert list(folder.iterdir()) == []


def test_a_mask_that_keeps_every_pair_is_plain_rope(tmp_path) -> None:
    """rope:4 on d_h = 8 keeps all four pairs: the model is the original one and saves as it is."""
    model = model_of("llama_gqa")
    variant = apply(model, "rope:4", stats=stats_of("llama_gqa", model))
    torch.testing.assert_close(outputs(variant), outputs(model), atol=ROUNDING, rtol=0)
    variant.save_pretrained(tmp_path)
    torch.testing.assert_close(outputs(reload(model, tmp_path)), outputs(variant), atol=ROUNDING, rtol=0)


def test_uniform_mqa_updates_the_config(tmp_path) -> None:
    model = model_of("llama_gqa")
    apply(model, "mqa").save_pretrained(tmp_path)
    loaded = headwidget.adapters.adapter_for(reload(model, tmp_path))
    assert loaded.model.config.num_key_value_heads == 1
    assert [loaded.kv_heads_of(a) for a in loaded.attention_modules()] == [1, 1]


def test_mixed_kv_heads_name_the_layers_and_the_way_out(tmp_path) -> None:
    variant = apply(model_of("llama_gqa"), "mqa", layers=[1])
    with pytest.raises(VariantSaveError) as err:
        variant.save_pretrained(tmp_path / "x")
    message = str(err.value)
    assert "layer 0: 2, layer 1: 1" in message and "LlamaConfig" in message
    assert "layers=[1]" in message and isinstance(err.value, HeadwidgetError)


def test_push_to_hub_refuses_before_creating_a_repository(monkeypatch) -> None:
    import transformers.utils.hub as hub

    def no_hub(*args, **kwargs):
        raise AssertionError("push_to_hub reached the Hub")

    monkeypatch.setattr(hub, "hf_api", no_hub)
    variant = apply(model_of("llama_mha"), "rope:2", stats=stats_of("llama_mha", model_of("llama_mha")))
    with pytest.raises(VariantSaveError, match="push_to_hub"):
        variant.push_to_hub("someone/partial-rope")


def test_the_original_model_is_not_changed(tmp_path) -> None:
    model = make_model("llama_mha")  # its own: transformers' save_pretrained writes into the config
    cls = type(model)
    apply(
        model, "rope:2", stats=headwidget.capture(model, ragged_batches(seed=3), progress=False, inputs=True)
    )
    assert type(model) is cls and "save_pretrained" not in vars(model) and "push_to_hub" not in vars(model)
    assert cls.save_pretrained is PreTrainedModel.save_pretrained  # the class is not patched either
    model.save_pretrained(tmp_path)  # the original still saves
    torch.testing.assert_close(outputs(reload(model, tmp_path)), outputs(model), atol=ROUNDING, rtol=0)


def test_copies_keep_the_check_and_check_themselves(tmp_path) -> None:
    model = model_of("llama_gqa")
    rope = apply(model, "rope:2", stats=stats_of("llama_gqa", model))
    for other in (copy.deepcopy(rope), pickle.loads(pickle.dumps(rope))):
        torch.testing.assert_close(outputs(other), outputs(rope), atol=0, rtol=0)
        with pytest.raises(VariantSaveError):
            other.save_pretrained(tmp_path / "rope")
    assert not (tmp_path / "rope").exists()
    mqa = apply(model, "mqa")
    twin = copy.deepcopy(mqa)
    with torch.no_grad():
        twin.model.layers[0].self_attn.k_proj.weight.mul_(2.0)
    twin.save_pretrained(tmp_path / "twin")  # saves the copy's weights, not the variant's
    loaded = reload(model, tmp_path / "twin")
    torch.testing.assert_close(outputs(loaded), outputs(twin), atol=ROUNDING, rtol=0)
    assert not torch.allclose(outputs(loaded), outputs(mqa))


def test_a_pickled_partial_rope_variant_loads_where_its_class_was_never_made(monkeypatch, tmp_path) -> None:
    """A fresh process has no ``PartialRopeLlamaAttention`` until one is made: unpickling makes it."""
    from headwidget.adapters import _partial_rope

    model = model_of("llama_mha")
    rope = apply(model, "rope:2", stats=stats_of("llama_mha", model))
    data = pickle.dumps(rope)
    monkeypatch.delattr(_partial_rope, "PartialRopeLlamaAttention")
    loaded = pickle.loads(data)
    assert type(loaded.model.layers[0].self_attn) is type(rope.model.layers[0].self_attn)
    torch.testing.assert_close(outputs(loaded), outputs(rope), atol=0, rtol=0)
    with pytest.raises(VariantSaveError):
        loaded.save_pretrained(tmp_path / "rope")
    assert not (tmp_path / "rope").exists()
    with pytest.raises(AttributeError, match="PartialRopeNoSuchAttention"):
        _partial_rope.PartialRopeNoSuchAttention  # noqa: B018


def test_variants_still_generate() -> None:
    model = model_of("llama_gqa")
    for spec in ("mqa", "rope:2"):
        variant = apply(model, spec, stats=stats_of("llama_gqa", model))
        out = variant.generate(IDS[:1], max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
        assert out.shape == (1, IDS.shape[1] + 3)
