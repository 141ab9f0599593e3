"""The Li et al. (2018) regularizers against the paper's double sums over all head pairs, computed naively: the
factors stated in attn_lab/train/diversity.py's docstring hold (weight = lambda (N-1)/N for subspace / output,
lambda T (N-1)/N plus the paper's i = j terms for position)."""

import numpy as np

from attn_lab.train import diversity


def _paper_cosine(x):
    """-D of the paper for one position: (1/N^2) sum_i sum_j cos(x_i, x_j), x ``[N, H]``."""
    n = x.shape[0]
    return sum(x[i] @ x[j] / (np.linalg.norm(x[i]) * np.linalg.norm(x[j])) for i in range(n) for j in range(n)) / n**2


def test_subspace_and_output_scale():
    rng = np.random.default_rng(0)
    b, t, n, h = 2, 3, 4, 5
    x = rng.normal(size=(b, t, n, h)).astype(np.float32)
    ours = float(diversity.head_cosine(x))
    paper = np.mean([_paper_cosine(x[e, p].astype(np.float64)) for e in range(b) for p in range(t)])
    np.testing.assert_allclose(paper, 1 / n + (n - 1) / n * ours, rtol=1e-5)


def test_position_scale():
    rng = np.random.default_rng(1)
    b, n, t, s = 2, 4, 3, 5
    logits = rng.normal(size=(b, n, t, s))
    maps = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    ours = float(diversity.position(maps.astype(np.float32)))
    paper, diag = [], []
    for e in range(b):  # (1/N^2) sum_i sum_j sum_{t,s} |A_i (.) A_j| per example, and its i = j part
        a = maps[e]
        paper.append(sum(np.abs(a[i] * a[j]).sum() for i in range(n) for j in range(n)) / n**2)
        diag.append(sum(np.abs(a[i] * a[i]).sum() for i in range(n)) / n**2)
    paper, diag = np.mean(paper), np.mean(diag)
    np.testing.assert_allclose(paper, diag + t * (n - 1) / n * ours, rtol=1e-5)
    pairs = np.mean([sum(np.abs(maps[e, i] * maps[e, j]).sum() for i in range(n) for j in range(i + 1, n))
                     for e in range(b)])
    np.testing.assert_allclose(ours, pairs / (n * (n - 1) / 2 * t), rtol=1e-5)  # pair sum / (P T)
