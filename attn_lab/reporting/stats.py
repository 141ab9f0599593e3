"""The interval of a paired comparison over few seeds, its tests, and the power of a preset before it runs.

A table row is compared with the table's baseline seed by seed (seed ``s`` of both saw the same data order and
initialization stream), so the unit of evidence is the per-seed difference ``d_s = other_s - baseline_s``. With
``n`` differences of mean ``m`` and sample standard deviation ``sd``, the **paired t-interval** is

    m +- t_{(1 + level) / 2, n - 1} * sd / sqrt(n)

(Student 1908). It covers the true mean difference at its stated level whenever the differences are normal, at
any ``n >= 2``; tests/test_stats.py measures it by simulation (3, 5 and 10 pairs, normal and log-normal
differences). The percentile bootstrap of the mean that this project used before undercovers badly at these
sizes (0.76 / 0.83 / 0.89 at 3 / 5 / 10 pairs for a nominal 0.95: Efron & Tibshirani 1993, ch. 13-14); it stays
here as :func:`percentile_bootstrap` so that the same test shows why it was replaced.

Power before a run: a preset declares the per-seed standard deviation of each paired difference it expects (from
a pilot on other seeds). The interval it will print then has the expected half-width
``t_{(1 + level) / 2, n - 1} * c4(n) * sd / sqrt(n)`` (``E[s] = c4(n) sigma`` for normal data), which says, before
any training, whether the preset can tell an effect of the finding's margin from none.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
from scipy import special
from scipy import stats as scipy_stats

LEVEL = 0.95
INTERVAL = "paired t"  # the interval's name, printed in every verdict table's header


@dataclasses.dataclass(frozen=True)
class Interval:
    """Mean paired difference (other - baseline) over ``pairs`` shared seeds, its interval at ``level`` and the
    sample standard deviation ``sd`` of the per-seed differences (what a pilot contributes to the next design)."""

    mean: float
    low: float
    high: float
    pairs: int
    sd: float = float("nan")
    level: float = LEVEL

    def text(self, digits: int = 3) -> str:
        """``+0.012 [-0.004, +0.030]``."""
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    @property
    def se(self) -> float:
        """Standard error of the mean difference, ``sd / sqrt(n)``."""
        return self.sd / math.sqrt(self.pairs)


def differences(baseline: Mapping[int, float], other: Mapping[int, float]) -> np.ndarray:
    """``other[s] - baseline[s]`` for every seed both have, in seed order (``[P]``)."""
    seeds = sorted(set(baseline) & set(other))
    return np.array([other[s] - baseline[s] for s in seeds], np.float64)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom."""
    return float(scipy_stats.t.ppf(p, df))


def t_interval(diffs: np.ndarray, level: float = LEVEL) -> Interval | None:
    """The paired t-interval of the mean of ``diffs``; None with fewer than 2 (no standard deviation)."""
    diffs = np.asarray(diffs, np.float64)
    n = diffs.size
    if n < 2:
        return None
    mean, sd = float(diffs.mean()), float(diffs.std(ddof=1))
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, sd, level)


def paired_t(baseline: Mapping[int, float], other: Mapping[int, float], level: float = LEVEL) -> Interval | None:
    """The paired t-interval of ``other - baseline`` over their shared seeds; None with fewer than 2 shared."""
    return t_interval(differences(baseline, other), level)


def percentile_bootstrap(diffs: np.ndarray, level: float = LEVEL, resamples: int = 10_000,
                         seed: int = 0) -> Interval | None:
    """The percentile bootstrap interval of the mean (the interval this project printed before the paired t).

    Kept only to be measured against (tests/test_stats.py): at 3-10 pairs it covers far less than ``level``.
    """
    diffs = np.asarray(diffs, np.float64)
    if diffs.size < 2:
        return None
    picks = np.random.default_rng(seed).integers(0, diffs.size, (resamples, diffs.size))  # (R, P)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(diffs[picks].mean(axis=1), [tail, 100 - tail])
    return Interval(float(diffs.mean()), float(low), float(high), diffs.size, float(diffs.std(ddof=1)), level)


def p_above(diff: Interval, threshold: float) -> float:
    """One-sided p-value of ``H0: mean <= threshold`` (small when the data say the mean is above it)."""
    return _p_tail(diff, diff.mean - threshold)


def p_below(diff: Interval, threshold: float) -> float:
    """One-sided p-value of ``H0: mean >= threshold``."""
    return _p_tail(diff, threshold - diff.mean)


def _p_tail(diff: Interval, distance: float) -> float:
    """``P(T_{n-1} >= distance / se)``; with zero spread the data decide exactly (0 or 1)."""
    if diff.se == 0.0 or not math.isfinite(diff.se):
        return 0.0 if distance > 0 else 1.0
    return float(scipy_stats.t.sf(distance / diff.se, diff.pairs - 1))


def c4(n: int) -> float:
    """``E[s] / sigma`` for the sample standard deviation of ``n`` normal values (0.798 at 2, 0.940 at 5)."""
    return math.sqrt(2.0 / (n - 1)) * math.exp(special.gammaln(n / 2) - special.gammaln((n - 1) / 2))


def expected_half_width(sd: float, n: int, level: float = LEVEL) -> float:
    """The expected half-width of the paired t-interval at ``level`` over ``n`` seeds when the per-seed
    differences have standard deviation ``sd``: ``t_{(1 + level)/2, n-1} c4(n) sd / sqrt(n)``; inf below 2."""
    if n < 2:
        return math.inf
    return t_quantile((1 + level) / 2, n - 1) * c4(n) * sd / math.sqrt(n)


def detectable_difference(sd: float, n: int, level: float = LEVEL, power: float = 0.8) -> float:
    """The smallest true mean difference that the interval excludes zero for with probability ``power``:
    ``(t_{(1 + level)/2, n-1} + t_{power, n-1}) sd / sqrt(n)`` (the usual normal-approximation form with t
    quantiles); inf below 2 seeds."""
    if n < 2:
        return math.inf
    return (t_quantile((1 + level) / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def seeds_needed(sd: float, margin: float, level: float = LEVEL, limit: int = 10_000) -> int | None:
    """The fewest seeds (>= 2) whose expected half-width is below ``margin``; None if more than ``limit`` would be
    needed. The half-width falls monotonically with n, so a bisection finds it."""
    if expected_half_width(sd, limit, level) >= margin:
        return None
    low, high = 2, limit  # the answer is in [low, high]
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if expected_half_width(sd, mid, level) < margin else (mid + 1, high)
    return low


def coverage(interval, draw, n: int, truth: float, simulations: int = 4000, seed: int = 0) -> float:
    """The share of ``simulations`` simulated sweeps of ``n`` paired differences (``draw(rng, shape)``) whose
    ``interval(diffs) -> Interval`` contains ``truth``: how often the interval really covers (tests/test_stats.py,
    scripts/interval_coverage.py)."""
    data = draw(np.random.default_rng(seed), (simulations, n))  # (D, n)
    return float(np.mean([(lambda iv: iv.low <= truth <= iv.high)(interval(row)) for row in data]))


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm's (1979) step-down adjusted p-values of one family: the k-th smallest is multiplied by
    ``(m - k + 1)``, made monotone, capped at 1. A claim stands at family-wise level alpha when its adjusted p is
    below alpha."""
    order = sorted(p_values, key=p_values.get)
    adjusted, running = {}, 0.0
    for k, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - k) * p_values[name]))
        adjusted[name] = running
    return adjusted
