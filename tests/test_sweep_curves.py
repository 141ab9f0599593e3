"""A sweep's learning curves per variant (attn_lab/reporting/curves.py): the mean over seeds and the band from the
lowest to the highest seed at each step, checked against numbers written out here."""

import json

import numpy as np
import pytest

from attn_lab.reporting.curves import variant_curves, variant_name, write_variant_curves


def _trial(sweep, name, train, validation):
    folder = sweep / name
    folder.mkdir()
    lines = [{"step": s, "train/loss": v} for s, v in train] + [{"step": s, "eval/loss": v} for s, v in validation]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.mark.parametrize("trial,variant", [
    ("variant=A-h8,seed=3", "variant=A-h8"), ("seed=0,num_heads=2", "num_heads=2"),
    ("num_heads=2,seed=10,lr=0.1", "num_heads=2,lr=0.1"), ("seed=1", "all")])
def test_a_variant_is_its_trial_name_without_the_seed(trial, variant):
    assert variant_name(trial) == variant


def test_curves_are_the_mean_and_range_over_seeds_at_the_steps_every_seed_logged(tmp_path):
    _trial(tmp_path, "v=a,seed=0", [(10, 4.0), (20, 2.0), (30, 1.0)], [(20, 2.5)])
    _trial(tmp_path, "v=a,seed=1", [(10, 3.0), (20, 1.0)], [(20, 1.5)])  # stopped logging earlier
    _trial(tmp_path, "v=b,seed=0", [(10, 5.0), (20, 4.0)], [])
    _trial(tmp_path, "v=b,seed=1", [(10, 9.0), (20, 9.0)], [])  # failed: not in the curves
    rows = [{"trial": "v=a,seed=0", "status": "ok"}, {"trial": "v=a,seed=1", "status": "skipped"},
            {"trial": "v=b,seed=0", "status": "ok"}, {"trial": "v=b,seed=1", "status": "failed: x"}]
    curves = variant_curves(str(tmp_path), rows)
    steps, mean, low, high = curves["train"]["v=a"]
    assert steps == [10, 20]
    np.testing.assert_allclose(mean, [3.5, 1.5])
    np.testing.assert_allclose(low, [3.0, 1.0])
    np.testing.assert_allclose(high, [4.0, 2.0])
    np.testing.assert_allclose(curves["train"]["v=b"][1], [5.0, 4.0])
    assert list(curves["validation"]) == ["v=a"]  # b validated on no seed
    np.testing.assert_allclose(curves["validation"]["v=a"][1:], [[2.0], [1.5], [2.5]])
    path = write_variant_curves(str(tmp_path), str(tmp_path), rows)
    assert path == str(tmp_path / "curves.png") and (tmp_path / "curves.png").stat().st_size > 0
