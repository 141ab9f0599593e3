"""The random pruning baseline is what its name says: each seed draws its own orders, the curve averages several,
and one head removed at random has an exact expectation (the single-head ablations averaged) that the averaged
curve estimates. A head's 'value' here is a weight the scorer adds up, so every score is written out."""

import numpy as np
import pytest

from attn_lab.analysis import pruning

SHAPES = {"encoder_self": (2, 4), "cross": (2, 4)}
WEIGHTS = {k: np.random.default_rng(i).uniform(0, 1, s) for i, (k, s) in enumerate(SHAPES.items())}


def score(state, masks):
    """The metric: the weights of the heads still on (masks 0/1), as the analysis scorer returns (loss, metric)."""
    return 0.0, float(sum((WEIGHTS[k] * masks[k]).sum() for k in SHAPES))


@pytest.fixture(autouse=True)
def fixed_importance(monkeypatch):
    monkeypatch.setattr(pruning, "head_importance", lambda *a, **k: {k: w.copy() for k, w in WEIGHTS.items()})


def curve(seed, orders=1):
    return pruning.pruning_curve({}, [], SHAPES, score, None, order="random", fraction=1 / 16, seed=seed,
                                 random_orders=orders)


def first_removed(points):
    """The weight the first step removed (score drop) -- which head went first."""
    return round(points[0]["score"] - points[1]["score"], 12)


def test_each_seed_draws_its_own_order_and_a_seed_repeats_its_own():
    firsts = {first_removed(curve(seed)) for seed in range(8)}
    assert len(firsts) >= 4  # not one fixed head on every seed
    assert curve(3) == curve(3)


def test_the_random_curve_is_the_mean_of_its_orders_each_from_the_seeds_own_stream():
    got = curve(5, orders=4)
    assert len(got[1]["scores"]) == 4 and len(set(got[1]["scores"])) > 1  # four different first heads
    for point in got:
        assert point["score"] == pytest.approx(np.mean(point["scores"]))
    flat = [w for k in SHAPES for w in WEIGHTS[k].ravel()]  # heads in the order pruning lists them
    full = sum(flat)
    for r, first in enumerate(got[1]["scores"]):  # order r's first head: the first of permutation (seed 5, r)
        head = np.random.default_rng([5, r]).permutation(len(flat))[0]
        assert first == pytest.approx(full - flat[head])


def test_exact_expectation_of_one_head_removed_against_brute_force_and_the_averaged_curve():
    full = score(None, {k: np.ones(s) for k, s in SHAPES.items()})[1]
    deltas, outcomes = {}, []
    for k, (layers, heads) in SHAPES.items():
        deltas[k] = np.zeros((layers, heads))
        for layer in range(layers):
            for head in range(heads):
                masks = {kk: np.ones(s) for kk, s in SHAPES.items()}
                masks[k][layer, head] = 0.0
                outcomes.append(score(None, masks)[1])
                deltas[k][layer, head] = outcomes[-1] - full
    exact = pruning.expected_one_head_removal(full, deltas)
    assert exact == pytest.approx(np.mean(outcomes))
    many = curve(11, orders=400)[1]["score"]  # the averaged curve's first step estimates it, within 4 se
    assert many == pytest.approx(exact, abs=4 * np.std(outcomes) / np.sqrt(400))
