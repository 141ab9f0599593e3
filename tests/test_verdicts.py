"""The verdict rule cell by cell, its tests against the interval, Holm over a table, the design a preset registers
before it runs (the planned family, exploratory rows, margins changed after the run, pilot runs), collapsed seeds and
zero-spread differences."""

import dataclasses
import json
import math

import numpy as np
import pytest

from attn_lab.reporting import stats
from attn_lab.reporting.stats import Interval
from attn_lab.reporting.verdicts import (
    ALPHA,
    EXPLORATORY,
    WITHHELD,
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


def _design(sd=0.01, effect=0.1, **findings):
    """A design whose pilot (seeds 0-4) saw ``effect`` with ``sd``: the default is confirmatory at 3-5 seeds."""
    findings = findings or {"a": UP}
    return Design(findings, {k: sd for k in findings}, "pilot", (0, 1, 2, 3, 4),
                  effect={k: effect * (-1 if f.direction == "down" else 1) for k, f in findings.items()})


def test_plan_uses_the_pilots_effect_and_a_pessimistic_sd():
    design = Design({"big": UP, "small": SAME, "none": NOT_WORSE}, {"big": 0.05, "small": 0.06, "none": None},
                    "pilot", (0, 1, 2, 3, 4), effect={"big": 0.4, "small": 0.01})
    plan = design.plan(5)
    assert plan["big"]["confirmatory"] and plan["big"]["chance"] >= 0.8  # 8 sds from zero: decided at 5 seeds
    assert plan["big"]["sd_plan"] == pytest.approx(stats.sd_upper(0.05, 5))
    assert not plan["small"]["confirmatory"] and plan["small"]["chance"] < 0.2  # noise 3x the margin
    assert plan["none"]["chance"] is None and not plan["none"]["confirmatory"]  # no pilot: exploratory
    assert not design.plan(2)["big"]["confirmatory"]  # below MIN_PAIRS


def test_powered_seeds_give_every_finding_its_chance():
    design = Design({"a": UP, "b": SAME}, {"a": 0.01, "b": 0.02}, "pilot", (0, 1, 2, 3, 4),
                    effect={"a": 0.03, "b": 0.0})
    seeds = design.powered_seeds(first=100)
    assert seeds[0] == 100 and seeds == list(range(100, 100 + len(seeds)))
    assert all(p["chance"] >= 0.8 and p["confirmatory"] for p in design.plan(len(seeds)).values())  # both in
    with pytest.raises(ValueError, match="no finding has a pilot effect and sd"):
        Design({"a": UP}, {"a": None}).powered_seeds()


def test_a_finding_no_seed_count_powers_stays_exploratory_and_the_others_are_powered_as_their_own_family():
    """A pilot effect far inside its noise needs more than plan.MAX_SEEDS seeds: it is left out of the family the
    seeds are counted for (Holm's floor over the one finding left), stays exploratory, and a preset whose findings
    are all like it takes its cap (``Powered``), each finding exploratory."""
    design = Design({"a": UP, "flat": UP}, {"a": 0.01, "flat": 0.05}, "pilot", (0, 1, 2, 3, 4),
                    effect={"a": 0.03, "flat": 0.0})
    alone = Design({"a": UP}, {"a": 0.01}, "pilot", (0, 1, 2, 3, 4), effect={"a": 0.03})
    seeds = design.powered_seeds(first=100)
    assert seeds == alone.powered_seeds(first=100)  # counted with Holm's floor over 'a' alone
    plan = design.plan(len(seeds))
    assert plan["a"]["chance"] >= 0.8 and not plan["flat"]["confirmatory"] and plan["flat"]["seeds_needed"] is None
    with pytest.raises(ValueError, match="no finding has a pilot effect and sd"):
        Design({"flat": UP}, {"flat": 0.05}, "pilot", (0, 1, 2, 3, 4), effect={"flat": 0.0}).powered_seeds()


def test_judge_holm_over_the_planned_family_and_exploratory_rows_for_the_rest():
    findings = {"a": UP, "b": UP, "c": UP, "u": SAME}
    design = Design(findings, {"a": 0.004, "b": 0.004, "c": 0.004, "u": 0.5}, "pilot", (0, 1, 2, 3, 4),
                    effect={"a": 0.05, "b": 0.05, "c": 0.05, "u": 0.0})
    rng = np.random.default_rng(1)
    # a: a clear gain; b: a gain with one-sided p 0.015 (< 0.025 alone; Holm's second step needs < 0.025 / 2);
    # c: straddles zero and the margin (inconclusive: it claims nothing, p = 1, but counts in the family)
    diffs = {"a": stats.t_interval(0.05 + 0.004 * rng.standard_normal(5)), "b": _interval_with_p(0.015),
             "c": Interval(0.01, -0.015, 0.035, 5, 0.02),
             "u": stats.t_interval(np.array([0.001, -0.001, 0.0, 0.0005, -0.0005]))}  # noise far above: exploratory
    assert decide(UP, diffs["b"]) == "reproduced"  # unadjusted it would stand
    # planned at 7 seeds (at 5 the hull's bootstrap-t tails are too coarse for three claims at 0.025 / 3 each)
    assert all(p["confirmatory"] for k, p in design.plan(7).items() if k != "u")
    got = {j.key: j for j in judge(design, diffs, seeds=7)}
    assert got["u"].verdict == f"reproduced (no collapse in 5 seeds: rate < 45%) ({EXPLORATORY})"  # shown,
    assert got["u"].p_holm is None  # never claimed
    assert got["a"].verdict == "reproduced"
    assert got["c"].verdict == "inconclusive" and got["c"].p_holm == 1.0
    assert got["b"].verdict == "inconclusive" and got["b"].p_holm == pytest.approx(0.03, rel=1e-3)  # 2 x 0.015
    assert got["a"].p_holm == pytest.approx(3 * claim_p(UP, diffs["a"], "reproduced"))


def test_no_row_is_ever_withheld_as_undecidable():
    """Whatever the plan says, a decisive interval prints its verdict: confirmatory or exploratory."""
    design = Design({"a": DOWN}, {"a": None}, "pilot", (0, 1, 2))
    d = stats.interval(np.array([-0.71, -0.69, -0.74, -0.70, -0.72]))
    (j,) = judge(design, {"a": d}, seeds=5)
    assert j.verdict == f"reproduced ({EXPLORATORY})" and "undecidable" not in j.verdict


def _interval_with_p(p: float, n: int = 5, sd: float = 0.01) -> Interval:
    """An interval whose one-sided p-value against 0 is ``p`` and whose upper end is far past the margin."""
    se = sd / math.sqrt(n)
    mean = stats.t_quantile(1 - p, n - 1) * se
    half = stats.t_quantile(0.975, n - 1) * se
    return Interval(mean, mean - half, mean + half, n, sd)


def test_exploratory_findings_are_shown_but_never_in_the_family():
    design = Design({"a": UP, "x": dataclasses.replace(UP, exploratory=True)}, {"a": 0.004, "x": 0.004}, "pilot",
                    (0, 1, 2, 3, 4), effect={"a": 0.05, "x": 0.05})
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
    assert row[4] == f"{d.sd:.3f} (0.010)" and row[5] == "0 of 5" and row[7] == "reproduced"


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
    assert not any(p["confirmatory"] for p in bare.plan(5).values())


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
    design = Design(findings, {"a": 0.001, "b": 0.001}, "pilot", (0, 10, 11), effect={"a": 0.1, "b": 0.1})
    exp = SimpleNamespace(design=design, seeds=[1, 2, 3, 4, 5])
    rows = lambda shift: [{"seed": s, "m": 0.5 + shift + 0.001 * s * (s % 2) * (shift > 0)} for s in exp.seeds]  # noqa
    both = variant_verdicts({"base": rows(0), "a": rows(0.1), "b": rows(0.1)}, "base", exp, str(tmp_path), "m", "m")
    one = variant_verdicts({"base": rows(0), "a": rows(0.1)}, "base", exp, str(tmp_path), "m", "m")
    by_claim = lambda table: {r[0]: r for r in table.rows}  # noqa: E731
    assert "Family: 2 findings" in both.note and "Family: 2 findings" in one.note
    assert by_claim(one)["b"][3] == "–" and by_claim(one)["b"][-1] == "inconclusive"
    assert by_claim(one)["a"][-1] == "reproduced"
    assert by_seed([{"seed": 1, "m": float("nan")}, {"seed": 2, "m": 0.5}, {"seed": 3, "m": None}], "m") == {2: 0.5}


def test_a_pilot_table_says_what_its_findings_would_need(tmp_path):
    from types import SimpleNamespace

    from attn_lab.reporting.verdicts import variant_verdicts

    design = Design({"a": dataclasses.replace(UP, claim="a")}, {"a": None}, "pilot", (1, 2, 3))
    exp = SimpleNamespace(design=design, seeds=[1, 2, 3])
    rows = lambda shift: [{"seed": s, "m": 0.5 + shift + 0.01 * s * (shift > 0) * s} for s in exp.seeds]  # noqa
    table = variant_verdicts({"base": rows(0), "a": rows(0.1)}, "base", exp, str(tmp_path), "m", "m")
    assert table.rows[0][-1] == f"reproduced ({EXPLORATORY}) (pilot)"  # shown, labelled twice
    assert "'a' (exploratory): no pilot effect and sd" in table.note


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
        exp = SimpleNamespace(design=Design(finding, {"a": 0.001}, "pilot", (0, 10, 11), level=level,
                                            effect={"a": 0.05}), seeds=seeds)
        tables[level] = variant_verdicts(groups, "base", exp, str(tmp_path), "m", "m").rows[0]
    half = sp.t.ppf(0.9, 4) * diff.std(ddof=1) / math.sqrt(5)
    assert stats.interval(diff, 0.8).low == pytest.approx(diff.mean() - half)  # the t's edge is the hull's here
    assert tables[0.8][3] == f"{stats.interval(diff, 0.8).text()} (5 seeds)"
    assert tables[0.95][-1] == "inconclusive" and tables[0.8][-1] == "reproduced"


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
    assert [row[-1] for row in old.rows] == ["reproduced"] and "Registered when the sweep started" in old.note
    assert old.header[2:4] == ["margin (m)", "ours: m, mean diff [95% CI]"]  # the deciding metric, in the table
    assert old.note.startswith("Decided in m: ") and "docs/sweeps.md#verdicts" in old.note
    new = verdict_table(current, diffs, "m", str(tmp_path),
                        types.SimpleNamespace(seeds=[10, 11, 12], judge="current"))
    assert [row[-1] for row in new.rows] == ["reproduced (current design)"]
    assert "current design (--design current)" in new.note and "never a verdict" in new.note


def test_collapsed_seeds_withhold_same_and_not_worse_reproductions():
    """A 'not worse' reproduction says what collapse rate its seeds exclude; it is withheld when a run seed or a
    pilot seed collapsed; an 'up' finding's verdict is not what a collapse breaks, so it stands (seeds named)."""
    d = stats.interval(np.array([0.001, -0.002, 0.0, 0.002, 0.001]), seeds=(1, 2, 3, 4, 5))
    assert decide(NOT_WORSE, d) == "reproduced"
    design = Design({"a": NOT_WORSE}, {"a": 0.003}, "pilot", (0, 10, 11, 12, 13), effect={"a": 0.0})
    (j,) = judge(design, {"a": d}, seeds=5)
    assert j.verdict == "reproduced (no collapse in 5 seeds: rate < 45%)" and j.collapsed == ()
    bad = dataclasses.replace(design, pilot_collapsed={"a": 1})
    assert judge(bad, {"a": d}, seeds=5)[0].verdict == f"{WITHHELD}: 1 pilot seed collapsed"
    (j,) = judge(design, {"a": d}, seeds=5, diverged={"a": [6]})  # a sixth seed's run diverged: no pair, collapsed
    assert j.verdict == f"{WITHHELD}: 1 of 5 seeds collapsed" and j.collapsed == (6,)
    assert verdict_rows([j])[0][5] == "1 of 6 (6)"
    fell = stats.interval(np.array([0.30, 0.31, 0.29, 0.30, -0.40]), seeds=(1, 2, 3, 4, 5))
    (j,) = judge(Design({"a": UP}, {"a": 0.01}, "pilot", (0, 10, 11, 12, 13), effect={"a": 0.3}), {"a": fell}, 5)
    assert j.collapsed == (5,) and not j.verdict.startswith(WITHHELD)


def test_a_difference_without_spread_is_decided_by_its_counts(tmp_path):
    """Every seed at the ceiling in both rows: no t can be formed from seeds; the pooled per-example counts
    (Clopper-Pearson) decide, or without counts nothing is claimed (p = 0 from seeds alone never)."""
    from attn_lab.reporting.verdicts import compare

    rows = [{"seed": s, "m": 1.0, "m_count": 400} for s in (1, 2, 3)]
    diff, diverged = compare(rows, rows, "m")
    assert diff.method.startswith("Clopper-Pearson") and diverged == []
    assert decide(SAME, diff) == "reproduced" and diff.low > -0.02 and diff.high < 0.02  # 1,200 of 1,200 each
    assert claim_p(SAME, diff, "reproduced") < ALPHA
    bare = [{k: v for k, v in r.items() if k != "m_count"} for r in rows]
    diff, _ = compare(bare, bare, "m")
    assert math.isinf(diff.low) and decide(SAME, diff) == "inconclusive"
    recall, _ = compare([], [{"seed": s, "m": 1.0, "m_count": 300} for s in (1, 2, 3)], "m", fixed=1.0)
    assert decide(NOT_WORSE, recall) == "reproduced" and recall.high == 0.0  # perfect recall vs a fixed 1.0


def test_a_smaller_than_published_claim_that_fails_holm_keeps_its_above_zero_half():
    """'Smaller than published' claims above 0 and below m; when the pair fails Holm but 'above 0' alone passes,
    the row reads 'reproduced' (what the data decide at the family's level), not inconclusive."""
    wide = dataclasses.replace(UP, margin=1.0)
    design = Design({"a": UP, "b": wide}, {"a": 0.1, "b": 0.1}, "pilot", (0, 10, 11, 12, 13),
                    effect={"a": 0.6, "b": 0.6})
    diffs = {"a": _interval_with_p(0.0134), "b": Interval(0.6, 0.277, 0.923, 5, 0.26)}
    assert decide(wide, diffs["b"]) == "smaller than published"
    p_zero, p_margin = stats.p_above(diffs["b"], 0.0), stats.p_below(diffs["b"], 1.0)
    assert p_zero < ALPHA / 2 < p_margin < ALPHA  # the pair fails at Holm's first step, 'above 0' passes it
    got = {j.key: j for j in judge(design, diffs, seeds=9)}
    assert got["b"].verdict == "reproduced" and got["b"].p_holm == pytest.approx(2 * p_zero)
    assert got["a"].verdict == "reproduced"
