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


def test_pruning_orders_normalized_vs_raw_importance():
    """Per-layer normalization reorders heads across layers: with sums [[1, 2], [10, 30]] the normalized scores are
    [[.447, .894], [.316, .949]], so 'importance' prunes layer 1's head 0 first while 'importance_raw' prunes both
    layer-0 heads first. The score counts layer 1's live heads, showing which went."""
    from attn_lab.analysis.pruning import pruning_curve

    sums = np.array([[1.0, 2.0], [10.0, 30.0]])
    batches = [{"inputs": np.zeros((1, 3)), "mask": np.ones(1)}]
    importance_sums = lambda state, batch, masks: {"a": sums}
    score = lambda state, masks: (None, float(masks["a"][1].sum()))
    curve = lambda order: [p["score"] for p in pruning_curve(None, batches, {"a": (2, 2)}, score, importance_sums,
                                                             order=order, fraction=0.25)]
    assert curve("importance") == [2.0, 1.0, 1.0, 1.0]
    assert curve("importance_raw") == [2.0, 2.0, 2.0, 1.0]
    assert curve("reverse") == [2.0, 1.0, 1.0, 1.0]  # normalized, most important first: .949 (layer 1) goes first
