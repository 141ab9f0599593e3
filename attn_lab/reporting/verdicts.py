"""The verdict on a published finding: one decision table, Holm's correction over a table's findings, and the
design a preset registers before it runs (which findings it can decide at all).

Evidence is the paired t-interval of the per-seed difference (compared row minus baseline; :mod:`.stats`) at
``LEVEL``. A finding says the difference goes ``up`` or ``down`` (by at least ``margin``, the smallest difference
that counts), stays the ``same`` (within ``margin`` either way: equivalence) or is ``not_worse`` (loses less than
``margin``: non-inferiority). For up/down the interval ``[L, H]`` is first turned to the paper's side (a 'down'
finding's difference is negated), so ``m = margin > 0`` below is an effect in the paper's direction.

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
t-test at ``(1 - LEVEL) / 2``: ``L > 0`` is ``p(H0: d <= 0) < 0.025``, and so on (:func:`claim_p`).

**Multiplicity.** The family is the confirmatory, decidable findings of one table: a verdict other than
inconclusive stands only if its claim's p-value, Holm-adjusted over that family, is below ``(1 - LEVEL) / 2``
(Holm 1979; with data-chosen directions as in Shaffer 1980); otherwise the row is inconclusive.

**Design, before the run.** A preset declares, per finding, the per-seed standard deviation of the paired
difference it expects (from a pilot on seeds the verdict run does not use). With its number of seeds this gives
the expected half-width of the interval (:func:`attn_lab.reporting.stats.expected_half_width`); a finding whose
expected half-width is not below its margin is ``undecidable at this budget``: it is not tested, its row says so
whatever the data, and it is not in the Holm family. The sweep writes the design into ``sweep.json`` when it starts
(:func:`registration`); the table compares it with the experiment file as it is now.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from attn_lab.reporting import stats
from attn_lab.reporting.stats import INTERVAL, LEVEL, Interval, paired_t

MIN_PAIRS = 3  # below this a t-interval has one degree of freedom: nothing is decided by one seed's luck
ALPHA = (1 - LEVEL) / 2  # one-sided level of each interval edge
Direction = Literal["up", "down", "same", "not_worse"]
DIRECTIONS = ("up", "down", "same", "not_worse")
UNDECIDABLE = "undecidable at this budget"
VERDICTS = ("reproduced", "smaller than published", "not reproduced", "inconclusive", UNDECIDABLE)


def _number(x: Any) -> bool:
    """An int or float, not a bool (``True`` is an int to Python, never a margin or an sd)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class Finding:
    """A published finding in one line, how it would show in our metric, and the paper's own number.

    Attributes:
      claim: the finding, e.g. 'one head is worse than eight (Table 3, rows A)'.
      paper: the paper's number as text, e.g. '-0.9 BLEU'.
      direction: 'up' / 'down' (the compared row's metric minus the baseline's should be > 0 / < 0 by at least
        ``margin``), 'same' (within ``margin`` either way) or 'not_worse' (loses less than ``margin``).
      margin: the smallest difference that counts as an effect, in the metric's units; fixed before a run.
      exploratory: a finding formed after looking at data of these seeds: shown, never in the Holm family.
    """

    claim: str
    paper: str
    direction: Direction
    margin: float
    exploratory: bool = False

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"Finding({self.claim!r}): direction={self.direction!r}, allowed: {DIRECTIONS}")
        if not (_number(self.margin) and self.margin > 0 and math.isfinite(self.margin)):
            raise ValueError(f"Finding({self.claim!r}): margin={self.margin!r} must be a positive number")


@dataclasses.dataclass(frozen=True)
class Design:
    """What a preset promises before it runs (pre-registration): its findings and the noise it expects.

    Attributes:
      findings: key -> finding (the key names the compared row, or whatever the experiment's report pairs).
      sd: key -> the per-seed standard deviation of that finding's paired difference expected at this preset, from
        a pilot run (None: no pilot; the preset cannot say what it detects, and the finding is undecidable).
      pilot: where the standard deviations come from: the command and the seeds of the pilot run.
      pilot_seeds: the seeds the pilot used; a verdict run must use others (a run on them is a pilot itself).
      level: the interval's level.
    """

    findings: Mapping[str, Finding]
    sd: Mapping[str, float | None]
    pilot: str = ""
    pilot_seeds: tuple[int, ...] = ()
    level: float = LEVEL

    def __post_init__(self):
        missing = [k for k in self.findings if k not in self.sd]
        if missing:
            raise ValueError(f"Design: finding '{missing[0]}' has no expected sd (give None when no pilot ran)")
        for key, sd in self.sd.items():
            if sd is not None and not (_number(sd) and sd > 0 and math.isfinite(sd)):
                raise ValueError(f"Design: sd['{key}']={sd!r}; allowed: a positive number (None: no pilot)")
        if not (isinstance(self.level, float) and 0.5 < self.level < 1):
            raise ValueError(f"Design: level={self.level!r}; allowed: a float in (0.5, 1), e.g. 0.95")

    @classmethod
    def of(cls, findings: Mapping[str, Finding], sd: Mapping[str, float | None] | None, pilot: str,
           pilot_seeds: tuple[int, ...], rows=None) -> "Design":
        """A preset's design: the ``findings`` among ``rows`` (default all) with the sds its pilot measured (``sd``
        None or a key missing: no pilot at this preset, so that finding is undecidable)."""
        unknown = sorted(set(sd or {}) - set(findings))
        if unknown:
            raise ValueError(f"Design: sd key '{unknown[0]}' is not a finding; findings: {', '.join(findings)}")
        chosen = {k: f for k, f in findings.items() if rows is None or k in rows}
        return cls(chosen, {k: (sd or {}).get(k) for k in chosen}, pilot if sd else "no pilot at this preset",
                   tuple(pilot_seeds))

    def plan(self, seeds: int) -> dict[str, dict[str, Any]]:
        """Per finding, what ``seeds`` seeds can show: the expected half-width, the smallest difference detected
        with 80% power, whether the finding is decidable (half-width below the margin) and the seeds it needs."""
        out = {}
        for key, finding in self.findings.items():
            sd = self.sd[key]
            known = sd is not None
            half = stats.expected_half_width(sd, seeds, self.level) if known else math.inf
            needed = stats.seeds_needed(sd, finding.margin, self.level) if known else None
            out[key] = {"sd": sd, "seeds": seeds, "half_width": half,
                        "detectable": stats.detectable_difference(sd, seeds, self.level) if known else math.inf,
                        "decidable": seeds >= MIN_PAIRS and half < finding.margin,
                        "seeds_needed": None if needed is None else max(MIN_PAIRS, needed)}
        return out

    def powered_seeds(self, first: int = 100) -> list[int]:
        """The seeds (``first``, ``first + 1``, ...) that make every finding with a pilot sd decidable: the most any
        of them needs. For presets meant for an accelerator, where a vectorized seed costs almost nothing."""
        needed = [p["seeds_needed"] for p in self.plan(MIN_PAIRS).values() if p["sd"] is not None]
        if not needed or None in needed:
            raise ValueError("Design.powered_seeds: every finding needs a pilot sd and a finite seed count")
        return list(range(first, first + max(needed)))

    def record(self) -> dict[str, Any]:
        """The design as JSON (what ``sweep.json`` keeps)."""
        return {"level": self.level, "pilot": self.pilot, "pilot_seeds": list(self.pilot_seeds),
                "findings": {k: {**dataclasses.asdict(f), "sd": self.sd[k]} for k, f in self.findings.items()}}


def oriented(finding: Finding, diff: Interval) -> Interval:
    """``diff`` turned to the paper's side for an up/down finding (a 'down' difference negated)."""
    if finding.direction != "down":
        return diff
    return dataclasses.replace(diff, mean=-diff.mean, low=-diff.high, high=-diff.low)


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
    """One finding's row: the evidence, the plan it was judged under and the verdict after Holm."""

    key: str
    finding: Finding
    diff: Interval | None
    plan: dict[str, Any]
    verdict: str
    p_holm: float | None  # None: not tested (undecidable, exploratory or without an interval)


def judge(design: Design, diffs: Mapping[str, Interval | None], seeds: int) -> list[Judged]:
    """Every finding of ``design`` that ``diffs`` has, judged: undecidable ones by the plan at ``seeds`` seeds
    (before looking), the others by the decision table and Holm over the confirmatory decidable ones."""
    plan = design.plan(seeds)
    keys = [k for k in design.findings if k in diffs]
    raw = {k: decide(design.findings[k], diffs[k]) for k in keys}
    family = [k for k in keys if plan[k]["decidable"] and not design.findings[k].exploratory]
    adjusted = stats.holm({k: claim_p(design.findings[k], diffs[k], raw[k]) if diffs[k] is not None
                           and raw[k] != "inconclusive" else 1.0 for k in family})
    out = []
    for k in keys:
        finding = design.findings[k]
        if not plan[k]["decidable"]:
            verdict, p = UNDECIDABLE, None
        elif finding.exploratory:
            verdict, p = f"{raw[k]} (exploratory)", None
        else:
            p = adjusted[k]
            verdict = raw[k] if p < (1 - design.level) / 2 else "inconclusive"
        out.append(Judged(k, finding, diffs[k], plan[k], verdict, p))
    return out


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
    changed = sorted(k for k in set(before) | set(now)
                     if {f: (before.get(k) or {}).get(f) for f in ("claim", "direction", "margin", "sd")}
                     != {f: (now.get(k) or {}).get(f) for f in ("claim", "direction", "margin", "sd")})
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
                  tuple(rec.get("pilot_seeds", ())), rec.get("level", LEVEL))


# --- the table -------------------------------------------------------------------------------------------------

VERDICT_HEADER = ("finding", "paper", "margin", f"ours: mean diff [{LEVEL:.0%} {INTERVAL} CI]",
                  "sd: run (planned)", "Holm p", "verdict")
RULE = (f"Interval: {INTERVAL} at {LEVEL:.0%} over seeds. Rule (attn_lab/reporting/verdicts.py): up/down -- the "
        "interval above 0 and reaching the margin -> reproduced, above 0 but below the margin -> smaller than "
        "published, below the margin and not above 0 -> not reproduced; same -- inside ± margin -> reproduced, "
        "wholly outside -> not reproduced; not worse -- above -margin -> reproduced, wholly below -> not reproduced; "
        f"otherwise inconclusive. A verdict stands if its claim's Holm-adjusted one-sided p < {ALPHA:g} over the "
        "table's confirmatory decidable findings (the family); a finding whose expected half-width at the planned "
        "seeds is not below its margin is undecidable at this budget, decided before the run.")


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _p_text(p: float | None) -> str:
    return "–" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def verdict_rows(judged: Sequence[Judged], digits: int = 3) -> list[list[str]]:
    rows = []
    for j in judged:
        ours = "–" if j.diff is None else f"{j.diff.text(digits)} ({j.diff.pairs} seeds)"
        sd = f"{_fmt(None if j.diff is None else j.diff.sd, digits)} ({_fmt(j.plan['sd'], digits)})"
        rows.append([j.finding.claim, j.finding.paper, f"{j.finding.margin:g}", ours, sd,
                     _p_text(j.p_holm), j.verdict])
    return rows


def plan_text(plan: Mapping[str, Any], margin: float) -> str:
    """One finding's plan in words: ``±0.075 expected at 5 seeds vs margin 0.02 (needs 43 seeds)``."""
    if plan["sd"] is None:
        return f"no pilot sd, so what {plan['seeds']} seeds detect is unknown (margin {margin:g})"
    need = plan["seeds_needed"]
    return (f"±{_fmt(plan['half_width'])} expected at {plan['seeds']} seeds vs margin {margin:g}, detectable "
            f"{_fmt(plan['detectable'])} (80% power); "
            + (f"needs {need} seeds" if need is not None else "needs more than 10000 seeds"))


def verdict_note(judged: Sequence[Judged], metric: str, notes: Sequence[str] = ()) -> str:
    """The rule, the metric, the family, what the undecidable findings would need, and the registration notes."""
    family = [j for j in judged if j.p_holm is not None]
    text = (f"Differences in {metric} (compared row minus baseline, paired by seed). {RULE} Family: "
            f"{len(family)} finding{'s' * (len(family) != 1)}.")
    undecidable = [j for j in judged if j.verdict.startswith(UNDECIDABLE)]  # a pilot's too: '... (pilot)'
    if undecidable:
        need = "; ".join(f"'{j.key}': {plan_text(j.plan, j.finding.margin)}" for j in undecidable)
        text += f" Undecidable at this budget: {need}."
    return " ".join([text, *notes])


def verdict_table(design: Design | None, diffs: Mapping[str, Interval | None], metric: str, sweep_dir: str,
                  exp: Any, title: str = "Verdicts"):
    """The verdict table of ``diffs`` (finding key -> interval) under the design registered in ``sweep_dir``'s
    sweep.json (or ``design`` when none was); None when no finding has a comparison."""
    from attn_lab.reporting.tables import Table, read_sweep_info

    info = read_sweep_info(sweep_dir)
    registered = (info or {}).get("registration")
    current = getattr(exp, "judge", "registered") == "current"
    used = design if current else registered_design(registered, design)
    if used is None or not any(k in diffs for k in used.findings):
        return None
    seeds = list((registered or {}).get("seeds") or getattr(exp, "seeds", []))
    judged = judge(used, diffs, len(seeds))
    path = ((info or {}).get("experiment") or "").rsplit(":", 1)[0]
    notes = (["Judged under the experiment file's current design (--design current), not the one registered when "
              "the sweep started: a reading of a finished run under revised findings, never a verdict."] if current
             else registration_notes(design, registered, path, seeds))
    if set(seeds) & set(used.pilot_seeds):  # a pilot: shown, never a verdict
        judged = [dataclasses.replace(j, verdict=f"{j.verdict} (pilot)") for j in judged]
    elif current:
        judged = [dataclasses.replace(j, verdict=f"{j.verdict} (current design)") for j in judged]
    return Table(title, VERDICT_HEADER, verdict_rows(judged), verdict_note(judged, metric, notes))


def by_seed(group: Sequence[Mapping], metric: str) -> dict[int, float]:
    """``{seed: value}`` of a variant's finished rows (a sweep's ``seed`` axis pairs rows across variants); a
    non-finite value (a diverged run) is no pair: the table's seed count shows it."""
    return {int(r["seed"]): float(r[metric]) for r in group
            if r.get(metric) is not None and "seed" in r and math.isfinite(float(r[metric]))}


def variant_verdicts(groups: Mapping[str, Sequence[Mapping]], baseline: str, exp: Any, sweep_dir: str, metric: str,
                     label: str, sign: float = 1.0):
    """The verdict table of findings that each compare one variant with ``baseline`` (``groups``: variant -> its
    finished rows), paired by seed in ``metric`` (times ``sign``: -1 turns a loss into a higher-is-better score),
    under the experiment's design; None without a comparison."""
    design = getattr(exp, "design", None)
    if baseline not in groups or design is None:
        return None
    score = lambda group: {s: sign * v for s, v in by_seed(group, metric).items()}  # noqa: E731
    base = score(groups[baseline])  # a finding whose variant has no finished row stays in the family
    diffs = {v: paired_t(base, score(groups[v]), design.level) if v in groups else None for v in design.findings}
    return verdict_table(design, diffs, label, sweep_dir, exp)
