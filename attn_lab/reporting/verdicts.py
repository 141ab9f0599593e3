"""The verdict on a published finding: one decision table, Holm's correction over a table's confirmatory findings,
and the design a preset registers before it runs (what its pilot measured, from which the plan picks the family).

Evidence is the verdict interval of the per-seed difference (compared row minus baseline; the hull of the paired t
and the bootstrap-t, :mod:`.stats`) at ``LEVEL``. A finding says the difference goes ``up`` or ``down`` (by at
least ``margin``, the smallest difference that counts), stays the ``same`` (within ``margin`` either way:
equivalence) or is ``not_worse`` (loses less than ``margin``: non-inferiority). For up/down the interval
``[L, H]`` is first turned to the paper's side (a 'down' finding's difference is negated), so ``m = margin > 0``
below is an effect in the paper's direction.

**The decision table** (:func:`decide`; tests/test_verdicts.py checks every cell):

=========== ============================== ========================== ==========================================
direction   the interval                   verdict                    reading
=========== ============================== ========================== ==========================================
up / down   L > 0 and H >= m               reproduced                 a real effect, not shown smaller than m
up / down   L > 0 and H < m                smaller than published     real, but every value is below the margin
up / down   L <= 0 and H < m               not reproduced             no effect of the margin's size (or reversed)
up / down   L <= 0 and H >= m              inconclusive               straddles zero and the margin
same        -m < L and H < m               reproduced                 equivalent within the band (TOST)
same        L > m or H < -m                not reproduced             differs by more than the margin
same        otherwise                      inconclusive               straddles a band edge
not_worse   L > -m                         reproduced                 loses less than the margin
not_worse   H < -m                         not reproduced             loses more than the margin
not_worse   otherwise                      inconclusive               straddles -m
=========== ============================== ========================== ==========================================

These are Lakens' (2017, "Equivalence tests", Fig. 1) four outcomes of combining a test against zero with a test
against the margin: different from zero and not equivalent (reproduced), different and equivalent (smaller than
published), equivalent and not different (not reproduced), neither (inconclusive). Each interval edge is a one-sided
test at ``(1 - LEVEL) / 2``: ``L > 0`` is ``p(H0: d <= 0) < 0.025``, and so on (:func:`claim_p`).

**The plan, before the run** (:mod:`.plan`). A preset declares, per finding, what a pilot on other seeds measured:
the mean paired difference (its *effect*) and the sd of the per-seed differences. With the preset's seeds, the
plan simulates the verdict run from that effect and a pessimistic sd (the pilot sd's 80% upper limit) and gives the
finding's chance of reaching any verdict; the findings whose chance is at least 0.8 at the family's Holm floor form
the table's **confirmatory family**. A large effect is decided by few seeds however small its margin.

**Multiplicity.** A confirmatory verdict other than inconclusive stands only if its claim's p-value, Holm-adjusted
over the family, is below ``(1 - LEVEL) / 2`` (Holm 1979; with data-chosen directions as in Shaffer 1980);
otherwise the row is inconclusive. A finding outside the family (no pilot, a chance below 0.8, or formed on these
seeds) is still judged by the same table and printed with its interval as ``<verdict> (exploratory)``: never
withheld, never counted as a confirmed claim.

**What few seeds cannot see** (:mod:`.stats`). A seed whose difference lies far from the rest is named as collapsed
(a stated rule: :func:`attn_lab.reporting.stats.collapsed`). 'Same' and 'not worse' claims -- the ones a variant
that sometimes fails to train breaks, and that no interval over seeds that showed no failure can protect -- are
withheld when a run or pilot seed collapsed, and otherwise state the collapse rate their seeds exclude
(``< 1 - 0.05^(1/n)``). A difference with no spread across seeds (a floor or ceiling) is decided from each seed's
per-example counts (Clopper-Pearson, the hull over seeds), never from a zero-width interval over seeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attn_lab.experiment import DIRECTIONS, Direction, Finding  # noqa: F401 (re-exported: the rule's names)
from attn_lab.experiment import is_number as _number
from attn_lab.reporting import plan as plan_lib
from attn_lab.reporting import stats
from attn_lab.reporting.plan import MIN_PAIRS, POWER
from attn_lab.reporting.stats import INTERVAL, LEVEL, Interval, paired

ALPHA = (1 - LEVEL) / 2  # one-sided level of each interval edge
EXPLORATORY = "exploratory"
WITHHELD = "withheld"
VERDICTS = ("reproduced", "smaller than published", "not reproduced", "inconclusive")


@dataclasses.dataclass(frozen=True)
class Design:
    """What a preset promises before it runs (pre-registration): its findings and what a pilot measured.

    Attributes:
      findings: key -> finding (the key names the compared row, or whatever the experiment's report pairs).
      sd: key -> the per-seed standard deviation of that finding's paired difference in the pilot (None: no pilot;
        the finding is exploratory).
      pilot: where the pilot's numbers come from: the command and the seeds of the pilot run.
      pilot_seeds: the seeds the pilot used; a verdict run must use others (a run on them is a pilot itself).
      level: the interval's level.
      effect: key -> the pilot's mean paired difference (compared row minus baseline, as its table printed it;
        None or absent: unknown, so the finding is exploratory).
      pilot_collapsed: key -> how many of the pilot's seeds collapsed (its table's 'collapsed' column); a 'same' or
        'not worse' verdict is withheld when any did.
    """

    findings: Mapping[str, Finding]
    sd: Mapping[str, float | None]
    pilot: str = ""
    pilot_seeds: tuple[int, ...] = ()
    level: float = LEVEL
    effect: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    pilot_collapsed: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        missing = [k for k in self.findings if k not in self.sd]
        if missing:
            raise ValueError(f"Design: finding '{missing[0]}' has no expected sd (give None when no pilot ran)")
        for key, sd in self.sd.items():
            if sd is not None and not (_number(sd) and sd > 0 and math.isfinite(sd)):
                raise ValueError(f"Design: sd['{key}']={sd!r}; allowed: a positive number (None: no pilot)")
        for key, effect in self.effect.items():
            if key not in self.findings:
                raise ValueError(f"Design: effect key '{key}' is not a finding; findings: {', '.join(self.findings)}")
            if effect is not None and not (_number(effect) and math.isfinite(effect)):
                raise ValueError(f"Design: effect['{key}']={effect!r}; allowed: a finite number (None: no pilot)")
        for key, count in self.pilot_collapsed.items():
            if key not in self.findings or not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
                raise ValueError(f"Design: pilot_collapsed['{key}']={count!r}; allowed: a finding's count of "
                                 "collapsed pilot seeds (an int >= 0)")
        if not (isinstance(self.level, float) and 0.5 < self.level < 1):
            raise ValueError(f"Design: level={self.level!r}; allowed: a float in (0.5, 1), e.g. 0.95")
        # one value per finding, so a design and its sweep.json record compare equal
        object.__setattr__(self, "effect", {k: self.effect.get(k) for k in self.findings})
        object.__setattr__(self, "pilot_collapsed", {k: self.pilot_collapsed.get(k, 0) for k in self.findings})

    @classmethod
    def of(cls, findings: Mapping[str, Finding], sd: Mapping[str, float | None] | None, pilot: str,
           pilot_seeds: tuple[int, ...], rows=None, effect: Mapping[str, float | None] | None = None,
           pilot_collapsed: Mapping[str, int] | None = None) -> "Design":
        """A preset's design: the ``findings`` among ``rows`` (default all) with what its pilot measured (``sd``
        None or a key missing: no pilot at this preset, so that finding is exploratory)."""
        for name, given in (("sd", sd), ("effect", effect), ("pilot_collapsed", pilot_collapsed)):
            unknown = sorted(set(given or {}) - set(findings))
            if unknown:
                raise ValueError(f"Design: {name} key '{unknown[0]}' is not a finding; findings: {', '.join(findings)}")
        chosen = {k: f for k, f in findings.items() if rows is None or k in rows}
        return cls(chosen, {k: (sd or {}).get(k) for k in chosen}, pilot if sd else "no pilot at this preset",
                   tuple(pilot_seeds), effect={k: v for k, v in (effect or {}).items() if k in chosen},
                   pilot_collapsed={k: v for k, v in (pilot_collapsed or {}).items() if k in chosen})

    def plan(self, seeds: int) -> dict[str, dict[str, Any]]:
        """Per finding, what ``seeds`` seeds can show (:func:`attn_lab.reporting.plan.plan`): the pilot's effect and
        sd, the sd planned with, the chance of a verdict, whether it is in the confirmatory family, and the seeds
        that would give it a chance of 0.8."""
        return plan_lib.plan(self.findings, self.effect, self.sd, len(self.pilot_seeds), seeds, self.level)

    def powered_seeds(self, first: int = 100) -> list[int]:
        """The seeds (``first``, ``first + 1``, ...) that give every finding with a pilot a chance of a verdict of
        at least 0.8 with all of them in the family: the most any of them needs. A finding that no count up to
        ``plan.MAX_SEEDS`` gives that chance (an effect far inside its noise) is left out of the family it is
        planned for, and stays exploratory at these seeds. For presets meant for an accelerator, where a vectorized
        seed costs almost nothing."""
        family = [k for k, f in self.findings.items() if self.effect.get(k) is not None and self.sd.get(k) is not None
                  and not f.exploratory and len(self.pilot_seeds) >= 2]
        needed = self._seeds_needed(family)
        if None in needed.values():  # plan the findings that can be powered as a family of their own
            needed = self._seeds_needed([k for k, n in needed.items() if n is not None])
        if not needed or None in needed.values():
            raise ValueError("Design.powered_seeds: no finding has a pilot effect and sd that a seed count of at "
                             f"most {plan_lib.MAX_SEEDS} gives a chance of a verdict of 0.8")
        return list(range(first, first + max(needed.values())))

    def _seeds_needed(self, family: list[str]) -> dict[str, int | None]:
        """Per finding of ``family``, the seeds for a 0.8 chance at Holm's first step over that family."""
        floor = (1 - self.level) / 2 / max(len(family), 1)
        return {k: plan_lib.seeds_needed(self.findings[k].direction, self.findings[k].margin, self.effect[k],
                                         stats.sd_upper(self.sd[k], len(self.pilot_seeds), plan_lib.SD_CONFIDENCE),
                                         floor) for k in family}

    def record(self) -> dict[str, Any]:
        """The design as JSON (what ``sweep.json`` keeps)."""
        return {"level": self.level, "pilot": self.pilot, "pilot_seeds": list(self.pilot_seeds),
                "findings": {k: {**dataclasses.asdict(f), "sd": self.sd[k], "effect": self.effect.get(k),
                                 "pilot_collapsed": self.pilot_collapsed.get(k, 0)}
                             for k, f in self.findings.items()}}


def oriented(finding: Finding, diff: Interval) -> Interval:
    """``diff`` turned to the paper's side for an up/down finding (a 'down' difference negated)."""
    if finding.direction != "down":
        return diff
    edges = diff.edges
    return dataclasses.replace(diff, mean=-diff.mean, low=-diff.high, high=-diff.low,
                               values=tuple(-v for v in diff.values),
                               edges=None if edges is None else (lambda lv: tuple(-e for e in edges(lv)[::-1])))


def decide(finding: Finding, diff: Interval | None) -> str:
    """The decision table's verdict on ``finding`` for the interval ``diff`` (see the module docstring); no
    multiplicity here. Fewer than ``MIN_PAIRS`` pairs, or no interval: inconclusive."""
    if diff is None or diff.pairs < MIN_PAIRS:
        return "inconclusive"
    m = finding.margin
    if finding.direction == "not_worse":
        return "reproduced" if diff.low > -m else "not reproduced" if diff.high < -m else "inconclusive"
    if finding.direction == "same":
        if -m < diff.low and diff.high < m:
            return "reproduced"
        return "not reproduced" if diff.low > m or diff.high < -m else "inconclusive"
    d = oriented(finding, diff)
    if d.low > 0:
        return "reproduced" if d.high >= m else "smaller than published"
    return "not reproduced" if d.high < m else "inconclusive"


def claim_p(finding: Finding, diff: Interval, verdict: str) -> float:
    """The one-sided p-value of the claim a verdict makes (1 for inconclusive: it claims nothing). A claim holds at
    ``ALPHA`` exactly when :func:`decide` reaches that verdict (the interval edges are these tests)."""
    m, d = finding.margin, oriented(finding, diff)
    claims = {
        "up": {"reproduced": lambda: stats.p_above(d, 0.0),
               "smaller than published": lambda: max(stats.p_above(d, 0.0), stats.p_below(d, m)),
               "not reproduced": lambda: stats.p_below(d, m)},
        "same": {"reproduced": lambda: max(stats.p_above(diff, -m), stats.p_below(diff, m)),
                 "not reproduced": lambda: (stats.p_above(diff, m) if diff.mean > 0 else stats.p_below(diff, -m))},
        "not_worse": {"reproduced": lambda: stats.p_above(diff, -m),
                      "not reproduced": lambda: stats.p_below(diff, -m)},
    }[{"down": "up"}.get(finding.direction, finding.direction)]
    return claims[verdict]() if verdict in claims else 1.0


@dataclasses.dataclass(frozen=True)
class Judged:
    """One finding's row: the evidence, the plan it was judged under, the seeds that collapsed and the verdict."""

    key: str
    finding: Finding
    diff: Interval | None
    plan: dict[str, Any]
    verdict: str
    p_holm: float | None  # None: not a confirmed claim (exploratory, or without an interval)
    collapsed: tuple[int, ...] = ()


def collapse_guard(finding: Finding, diff: Interval | None, verdict: str, collapsed: Sequence[int],
                   pilot_collapsed: int) -> str:
    """A 'same' / 'not worse' reproduction -- the claims a variant that sometimes fails to train breaks -- is
    withheld when a run or pilot seed collapsed, and otherwise says what collapse rate its seeds exclude."""
    if finding.direction not in ("same", "not_worse") or verdict != "reproduced" or diff is None:
        return verdict
    if collapsed or pilot_collapsed:
        where = (f"{len(collapsed)} of {diff.pairs} seeds" if collapsed else "") + \
                (" and " if collapsed and pilot_collapsed else "") + \
                (f"{pilot_collapsed} pilot seed{'s' * (pilot_collapsed != 1)}" if pilot_collapsed else "")
        return f"{WITHHELD}: {where} collapsed"
    return (f"reproduced (no collapse in {diff.pairs} seeds: rate < "
            f"{stats.collapse_rate_bound(diff.pairs, diff.level):.0%})")


def judge(design: Design, diffs: Mapping[str, Interval | None], seeds: int,
          diverged: Mapping[str, Sequence[int]] | None = None) -> list[Judged]:
    """Every finding of ``design`` that ``diffs`` has, judged by the decision table; the plan at ``seeds`` seeds
    (fixed before the run) says which are confirmatory, and Holm runs over those; ``diverged``: per finding, seeds
    whose compared run has no finite value (they count as collapsed)."""
    plan = design.plan(seeds)
    keys = [k for k in design.findings if k in diffs]
    collapsed = {k: _collapsed(design.findings[k], diffs[k], plan[k], (diverged or {}).get(k, ())) for k in keys}
    raw = {k: collapse_guard(design.findings[k], diffs[k], decide(design.findings[k], diffs[k]), collapsed[k],
                             design.pilot_collapsed.get(k, 0)) for k in keys}
    family = [k for k in keys if plan[k]["confirmatory"]]
    claims = {k: claim_p(design.findings[k], diffs[k], raw[k].split(" (")[0]) if diffs[k] is not None else 1.0
              for k in family}
    adjusted = stats.holm(claims)
    alpha = (1 - design.level) / 2
    for k in family:  # 'smaller than published' = above 0 and below m: if both fail Holm, 'above 0' may still hold
        if raw[k] == "smaller than published" and adjusted[k] >= alpha:
            weaker = stats.holm({**claims, k: claim_p(design.findings[k], diffs[k], "reproduced")})
            if weaker[k] < alpha:
                raw[k], claims, adjusted = "reproduced", {**claims, k: claim_p(design.findings[k], diffs[k],
                                                                                "reproduced")}, weaker
    out = []
    for k in keys:
        if k in family:
            p = adjusted[k]
            verdict = raw[k] if p < alpha or raw[k].startswith(WITHHELD) else "inconclusive"
        else:
            verdict, p = f"{raw[k]} ({EXPLORATORY})", None
        out.append(Judged(k, design.findings[k], diffs[k], plan[k], verdict, p, collapsed[k]))
    return out


def _collapsed(finding: Finding, diff: Interval | None, plan: Mapping[str, Any], diverged: Sequence[int]) -> tuple:
    """The seeds of ``diff`` that collapsed (:func:`attn_lab.reporting.stats.collapsed`, with the planned sd where
    the plan has one) plus the ``diverged`` ones."""
    found = []
    if diff is not None and diff.values and diff.seeds:
        found = stats.collapsed(dict(zip(diff.seeds, diff.values)), plan.get("sd_plan"), finding.margin)
    return tuple(sorted(set(found) | set(diverged)))


# --- pre-registration: what the sweep writes when it starts, and what the table compares it with ---------------

def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def registration(exp: Any, experiment_path: str, command_line: Sequence[str] = ()) -> dict[str, Any]:
    """What a sweep records in ``sweep.json`` before any trial starts: the experiment file's sha256, its design
    (findings, margins, expected sds, pilot seeds), the seeds, the fixed overrides (budgets) and the command-line
    overrides every trial gets (``--config.train.num_steps=...``: a budget too)."""
    return {"experiment_sha256": file_sha256(experiment_path), "seeds": list(exp.seeds),
            "overrides": dict(exp.overrides), "command_line": list(command_line),
            "design": exp.design.record() if exp.design else None}


def registration_notes(design: Design | None, registered: Mapping[str, Any] | None, experiment_path: str,
                       seeds: Sequence[int]) -> list[str]:
    """What a reader must know before trusting the verdicts: no registration, a file or design that changed after
    the run started, a run on the pilot's seeds."""
    if not registered or registered.get("design") is None:
        return ["This sweep recorded no design when it started (an older sweep, or an experiment without one): the "
                "verdicts are not pre-registered."]
    budget = ", ".join(f"{k}={v}" for k, v in sorted(registered.get("overrides", {}).items()) if k.startswith("train."))
    seeds_text = ", ".join(map(str, registered.get("seeds", [])))
    notes = [f"Registered when the sweep started (sweep.json): experiment sha256 "
             f"{registered.get('experiment_sha256', '?')[:12]}, seeds {seeds_text}"
             + (f", budget {budget}" if budget else "")
             + (f", command line {' '.join(registered['command_line'])}" if registered.get("command_line") else "")
             + "."]
    if os.path.exists(experiment_path) and file_sha256(experiment_path) != registered.get("experiment_sha256"):
        notes.append(f"The experiment file changed after the run started (sha256 {registered['experiment_sha256'][:12]}"
                     f" -> {file_sha256(experiment_path)[:12]}).")
    before = registered["design"]["findings"]
    now = design.record()["findings"] if design else {}
    fields = ("claim", "direction", "margin", "sd", "effect")
    def registered_fields(record, key):
        return {f: (record.get(key) or {}).get(f) for f in fields}
    changed = sorted(k for k in set(before) | set(now) if registered_fields(before, k) != registered_fields(now, k))
    if changed:
        notes.append("margins changed after the run: the findings " + ", ".join(f"'{k}'" for k in changed) +
                     " differ from the ones registered when the sweep started; the table judges the registered ones.")
    pilot = sorted(set(seeds) & set(registered["design"].get("pilot_seeds", [])))
    if pilot:
        notes.append(f"This run uses the design's pilot seeds ({', '.join(map(str, pilot))}): it is a pilot, its "
                     "verdicts are exploratory; its per-seed sds are what a design declares.")
    return notes


def registered_design(registered: Mapping[str, Any] | None, fallback: Design | None) -> Design | None:
    """The design as registered when the sweep started (what the verdicts are judged under), else ``fallback``."""
    if not registered or not registered.get("design"):
        return fallback
    rec = registered["design"]
    findings = {k: Finding(**{f: v[f] for f in ("claim", "paper", "direction", "margin", "exploratory")})
                for k, v in rec["findings"].items()}
    return Design(findings, {k: v["sd"] for k, v in rec["findings"].items()}, rec.get("pilot", ""),
                  tuple(rec.get("pilot_seeds", ())), rec.get("level", LEVEL),
                  effect={k: v.get("effect") for k, v in rec["findings"].items()},  # absent before effects: None
                  pilot_collapsed={k: v.get("pilot_collapsed", 0) for k, v in rec["findings"].items()})


# --- the table -------------------------------------------------------------------------------------------------

VERDICT_HEADER = ("finding", "paper (its metric)", "margin", f"ours: mean diff [{LEVEL:.0%} CI]", "sd: run (pilot)",
                  "collapsed seeds", "Holm p", "verdict")
SHORT_RULE = (f"Interval: {INTERVAL} at {LEVEL:.0%} over seeds (Clopper-Pearson on each seed's per-example counts "
              "where every seed gives the same difference). Up/down: the interval beyond 0 and reaching the margin "
              "-> reproduced, beyond 0 short of it -> smaller than published; same: inside ± margin; not worse: above "
              f"-margin; otherwise inconclusive. Confirmatory findings (planned chance of a verdict >= {POWER:g}) "
              f"stand at Holm-adjusted p < {ALPHA:g}; the others are exploratory. The whole rule, collapsed seeds "
              "and the interval's coverage: docs/sweeps.md#verdicts.")


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _p_text(p: float | None) -> str:
    return "–" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def _collapsed_text(j: Judged) -> str:
    if j.diff is None:
        return "–"
    pairs = j.diff.pairs + len(set(j.collapsed) - set(j.diff.seeds))  # a diverged seed is no pair, still a seed
    return f"{len(j.collapsed)} of {pairs}" + (f" ({', '.join(map(str, j.collapsed))})" if j.collapsed else "")


def verdict_rows(judged: Sequence[Judged], digits: int = 3) -> list[list[str]]:
    rows = []
    for j in judged:
        ours = "–" if j.diff is None else f"{j.diff.text(digits)} ({j.diff.pairs} seeds)"
        sd = f"{_fmt(None if j.diff is None else j.diff.sd, digits)} ({_fmt(j.plan['sd'], digits)})"
        rows.append([j.finding.claim, j.finding.paper, f"{j.finding.margin:g}", ours, sd, _collapsed_text(j),
                     _p_text(j.p_holm), j.verdict])
    return rows


def plan_text(plan: Mapping[str, Any], margin: float) -> str:
    """One finding's plan in words: ``pilot effect -0.159, sd 0.064 (planned 0.100): chance of a verdict 0.42 at
    5 seeds (each claim at p < 0.0125); 0.8 at 9 seeds``."""
    if plan["chance"] is None:
        return f"no pilot effect and sd, so what {plan['seeds']} seeds decide is unknown (margin {margin:g})"
    need = plan["seeds_needed"]
    return (f"pilot effect {plan['effect']:+.3f}, sd {_fmt(plan['sd'])} (planned {_fmt(plan['sd_plan'])}): chance "
            f"of a verdict {plan['chance']:.2f} at {plan['seeds']} seeds (claims at p < {plan['alpha']:.3g}); "
            + (f"{POWER:g} at {need} seeds" if need is not None else f"below {POWER:g} even at "
               f"{plan_lib.MAX_SEEDS} seeds"))


def verdict_header(metric: str) -> tuple[str, ...]:
    """:data:`VERDICT_HEADER` with the metric that decides named where the numbers are (the paper's column names
    the paper's metric in each row's text)."""
    return tuple(f"ours: {metric}, mean diff [{LEVEL:.0%} CI]" if h.startswith("ours:") else
                 f"margin ({metric})" if h == "margin" else h for h in VERDICT_HEADER)


def verdict_note(judged: Sequence[Judged], metric: str, notes: Sequence[str] = ()) -> str:
    """The metric, the short rule (the whole one and the interval's coverage: docs/sweeps.md#verdicts), the family,
    the plan of every finding, and the registration notes."""
    family = [j for j in judged if j.plan["confirmatory"]]
    text = (f"Decided in {metric}: compared row minus baseline, paired by seed. {SHORT_RULE} Family: "
            f"{len(family)} finding{'s' * (len(family) != 1)}.")
    plans = "; ".join(f"'{j.key}' ({'confirmatory' if j.plan['confirmatory'] else EXPLORATORY}): "
                      f"{plan_text(j.plan, j.finding.margin)}" for j in judged)
    return " ".join([f"{text} Plan: {plans}.", *notes])


def verdict_table(design: Design | None, diffs: Mapping[str, Interval | None], metric: str, sweep_dir: str,
                  exp: Any, title: str = "Verdicts", diverged: Mapping[str, Sequence[int]] | None = None):
    """The verdict table of ``diffs`` (finding key -> interval) under the design registered in ``sweep_dir``'s
    sweep.json (or ``design`` when none was); None when no finding has a comparison. ``diverged``: per finding,
    the seeds whose compared run ended without a finite value."""
    from attn_lab.reporting.tables import Table, read_sweep_info

    info = read_sweep_info(sweep_dir)
    registered = (info or {}).get("registration")
    current = getattr(exp, "judge", "registered") == "current"
    used = design if current else registered_design(registered, design)
    if used is None or not any(k in diffs for k in used.findings):
        return None
    seeds = list((registered or {}).get("seeds") or getattr(exp, "seeds", []))
    judged = judge(used, diffs, len(seeds), diverged)
    path = ((info or {}).get("experiment") or "").rsplit(":", 1)[0]
    notes = (["Judged under the experiment file's current design (--design current), not the one registered when "
              "the sweep started: a reading of a finished run under revised findings, never a verdict."] if current
             else registration_notes(design, registered, path, seeds))
    if set(seeds) & set(used.pilot_seeds):  # a pilot: shown, never a verdict
        judged = [dataclasses.replace(j, verdict=f"{j.verdict} (pilot)") for j in judged]
    elif current:
        judged = [dataclasses.replace(j, verdict=f"{j.verdict} (current design)") for j in judged]
    return Table(title, verdict_header(metric), verdict_rows(judged), verdict_note(judged, metric, notes))


def by_seed(group: Sequence[Mapping], metric: str) -> dict[int, float]:
    """``{seed: value}`` of a variant's finished rows (a sweep's ``seed`` axis pairs rows across variants); a
    non-finite value (a diverged run) is no pair: :func:`compare` names it as collapsed."""
    return {int(r["seed"]): float(r[metric]) for r in group
            if r.get(metric) is not None and "seed" in r and math.isfinite(float(r[metric]))}


def counts_by_seed(group: Sequence[Mapping], metric: str) -> dict[int, tuple[int, int]]:
    """``{seed: (correct, total)}`` where the rows carry ``<metric>_count`` (the examples or positions a rate was
    measured on: the trainer records it beside accuracy and exact match)."""
    out = {}
    for r in group:
        total = r.get(f"{metric}_count")
        if total and r.get(metric) is not None and "seed" in r:
            out[int(r["seed"])] = (round(float(r[metric]) * float(total)), int(float(total)))
    return out


def compare(baseline: Sequence[Mapping], other: Sequence[Mapping], metric: str, sign: float = 1.0,
            level: float = LEVEL, fixed: float | None = None) -> tuple[Interval | None, list[int]]:
    """The verdict interval of ``other - baseline`` in ``metric`` (times ``sign``) over the seeds both finished,
    and the seeds where ``other`` has no finite value while the baseline has one (diverged: collapsed). With no
    spread across seeds and per-example counts on every row, the counts decide (Clopper-Pearson); ``fixed``: the
    baseline is that constant (e.g. perfect recall, 1.0), not a run."""
    def score(group):
        return {s: sign * v for s, v in by_seed(group, metric).items()}
    other_scores = score(other)
    base = score(baseline) if fixed is None else {s: sign * fixed for s in {int(r["seed"]) for r in other}}
    diverged = sorted(s for s in base if s not in other_scores and any(int(r.get("seed", -1)) == s for r in other))
    diff = paired(base, other_scores, level)
    if diff is None or diff.method != stats.NO_SPREAD:
        return diff, diverged
    oc = counts_by_seed(other, metric) if sign == 1.0 else {}  # counts belong to a rate, not to a loss
    bc = {s: None for s in diff.seeds} if fixed is not None else counts_by_seed(baseline, metric)
    if not all(s in oc and s in bc for s in diff.seeds):
        return diff, diverged  # infinite: no spread and no counts, nothing is claimed
    values = np.full(diff.pairs, diff.mean)
    return (stats.counts_interval([oc[s] for s in diff.seeds], fixed if fixed is not None else
                                  [bc[s] for s in diff.seeds], values, level, diff.seeds), diverged)


def arm_comparisons(groups: Mapping[str, Sequence[Mapping]], baseline: str, keys: Sequence[str], metric: str,
                    sign: float = 1.0, level: float = LEVEL) -> tuple[dict, dict]:
    """Each key's variant minus ``baseline`` (``groups``: variant -> its finished rows), paired by seed in
    ``metric`` times ``sign``: ``({key: Interval | None}, {key: diverged seeds})``; a key whose variant has no
    finished row is None (it stays in the family)."""
    compared = {k: compare(groups[baseline], groups[k], metric, sign, level) if groups.get(k) else (None, [])
                for k in keys}
    return {k: d for k, (d, _) in compared.items()}, {k: list(s) for k, (_, s) in compared.items()}


def variant_verdicts(groups: Mapping[str, Sequence[Mapping]], baseline: str, exp: Any, sweep_dir: str, metric: str,
                     label: str, sign: float = 1.0):
    """The verdict table of findings that each compare one variant with ``baseline`` (:func:`arm_comparisons`),
    under the experiment's design; None without a comparison."""
    design = getattr(exp, "design", None)
    if baseline not in groups or design is None:
        return None
    diffs, diverged = arm_comparisons(groups, baseline, list(design.findings), metric, sign, design.level)
    return verdict_table(design, diffs, label, sweep_dir, exp, diverged=diverged)
