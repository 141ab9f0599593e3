"""The verdict rule cell by cell, its tests against the interval, Holm over a table, and the design a preset
registers before it runs (undecidable findings, margins changed after the run, pilot runs)."""

import dataclasses
import json
import math

import numpy as np
import pytest

from attn_lab.reporting import stats
from attn_lab.reporting.stats import Interval
from attn_lab.reporting.verdicts import (
    ALPHA,
    UNDECIDABLE,
    Design,
    Finding,
    by_seed,
    claim_p,
    decide,
    judge,
    registered_design,
    registration_notes,
    verdict_rows,
)

M = 0.02
UP, DOWN, SAME, NOT_WORSE = (Finding("c", "p", d, margin=M) for d in ("up", "down", "same", "not_worse"))


def iv(low, high, pairs=5):
    return Interval((low + high) / 2, low, high, pairs, sd=1.0)


@pytest.mark.parametrize("finding, low, high, expected", [
    # up: every cell of the table, and its boundaries
    (UP, 0.03, 0.08, "reproduced"),  # above the margin
    (UP, 0.005, 0.05, "reproduced"),  # above 0, reaching past the margin: real, not shown smaller
    (UP, 0.005, 0.02, "reproduced"),  # H = m: not below the margin
    (UP, 0.004, 0.017, "smaller than published"),  # inside the margin but excluding zero
    (UP, -0.005, 0.015, "not reproduced"),  # inside the band around zero: no effect of the margin's size
    (UP, -0.06, 0.015, "not reproduced"),  # below the margin (a large reverse effect is possible, not the claim)
    (UP, -0.05, -0.03, "not reproduced"),  # reversed
    (UP, -0.005, 0.05, "inconclusive"),  # straddles zero and the margin
    (UP, 0.0, 0.05, "inconclusive"),  # L = 0 is not above zero
    # down mirrors up
    (DOWN, -0.08, -0.03, "reproduced"),
    (DOWN, -0.017, -0.004, "smaller than published"),  # e.g. variants' 'local below dense' at -0.011
    (DOWN, -0.015, 0.005, "not reproduced"),
    (DOWN, 0.03, 0.05, "not reproduced"),
    (DOWN, -0.05, 0.005, "inconclusive"),
    # same: equivalence within the band
    (SAME, -0.015, 0.018, "reproduced"),
    (SAME, -0.02, 0.01, "inconclusive"),  # touches the band edge
    (SAME, 0.03, 0.05, "not reproduced"),
    (SAME, -0.05, -0.03, "not reproduced"),
    (SAME, -0.005, 0.03, "inconclusive"),  # straddles the upper edge
    (SAME, 0.005, 0.03, "inconclusive"),  # excludes zero, straddles the edge
    (SAME, -0.055, 0.032, "inconclusive"),  # wider than the band (head_count's 16 vs 8 heads)
    # not worse: non-inferiority
    (NOT_WORSE, -0.015, 0.05, "reproduced"),
    (NOT_WORSE, 0.01, 0.05, "reproduced"),  # a gain is no loss
    (NOT_WORSE, -0.05, -0.03, "not reproduced"),
    (NOT_WORSE, -0.03, 0.01, "inconclusive"),
    (NOT_WORSE, -0.02, 0.01, "inconclusive"),  # L = -m
])
def test_decision_table(finding, low, high, expected):
    assert decide(finding, iv(low, high)) == expected


def test_too_few_pairs_or_no_interval_is_inconclusive():
    assert decide(UP, iv(0.4, 0.6, pairs=2)) == "inconclusive"
    assert decide(UP, None) == "inconclusive"


@pytest.mark.parametrize("finding", [UP, DOWN, SAME, NOT_WORSE])
def test_each_verdict_is_exactly_its_claims_one_sided_test(finding):
    """On real t-intervals: the decision table reaches a verdict exactly when that verdict's claim has p < ALPHA,
    so Holm over claim p-values corrects the same decisions the table makes."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        d = stats.t_interval(rng.normal(rng.normal(0, 0.03), rng.uniform(0.002, 0.04), rng.integers(3, 12)))
        verdict = decide(finding, d)
        p = claim_p(finding, d, verdict)
        assert (p < ALPHA) == (verdict != "inconclusive"), (verdict, p, d)


def _design(sd=0.01, **findings):
    findings = findings or {"a": UP}
    return Design(findings, {k: sd for k in findings}, "pilot", (0, 1, 2))


def test_plan_marks_findings_the_seeds_cannot_decide_before_the_run():
    design = Design({"big": UP, "small": SAME, "none": NOT_WORSE}, {"big": 0.005, "small": 0.06, "none": None})
    plan = design.plan(5)
    assert plan["big"]["decidable"] and plan["big"]["half_width"] == pytest.approx(
        stats.expected_half_width(0.005, 5))
    assert not plan["small"]["decidable"] and plan["small"]["seeds_needed"] == stats.seeds_needed(0.06, M)
    assert not plan["none"]["decidable"] and plan["none"]["seeds_needed"] is None  # no pilot: nothing known
    assert not design.plan(2)["big"]["decidable"]  # below MIN_PAIRS


def test_powered_seeds_make_every_finding_decidable():
    design = Design({"a": UP, "b": SAME}, {"a": 0.01, "b": 0.05})
    seeds = design.powered_seeds(first=100)
    assert seeds[0] == 100 and len(seeds) == stats.seeds_needed(0.05, M)
    assert all(p["decidable"] for p in design.plan(len(seeds)).values())
    with pytest.raises(ValueError, match="needs a pilot sd"):
        Design({"a": UP}, {"a": None}).powered_seeds()


def test_judge_undecidable_whatever_the_data_and_holm_over_the_decidable_family():
    findings = {"a": UP, "b": UP, "c": UP, "u": SAME}
    design = Design(findings, {"a": 0.004, "b": 0.004, "c": 0.004, "u": 0.5})
    rng = np.random.default_rng(1)
    # a: a clear gain; b: a gain with one-sided p 0.015 (< 0.025 alone; Holm's second step needs < 0.025 / 2);
    # c: straddles zero and the margin (inconclusive: it claims nothing, p = 1, but counts in the family)
    diffs = {"a": stats.t_interval(0.05 + 0.004 * rng.standard_normal(5)), "b": _interval_with_p(0.015),
             "c": Interval(0.01, -0.015, 0.035, 5, 0.02),
             "u": stats.t_interval(np.array([0.001, -0.001, 0.0, 0.0005, -0.0005]))}  # would pass alone
    assert decide(UP, diffs["b"]) == "reproduced"  # unadjusted it would stand
    got = {j.key: j for j in judge(design, diffs, seeds=5)}
    assert got["u"].verdict == UNDECIDABLE and got["u"].p_holm is None  # decided before looking at the data
    assert got["a"].verdict == "reproduced"
    assert got["c"].verdict == "inconclusive" and got["c"].p_holm == 1.0
    assert got["b"].verdict == "inconclusive" and got["b"].p_holm == pytest.approx(0.03, rel=1e-3)  # 2 x 0.015
    assert got["a"].p_holm == pytest.approx(3 * claim_p(UP, diffs["a"], "reproduced"))


def _interval_with_p(p: float, n: int = 5, sd: float = 0.01) -> Interval:
    """An interval whose one-sided p-value against 0 is ``p`` and whose upper end is far past the margin."""
    se = sd / math.sqrt(n)
    mean = stats.t_quantile(1 - p, n - 1) * se
    half = stats.t_quantile(0.975, n - 1) * se
    return Interval(mean, mean - half, mean + half, n, sd)


def test_exploratory_findings_are_shown_but_never_in_the_family():
    design = Design({"a": UP, "x": dataclasses.replace(UP, exploratory=True)}, {"a": 0.004, "x": 0.004})
    d = _interval_with_p(0.015)
    got = {j.key: j for j in judge(design, {"a": d, "x": d}, seeds=5)}
    assert got["x"].verdict == "reproduced (exploratory)" and got["x"].p_holm is None
    assert got["a"].verdict == "reproduced" and got["a"].p_holm == pytest.approx(0.015, rel=1e-3)  # a family of 1


def test_rows_show_the_interval_its_sd_against_the_plan_and_holm_p():
    design = _design(0.01)
    d = stats.t_interval(np.array([0.05, 0.06, 0.04, 0.05, 0.055]))
    (row,) = verdict_rows(judge(design, {"a": d}, seeds=5))
    assert row[:3] == ["c", "p", "0.02"]
    assert row[3] == f"{d.text()} (5 seeds)"
    assert row[4] == f"{d.sd:.3f} (0.010)" and row[6] == "reproduced"


def test_registration_round_trip_and_margins_changed_after_the_run(tmp_path):
    exp_file = tmp_path / "exp.py"
    exp_file.write_text("# an experiment\n")
    before = _design(0.01, a=UP, b=SAME)
    registered = json.loads(json.dumps({"experiment_sha256": stats_sha(exp_file), "seeds": [10, 11, 12],
                                        "overrides": {}, "design": before.record()}))
    assert registered_design(registered, None) == before
    (registered_line,) = registration_notes(before, registered, str(exp_file), [10, 11, 12])
    assert registered_line.startswith(f"Registered when the sweep started (sweep.json): experiment sha256 "
                                      f"{stats_sha(exp_file)[:12]}, seeds 10, 11, 12")
    after = _design(0.01, a=dataclasses.replace(UP, margin=0.05), b=SAME)
    exp_file.write_text("# an experiment, margins widened after seeing the data\n")
    notes = " ".join(registration_notes(after, registered, str(exp_file), [10, 11, 12]))
    assert "margins changed after the run" in notes and "'a'" in notes and "'b'" not in notes
    assert "The experiment file changed after the run started" in notes
    pilot = " ".join(registration_notes(before, registered, str(exp_file), [0, 1, 2]))
    assert "pilot" in pilot
    assert "not pre-registered" in " ".join(registration_notes(before, None, str(exp_file), [10]))


def stats_sha(path):
    from attn_lab.reporting.verdicts import file_sha256

    return file_sha256(str(path))


def test_by_seed_pairs_rows_by_their_seed_column_and_skips_missing_metrics():
    rows = [{"seed": 2, "m": 0.5}, {"seed": 0, "m": 0.7}, {"seed": 1, "m": None}, {"m": 0.9}]
    assert by_seed(rows, "m") == {2: 0.5, 0: 0.7}


def test_findings_reject_bad_directions_and_margins():
    with pytest.raises(ValueError, match="direction='sideways'"):
        Finding("c", "p", "sideways", 0.1)
    with pytest.raises(ValueError, match="margin=0"):
        Finding("c", "p", "up", 0)
    with pytest.raises(ValueError, match="finding 'a' has no expected sd"):
        Design({"a": UP}, {})
    for bad in (0, -0.1, float("nan"), float("inf"), "0.1"):
        with pytest.raises(ValueError, match=r"sd\['a'\]=.*allowed: a positive number"):
            Design({"a": UP}, {"a": bad})
    for level in (0.4, 1.0, 95):
        with pytest.raises(ValueError, match="level=.*allowed: a float in"):
            Design({"a": UP}, {"a": 0.1}, level=level)


def test_design_of_picks_rows_and_marks_presets_without_a_pilot():
    findings = {"a": UP, "b": SAME}
    design = Design.of(findings, {"a": 0.01}, "pilot cmd", [0, 1], rows=["a"])
    assert list(design.findings) == ["a"] and design.sd == {"a": 0.01} and design.pilot_seeds == (0, 1)
    bare = Design.of(findings, None, "pilot cmd", (0, 1))
    assert bare.sd == {"a": None, "b": None} and bare.pilot == "no pilot at this preset"
    assert not any(p["decidable"] for p in bare.plan(5).values())


def test_bools_are_no_margins_or_sds_and_a_misspelled_sd_key_stops():
    with pytest.raises(ValueError, match="margin=True"):
        Finding("c", "p", "up", True)
    with pytest.raises(ValueError, match=r"sd\['a'\]=True"):
        Design({"a": UP}, {"a": True})
    with pytest.raises(ValueError, match="sd key 'linformr' is not a finding; findings: a, b"):
        Design.of({"a": UP, "b": SAME}, {"a": 0.01, "linformr": 0.01}, "pilot", (0,))


def test_a_finding_without_finished_trials_stays_in_the_family_and_diverged_seeds_are_no_pairs(tmp_path):
    """If every seed of one compared variant failed, its row stays ('–', inconclusive) and Holm still counts it:
    the other findings are corrected for the family the design registered, not for the rows that happened to
    finish. A non-finite metric (a diverged run) is no pair."""
    from types import SimpleNamespace

    from attn_lab.reporting.verdicts import variant_verdicts

    findings = {"a": dataclasses.replace(UP, claim="a"), "b": dataclasses.replace(UP, claim="b")}
    design = Design(findings, {"a": 0.001, "b": 0.001}, "pilot", (0,))
    exp = SimpleNamespace(design=design, seeds=[1, 2, 3, 4, 5])
    rows = lambda shift: [{"seed": s, "m": 0.5 + shift + 0.001 * s} for s in exp.seeds]  # noqa: E731
    both = variant_verdicts({"base": rows(0), "a": rows(0.1), "b": rows(0.1)}, "base", exp, str(tmp_path), "m", "m")
    one = variant_verdicts({"base": rows(0), "a": rows(0.1)}, "base", exp, str(tmp_path), "m", "m")
    by_claim = lambda table: {r[0]: r for r in table.rows}  # noqa: E731
    assert "Family: 2 findings" in both.note and "Family: 2 findings" in one.note
    assert by_claim(one)["b"][3] == "–" and by_claim(one)["b"][6] == "inconclusive"
    assert by_claim(one)["a"][6] == "reproduced"
    assert by_seed([{"seed": 1, "m": float("nan")}, {"seed": 2, "m": 0.5}, {"seed": 3, "m": None}], "m") == {2: 0.5}


def test_a_pilot_table_still_says_what_its_undecidable_findings_would_need(tmp_path):
    from types import SimpleNamespace

    from attn_lab.reporting.verdicts import variant_verdicts

    design = Design({"a": dataclasses.replace(UP, claim="a")}, {"a": None}, "pilot", (1, 2, 3))
    exp = SimpleNamespace(design=design, seeds=[1, 2, 3])
    rows = lambda shift: [{"seed": s, "m": 0.5 + shift + 0.01 * s} for s in exp.seeds]  # noqa: E731
    table = variant_verdicts({"base": rows(0), "a": rows(0.1)}, "base", exp, str(tmp_path), "m", "m")
    assert table.rows[0][6] == f"{UNDECIDABLE} (pilot)"
    assert "Undecidable at this budget: 'a': no pilot sd" in table.note


def test_the_designs_level_sets_the_interval_and_the_holm_threshold(tmp_path):
    """A design at 80% judges with the 80% paired t-interval (narrower than 95%, written out with scipy's t
    quantile) and calls a verdict at one-sided p < 0.10: a difference that is inconclusive at 95% is decided."""
    from types import SimpleNamespace

    from scipy import stats as sp

    from attn_lab.reporting.verdicts import variant_verdicts

    seeds = [1, 2, 3, 4, 5]
    diff = np.array([0.030, 0.010, 0.050, 0.000, 0.060])  # mean 0.03, sd 0.025
    groups = {"base": [{"seed": s, "m": 0.5} for s in seeds],
              "a": [{"seed": s, "m": 0.5 + d} for s, d in zip(seeds, diff)]}
    finding = {"a": dataclasses.replace(UP, claim="a", margin=0.01)}
    tables = {}
    for level in (0.95, 0.8):
        exp = SimpleNamespace(design=Design(finding, {"a": 0.001}, "pilot", (0,), level=level), seeds=seeds)
        tables[level] = variant_verdicts(groups, "base", exp, str(tmp_path), "m", "m").rows[0]
    half = sp.t.ppf(0.9, 4) * diff.std(ddof=1) / math.sqrt(5)
    assert tables[0.8][3] == f"{diff.mean():+.3f} [{diff.mean() - half:+.3f}, {diff.mean() + half:+.3f}] (5 seeds)"
    assert tables[0.95][6] == "inconclusive" and tables[0.8][6] == "reproduced"


def test_tables_judge_the_registered_design_unless_asked_for_the_current_one(tmp_path):
    """A pilot read after its findings were revised: by default the table judges what sweep.json registered (finding
    'a'); ``judge='current'`` (make_tables --design current) judges the file's design ('z'), labelled as such."""
    import types

    from attn_lab.reporting.verdicts import verdict_table

    registered = _design(0.001, a=UP)
    (tmp_path / "sweep.json").write_text(json.dumps({"experiment": str(tmp_path / "exp.py:quick"), "registration": {
        "experiment_sha256": "0" * 64, "seeds": [10, 11, 12], "overrides": {}, "design": registered.record()}}))
    current = _design(0.001, z=DOWN)
    diffs = {"a": Interval(0.04, 0.03, 0.05, 3, sd=0.004), "z": Interval(-0.04, -0.05, -0.03, 3, sd=0.004)}
    old = verdict_table(current, diffs, "m", str(tmp_path), types.SimpleNamespace(seeds=[10, 11, 12]))
    assert [row[6] for row in old.rows] == ["reproduced"] and "Registered when the sweep started" in old.note
    new = verdict_table(current, diffs, "m", str(tmp_path),
                        types.SimpleNamespace(seeds=[10, 11, 12], judge="current"))
    assert [row[6] for row in new.rows] == ["reproduced (current design)"]
    assert "current design (--design current)" in new.note and "never a verdict" in new.note
