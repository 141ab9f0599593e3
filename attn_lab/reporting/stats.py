"""The interval of a paired comparison over few seeds, its one-sided tests, and what collapsed.

A table row is compared with the table's baseline seed by seed (seed ``s`` of both saw the same data order and
initialization stream), so the unit of evidence is the per-seed difference ``d_s = other_s - baseline_s``.

**The verdict interval** (:func:`interval`) is the hull of two intervals for the mean of ``d``:

- the paired t-interval ``m +- t_{(1 + level)/2, n-1} sd / sqrt(n)`` (Student 1908), exact for normal differences;
- the bootstrap-t (studentized bootstrap; Efron & Tibshirani 1993, ch. 12), whose quantiles of
  ``t* = (m* - m) / se*`` come from the data's own shape, so a skewed difference widens the side it leans to. Its
  bootstrap distribution is enumerated exactly up to 7 pairs (every multiset of the pairs with its multinomial
  probability) and sampled (3,999 resamples, a fixed stream) above, so a verdict never depends on a random draw.

The hull covers at least what either interval covers, in every shape: it was chosen by simulation
(``python scripts/interval_coverage.py``; tests/test_stats.py holds the numbers) over the paired t, the bootstrap-t,
BCa and the hull, at 3, 5 and 10 pairs, for normal, heavy-tailed (t3), skewed (log-normal, chi-square) and
15%-collapse differences: the hull has the best worst case and is never below the paired t. Below 4 pairs the
interval is the paired t alone (covering only ~0.82 for skewed differences there): at 3 pairs 3 of the bootstrap's
10 multisets have no spread, so its tails are set by the se* floor below, not by the data.

A verdict edge is a one-sided test at ``(1 - level) / 2``: ``low > x`` exactly when :func:`p_above` ``(x) < 0.025``;
for the hull that p-value is the larger of the t's and the bootstrap-t's (both edges must clear ``x``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import itertools
import math
from collections.abc import Callable, Mapping

import numpy as np


class _Lazy:
    """A module imported on first use: the sweep command imports this module's constants, and its ``--help`` and
    bad-flag lines should not wait for scipy (about a second)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


scipy_stats, special = _Lazy("scipy.stats"), _Lazy("scipy.special")

LEVEL = 0.95
INTERVAL = "t + bootstrap-t hull"  # the interval's name, printed in every verdict table's header
BOOT_MIN_PAIRS = 4  # below this the bootstrap-t is set by its resamples without spread: the paired t alone
EXACT_UP_TO = 7  # enumerate the bootstrap exactly up to this many pairs (1,716 multisets at 7)
RESAMPLES = 3999  # sampled bootstrap above that: alpha * RESAMPLES is never an integer, so no edge is a tie
CHUNK = 500  # datasets studentized at once in a simulation ([CHUNK, B] arrays)


@dataclasses.dataclass(frozen=True)
class Interval:
    """Mean paired difference (other - baseline) over ``pairs`` shared seeds, its interval at ``level``, the sample
    standard deviation ``sd`` of the per-seed differences, and the differences themselves (``values``, by seed
    ``seeds``; empty for an interval given by its edges) from which the one-sided tests are computed."""

    mean: float
    low: float
    high: float
    pairs: int
    sd: float = float("nan")
    level: float = LEVEL
    values: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()
    method: str = "paired t"
    edges: Callable[[float], tuple[float, float]] | None = dataclasses.field(default=None, compare=False, repr=False)

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
    return Interval(mean, mean - half, mean + half, n, sd, level, tuple(map(float, diffs)))


# --- the bootstrap-t ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=128)
def resamples(n: int, sampled: int = RESAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap distribution of ``n`` pairs as (counts ``[B, n]``: how often each pair is drawn, weights
    ``[B]`` summing to 1): every multiset exactly up to ``EXACT_UP_TO`` pairs, else ``sampled`` fixed draws."""
    if n <= EXACT_UP_TO:
        counts = np.array([np.bincount(c, minlength=n) for c in itertools.combinations_with_replacement(range(n), n)],
                          np.float64)  # (B, n)
        log_w = special.gammaln(n + 1) - special.gammaln(counts + 1).sum(1) - n * math.log(n)
        return counts, np.exp(log_w)
    picks = np.random.default_rng(20261203).integers(0, n, (sampled, n))
    counts = np.stack([np.bincount(p, minlength=n) for p in picks]).astype(np.float64)
    return counts, np.full(sampled, 1.0 / sampled)


@dataclasses.dataclass(frozen=True)
class Studentized:
    """Per dataset (leading axis ``R``): mean ``m``, standard error ``se``, and the bootstrap's ``t*`` sorted
    ascending (``[R, B]``) with their weights in that order and the weights' running sums from either end."""

    m: np.ndarray
    se: np.ndarray
    t: np.ndarray
    below: np.ndarray  # (R, B): total weight of t*[:i+1]
    above: np.ndarray  # (R, B): total weight of t*[i:]

    def p_above(self, c: np.ndarray) -> np.ndarray:
        """Bootstrap weight of ``t* >= c`` per dataset (``c``: ``[R]``)."""
        i = (self.t < c[:, None]).sum(1)  # first index with t* >= c
        padded = np.concatenate([self.above, np.zeros((len(c), 1))], 1)
        return padded[np.arange(len(c)), i]

    def p_below(self, c: np.ndarray) -> np.ndarray:
        """Bootstrap weight of ``t* <= c`` per dataset."""
        i = (self.t <= c[:, None]).sum(1)  # number of t* <= c
        padded = np.concatenate([np.zeros((len(c), 1)), self.below], 1)
        return padded[np.arange(len(c)), i]

    def quantile_edges(self, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """The bootstrap-t's ``(low, high)`` per dataset: ``low > x`` iff ``p_above(c(x)) < alpha`` with
        ``c(x) = (m - x) / se``, and ``high < x`` iff ``p_below(c(x)) < alpha``."""
        rows = np.arange(len(self.m))
        upper = self.t[rows, (self.above >= alpha).sum(1) - 1]  # the last t* whose upper tail still holds alpha
        lower = self.t[rows, np.minimum((self.below < alpha).sum(1), self.t.shape[1] - 1)]
        return self.m - upper * self.se, self.m - lower * self.se


def studentize(data: np.ndarray, resampled: tuple[np.ndarray, np.ndarray] | None = None) -> Studentized:
    """The bootstrap-t distribution of each row of ``data`` (``[R, n]``, n >= 2) over ``resampled`` (default
    :func:`resamples`). A resample without spread has ``t* = +-inf`` (0 when its mean is the sample's): that is
    where the tails become infinite at 3 pairs."""
    data = np.asarray(data, np.float64)
    r, n = data.shape
    counts, weights = resampled or resamples(n)
    m, sd = data.mean(1), data.std(1, ddof=1)
    centered = data - m[:, None]  # t* is shift-invariant: centering keeps the sums below exact
    mb = centered @ counts.T / n  # (R, B) resample means, minus m
    var = np.maximum((centered**2) @ counts.T - n * mb**2, 0.0) / (n - 1)  # (R, B)
    # A resample drawn from tied pairs has no spread (t* = +-inf); its se* is floored at the sample's se / n, so
    # tied seeds (a metric at a ceiling on some seeds) give a wide but finite edge instead of an infinite one.
    floor = (sd / math.sqrt(n) / n)[:, None] ** 2 * n  # as a variance: (se / n)^2 * n
    scale = np.maximum(np.abs(centered).max(1, keepdims=True), 1e-300)
    flat = np.maximum(var, floor) <= (1e-10 * scale) ** 2  # no spread even after the floor: the sample has none
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(flat, np.sign(np.where(np.abs(mb) <= 1e-12 * scale, 0.0, mb)) * np.inf,
                     mb / np.sqrt(np.maximum(var, floor) / n))
    t = np.nan_to_num(t, nan=0.0, posinf=np.inf, neginf=-np.inf)
    order = np.argsort(t, axis=1, kind="stable")
    w = weights[order]  # (R, B)
    return Studentized(m, sd / math.sqrt(n), np.take_along_axis(t, order, 1), np.cumsum(w, 1),
                       np.cumsum(w[:, ::-1], 1)[:, ::-1])


def bootstrap_t_interval(diffs: np.ndarray, level: float = LEVEL) -> Interval | None:
    """The bootstrap-t interval of the mean of ``diffs`` alone (a candidate the simulation compares); None below 2."""
    diffs = np.asarray(diffs, np.float64)
    if diffs.size < 2:
        return None
    s = studentize(diffs[None])
    low, high = s.quantile_edges((1 - level) / 2)
    return Interval(float(s.m[0]), float(low[0]), float(high[0]), diffs.size, float(diffs.std(ddof=1)), level,
                    tuple(map(float, diffs)), method="bootstrap-t")


def hull_edges(data: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """The verdict interval's ``(low, high)`` for each row of ``data`` (``[R, n]``): the paired t's edges, widened
    to the bootstrap-t's from ``BOOT_MIN_PAIRS`` pairs on."""
    data = np.asarray(data, np.float64)
    n = data.shape[1]
    m, se = data.mean(1), data.std(1, ddof=1) / math.sqrt(n)
    half = t_quantile((1 + level) / 2, n - 1) * se
    low, high = m - half, m + half
    if n >= BOOT_MIN_PAIRS:
        for i in range(0, len(data), CHUNK):  # (CHUNK, B) arrays at a time
            bl, bh = studentize(data[i:i + CHUNK]).quantile_edges((1 - level) / 2)
            low[i:i + CHUNK], high[i:i + CHUNK] = np.minimum(low[i:i + CHUNK], bl), np.maximum(high[i:i + CHUNK], bh)
    return low, high


NO_SPREAD = "none: no spread across seeds"


def interval(diffs: np.ndarray, level: float = LEVEL, seeds: tuple[int, ...] = ()) -> Interval | None:
    """The verdict interval of the mean of ``diffs`` (see the module docstring); None with fewer than 2. When every
    difference is the same, the seeds say nothing about the spread: the interval is infinite (p = 1 for every
    claim), never a zero-width interval with p = 0 (per-example counts can decide instead: :func:`counts_interval`)."""
    diffs = np.asarray(diffs, np.float64)
    if diffs.size < 2:
        return None
    if np.ptp(diffs) <= 1e-12 * max(1.0, float(np.abs(diffs).max())):
        return Interval(float(diffs.mean()), -math.inf, math.inf, diffs.size, 0.0, level, (), tuple(seeds), NO_SPREAD,
                        lambda lv: (-math.inf, math.inf))
    low, high = hull_edges(diffs[None], level)
    method = INTERVAL if diffs.size >= BOOT_MIN_PAIRS else "paired t"
    return Interval(float(diffs.mean()), float(low[0]), float(high[0]), diffs.size, float(diffs.std(ddof=1)), level,
                    tuple(map(float, diffs)), tuple(seeds), method)


def paired(baseline: Mapping[int, float], other: Mapping[int, float], level: float = LEVEL) -> Interval | None:
    """The verdict interval of ``other - baseline`` over their shared seeds; None with fewer than 2 shared."""
    seeds = tuple(sorted(set(baseline) & set(other)))
    return interval(differences(baseline, other), level, seeds)


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


# --- one-sided tests: the interval's edges as p-values ----------------------------------------------------------

def p_values_above(data: np.ndarray, x: np.ndarray | float, boot: Studentized | None = None) -> np.ndarray:
    """Per row of ``data`` (``[R, n]``) the one-sided p of ``H0: mean <= x`` under the verdict interval: the
    larger of the t-test's and (from ``BOOT_MIN_PAIRS`` pairs) the bootstrap-t's. ``boot``: ``studentize(data)``
    when the caller has it."""
    data = np.asarray(data, np.float64)
    n = data.shape[1]
    m, se = data.mean(1), data.std(1, ddof=1) / math.sqrt(n)
    dist = m - np.broadcast_to(np.asarray(x, np.float64), m.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(se > 0, dist / np.where(se > 0, se, 1.0), np.sign(dist) * np.inf)
    p = np.where(np.isnan(c), 1.0, scipy_stats.t.sf(np.nan_to_num(c, nan=0.0), n - 1))
    p = np.where(c == np.inf, 0.0, np.where(c == -np.inf, 1.0, p))
    if n >= BOOT_MIN_PAIRS and np.any(se > 0):
        p = np.maximum(p, np.where(se > 0, (boot or studentize(data)).p_above(np.where(se > 0, c, 0.0)), p))
    return p


def p_above(diff: Interval, threshold: float) -> float:
    """One-sided p-value of ``H0: mean <= threshold`` (small when the data say the mean is above it), the test its
    own lower edge makes: the hull's from its differences, a counts interval's from its ``edges`` function, else
    (a paired t-interval) the t-test's from its mean and sd."""
    if diff.values and diff.method == INTERVAL:
        return float(p_values_above(np.array([diff.values]), threshold)[0])
    if diff.edges is not None:
        return _p_by_level(lambda a: diff.edges(1 - 2 * a)[0] > threshold)
    return _p_tail(diff, diff.mean - threshold)


def p_below(diff: Interval, threshold: float) -> float:
    """One-sided p-value of ``H0: mean >= threshold``."""
    if diff.values and diff.method == INTERVAL:
        return float(p_values_above(-np.array([diff.values]), -threshold)[0])
    if diff.edges is not None:
        return _p_by_level(lambda a: diff.edges(1 - 2 * a)[1] < threshold)
    return _p_tail(diff, threshold - diff.mean)


def _p_by_level(holds: Callable[[float], bool]) -> float:
    """The smallest one-sided level ``a`` at which ``holds(a)`` (an interval edge at level ``1 - 2a`` clears a
    threshold), by bisection: the p-value of that edge's test. 1 when it never holds below 0.5."""
    low, high = 1e-12, 0.5
    if not holds(high - 1e-12):
        return 1.0
    if holds(low):
        return low
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if holds(mid) else (mid, high)
    return high


def _p_tail(diff: Interval, distance: float) -> float:
    """``P(T_{n-1} >= distance / se)``; with zero spread the data decide exactly (0 or 1)."""
    if diff.se == 0.0 or not math.isfinite(diff.se):
        return 0.0 if distance > 0 else 1.0
    return float(scipy_stats.t.sf(distance / diff.se, diff.pairs - 1))


# --- what few seeds cannot show: collapsed seeds, zero spread -----------------------------------------------------

COLLAPSE_SDS = 4.0  # a seed is collapsed when its difference lies this many planned sds from the median
COLLAPSE_MADS = 8.0  # ... or, without a planned sd, this many robust sds (MAD x 1.4826) of the other seeds


def collapsed(diffs: Mapping[int, float], planned_sd: float | None, margin: float) -> list[int]:
    """The seeds whose paired difference is far from the rest: farther from the median of all differences than
    ``COLLAPSE_SDS`` planned sds (the pilot's sd's upper limit, fixed before the run), or without a plan farther
    from the median of the other seeds than ``COLLAPSE_MADS`` of their robust sds; never closer than 2 margins.
    A run that fails to train on one seed shows as one such seed (tests/test_stats.py measures the rule's false
    and true rates)."""
    seeds = sorted(diffs)
    values = np.array([diffs[s] for s in seeds], np.float64)
    if values.size < 3:
        return []
    out = []
    for i, s in enumerate(seeds):
        if planned_sd is not None:
            center, reach = float(np.median(values)), COLLAPSE_SDS * planned_sd
        else:
            others = np.delete(values, i)
            center = float(np.median(others))
            reach = COLLAPSE_MADS * 1.4826 * float(np.median(np.abs(others - center)))
        if abs(values[i] - center) > max(reach, 2 * margin):
            out.append(s)
    return out


def collapse_rate_bound(n: int, level: float = LEVEL) -> float:
    """With no collapse in ``n`` seeds, the rate of collapse the data exclude at ``level``: ``1 - (1-level)^(1/n)``
    (45% at 5 seeds, 26% at 10: few seeds cannot rule out a variant that sometimes fails)."""
    return 1.0 - (1.0 - level) ** (1.0 / n)


def clopper_pearson(k: int, total: int, level: float) -> tuple[float, float]:
    """The exact (Clopper-Pearson 1934) interval of a rate from ``k`` of ``total``."""
    a = 1 - level
    low = 0.0 if k <= 0 else float(scipy_stats.beta.ppf(a / 2, k, total - k + 1))
    high = 1.0 if k >= total else float(scipy_stats.beta.ppf(1 - a / 2, k + 1, total - k))
    return low, high


def binomial_difference(other: tuple[int, int], baseline: tuple[int, int] | float,
                        level: float = LEVEL) -> tuple[float, float]:
    """An interval for ``p_other - p_baseline`` from pooled per-example counts ``(correct, total)`` (``baseline``
    a number: a fixed value such as perfect recall, 1.0): each rate's Clopper-Pearson interval -- at
    ``1 - (1 - level) / 2`` each when both are estimated (Bonferroni) -- then the difference of the far edges. For a
    difference with no spread across seeds (a floor or ceiling), where seeds carry nothing to build a t from."""
    if isinstance(baseline, (int, float)) and not isinstance(baseline, bool):
        low, high = clopper_pearson(*other, level)
        return low - baseline, high - baseline
    each = 1 - (1 - level) / 2
    (ol, oh), (bl, bh) = clopper_pearson(*other, each), clopper_pearson(*baseline, each)
    return ol - bh, oh - bl


def counts_interval(other: list[tuple[int, int]], baseline: list[tuple[int, int]] | float, diffs: np.ndarray,
                    level: float = LEVEL, seeds: tuple[int, ...] = ()) -> Interval:
    """The verdict interval of a zero-spread difference from per-example counts: per seed
    :func:`binomial_difference` of that seed's counts, and the hull over seeds (every seed is scored on the same
    test examples, so pooling them would count each example once per seed), with its edges at any level (its
    one-sided tests come from them)."""
    pairs = list(zip(other, baseline if isinstance(baseline, list) else [baseline] * len(other)))

    def edges(lv: float) -> tuple[float, float]:
        each = [binomial_difference(o, b, lv) for o, b in pairs]
        return min(e[0] for e in each), max(e[1] for e in each)
    low, high = edges(level)
    return Interval(float(np.mean(diffs)), low, high, len(diffs), 0.0, level, (), tuple(seeds),
                    "Clopper-Pearson on per-example counts (no spread across seeds)", edges)


# --- coverage, planning helpers, multiplicity -------------------------------------------------------------------

def coverage(interval_fn, draw, n: int, truth: float, simulations: int = 4000, seed: int = 0) -> float:
    """The share of ``simulations`` simulated sweeps of ``n`` paired differences (``draw(rng, shape)``) whose
    ``interval_fn(diffs) -> Interval`` (or, batched, ``interval_fn(data [R, n]) -> (low, high)``) contains
    ``truth``: how often the interval really covers (tests/test_stats.py, scripts/interval_coverage.py)."""
    data = draw(np.random.default_rng(seed), (simulations, n))  # (D, n)
    if getattr(interval_fn, "batched", False):
        low, high = interval_fn(data)
        return float(np.mean((low <= truth) & (truth <= high)))
    return float(np.mean([(lambda iv: iv.low <= truth <= iv.high)(interval_fn(row)) for row in data]))


def batched(fn):
    """Marks ``fn(data [R, n]) -> (low [R], high [R])`` for :func:`coverage`."""
    fn.batched = True
    return fn


def sd_upper(sd: float, n: int, confidence: float = 0.8) -> float:
    """The one-sided upper confidence limit of a standard deviation measured on ``n`` normal values:
    ``sd sqrt((n - 1) / chi2_{1 - confidence, n - 1})`` (1.56 x sd at 80% from 5 values, 2.12 x from 3)."""
    return sd * math.sqrt((n - 1) / scipy_stats.chi2.ppf(1 - confidence, n - 1))


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
