"""The allocation leak flag follows the tokens: every protocol an allocation chose under against every
protocol it is evaluated under, every spelling of its spec, repeated rows and templates, short pieces.
Each share is compared exactly with a brute-force count over Python tuples, built from the token
stream the test made (not from the batches the code reads)."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from headwidget.analysis.variants import parse_variant
from headwidget.capture.inputs import Batch
from headwidget.evaluation import _chosen, allocate, evaluate
from headwidget.evaluation._inputs import chunk_batches, evaluation_batches, stride_batches
from tiny_models import VOCAB, three_layer_llama

F64 = torch.float64


# ------------------------------------------------------------------------------------- brute force
#: The rules' numbers, as the README states them: runs of 32 tokens; pieces of 16 or more count whole.
RUN, SHORTEST = 32, 16


def flat(rows: list[list[int]]) -> list[int]:
    return list(itertools.chain.from_iterable(rows))


def _tuples_of(piece: list[int], width: int) -> set[tuple[int, ...]]:
    return {tuple(piece[a : a + width]) for a in range(len(piece) - width + 1)}


def brute_share(text: list[tuple[list[int], list[bool]]], chosen: list[list[int]]) -> float:
    """The share of predicted tokens of ``text`` (pieces with their predicted flags) chosen on, by the
    rules of the module docstring, with Python tuples."""
    width, shortest = RUN, SHORTEST
    runs: set[tuple[int, ...]] = set()
    for c in chosen:
        runs |= _tuples_of(c, width)
    short = [tuple(c) for c in chosen if shortest <= len(c) < width]
    found = total = 0
    for piece, predicted in text:
        n = len(piece)
        covered = [False] * n
        for a in range(n - width + 1):
            if tuple(piece[a : a + width]) in runs:
                covered[a : a + width] = [True] * width
        if shortest <= n < width and any(tuple(piece) in _tuples_of(c, n) for c in chosen):
            covered = [True] * n
        for s in short:
            for a in range(n - len(s) + 1):
                if tuple(piece[a : a + len(s)]) == s:
                    covered[a : a + len(s)] = [True] * len(s)
        total += sum(predicted)
        found += sum(1 for c, p in zip(covered, predicted, strict=True) if c and p)
    return found / total if total else 0.0


def read(stream: list[int], protocol: str, rows: list[list[int]]) -> list[tuple[list[int], list[bool]]]:
    """What ``protocol`` scores of a text, from first principles: ``documents`` reads ``rows`` (each
    token but a row's first predicted), ``chunks:W`` the stream in whole windows (each window's first
    token not predicted), ``stride:W/S`` the whole stream (every token but the first predicted)."""
    if protocol == "documents":
        return [(r, [i > 0 for i in range(len(r))]) for r in rows]
    kind, _, size = protocol.partition(":")
    window = int(size.split("/")[0])
    if kind == "chunks":
        kept = stream[: len(stream) // window * window]
        return [(kept, [i % window > 0 for i in range(len(kept))])]
    return [(stream, [i > 0 for i in range(len(stream))])]


def batches_of(ids: torch.Tensor, protocol: str) -> list[Batch]:
    """The batches evaluate reads ``ids`` into under ``protocol`` (rows as they are for documents)."""
    if protocol == "documents":
        return evaluation_batches(ids, batch_size=3, max_length=ids.shape[1])
    kind, _, size = protocol.partition(":")
    if kind == "chunks":
        return chunk_batches(ids, None, int(size), batch_size=3, max_tokens=None, context=None)
    window, stride = (int(x) for x in size.split("/"))
    return stride_batches(ids, None, window, stride, batch_size=3, max_tokens=None, context=None)


def chosen_pieces(stream: list[int], protocol: str, rows: list[list[int]]) -> list[list[int]]:
    return [p for p, _ in read(stream, protocol, rows)]


def random_rows(seed: int, rows: int, length: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------- protocols × protocols
CHOSEN_PROTOCOLS = ["documents", "chunks:64", "stride:64/64", "stride:64/32", "stride:64/16", "stride:64/8"]
EVALUATED_PROTOCOLS = ["documents", "chunks:48", "stride:48/48", "stride:48/12", "stride:40/3"]


ORDER = [3, 0, 6, 1, 5, 2, 4, 9, 8, 11, 10, 7]


def _texts() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(chosen-on rows, evaluated rows) per scenario."""
    chosen = random_rows(1, 6, 50)
    other = random_rows(2, 12, 50)
    repeated = random_rows(3, 1, 50).expand(5, 50).clone()
    return {
        # the evaluation holds 2 of the 6 chosen-on rows among 10 other rows, in another order
        "mixed": (
            chosen,
            torch.cat([other[:5], chosen[4:6], other[5:10]])[[3, 0, 6, 1, 5, 2, 4, 9, 8, 11, 10, 7]],
        ),
        # nothing shared
        "other": (chosen, other),
        # a template: every evaluated row starts with the same chosen-on 40 tokens
        "template": (chosen, torch.cat([chosen[2:3, :40].expand(6, 40), other[:6, :30]], dim=1)),
        # the chosen-on text repeats one row; the evaluation holds it once among others
        "repeated rows": (repeated, torch.cat([other[:4], repeated[:1]])),
        # short pieces: chosen-on rows of 20 tokens inside evaluated rows, and evaluated rows of 20
        "short chosen": (chosen[:, :20], torch.cat([other[:4, :10], chosen[:4, :20], other[:4, :20]], dim=1)),
        "short evaluated": (chosen, torch.cat([chosen[:3, 5:25], other[:3, :20]])),
        # pieces of 12 shared tokens: too short to tell from common words
        "too short": (chosen[:, :12], torch.cat([other[:4, :10], chosen[:4, :12]], dim=1)),
    }


def flagged_by_design(scenario: str, chosen_under: str, evaluated_under: str) -> bool:
    """Whether a scenario must be flagged. Pieces under 32 tokens count only as the pieces they are: a
    stream protocol joins short rows into one long piece whose runs cross from one row into the next,
    text the other side never read."""
    if scenario in ("other", "too short"):
        return False
    if scenario == "short chosen":
        return chosen_under == "documents"
    if scenario == "short evaluated":
        return evaluated_under == "documents"
    return True


CASES = list(itertools.product(_texts(), CHOSEN_PROTOCOLS, EVALUATED_PROTOCOLS))


@pytest.mark.parametrize(("scenario", "chosen_under", "evaluated_under"), CASES)
def test_the_share_equals_the_brute_force_count(
    scenario: str, chosen_under: str, evaluated_under: str
) -> None:
    chosen_ids, evaluated_ids = _texts()[scenario]
    if chosen_under != "documents" and chosen_ids.numel() < 64:
        pytest.skip("less chosen-on text than one window")
    chosen_rows, evaluated_rows = chosen_ids.tolist(), evaluated_ids.tolist()
    chosen_stream, evaluated_stream = flat(chosen_rows), flat(evaluated_rows)
    want = brute_share(
        read(evaluated_stream, evaluated_under, evaluated_rows),
        chosen_pieces(chosen_stream, chosen_under, chosen_rows),
    )
    pieces = _chosen.token_pieces(
        batches_of(chosen_ids, chosen_under), stream=chosen_under != "documents"
    ).pieces
    got = _chosen.share_chosen_on(
        batches_of(evaluated_ids, evaluated_under), pieces, stream=evaluated_under != "documents"
    )
    assert got == want
    assert (got >= _chosen.FLAG_SHARE) == flagged_by_design(scenario, chosen_under, evaluated_under)


def _weak_hashes(piece: np.ndarray, width: int) -> np.ndarray:
    """Three hash values for every run: nearly every lookup meets runs that only share the hash."""
    count = piece.shape[0] - width + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    sums = np.convolve(piece, np.ones(width, dtype=np.int64), mode="valid")
    return (sums % 3).astype(np.uint64)


@pytest.mark.parametrize("scenario", ["mixed", "template", "short chosen", "short evaluated", "other"])
def test_a_shared_hash_alone_finds_nothing(monkeypatch, scenario: str) -> None:
    """Runs are compared token for token: with a hash of three values the shares stay the brute force's."""
    monkeypatch.setattr(_chosen, "_hashes", _weak_hashes)
    chosen_ids, evaluated_ids = _texts()[scenario]
    chosen_rows, evaluated_rows = chosen_ids.tolist(), evaluated_ids.tolist()
    for evaluated_under in ["documents", "stride:48/12"]:
        want = brute_share(read(flat(evaluated_rows), evaluated_under, evaluated_rows), chosen_rows)
        pieces = _chosen.token_pieces(batches_of(chosen_ids, "documents")).pieces
        evaluated = batches_of(evaluated_ids, evaluated_under)
        got = _chosen.share_chosen_on(evaluated, pieces, stream=evaluated_under != "documents")
        assert got == want


def test_the_rules_numbers() -> None:
    assert (_chosen.RUN_TOKENS, _chosen.SHORT_RUN_TOKENS, _chosen.FLAG_SHARE) == (RUN, SHORTEST, 0.01)


def test_the_pieces_are_the_text_each_protocol_read() -> None:
    ids = random_rows(5, 4, 50)
    stream = flat(ids.tolist())
    for protocol in ["chunks:64", "stride:64/64", "stride:64/16", "stride:7/7", "stride:7/1"]:
        read_back = _chosen.token_pieces(batches_of(ids, protocol), stream=True)
        (piece,), (predicted,) = read_back.pieces, read_back.predicted
        (want, flags), *_ = read(stream, protocol, [])
        assert piece.tolist() == want and predicted.tolist() == flags, protocol


# ---------------------------------------------------------------------------------------- spellings
@pytest.fixture
def forgetful() -> Iterator[None]:
    """CHOSEN_ON as it was before the test (allocations of other tests stay out of its way)."""
    saved = list(_chosen.CHOSEN_ON)
    _chosen.CHOSEN_ON.clear()
    yield
    _chosen.CHOSEN_ON[:] = saved


SPELLINGS = [
    # (the allocation's choice per layer, an evaluated spelling, its layers, whether it is that choice)
    (("kv:int4",) * 3, "kv:int4", None, True),
    (("kv:int4",) * 3, "kv:int4@0-2", None, True),
    (("kv:int4",) * 3, "KV:INT4/g32@2;kv:int4@0,1", None, True),
    (("kv:int4",) * 3, "kv:int4", [0, 1, 2], True),
    (("kv:int4",) * 3, "kv:int4", [0, 1], False),
    (("kv:int4",) * 3, "kv:int4@0-1", None, False),
    (("kv:int4",) * 3, "kv:int2", None, False),
    (("model", "mqa", "mqa"), "mqa@1-2", None, True),
    (("model", "mqa", "mqa"), "model@0;mqa@1,2", None, True),
    (("model", "mqa", "mqa"), "mqa", [1, 2], True),
    (("model", "mqa", "mqa"), "mqa", None, False),
    (("mqa", "kv:int4", "lrkv:4"), "lrkv:4@2;mqa@0;kv:int4@1", None, True),
    (("mqa", "kv:int4", "lrkv:4"), "mqa@0;kv:int4@1;lrkv:4@2-3", None, False),  # a layer it lacks
    (("model",) * 3, "model", None, False),  # the model itself is never flagged
]


@pytest.mark.parametrize(("choice", "spec", "layers", "same"), SPELLINGS)
def test_a_spec_is_matched_by_what_it_does_per_layer(forgetful, choice, spec, layers, same) -> None:
    ids = random_rows(6, 2, 40)
    batches = batches_of(ids, "documents")
    _chosen.remember(choice, "elsewhere", _chosen.token_pieces(batches).pieces)
    shares = _chosen.chosen_shares([spec], "another fingerprint", batches, layers=layers)
    assert shares == ({spec: 1.0} if same else {})
    assert (_chosen.per_layer_specs(spec, 3, layers) == choice) == (same or choice == ("model",) * 3)


def test_the_very_sequences_are_chosen_on_however_short(forgetful) -> None:
    ids = random_rows(7, 3, 8)  # shorter than any run that counts
    batches = batches_of(ids, "documents")
    _chosen.remember(["mqa"] * 3, "fp", _chosen.token_pieces(batches).pieces)
    assert _chosen.chosen_shares(["mqa"], "fp", batches) == {"mqa": 1.0}
    assert _chosen.chosen_shares(["mqa"], "other", batches) == {"mqa": 0.0}


# ---------------------------------------------------------------------------- allocate → evaluate
@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return three_layer_llama(seed=4)


def _flagged(model: torch.nn.Module, texts, spec: str, **options) -> tuple[bool, str | None]:
    options.setdefault("dtype", F64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = evaluate(model, texts, [spec], progress=False, **options)
    said = [str(w.message) for w in caught if "chosen by headwidget.allocate" in str(w.message)]
    flagged = parse_variant(spec).text in report.chosen_on_these_tokens
    assert len(said) == flagged
    return flagged, said[0] if said else None


def test_chosen_on_2048_tokens_under_stride_and_evaluated_on_16384_under_documents_is_flagged(llama) -> None:
    """The issue's case: 2,048 tokens chosen on under stride:256/64 (S = W/4), evaluated on 16,384
    tokens of the same text as documents of 512 (and under chunks and another stride)."""
    text = random_rows(8, 32, 512)
    alloc = allocate(
        llama,
        text,
        budget=0.6,
        candidates=["model", "mqa"],
        refine=0,
        dtype=torch.float32,
        max_tokens=2048,
        protocol="stride:256/64",
        progress=False,
    )
    rows = text.tolist()
    chosen = [flat(rows)[:2048]]  # the stream the allocation read
    for protocol in ["documents", "chunks:512", "stride:512/256"]:
        flagged, said = _flagged(llama, text, alloc.spec, protocol=protocol, dtype=torch.float32)
        want = brute_share(read(flat(rows), protocol, rows), chosen)
        assert 0.12 < want < 0.13 and flagged, protocol
        assert said is not None and f"(on {want:.0%} of them)" in said
    other = random_rows(9, 32, 512)
    assert _flagged(llama, other, alloc.spec, dtype=torch.float32) == (False, None)


def test_the_same_spec_written_uniformly_is_flagged(llama) -> None:
    calibration = random_rows(10, 4, 64)
    alloc = allocate(
        llama, calibration, budget=0.3, candidates=["model", "kv:int4"], refine=0, dtype=F64, progress=False
    )
    assert alloc.spec == "kv:int4@0-2"  # the only choice within the budget, as the allocation writes it
    for spec, layers in [("kv:int4", None), ("kv:int4@0-2", None), ("kv:int4/g32", [0, 1, 2])]:
        flagged, said = _flagged(llama, calibration[:2], spec, layers=layers)
        assert flagged and said is not None and "(on 100% of them)" in said, spec
    assert _flagged(llama, calibration[:2], "kv:int4", layers=[0, 1]) == (False, None)


def test_calibration_rows_that_repeat_are_chosen_on(llama) -> None:
    template = random_rows(11, 1, 48)
    calibration = torch.cat([template.expand(6, 48), random_rows(12, 2, 48)])
    alloc = allocate(
        llama,
        calibration,
        budget=0.5,
        candidates=["model", "mqa", "kv:int4"],
        refine=0,
        dtype=F64,
        progress=False,
    )
    flagged, said = _flagged(llama, torch.cat([template, random_rows(13, 3, 48)]), alloc.spec)
    assert flagged and said is not None and "(on 25% of them)" in said
    # as one stream cut into other windows
    flagged, said = _flagged(llama, template.expand(2, 48), alloc.spec, protocol="chunks:24")
    assert flagged and said is not None and "(on 100% of them)" in said


def test_the_english_sample_s_splits_share_no_run_that_counts(smollm2) -> None:
    """Different natural text is not flagged: SmolLM2's tokens of the evaluation split against the
    calibration split (the text allocate and evaluate are meant to be given)."""
    from headwidget.texts import english_sample

    _, tokenizer = smollm2
    calibration = evaluation_batches(english_sample(split="calibration"), tokenizer, max_length=512)
    held_out = evaluation_batches(english_sample(split="evaluation"), tokenizer, max_length=512)
    pieces = _chosen.token_pieces(calibration).pieces
    assert sum(p.size for p in pieces) > 50_000
    assert _chosen.share_chosen_on(held_out, pieces) == 0.0
    # the evaluation split cut by another protocol is found: all but the few tokens of the runs that
    # cross from one paragraph into the next, and the tails beyond max_length, which documents leave out
    stream = chunk_batches(
        english_sample(split="evaluation"), tokenizer, 256, batch_size=8, max_tokens=None, context=None
    )
    assert _chosen.share_chosen_on(stream, _chosen.token_pieces(held_out).pieces, stream=True) > 0.8


def test_the_reported_share_is_the_float_of_the_count() -> None:
    """A share is found / predicted as one float division, for a hand-made case: 40 chosen-on tokens
    inside a 100-token row (99 predicted), so 40 / 99 exactly."""
    chosen = np.arange(1000, 1040, dtype=np.int64)
    row = torch.cat([torch.arange(1, 31), torch.arange(1000, 1040), torch.arange(31, 61)]).reshape(1, 100)
    share = _chosen.share_chosen_on([Batch(row, torch.ones_like(row))], [chosen])
    assert share == 40 / 99
