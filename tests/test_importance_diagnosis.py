"""Pruning diagnosis: Spearman's rho against its textbook formulas, and importance vs masking drop per kind."""

import numpy as np
import pytest

from attn_lab.analysis.importance import importance_vs_drop, rank_correlation


def test_rank_correlation_without_ties_is_the_textbook_formula():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=24), rng.normal(size=24)
    d = np.argsort(np.argsort(x)) - np.argsort(np.argsort(y))
    n = len(x)
    assert rank_correlation(x, y) == pytest.approx(1 - 6 * (d**2).sum() / (n * (n**2 - 1)), abs=1e-12)
    assert rank_correlation(x, np.exp(x)) == pytest.approx(1.0)  # any increasing map: rho = 1
    assert rank_correlation(x, -x**3) == pytest.approx(-1.0)


def test_rank_correlation_with_ties_uses_mean_ranks():
    # x ranks: 0, 1.5, 1.5, 3; y ranks: 0, 1, 2, 3 -> Pearson of the centred ranks written out
    rx, ry = np.array([-1.5, 0.0, 0.0, 1.5]), np.array([-1.5, -0.5, 0.5, 1.5])
    expected = (rx * ry).sum() / np.sqrt((rx**2).sum() * (ry**2).sum())
    assert rank_correlation([1.0, 2.0, 2.0, 3.0], [10.0, 20.0, 30.0, 40.0]) == pytest.approx(expected)
    assert np.isnan(rank_correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))


def test_importance_vs_drop_separates_within_kind_from_across_kinds():
    """Within each kind importance orders heads exactly like their masking drop, but the encoder's heads score
    high while barely mattering: the across-kinds rho falls though every within-kind rho is 1."""
    deltas = {"encoder_self": np.array([[-0.001, -0.002], [-0.003, -0.004]]),
              "cross": np.array([[-0.10, -0.20], [-0.30, -0.40]])}
    imp = {"encoder_self": np.array([[5.0, 6.0], [7.0, 8.0]]), "cross": np.array([[1.0, 2.0], [3.0, 4.0]])}
    rho = importance_vs_drop(imp, deltas)
    assert rho["encoder_self"] == pytest.approx(1.0) and rho["cross"] == pytest.approx(1.0)
    drops = np.concatenate([-deltas["encoder_self"].ravel(), -deltas["cross"].ravel()])
    scores = np.concatenate([imp["encoder_self"].ravel(), imp["cross"].ravel()])
    assert rho["all"] == pytest.approx(rank_correlation(scores, drops)) and rho["all"] < 0
