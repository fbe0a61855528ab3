"""Partition heads into equal-size groups of mutually similar heads (the grouping step of MHA → GQA).

Objective: the sum of within-group similarities ``Σ_groups Σ_{i<j in group} S_ij`` with every group of
size ``P / num_groups``. Search: from a random balanced partition, repeatedly apply the single swap of
two heads in different groups that raises the objective most, until no swap helps; keep the best of
``restarts`` such starts. Seeded, so the same input always gives the same groups.

Example:
    >>> import numpy as np
    >>> s = np.eye(4); s[0, 2] = s[2, 0] = s[1, 3] = s[3, 1] = 0.9
    >>> group_heads(s, 2)
    [[0, 2], [1, 3]]
    >>> round(within_group_mean(s, [[0, 2], [1, 3]]), 3)
    0.9
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from headwidget.checks import whole_number
from headwidget.errors import ArgumentError, GroupCountError

__all__ = ["group_heads", "within_group_mean"]


def _check(similarity: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    try:
        s = np.asarray(similarity, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ArgumentError(
            f"similarity must be a numeric (P, P) array, got {type(similarity).__name__} ({err})"
        ) from None
    if s.ndim != 2 or s.shape[0] != s.shape[1]:
        raise ArgumentError(f"similarity must be a square (P, P) matrix, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise ArgumentError(
            "similarity has NaN or infinite entries (undefined scores of constant heads); "
            "replace them, e.g. np.nan_to_num(similarity), before grouping"
        )
    return (s + s.T) / 2


def _objective(s: np.ndarray, labels: np.ndarray) -> float:
    same = labels[:, None] == labels[None, :]
    return float((s * same).sum() - np.trace(s)) / 2


def _swap_search(s: np.ndarray, labels: np.ndarray, groups: int) -> np.ndarray:
    heads = len(labels)
    diag = np.diag(s)
    onehot = np.zeros((heads, groups))
    onehot[np.arange(heads), labels] = 1.0
    w = s @ onehot  # w[i, k] = Σ_{l in group k} S_il
    tol = 1e-12 * max(1.0, float(np.abs(s).max()))
    for _ in range(heads * heads):
        own = w[np.arange(heads), labels]
        a = w[:, labels] - own[:, None] + diag[:, None]
        gain = a + a.T - 2 * s
        gain[labels[:, None] == labels[None, :]] = -np.inf
        best = int(np.argmax(gain))
        i, j = divmod(best, heads)
        if gain[i, j] <= tol:
            break
        gi, gj = labels[i], labels[j]
        w[:, gi] += s[:, j] - s[:, i]
        w[:, gj] += s[:, i] - s[:, j]
        labels[i], labels[j] = gj, gi
    return labels


def group_heads(
    similarity: np.ndarray | Sequence[Sequence[float]],
    num_groups: int,
    *,
    restarts: int = 8,
    seed: int = 0,
) -> list[list[int]]:
    """Equal-size groups of heads maximising the within-group similarity (see the module docstring).

    Args:
        similarity: (P, P) head × head similarity (symmetrised; must be finite).
        num_groups: number of groups; must divide P.
        restarts: random starting partitions; the best local optimum is kept.
        seed: seed of the starting partitions.

    Returns:
        ``num_groups`` sorted lists of head indices, ordered by their first head.

    Raises:
        GroupCountError: ``num_groups`` does not divide the number of heads.
        ArgumentError: a similarity that is not a finite square array, or a count that is not an integer.

    >>> group_heads(np.zeros((6, 6)), 3)
    [[0, 3], [1, 4], [2, 5]]
    """
    s = _check(similarity)
    heads = s.shape[0]
    num_groups = whole_number("num_groups", num_groups, minimum=1, hint=f"groups of the {heads} heads")
    restarts = whole_number(
        "restarts", restarts, minimum=0, maximum=10_000, hint="random starting partitions"
    )
    seed = whole_number(
        "seed", seed, minimum=0, maximum=2**63 - 1, hint="the seed of the starting partitions"
    )
    if heads % num_groups:
        raise GroupCountError(
            f"cannot split {heads} heads into {num_groups} equal groups; use a divisor of {heads}: "
            + ", ".join(str(k) for k in range(1, heads + 1) if heads % k == 0)
        )
    rng = np.random.default_rng(seed)
    base = np.arange(heads) % num_groups
    best_labels, best_value = base, _objective(s, base)
    for _ in range(max(1, restarts)):
        labels = _swap_search(s, rng.permutation(base), num_groups)
        value = _objective(s, labels)
        if value > best_value + 1e-12 * max(1.0, abs(best_value)):
            best_labels, best_value = labels, value
    groups = [sorted(np.flatnonzero(best_labels == k).tolist()) for k in range(num_groups)]
    return sorted(groups, key=lambda g: g[0])


def within_group_mean(
    similarity: np.ndarray | Sequence[Sequence[float]], groups: Sequence[Sequence[int]]
) -> float:
    """Mean similarity over the pairs ``i < j`` that share a group (NaN when no group has two heads).

    >>> within_group_mean([[1, 0.5, 0.1], [0.5, 1, 0.3], [0.1, 0.3, 1]], [[0, 1], [2]])
    0.5
    """
    s = np.asarray(similarity, dtype=np.float64)
    pairs = [s[i, j] for g in groups for a, i in enumerate(g) for j in g[a + 1 :]]
    return float(np.mean(pairs)) if pairs else float("nan")
