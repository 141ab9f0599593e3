"""The plan: how likely a finding is to get a verdict at ``n`` seeds, from its pilot's effect and a pessimistic sd.

A pilot on seeds the verdict run does not use measures each finding's mean paired difference (its *effect*) and
the sd of the per-seed differences. The plan draws ``PLAN_DRAWS`` verdict runs of ``n`` normal differences with
that effect and the sd's one-sided ``SD_CONFIDENCE`` upper limit (a 5-seed sd is biased low and noisy: 1.56 x at
80%), applies the verdict interval and the decision table to each, and calls the share that reaches any verdict
(reproduced, smaller than published, not reproduced) the finding's **chance of a verdict**. A finding enters the
table's confirmatory family when that chance is at least ``POWER`` at the family's Holm floor (each claim tested
at ``alpha / |family|``, the level Holm's first step uses), so a large effect is decided by few seeds however
small its margin, and a finding whose margin sits inside the noise is planned out before the run.

Selecting on a pilot whose seeds the verdict run does not share leaves the verdict's error rate where the interval
and Holm put it; :func:`operating_characteristics` simulates the whole pilot-then-run procedure to show it
(tests/test_plan.py; the table in docs/sweeps.md: ``python scripts/plan_characteristics.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from attn_lab.experiment import MIN_PAIRS  # noqa: F401 (re-exported: the plan's floor)
from attn_lab.reporting import stats

PLAN_DRAWS = 1000  # simulated verdict runs per (n, effect, sd): the chance's standard error is <= 0.016
POWER = 0.8  # the chance of a verdict a confirmatory finding needs
SD_CONFIDENCE = 0.8  # plan with the pilot sd's upper limit at this confidence
MAX_SEEDS = 64  # the plan looks for the seeds a finding needs up to here
SCAN_UP_TO = 12  # ... counting one by one up to here
PLAN_RESAMPLES = 399  # sampled bootstrap-t in the plan's simulated runs above stats.EXACT_UP_TO pairs
# below MIN_PAIRS a t-interval has one degree of freedom: nothing is decided by one seed's luck
INCONCLUSIVE, REPRODUCED, SMALLER, NOT_REPRODUCED = range(4)
NAMES = ("inconclusive", "reproduced", "smaller than published", "not reproduced")


@functools.lru_cache(maxsize=256)
def _standard(n: int, sign: int) -> tuple[np.ndarray, stats.Studentized]:
    """``PLAN_DRAWS`` standard normal datasets of ``n`` (times ``sign``) and their bootstrap-t, drawn once per n:
    the t statistic and the bootstrap-t are affine-invariant, so every (effect, sd) reuses them."""
    z = sign * np.random.default_rng(1000 + n).standard_normal((PLAN_DRAWS, n))
    return z, stats.studentize(z, stats.resamples(n, PLAN_RESAMPLES))


def outcomes(direction: str, margin: float, effect: float, sd: float, n: int, alpha: float,
             data: np.ndarray | None = None) -> np.ndarray:
    """The verdict code (``INCONCLUSIVE`` ... ``NOT_REPRODUCED``) of each simulated run of ``n`` differences
    ``effect + sd * z`` (``data``: the differences themselves instead), each claim tested at ``alpha``."""
    if data is None:
        (z, zb), (nz, nzb) = _standard(n, 1), _standard(n, -1)

        def pa(x):  # p of H0: mean <= x, on effect + sd z: the same as on z at (x - effect) / sd
            return stats.p_values_above(z, (x - effect) / sd, zb)

        def pb(x):
            return stats.p_values_above(nz, -(x - effect) / sd, nzb)
    else:
        def pa(x):
            return stats.p_values_above(data, x)

        def pb(x):
            return stats.p_values_above(-data, -x)
    return decide_codes(direction, margin, pa, pb, alpha)


def decide_codes(direction: str, m: float, pa, pb, alpha: float) -> np.ndarray:
    """The decision table (:func:`attn_lab.reporting.verdicts.decide`) on one-sided tests: ``pa(x)`` / ``pb(x)``
    are the p-values of ``H0: mean <= x`` / ``H0: mean >= x``; a claim holds when its p is below ``alpha``."""
    if direction in ("up", "down"):
        if direction == "up":
            above_zero, below_margin = pa(0.0) < alpha, pb(m) < alpha
        else:  # turned to the paper's side: -mean > 0 and -mean < m
            above_zero, below_margin = pb(0.0) < alpha, pa(-m) < alpha
        return np.where(above_zero, np.where(below_margin, SMALLER, REPRODUCED),
                        np.where(below_margin, NOT_REPRODUCED, INCONCLUSIVE))
    if direction == "same":
        inside = (pa(-m) < alpha) & (pb(m) < alpha)
        outside = (pa(m) < alpha) | (pb(-m) < alpha)
        return np.where(inside, REPRODUCED, np.where(outside, NOT_REPRODUCED, INCONCLUSIVE))
    return np.where(pa(-m) < alpha, REPRODUCED, np.where(pb(-m) < alpha, NOT_REPRODUCED, INCONCLUSIVE))


def chance_of_verdict(direction: str, margin: float, effect: float, sd: float, n: int, alpha: float) -> float:
    """The share of simulated runs of ``n`` seeds that reach a verdict; 0 below ``MIN_PAIRS``."""
    if n < MIN_PAIRS:
        return 0.0
    return float(np.mean(outcomes(direction, margin, effect, sd, n, alpha) != INCONCLUSIVE))


def seeds_needed(direction: str, margin: float, effect: float, sd: float, alpha: float) -> int | None:
    """The fewest seeds (``MIN_PAIRS`` ... ``MAX_SEEDS``) whose chance of a verdict is at least ``POWER``: counted
    up to ``SCAN_UP_TO`` (the chance is not monotone there: 3 seeds use the paired t alone, 4-5 the wider hull),
    then by bisection (the chance grows with n, up to the simulation's noise); None beyond ``MAX_SEEDS``."""
    def enough(n):
        return chance_of_verdict(direction, margin, effect, sd, n, alpha) >= POWER
    first = next((n for n in range(MIN_PAIRS, SCAN_UP_TO + 1) if enough(n)), None)
    if first is not None or not enough(MAX_SEEDS):
        return first
    low, high = SCAN_UP_TO + 1, MAX_SEEDS
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid + 1, high)
    return low


def plan(findings: Mapping, effect: Mapping[str, float | None], sd: Mapping[str, float | None], pilot_pairs: int,
         seeds: int, level: float = stats.LEVEL) -> dict[str, dict]:
    """Per finding: the pilot's effect and sd, the sd planned with (its upper limit), the chance of a verdict at
    ``seeds`` seeds at the family's Holm floor, whether it is confirmatory (in the family) and the seeds it needs.

    The family is the largest ``k`` findings that each reach ``POWER`` when every claim is tested at
    ``alpha / k`` (the level of Holm's first step, so Holm can only do better): for ``k`` from every confirmatory
    finding with a pilot down to 1, the ``k`` likeliest of those that pass at ``alpha / k``, if ``k`` pass."""
    alpha = (1 - level) / 2
    known = {k: f for k, f in findings.items() if effect.get(k) is not None and sd.get(k) is not None
             and pilot_pairs >= 2}
    planned = {k: stats.sd_upper(sd[k], pilot_pairs, SD_CONFIDENCE) for k in known}

    def chances(floor: float) -> dict[str, float]:
        return {k: chance_of_verdict(f.direction, f.margin, effect[k], planned[k], seeds, floor)
                for k, f in known.items()}
    candidates = [k for k, f in known.items() if not f.exploratory]
    family, chance = [], chances(alpha)
    for size in range(len(candidates), 0, -1):
        at = chances(alpha / size)
        passing = sorted((k for k in candidates if at[k] >= POWER), key=lambda k: -at[k])
        if len(passing) >= size:
            family, chance = passing[:size], at
            break
    floor = alpha / max(len(family), 1)
    out = {}
    for key, finding in findings.items():
        entry = {"effect": effect.get(key), "sd": sd.get(key), "sd_plan": planned.get(key), "seeds": seeds,
                 "alpha": floor, "chance": chance.get(key), "confirmatory": key in family, "seeds_needed": None}
        if key in known:
            entry["seeds_needed"] = seeds_needed(finding.direction, finding.margin, effect[key], planned[key],
                                                 alpha / max(len(family) + (key not in family), 1))
        out[key] = entry
    return out


def operating_characteristics(direction: str, margin: float, sd: float, truth: float, pilot_pairs: int = 5,
                              run_pairs: int = 5, pilots: int = 400, seed: int = 0) -> dict[str, float]:
    """The whole procedure, simulated for one finding tested alone: a pilot of ``pilot_pairs`` normal differences
    (mean ``truth``, sd ``sd``), its plan, and -- when the plan makes it confirmatory -- a verdict run of
    ``run_pairs`` fresh differences. Returns the shares of pilots that made it confirmatory (``confirmatory``),
    that ended in a confirmatory verdict (``verdict``) and in a false claim (``false_claim``: a verdict whose claim
    the truth contradicts -- the type-I error), and per verdict name its share."""
    rng = np.random.default_rng(seed)
    alpha = (1 - stats.LEVEL) / 2
    pilot = truth + sd * rng.standard_normal((pilots, pilot_pairs))
    effects, sds = pilot.mean(1), pilot.std(1, ddof=1)
    confirmed = np.array([chance_of_verdict(direction, margin, e, stats.sd_upper(s, pilot_pairs, SD_CONFIDENCE),
                                            run_pairs, alpha) >= POWER for e, s in zip(effects, sds)])
    runs = truth + sd * rng.standard_normal((pilots, run_pairs))
    codes = np.where(confirmed, outcomes(direction, margin, 0.0, 1.0, run_pairs, alpha, data=runs), INCONCLUSIVE)
    false = false_claims(direction, margin, truth, codes)
    return {"confirmatory": float(confirmed.mean()), "verdict": float(np.mean(codes != INCONCLUSIVE)),
            "false_claim": float(np.mean(false)), **{NAMES[c]: float(np.mean(codes == c)) for c in range(1, 4)}}


def false_claims(direction: str, m: float, truth: float, codes: np.ndarray) -> np.ndarray:
    """Whether each verdict code claims something ``truth`` contradicts (a 'down' finding's truth is negated first:
    its claims are about the paper's side). up/down: reproduced claims > 0; smaller than published claims in
    (0, m); not reproduced claims < m. same: reproduced claims inside (-m, m), not reproduced outside.
    not_worse: reproduced claims > -m, not reproduced < -m."""
    d = -truth if direction == "down" else truth
    if direction in ("up", "down"):
        wrong = {REPRODUCED: d <= 0, SMALLER: not 0 < d < m, NOT_REPRODUCED: d >= m}
    elif direction == "same":
        wrong = {REPRODUCED: not -m < d < m, NOT_REPRODUCED: -m <= d <= m}
    else:
        wrong = {REPRODUCED: d <= -m, NOT_REPRODUCED: d >= -m}
    return np.isin(codes, [c for c, w in wrong.items() if w])
