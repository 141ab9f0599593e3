"""The simulation that chose the verdict interval: candidate intervals for the mean of few paired differences, the
shapes of difference they meet in practice, and the coverage of each (``python scripts/interval_coverage.py``
prints the table docs/sweeps.md quotes; tests/test_stats.py asserts it).

Shapes: normal (a clean gap), Student t3 (heavy tails: an occasional far seed), log-normal and chi-square(1)
(skewed: a metric near a floor or ceiling), and a 15% collapse (a variant that fails to train on some seeds: -0.5,
else N(0, 0.05)). Candidates: the paired t, the bootstrap-t, BCa (Efron 1987) and the hull of the t and the
bootstrap-t (the verdict interval, :func:`attn_lab.reporting.stats.interval`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats

from attn_lab.reporting import stats

SHAPES = {  # name -> (draw(rng, shape), true mean)
    "normal": (lambda rng, shape: 0.1 + 0.05 * rng.standard_normal(shape), 0.1),
    "heavy-tailed (t3)": (lambda rng, shape: 0.05 * rng.standard_t(3, shape), 0.0),
    "skewed (log-normal)": (lambda rng, shape: np.exp(rng.standard_normal(shape)), math.exp(0.5)),
    "skewed (chi-square 1)": (lambda rng, shape: rng.chisquare(1, shape), 1.0),
    "15% collapse": (lambda rng, shape: np.where(rng.random(shape) < 0.15, -0.5, 0.05 * rng.standard_normal(shape)),
                     0.85 * 0.0 + 0.15 * -0.5),
}
PAIRS = (3, 5, 10)


@stats.batched
def paired_t(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = data.shape[1]
    m, half = data.mean(1), stats.t_quantile(0.975, n - 1) * data.std(1, ddof=1) / math.sqrt(n)
    return m - half, m + half


@stats.batched
def bootstrap_t(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap-t alone (infinite below 4 pairs, where its tails hold constant resamples)."""
    edges = [stats.studentize(data[i:i + stats.CHUNK]).quantile_edges(0.025) for i in range(0, len(data), stats.CHUNK)]
    return np.concatenate([e[0] for e in edges]), np.concatenate([e[1] for e in edges])


@stats.batched
def bca(data: np.ndarray, resamples: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """The bias-corrected and accelerated percentile interval (a fixed resampling stream)."""
    n = data.shape[1]
    picks = np.random.default_rng(1).integers(0, n, (resamples, n))
    low, high = np.empty(len(data)), np.empty(len(data))
    for i in range(0, len(data), stats.CHUNK):
        x = data[i:i + stats.CHUNK]
        means, m = x[:, picks].mean(2), x.mean(1, keepdims=True)  # (C, B)
        z0 = scipy_stats.norm.ppf(np.clip((means < m).mean(1) + 0.5 * (means == m).mean(1), 1e-6, 1 - 1e-6))
        jack = (x.sum(1, keepdims=True) - x) / (n - 1)
        dev = jack.mean(1, keepdims=True) - jack
        den = 6 * ((dev**2).sum(1)) ** 1.5
        a = np.where(den > 0, (dev**3).sum(1) / np.where(den > 0, den, 1), 0.0)
        for out, z in ((low, scipy_stats.norm.ppf(0.025)), (high, scipy_stats.norm.ppf(0.975))):
            share = scipy_stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
            out[i:i + stats.CHUNK] = [np.quantile(row, q) for row, q in zip(means, share)]
    return low, high


CANDIDATES = {"paired t": paired_t, "bootstrap-t": bootstrap_t, "BCa (2,000 resamples)": bca,
              stats.INTERVAL + " (the verdicts')": stats.batched(stats.hull_edges)}


def table(simulations: int = 4000, candidates=CANDIDATES) -> dict[tuple[str, str, int], float]:
    """``{(candidate, shape, pairs): coverage}`` of every cell, each from ``simulations`` simulated sweeps (the
    same draws for every candidate)."""
    return {(name, shape, n): stats.coverage(fn, draw, n, truth, simulations)
            for shape, (draw, truth) in SHAPES.items() for n in PAIRS for name, fn in candidates.items()}
