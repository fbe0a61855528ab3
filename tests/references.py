"""Brute-force float64 references for the statistics headwidget derives (loops, no shortcuts)."""

from __future__ import annotations

import numpy as np


def heads(x: np.ndarray, head_dim: int) -> list[np.ndarray]:
    return [x[:, h * head_dim : (h + 1) * head_dim] for h in range(x.shape[1] // head_dim)]


def token_cosine(x: np.ndarray, head_dim: int) -> np.ndarray:
    hs = heads(x, head_dim)
    n = x.shape[0]
    out = np.zeros((len(hs), len(hs)))
    for i, a in enumerate(hs):
        for j, b in enumerate(hs):
            total = 0.0
            for t in range(n):
                na, nb = np.linalg.norm(a[t]), np.linalg.norm(b[t])
                if na > 0 and nb > 0:
                    total += float(a[t] @ b[t]) / (na * nb)
            out[i, j] = total / n
    return out


def frobenius_cosine(x: np.ndarray, head_dim: int, centred: bool) -> np.ndarray:
    if centred:
        x = x - x.mean(0)
    hs = heads(x, head_dim)
    out = np.zeros((len(hs), len(hs)))
    for i, a in enumerate(hs):
        for j, b in enumerate(hs):
            out[i, j] = np.sum(a * b) / np.sqrt(np.sum(a * a) * np.sum(b * b))
    return out


def linear_cka(x: np.ndarray, head_dim: int) -> np.ndarray:
    hs = heads(x - x.mean(0), head_dim)
    out = np.zeros((len(hs), len(hs)))
    for i, a in enumerate(hs):
        for j, b in enumerate(hs):
            out[i, j] = np.linalg.norm(a.T @ b) ** 2 / (np.linalg.norm(a.T @ a) * np.linalg.norm(b.T @ b))
    return out


def head_metric(x: np.ndarray, head_dim: int, metric: str) -> np.ndarray:
    if metric == "token_cosine":
        return token_cosine(x, head_dim)
    if metric == "cosine":
        return frobenius_cosine(x, head_dim, centred=False)
    if metric == "pearson":
        return frobenius_cosine(x, head_dim, centred=True)
    if metric == "cka":
        return linear_cka(x, head_dim)
    raise KeyError(metric)
