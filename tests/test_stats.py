"""The verdict interval's coverage, measured by simulation, and the power helpers against their formulas.

Coverage: 4,000 simulated sweeps per case (a binomial standard error of 0.0034 at 0.95), each with ``n`` paired
differences drawn around a known mean; the interval covers when it contains that mean. The paired t-interval must
cover 0.93-0.97 at 3, 5 and 10 pairs on normal differences; the percentile bootstrap this project printed before
must fail the same check (it covers ~0.76 / 0.83 at 3 / 5 pairs). Log-normal differences (skewed) are measured
too: no interval for a mean covers its level there at these sizes; the test pins the t-interval's lower bound and
that it beats the bootstrap.
"""

import math

import numpy as np
import pytest

from attn_lab.reporting import stats

SIMULATIONS = 4000
LOW, HIGH = 0.93, 0.97  # the band the stated 95% must fall in for normal differences


def coverage(interval, draw, n, truth, simulations=SIMULATIONS):
    return stats.coverage(interval, draw, n, truth, simulations)


def normal(rng, shape):
    return 0.1 + 0.05 * rng.standard_normal(shape)  # mean 0.1, sd 0.05: a head-count-like gap


LOGNORMAL_MEAN = math.exp(0.5)  # E[exp(Z)], Z ~ N(0, 1): skewness 6.2


def lognormal(rng, shape):
    return np.exp(rng.standard_normal(shape))


@pytest.mark.parametrize("n", [3, 5, 10])
def test_paired_t_covers_its_stated_level_on_normal_differences(n):
    got = coverage(stats.t_interval, normal, n, 0.1)
    assert LOW <= got <= HIGH, f"paired t at {n} pairs covers {got:.3f}"


@pytest.mark.parametrize("n, below", [(3, 0.85), (5, 0.89)])
def test_the_old_percentile_bootstrap_fails_the_same_check(n, below):
    """The check above is not one any interval passes: the percentile bootstrap (2,000 resamples here, as in the
    simulation the issue quotes) covers well under 0.93 at 3 and 5 pairs."""
    boot = lambda d: stats.percentile_bootstrap(d, resamples=2000)
    got = coverage(boot, normal, n, 0.1, simulations=2000)
    assert got < below < LOW, f"percentile bootstrap at {n} pairs covers {got:.3f}"


@pytest.mark.parametrize("n", [3, 5, 10])
def test_paired_t_on_skewed_differences(n):
    """Log-normal differences (skewness 6.2, far beyond what exact-match or accuracy gaps show): every interval
    for the mean undercovers; the t-interval covers 0.84 / 0.83 / 0.85 at 3 / 5 / 10 pairs (measured), the old
    percentile bootstrap 0.65 / 0.73 / 0.81 on the same data. Pinned: at least 0.80, and above the bootstrap."""
    got = coverage(stats.t_interval, lognormal, n, LOGNORMAL_MEAN, simulations=2000)
    boot = coverage(lambda d: stats.percentile_bootstrap(d, resamples=2000), lognormal, n, LOGNORMAL_MEAN,
                    simulations=2000)
    assert 0.80 <= got < HIGH and got > boot + 0.03, f"at {n} pairs: t {got:.3f}, bootstrap {boot:.3f}"


def test_t_interval_against_the_formula_written_out():
    diffs = np.array([0.12, 0.05, 0.18, 0.09, 0.11])
    got = stats.t_interval(diffs)
    mean, sd = diffs.mean(), diffs.std(ddof=1)
    half = 2.7764451051977987 * sd / math.sqrt(5)  # t_{0.975, 4}, from a table
    assert (got.mean, got.low, got.high, got.sd, got.pairs) == pytest.approx((mean, mean - half, mean + half, sd, 5))
    assert stats.t_interval(diffs[:1]) is None


def test_paired_t_pairs_by_seed_not_by_position():
    """A constant per-seed gain has a zero-width interval even when seeds differ a lot from each other."""
    base = {s: float(s) for s in range(6)}
    got = stats.paired_t(base, {s: v + 0.25 for s, v in reversed(base.items())} | {9: 5.0})  # seed 9: no pair
    assert (got.mean, got.low, got.high, got.pairs) == pytest.approx((0.25, 0.25, 0.25, 6))
    assert stats.paired_t(base, {7: 1.0}) is None


def test_one_sided_p_values_are_the_interval_edges():
    """``L > x`` exactly when ``p(H0: mean <= x) < 0.025`` (and ``H < x`` when ``p(H0: mean >= x) < 0.025``)."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        d = stats.t_interval(rng.normal(0.02, 0.05, rng.integers(3, 12)))
        x = rng.normal(0.0, 0.05)
        assert (d.low > x) == (stats.p_above(d, x) < 0.025)
        assert (d.high < x) == (stats.p_below(d, x) < 0.025)


def test_c4_and_expected_half_width_against_the_formulas():
    assert stats.c4(2) == pytest.approx(math.sqrt(2 / math.pi))  # 0.7979
    assert stats.c4(5) == pytest.approx(0.9399856, abs=1e-6)  # tabulated (ASTM)
    rng = np.random.default_rng(0)
    sds = rng.standard_normal((200_000, 5)).std(axis=1, ddof=1)
    assert sds.mean() == pytest.approx(stats.c4(5), abs=2e-3)  # E[s] = c4 sigma, by simulation
    assert stats.expected_half_width(0.06, 5) == pytest.approx(2.7764451 * 0.9399856 * 0.06 / math.sqrt(5), rel=1e-6)
    halves = np.array([stats.t_interval(row).high - row.mean() for row in 0.06 * rng.standard_normal((20_000, 5))])
    assert halves.mean() == pytest.approx(stats.expected_half_width(0.06, 5), rel=0.02)
    assert stats.expected_half_width(0.06, 1) == math.inf


def test_seeds_needed_is_the_first_n_whose_half_width_is_below_the_margin():
    for sd, margin in [(0.06, 0.02), (0.008, 0.03), (0.05, 0.05), (0.1, 0.011)]:
        n = stats.seeds_needed(sd, margin)
        assert stats.expected_half_width(sd, n) < margin
        assert n == 2 or stats.expected_half_width(sd, n - 1) >= margin
    assert stats.seeds_needed(1.0, 1e-6) is None  # beyond the limit
    assert stats.seeds_needed(0.0, 0.01) == 2


def test_detectable_difference_has_the_stated_power():
    """At the detectable difference the interval excludes zero in ~80% of simulated runs."""
    sd, n = 0.05, 6
    delta = stats.detectable_difference(sd, n)
    assert delta == pytest.approx((stats.t_quantile(0.975, 5) + stats.t_quantile(0.8, 5)) * sd / math.sqrt(n))
    rng = np.random.default_rng(1)
    excluded = [stats.t_interval(delta + sd * rng.standard_normal(n)).low > 0 for _ in range(4000)]
    assert 0.74 <= np.mean(excluded) <= 0.84  # the normal-approximation formula with t quantiles: ~0.78 here


def test_holm_against_the_step_down_written_out():
    p = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.2}
    # sorted: a 0.01 x4 = 0.04; c 0.03 x3 = 0.09; b 0.04 x2 = 0.08 -> monotone 0.09; d 0.2 x1 -> 0.2
    assert stats.holm(p) == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.2})
    assert stats.holm({"x": 0.3}) == {"x": 0.3}
    assert stats.holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}
