"""Statistics know the weights they were captured from: those of another model of the same
architecture (a fine-tune of a base model) are refused wherever statistics meet a model, unless the
caller says ``allow_other_weights=True``; the same weights in another dtype, or a copy, are accepted.

The fingerprint reads the first row of the first and of the last head of each layer's query, key and
value projections (:meth:`headwidget.adapters.Adapter.fingerprint_rows`), so the "fine-tune" here
changes one of them: the first key row of layer 0 (a real fine-tune changes every row).
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from transformers import PreTrainedTokenizerFast

import headwidget
from headwidget import KVStats, StatsFileError, StatsMismatchError, cli, views
from headwidget.adapters import adapter_for, weight_fingerprint
from headwidget.analysis.conversions import convert, mechanism_sweep
from headwidget.errors import ArgumentError
from headwidget.evaluation import apply, evaluate, fit_quantizer
from headwidget.evaluation._apply import fit_variant
from headwidget.views import check_sources
from ports import free_port, run_ranks
from tiny_models import FACTORIES, VOCAB, make_model, ragged_batches

#: What every refusal says: where the statistics come from, how to recapture, how to opt out.
REFUSAL = r"other weights.*fine-tune.*headwidget\.capture.*allow_other_weights=True"
#: A view takes no opt-out: its refusal says to show the statistics without the model.
VIEW_REFUSAL = r"other weights.*fine-tune.*headwidget\.capture.*or show them without the model"
IDS = torch.randint(1, VOCAB, (2, 16), generator=torch.Generator().manual_seed(5))


def fine_tune(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose first key row of layer 0 moved (the rest is the same weights)."""
    sibling = copy.deepcopy(model)
    with torch.no_grad():
        sibling.model.layers[0].self_attn.k_proj.weight[0] += 0.25
    return sibling


@pytest.fixture(scope="module")
def base() -> nn.Module:
    return make_model("llama_gqa", dtype=torch.float32)


@pytest.fixture(scope="module")
def stats(base: nn.Module) -> KVStats:
    """Keys (pre- and post-RoPE), values, inputs and token samples: every fit can use them."""
    return headwidget.capture(base, ragged_batches(), rope="both", inputs=True, samples=32, progress=False)


@pytest.fixture(scope="module")
def sibling(base: nn.Module) -> nn.Module:
    return fine_tune(base)


def old_file(stats: KVStats, path: Path) -> Path:
    """``stats`` saved as a headwidget without weight fingerprints wrote them (the field absent)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    stats.save(path)
    with safe_open(str(path), framework="pt") as fh:
        header = dict(fh.metadata())
    meta = json.loads(header["meta"])
    del meta["weights_fingerprint"]
    save_file(load_file(str(path)), str(path), metadata={**header, "meta": json.dumps(meta)})
    return path


# ---------------------------------------------------------------------- what is recorded
def test_the_fingerprint_is_the_hash_of_the_rows_the_adapter_names(base, stats):
    """An independent recomputation: sha256 over the bfloat16 bits of the named rows, layer by layer."""
    adapter = adapter_for(base)
    digest = hashlib.sha256()
    for layer in stats.layers:
        attention = base.model.layers[layer].self_attn
        for name, module, width in (
            ("q", attention.q_proj, 8),
            ("k", attention.k_proj, 8),
            ("v", attention.v_proj, 8),
        ):
            heads = module.weight.shape[0] // width
            rows = [0, (heads - 1) * width]  # the first row of the first and of the last head
            for part, t in (("weight", module.weight[rows]), ("bias", module.bias[rows])):
                x = t.detach().float().bfloat16().float()
                x = torch.where(x.abs() <= 2.0**-14, 0.0, x).bfloat16()
                digest.update(f"{layer}.{name}.{part}{tuple(x.shape)}".encode())
                digest.update(x.view(torch.int16).numpy().astype("<i2").tobytes())
        assert sorted(adapter.fingerprint_rows(layer)) == [
            "k.bias",
            "k.weight",
            "q.bias",
            "q.weight",
            "v.bias",
            "v.weight",
        ]
    assert stats.meta.weights_fingerprint == digest.hexdigest()[:16]


def test_captures_of_the_same_weights_agree_and_of_others_differ(base, sibling, stats):
    again = headwidget.capture(copy.deepcopy(base), ragged_batches(seed=3), progress=False)
    assert again.meta.weights_fingerprint == stats.meta.weights_fingerprint
    other = headwidget.capture(sibling, ragged_batches(), progress=False)
    assert other.meta.weights_fingerprint != stats.meta.weights_fingerprint
    # only the captured layers count: a change in layer 0 leaves layer 1's fingerprint alone
    one = [headwidget.capture(m, ragged_batches(), layers=[1], progress=False) for m in (base, sibling)]
    assert one[0].meta.weights_fingerprint == one[1].meta.weights_fingerprint


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_every_family_tells_its_weights_from_a_siblings(name):
    model = make_model(name, dtype=torch.float32)
    stats = headwidget.capture(model, ragged_batches(), progress=False)
    fingerprint = stats.meta.weights_fingerprint
    assert isinstance(fingerprint, str) and len(fingerprint) == 16
    check_sources(stats, model)
    check_sources(stats, copy.deepcopy(model).to(torch.bfloat16))  # the same weights, rounded
    check_sources(stats, make_model(name, dtype=torch.float64))  # float32 weights held in float64
    with pytest.raises(StatsMismatchError, match=VIEW_REFUSAL):
        check_sources(stats, make_model(name, dtype=torch.float32, seed=1))  # another initialisation


def test_weights_that_cannot_be_read_have_no_fingerprint_and_are_not_checked(base, stats):
    packed = copy.deepcopy(base)
    attention = packed.model.layers[1].self_attn
    attention.k_proj.weight = nn.Parameter(  # what a quantised checkpoint looks like
        torch.zeros_like(attention.k_proj.weight, dtype=torch.int8), requires_grad=False
    )
    assert adapter_for(packed).fingerprint_rows(1) is None
    assert weight_fingerprint(adapter_for(packed), [0, 1]) is None
    assert weight_fingerprint(adapter_for(packed), [0]) == weight_fingerprint(adapter_for(base), [0])
    with torch.device("meta"):  # weights not in memory (offloaded)
        offloaded = FACTORIES["llama_gqa"]()
    assert weight_fingerprint(adapter_for(offloaded), [0]) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_sources(stats, packed)  # nothing to compare: accepted, without a warning


# ---------------------------------------------------------------------- refused for other weights
def test_evaluate_refuses_the_siblings_weights_and_accepts_them_when_asked(base, sibling, stats):
    for spec in ("mqa+align", "lrkv:2", "kv:cq2c2b"):
        with pytest.raises(StatsMismatchError, match=REFUSAL):
            evaluate(sibling, IDS, [spec], stats=stats, progress=False)
    report = evaluate(
        sibling,
        IDS,
        ["mqa+align", "lrkv:2", "kv:cq2c2b"],
        stats=stats,
        allow_other_weights=True,
        dtype=torch.float32,
        progress=False,
    )
    assert report.variants == ["mqa+align", "lrkv:2", "kv:cq2c2b"]
    with pytest.raises(ArgumentError, match="allow_other_weights must be True or False"):
        evaluate(sibling, IDS, ["mqa"], stats=stats, allow_other_weights="yes", progress=False)


@pytest.mark.parametrize("spec", ["mqa+align", "gqa:1+align", "lrkv:2", "mla:12", "rope:2"])
def test_apply_refuses_the_siblings_weights_and_fits_with_the_statistics_when_asked(
    base, sibling, stats, spec
):
    with pytest.raises(StatsMismatchError, match=REFUSAL):
        apply(sibling, spec, stats)
    built = apply(sibling, spec, stats, allow_other_weights=True)
    # the statistics were used as given: the written layer is the fit of the sibling's weights on them
    fit = fit_variant(sibling, spec, stats, [0])[0]
    if fit.weights is not None:
        got = adapter_for(built).head_weights(0)
        torch.testing.assert_close(got.k, fit.weights.k.float().double(), rtol=0, atol=0)
        torch.testing.assert_close(got.v, fit.weights.v.float().double(), rtol=0, atol=0)
    if fit.rope_keep is not None:
        assert fit.rope_keep.sum() < fit.rope_keep.numel()  # partial RoPE: chosen from the statistics
    assert built.headwidget_variant.layers == [0, 1]


def test_fit_quantizer_refuses_codebooks_of_other_weights(base, sibling, stats):
    with pytest.raises(StatsMismatchError, match=REFUSAL):
        fit_quantizer(sibling, "kv:cq2c2b", stats)
    allowed = fit_quantizer(sibling, "kv:cq2c2b", stats, allow_other_weights=True)
    own = fit_quantizer(base, "kv:cq2c2b", stats)  # the codebooks depend on the samples alone
    for layer in own.layers:
        for kind in ("key", "value"):
            assert torch.equal(allowed.codebooks[layer][kind].centroids, own.codebooks[layer][kind].centroids)


def test_align_model_convert_and_sweep_refuse_the_siblings_weights(base, sibling, stats):
    with pytest.raises(StatsMismatchError, match=REFUSAL):
        headwidget.align_model(sibling, stats, [[0, 1]])
    aligned = headwidget.align_model(sibling, stats, [[0, 1]], allow_other_weights=True)
    with torch.no_grad():
        torch.testing.assert_close(aligned(IDS).logits, sibling(IDS).logits, atol=1e-5, rtol=0)
    with pytest.raises(StatsMismatchError, match=REFUSAL):
        convert(sibling, 0, "lrkv:2", stats)
    allowed = convert(sibling, 0, "lrkv:2", stats, allow_other_weights=True)
    assert allowed.weighting == "data-aware"
    with pytest.raises(StatsMismatchError, match=REFUSAL):
        mechanism_sweep(sibling, 0, ["lrkv:2"], stats)
    rows = mechanism_sweep(sibling, 0, ["lrkv:2"], stats, allow_other_weights=True)
    assert rows[0]["key_error"] == allowed.reconstruction_error["key"]
    with pytest.raises(StatsMismatchError, match=VIEW_REFUSAL):
        check_sources(stats, sibling)
    with pytest.raises(StatsMismatchError, match=VIEW_REFUSAL):
        views.MechanismView(sibling, stats=stats)


# ---------------------------------------------------------------------- accepted: the same weights
def test_the_same_weights_in_another_dtype_or_a_copy_are_accepted(base, stats):
    for same in (
        copy.deepcopy(base),
        copy.deepcopy(base).to(torch.bfloat16),
        copy.deepcopy(base).to(torch.float64),
    ):
        check_sources(stats, same)
        headwidget.align_model(same, stats, [[0, 1]])
        fit_quantizer(same, "kv:cq2c2b", stats)
    apply(copy.deepcopy(base).to(torch.bfloat16), "lrkv:2", stats)
    # statistics captured in float64 (or bfloat16) drive the float32 model
    for dtype in (torch.float64, torch.bfloat16):
        other = headwidget.capture(copy.deepcopy(base).to(dtype), ragged_batches(), progress=False)
        assert other.meta.weights_fingerprint == stats.meta.weights_fingerprint
    evaluate(base, IDS, ["mqa+align"], stats=stats, dtype=torch.bfloat16, progress=False)


def test_bfloat16_weights_loaded_as_float16_are_the_same_weights():
    """A bfloat16 checkpoint run in float16: exact but for values below float16's normal range."""
    model = make_model("llama_gqa", dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
        model.model.layers[0].self_attn.k_proj.weight[0, :3] = torch.tensor([3e-6, -1e-7, 2.0**-14])
        model.model.layers[0].self_attn.k_proj.weight[0, 3] = 2.0**-14 * 1.0078125  # the next bfloat16
    stats = headwidget.capture(model, ragged_batches(), progress=False)
    half = copy.deepcopy(model).half()
    assert not torch.equal(
        half.model.layers[0].self_attn.k_proj.weight[0, :2].float(),
        model.model.layers[0].self_attn.k_proj.weight[0, :2],
    )
    check_sources(stats, half)


# ---------------------------------------------------------------------- files
def test_save_and_load_keep_the_fingerprint(stats, tmp_path):
    loaded = KVStats.load(stats.save(tmp_path / "s.safetensors"))
    assert loaded.meta.weights_fingerprint == stats.meta.weights_fingerprint
    assert loaded.meta == stats.meta


def test_a_file_from_before_fingerprints_loads_and_is_accepted_with_a_warning(base, sibling, stats, tmp_path):
    old = KVStats.load(old_file(stats, tmp_path / "old.safetensors"))
    assert old.meta.weights_fingerprint is None
    for model in (base, sibling):  # nothing to tell them apart with
        with pytest.warns(UserWarning, match=r"no weight fingerprint.*capture them again"):
            apply(model, "mqa+align", old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply(base, "mqa+align", stats)  # a known fingerprint that agrees: no warning
    # saved again, the file still says "unknown"
    assert KVStats.load(old.save(tmp_path / "again.safetensors")).meta.weights_fingerprint is None


def rewrite_meta(good: Path, out: Path, **changes: Any) -> Path:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(good), framework="pt") as fh:
        header = dict(fh.metadata())
    meta = json.loads(header["meta"]) | changes
    save_file(load_file(str(good)), str(out), metadata={**header, "meta": json.dumps(meta)})
    return out


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (12, "must be a string of 16 hexadecimal digits or null, not the number 12"),
        (True, "must be a string of 16 hexadecimal digits or null, not true"),
        (["ab"], "must be a string of 16 hexadecimal digits or null, not a list of 1"),
        ("", "is '', which is not 16 lowercase hexadecimal digits"),
        ("0123456789abcde", "is '0123456789abcde', which is not 16 lowercase hexadecimal digits"),
        ("0123456789ABCDEF", "is '0123456789ABCDEF', which is not 16 lowercase hexadecimal digits"),
        ("0123456789abcdeg", "is '0123456789abcdeg', which is not 16 lowercase hexadecimal digits"),
    ],
)
def test_a_malformed_fingerprint_is_refused_by_name(stats, tmp_path, value, problem):
    good = stats.save(tmp_path / "good.safetensors")
    bad = rewrite_meta(good, tmp_path / "bad.safetensors", weights_fingerprint=value)
    with pytest.raises(StatsFileError, match=r"meta\.weights_fingerprint ") as info:
        KVStats.load(bad)
    assert problem in str(info.value)
    ok = rewrite_meta(good, tmp_path / "null.safetensors", weights_fingerprint=None)
    assert KVStats.load(ok).meta.weights_fingerprint is None


# ---------------------------------------------------------------------- merging
def test_merge_refuses_statistics_of_different_weights(base, sibling, stats, tmp_path):
    mine = headwidget.capture(base, ragged_batches(), progress=False)
    theirs = headwidget.capture(sibling, ragged_batches(), progress=False)
    with pytest.raises(StatsMismatchError, match=r"weights_fingerprint: '[0-9a-f]{16}' vs '[0-9a-f]{16}'"):
        mine.merge(theirs)
    again = headwidget.capture(copy.deepcopy(base).to(torch.bfloat16), ragged_batches(seed=3), progress=False)
    assert (mine + again).meta.weights_fingerprint == mine.meta.weights_fingerprint
    # an older file's statistics (unknown weights) merge, and the merge's weights are unknown too
    old = KVStats.load(old_file(mine, tmp_path / "old.safetensors"))
    assert (old + mine).meta.weights_fingerprint is None
    assert (mine + old).meta.weights_fingerprint is None


def _reduce_worker(rank: int, world: int, port: int, jobs: list[tuple[list[str], str]]) -> None:
    """Per job (one file per rank, an output prefix): this rank's all_reduce result or its refusal."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for paths, out in jobs:
            try:
                stats = KVStats.load(paths[rank]).all_reduce()
                text = f"ok {stats.meta.weights_fingerprint} {stats.tokens}"
            except StatsMismatchError as err:
                text = f"refused {err}"
            Path(f"{out}.{rank}").write_text(text)
    finally:
        dist.destroy_process_group()


def test_all_reduce_refuses_ranks_with_different_weights_on_every_rank(base, sibling, tmp_path):
    first, second = ragged_batches()
    own = [headwidget.capture(base, [b], progress=False) for b in (first, second)]
    mixed = [own[0], headwidget.capture(sibling, [second], progress=False)]
    jobs = []
    for name, parts in (("own", own), ("mixed", mixed)):
        paths = [str(p.save(tmp_path / f"{name}{i}.safetensors")) for i, p in enumerate(parts)]
        jobs.append((paths, str(tmp_path / name)))
    # one process group runs both cases (a refusal leaves the group usable for the next one)
    run_ranks(_reduce_worker, (2, free_port(), jobs))
    for name in ("own", "mixed"):
        texts = [(tmp_path / f"{name}.{rank}").read_text() for rank in (0, 1)]
        if name == "own":
            assert texts == [f"ok {own[0].meta.weights_fingerprint} {own[0].tokens + own[1].tokens}"] * 2
        else:
            assert all(t.startswith("refused ") and "different weights" in t for t in texts), texts


# ---------------------------------------------------------------------- the command line
def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (95 of them, and [UNK]): the tiny models' 96 ids."""
    from tokenizers import Tokenizer, models

    vocab = {"[UNK]": 0, **{chr(c): c - 31 for c in range(32, 127)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[UNK]")


def test_command_line_evaluate_refuses_statistics_of_other_weights(base, sibling, tmp_path, capsys):
    from transformers import LlamaForCausalLM

    for name, model in (("base", base), ("sibling", sibling)):
        model.save_pretrained(tmp_path / name)  # saving fills in the config, as a downloaded model has it
        char_tokenizer().save_pretrained(tmp_path / name)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32).eval()
    saved = headwidget.capture(loaded, ragged_batches(), progress=False).save(tmp_path / "base.safetensors")
    folder = tmp_path / "sibling"
    out = tmp_path / "report.json"
    argv = [
        "evaluate",
        "--model",
        str(folder),
        "--variants",
        "mqa+align",
        "--stats",
        str(saved),
        "--out",
        str(out),
        "--evaluation-tokens",
        "64",
        "--max-length",
        "32",
        "--no-progress",
    ]
    capsys.readouterr()
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("headwidget evaluate: ") and "other weights" in err and not out.exists()
    assert "--allow-other-weights" in err
    assert cli.main([*argv, "--allow-other-weights"]) == 0, capsys.readouterr().err
    assert out.is_file()


# ---------------------------------------------------------------------- the real model
@pytest.mark.slow
def test_smollm2_in_bfloat16_is_the_same_weights_and_a_changed_row_is_not(smollm2):
    model, tokenizer = smollm2
    stats = headwidget.capture(
        model,
        "The quick brown fox jumps over the lazy dog.",
        tokenizer=tokenizer,
        layers=[0, 29],
        progress=False,
    )
    half = copy.deepcopy(model).to(torch.bfloat16)
    check_sources(stats, half)
    with torch.no_grad():
        half.model.layers[29].self_attn.v_proj.weight[0] *= 1.5
    with pytest.raises(StatsMismatchError, match=VIEW_REFUSAL):
        check_sources(stats, half)
