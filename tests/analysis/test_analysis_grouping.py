"""Head grouping (``headwidget.analysis.grouping``) against exhaustive search over all equal partitions."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from headwidget.analysis.grouping import group_heads, within_group_mean
from headwidget.errors import ArgumentError, GroupCountError


def equal_partitions(items: list[int], size: int) -> Iterator[list[list[int]]]:
    """Every partition of ``items`` into groups of ``size`` (brute force)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    from itertools import combinations

    for others in combinations(rest, size - 1):
        remaining = [x for x in rest if x not in others]
        for tail in equal_partitions(remaining, size):
            yield [[first, *others], *tail]


def within_sum(s: np.ndarray, groups: list[list[int]]) -> float:
    return sum(s[i, j] for g in groups for a, i in enumerate(g) for j in g[a + 1 :])


@pytest.mark.parametrize(("heads", "groups", "seed"), [(8, 2, 0), (8, 4, 1), (9, 3, 2), (12, 3, 3)])
def test_finds_the_exhaustive_optimum(heads: int, groups: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    s = rng.uniform(-1, 1, (heads, heads))
    s = (s + s.T) / 2
    best = max(within_sum(s, p) for p in equal_partitions(list(range(heads)), heads // groups))
    found = group_heads(s, groups)
    assert sorted(h for g in found for h in g) == list(range(heads))
    assert all(len(g) == heads // groups for g in found)
    assert within_sum(s, found) == pytest.approx(best, abs=1e-12)


def test_recovers_planted_groups_deterministically() -> None:
    rng = np.random.default_rng(5)
    perm = rng.permutation(16)
    truth = [sorted(perm[4 * k : 4 * k + 4].tolist()) for k in range(4)]
    s = rng.normal(0, 0.1, (16, 16))
    for g in truth:
        s[np.ix_(g, g)] += 0.8
    found = group_heads(s, 4, restarts=4, seed=11)
    assert found == sorted(truth)
    assert group_heads(s, 4, restarts=4, seed=11) == found
    sym = (s + s.T) / 2
    want = np.mean([sym[i, j] for g in truth for a, i in enumerate(g) for j in g[a + 1 :]])
    assert within_group_mean(sym, found) == pytest.approx(want)


def test_bad_group_counts_and_nan() -> None:
    with pytest.raises(GroupCountError, match="1, 2, 4, 8"):
        group_heads(np.eye(8), 5)
    with pytest.raises(ArgumentError, match="num_groups must be at least 1, got 0"):
        group_heads(np.eye(8), 0)
    s = np.eye(4)
    s[0, 1] = np.nan
    with pytest.raises(ValueError, match="nan_to_num"):
        group_heads(s, 2)
