"""The paired bootstrap against the exact bootstrap distribution, and the verdict rule case by case."""

import itertools

import numpy as np
import pytest

from attn_lab.reporting.verdicts import Finding, Interval, decide, paired_bootstrap, verdict_row


def _exact_percentiles(diffs, level=0.95):
    """Every one of the n^n equally likely resamples of n paired differences, and their mean's percentiles."""
    means = np.array([np.mean(pick) for pick in itertools.product(diffs, repeat=len(diffs))])
    tail = (1 - level) / 2 * 100
    return np.percentile(means, [tail, 100 - tail])


def test_paired_bootstrap_matches_the_exact_bootstrap_distribution():
    base = {0: 0.50, 1: 0.62, 2: 0.55, 3: 0.70, 4: 0.58}
    other = {0: 0.56, 1: 0.61, 2: 0.66, 3: 0.74, 4: 0.60, 9: 0.99}  # seed 9 has no pair: ignored
    diffs = [other[s] - base[s] for s in sorted(base)]
    got = paired_bootstrap(base, other, resamples=200_000)
    low, high = _exact_percentiles(diffs)
    assert got.pairs == 5 and got.mean == pytest.approx(np.mean(diffs), abs=1e-12)
    assert got.low == pytest.approx(low, abs=4e-3) and got.high == pytest.approx(high, abs=4e-3)


def test_paired_bootstrap_pairs_by_seed_not_by_position():
    """A constant per-seed gain has a zero-width interval even when seeds differ a lot from each other."""
    base = {s: float(s) for s in range(6)}
    got = paired_bootstrap(base, {s: v + 0.25 for s, v in reversed(base.items())})
    assert (got.mean, got.low, got.high) == pytest.approx((0.25, 0.25, 0.25))


def test_paired_bootstrap_is_deterministic_and_none_without_shared_seeds():
    base, other = {0: 1.0, 1: 2.0, 2: 4.0}, {0: 1.5, 1: 1.0, 2: 5.0}
    assert paired_bootstrap(base, other) == paired_bootstrap(base, other)
    assert paired_bootstrap(base, {7: 1.0}) is None


UP, DOWN, SAME, NOT_WORSE = (Finding("c", "p", d, margin=0.01) for d in ("up", "down", "same", "not_worse"))


@pytest.mark.parametrize("finding, low, high, expected", [
    (UP, 0.02, 0.05, "reproduced"),
    (UP, -0.05, -0.02, "not reproduced"),
    (UP, -0.005, 0.008, "not reproduced"),  # inside the band: no effect of the claimed size
    (UP, -0.02, 0.05, "inconclusive"),
    (DOWN, -0.05, -0.02, "reproduced"),
    (DOWN, 0.02, 0.05, "not reproduced"),
    (DOWN, -0.05, 0.02, "inconclusive"),
    (SAME, -0.008, 0.009, "reproduced"),
    (SAME, 0.02, 0.04, "not reproduced"),
    (SAME, -0.04, -0.02, "not reproduced"),
    (SAME, -0.005, 0.03, "inconclusive"),
    (NOT_WORSE, -0.008, 0.05, "reproduced"),  # a gain is no loss
    (NOT_WORSE, -0.05, -0.02, "not reproduced"),
    (NOT_WORSE, -0.03, 0.01, "inconclusive"),
])
def test_decide_rule(finding, low, high, expected):
    assert decide(finding, Interval((low + high) / 2, low, high, pairs=5)) == expected


def test_too_few_pairs_or_no_interval_is_inconclusive():
    assert decide(UP, Interval(0.5, 0.4, 0.6, pairs=2)) == "inconclusive"
    assert decide(UP, None) == "inconclusive"
    assert verdict_row(UP, None) == ["c", "p", "–", "inconclusive"]
    assert verdict_row(UP, Interval(0.02, 0.01, 0.03, 5))[2:] == ["+0.020 [+0.010, +0.030] (5 seeds)", "reproduced"]


def test_by_seed_pairs_rows_by_their_seed_column_and_skips_missing_metrics():
    from attn_lab.reporting.verdicts import by_seed

    rows = [{"seed": 2, "m": 0.5}, {"seed": 0, "m": 0.7}, {"seed": 1, "m": None}, {"m": 0.9}]
    assert by_seed(rows, "m") == {2: 0.5, 0: 0.7}


def test_note_says_a_small_run_decides_nothing():
    from attn_lab.reporting.verdicts import verdict_note

    small = verdict_note([(UP, Interval(0.1, 0.0, 0.2, pairs=2))], "exact match")
    assert "decides nothing" in small and "'quick' preset" in small
    assert "decides nothing" not in verdict_note([(UP, Interval(0.1, 0.05, 0.2, pairs=5))], "exact match")
