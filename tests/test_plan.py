"""The plan against a simulation written out here, its decision table against the interval's, the family it picks,
and the whole pilot-then-verdict procedure's operating characteristics (what docs/sweeps.md prints:
``python scripts/plan_characteristics.py``)."""

import numpy as np
import pytest

from attn_lab.reporting import plan, stats
from attn_lab.reporting.verdicts import ALPHA, Finding, decide

M = 0.02
UP, DOWN, SAME, NOT_WORSE = (Finding("c", "p", d, margin=M) for d in ("up", "down", "same", "not_worse"))


@pytest.mark.parametrize("finding, effect, sd, n", [(DOWN, -0.05, 0.03, 5), (NOT_WORSE, -0.005, 0.01, 6),
                                                    (SAME, 0.004, 0.006, 4), (UP, 0.03, 0.02, 3)])
def test_chance_of_a_verdict_against_a_simulation_written_out(finding, effect, sd, n):
    """The plan reuses standard-normal draws (the t statistic and the bootstrap-t are affine-invariant); here fresh
    draws go through the verdict interval and the decision table one run at a time."""
    rng = np.random.default_rng(7)
    runs = [decide(finding, stats.interval(effect + sd * rng.standard_normal(n))) for _ in range(600)]
    direct = np.mean([v != "inconclusive" for v in runs])
    assert plan.chance_of_verdict(finding.direction, M, effect, sd, n, ALPHA) == pytest.approx(direct, abs=0.06)


@pytest.mark.parametrize("finding", [UP, DOWN, SAME, NOT_WORSE])
def test_the_plans_decision_table_is_the_verdicts(finding):
    rng = np.random.default_rng(1)
    data = rng.normal(rng.normal(0, 0.03, (300, 1)), rng.uniform(0.002, 0.04, (300, 1)), (300, 5))
    codes = plan.outcomes(finding.direction, M, 0.0, 1.0, 5, ALPHA, data=data)
    assert [plan.NAMES[c] for c in codes] == [decide(finding, stats.interval(row)) for row in data]


def test_a_large_effect_is_planned_in_whatever_its_margin_and_noise_near_the_margin_is_not():
    findings = {"big": dataclasses_replace(DOWN, margin=0.001), "edge": UP, "none": SAME}
    got = plan.plan(findings, {"big": -0.3, "edge": 0.02, "none": None}, {"big": 0.05, "edge": 0.02, "none": 0.01},
                    pilot_pairs=5, seeds=5)
    assert got["big"]["confirmatory"] and got["big"]["chance"] >= plan.POWER and got["big"]["seeds_needed"] <= 5
    assert not got["edge"]["confirmatory"] and got["edge"]["chance"] < 0.5
    assert got["edge"]["seeds_needed"] is None or got["edge"]["seeds_needed"] > 5
    assert got["none"]["chance"] is None and not got["none"]["confirmatory"]
    assert got["big"]["sd_plan"] == pytest.approx(stats.sd_upper(0.05, 5))  # planned with the pessimistic sd
    assert got["big"]["alpha"] == pytest.approx(ALPHA)  # a family of one


def test_the_family_is_planned_at_its_holm_floor():
    """Two findings that each pass at 0.025 alone but not at 0.0125: the family keeps the likelier one, at 0.025."""
    findings = {"a": UP, "b": UP}
    effect, sd = {"a": 0.075, "b": 0.072}, {"a": 0.02, "b": 0.02}
    alone = {k: plan.chance_of_verdict("up", M, effect[k], stats.sd_upper(sd[k], 5), 5, ALPHA) for k in findings}
    halved = {k: plan.chance_of_verdict("up", M, effect[k], stats.sd_upper(sd[k], 5), 5, ALPHA / 2) for k in findings}
    assert min(alone.values()) >= plan.POWER > max(halved.values()), (alone, halved)
    got = plan.plan(findings, effect, sd, 5, 5)
    assert [k for k in findings if got[k]["confirmatory"]] == ["a"] and got["a"]["alpha"] == pytest.approx(ALPHA)


def test_exploratory_findings_are_never_in_the_family():
    got = plan.plan({"x": dataclasses_replace(UP, exploratory=True)}, {"x": 0.5}, {"x": 0.01}, 5, 5)
    assert got["x"]["chance"] >= plan.POWER and not got["x"]["confirmatory"]


@pytest.mark.parametrize("finding, truths", [(UP, (0.0, M)), (DOWN, (0.0, -M)), (NOT_WORSE, (-M,)),
                                             (SAME, (M, -M))])
def test_the_procedure_keeps_its_type_one_error_at_the_boundaries(finding, truths):
    """A pilot of 5 seeds, its plan, then (when confirmatory) a verdict run of 5 fresh seeds: at every truth where a
    claim's null is only just true, false claims stay at or below the one-sided 0.025 (plus simulation error)."""
    for truth in truths:
        for sd in (0.25 * M, M):
            oc = plan.operating_characteristics(finding.direction, M, sd, truth, pilots=1000)
            assert oc["false_claim"] <= ALPHA + 0.012, (truth, sd, oc)  # 2.5 standard errors of 1,000 draws


def test_the_chance_of_a_verdict_grows_with_the_effect():
    got = [plan.operating_characteristics("up", M, 0.5 * M, t, pilots=400)["verdict"] for t in (0, M / 2, M, 2 * M)]
    assert got[3] > got[1] and got[3] > 0.5, got


def dataclasses_replace(finding, **changes):
    import dataclasses

    return dataclasses.replace(finding, **changes)
