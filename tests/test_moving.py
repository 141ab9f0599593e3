"""The verdict-vs-step figure (attn_lab/reporting/moving.py): each finding's paired difference at every validation
step, against the differences written out by hand from the runs' metrics.jsonl, its interval the verdict's own, and
the figure drawn beside the tables of a tiny finished sweep."""

import json
import os
import textwrap

import numpy as np
import pytest

from attn_lab.reporting import moving
from attn_lab.reporting.stats import paired
from attn_lab.sweep.spec import load_experiment

LOSS = {  # arm -> seed -> validation loss at steps 10, 20, 30 (h1 falls behind h2 as training goes on)
    "h2": {0: [3.0, 2.0, 1.50], 1: [3.1, 2.1, 1.60], 2: [2.9, 1.9, 1.40]},
    "h1": {0: [3.0, 2.1, 1.80], 1: [3.2, 2.2, 1.95], 2: [2.9, 2.05, 1.72]},
}


def _sweep(tmp_path):
    exp_file = tmp_path / "mine.py"
    exp_file.write_text(textwrap.dedent("""
        from attn_lab.experiment import Finding, Metric, Preset

        PRESETS = {"quick": Preset("mine", "configs/numbers.py:quick", {"h1": {"model.num_heads": 1}, "h2": {}},
                                   [0, 1, 2], {"h1": Finding("one head is worse", "-", "down", 0.1)}, "h2",
                                   Metric("test_loss", "minus the loss (nats)", -1.0))}
    """))
    rows = []
    for arm, seeds in LOSS.items():
        for seed, losses in seeds.items():
            trial = tmp_path / "runs" / f"variant={arm},seed={seed}"
            trial.mkdir(parents=True)
            lines = [{"step": 10 * (i + 1), "eval/loss": v} for i, v in enumerate(losses)]
            lines.insert(1, {"step": 15, "train/loss": 9.0})  # a training window: not a validation step
            (trial / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
            rows.append({"variant": arm, "seed": seed, "trial": trial.name, "status": "ok"})
    return load_experiment(f"{exp_file}:quick"), str(tmp_path / "runs"), rows


def test_the_paired_difference_at_each_validation_step_is_the_verdicts_interval(tmp_path):
    exp, sweep, rows = _sweep(tmp_path)
    series = moving.paired_by_step(sweep, rows, exp)["h1"]
    assert series["steps"] == [10, 20, 30] and series["pairs"] == [3, 3, 3]
    for i in range(len(series["steps"])):
        by_hand = [-(LOSS["h1"][s][i] - LOSS["h2"][s][i]) for s in (0, 1, 2)]  # minus the loss: h1 minus h2
        assert series["mean"][i] == pytest.approx(np.mean(by_hand), abs=1e-12)
        want = paired({s: -LOSS["h2"][s][i] for s in range(3)}, {s: -LOSS["h1"][s][i] for s in range(3)})
        assert (series["low"][i], series["high"][i]) == pytest.approx((want.low, want.high), abs=1e-12)
    assert series["mean"][0] > series["mean"][-1]  # the gap grew: still moving at the budget
    assert moving.write_verdict_steps(str(tmp_path), sweep, rows, exp) == str(tmp_path / moving.STEPS_FILE)
    assert os.path.getsize(tmp_path / moving.STEPS_FILE) > 0


def test_no_figure_without_a_per_step_metric_or_with_a_seed_missing_a_step(tmp_path):
    exp, sweep, rows = _sweep(tmp_path)
    assert moving.validation_key("test_loss") == "eval/loss" and moving.validation_key("log_likelihood") is None
    with open(os.path.join(sweep, "variant=h1,seed=2", "metrics.jsonl"), "a") as f:
        f.write('{"step": 40, "eval/loss": 1.5}\n{"step": 50, "eval/lo')  # a step only one seed has; a torn line
    assert moving.paired_by_step(sweep, rows, exp)["h1"]["steps"] == [10, 20, 30]
    import dataclasses

    custom = dataclasses.replace(exp, differences_fn=lambda *a: ({}, {}))  # pruning-like: no per-step counterpart
    assert moving.paired_by_step(sweep, rows, custom) == {}
    assert moving.write_verdict_steps(str(tmp_path), sweep, rows[:3], exp) is None  # the compared arm: none ran
