"""Uncertainty of a comparison and the verdict on a published finding, decided by one rule written here once.

A table row is compared with the table's baseline seed by seed: trial seeds are shared across rows, so seed ``s``
of a variant and seed ``s`` of the baseline saw the same initialization stream and data order, and their
difference removes that shared noise (a paired design). The interval is a percentile bootstrap of the mean
paired difference, resampling seeds with replacement (Efron & Tibshirani 1993, ch. 13); with the few seeds a
sweep affords it is a rough interval, which is why the rule below needs ``MIN_PAIRS`` pairs before it decides.

The rule (:func:`decide`), for a finding that says a change moves a higher-is-better metric up, down, leaves it
unchanged, or costs at most a little (not worse):

- ``reproduced``: the whole interval lies on the paper's side of zero (up/down), inside the equivalence band
  ``[-margin, margin]`` (same), or above ``-margin`` (not worse);
- ``not reproduced``: the whole interval lies on the other side of zero (up/down) -- or inside the band, so no
  effect of the size the paper reports exists here --, entirely outside the band (same), or below ``-margin``
  (not worse);
- ``inconclusive``: anything else (the interval straddles the boundary), or fewer than ``MIN_PAIRS`` pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

MIN_PAIRS = 3  # a bootstrap over fewer seeds than this cannot separate anything from its noise
LEVEL = 0.95
RESAMPLES = 10_000
Direction = Literal["up", "down", "same", "not_worse"]
VERDICTS = ("reproduced", "not reproduced", "inconclusive")


@dataclasses.dataclass(frozen=True)
class Interval:
    """Mean paired difference (other - baseline) and its bootstrap interval over ``pairs`` shared seeds."""

    mean: float
    low: float
    high: float
    pairs: int

    def text(self, digits: int = 3) -> str:
        """``+0.012 [-0.004, +0.030]`` (the interval at LEVEL)."""
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


@dataclasses.dataclass(frozen=True)
class Finding:
    """A published finding in one line, how it would show in our metric, and the paper's own number.

    Attributes:
      claim: the finding, e.g. 'one head is worse than eight (Table 3, rows A)'.
      paper: the paper's number as text, e.g. '-0.9 BLEU'.
      direction: 'up' / 'down' (the compared row's metric minus the baseline's should be > 0 / < 0), 'same'
        (within ``margin`` either way: equivalence) or 'not_worse' (loses less than ``margin``: non-inferiority).
      margin: the smallest difference that counts as an effect, in the metric's units (the equivalence band).
    """

    claim: str
    paper: str
    direction: Direction
    margin: float


def paired_bootstrap(baseline: Mapping[int, float], other: Mapping[int, float], *, level: float = LEVEL,
                     resamples: int = RESAMPLES, seed: int = 0) -> Interval | None:
    """The mean of ``other[s] - baseline[s]`` over the seeds both have, with a percentile bootstrap interval.

    Returns None when no seed is shared. Deterministic for a given ``seed`` (the table must not change between
    two make_tables runs on the same sweep).
    """
    seeds = sorted(set(baseline) & set(other))
    if not seeds:
        return None
    diffs = np.array([other[s] - baseline[s] for s in seeds], np.float64)  # (P,)
    picks = np.random.default_rng(seed).integers(0, len(diffs), (resamples, len(diffs)))  # (R, P)
    means = diffs[picks].mean(axis=1)  # (R,)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(diffs.mean()), float(low), float(high), len(seeds))


def decide(finding: Finding, diff: Interval | None) -> str:
    """The verdict on ``finding`` given our paired difference (see the module docstring for the rule)."""
    if diff is None or diff.pairs < MIN_PAIRS:
        return "inconclusive"
    inside_band = -finding.margin <= diff.low and diff.high <= finding.margin
    if finding.direction == "not_worse":
        if diff.low >= -finding.margin:
            return "reproduced"
        return "not reproduced" if diff.high < -finding.margin else "inconclusive"
    if finding.direction == "same":
        if inside_band:
            return "reproduced"
        outside_band = diff.low > finding.margin or diff.high < -finding.margin
        return "not reproduced" if outside_band else "inconclusive"
    sign = 1.0 if finding.direction == "up" else -1.0
    low, high = sorted((sign * diff.low, sign * diff.high))  # the paper's side is now > 0
    if low > 0:
        return "reproduced"
    if high < 0 or inside_band:
        return "not reproduced"
    return "inconclusive"


def verdict_row(finding: Finding, diff: Interval | None, digits: int = 3) -> list[str]:
    """``[claim, paper, ours with interval, verdict]``: one row of a table's verdict block."""
    ours = "–" if diff is None else f"{diff.text(digits)} ({diff.pairs} seeds)"
    return [finding.claim, finding.paper, ours, decide(finding, diff)]


VERDICT_HEADER = ("finding", "paper", f"ours: mean diff [{LEVEL:.0%} paired bootstrap CI]", "verdict")
RULE = (f"Verdict rule (attn_lab/reporting/verdicts.py): the {LEVEL:.0%} percentile bootstrap interval of the mean "
        "per-seed difference lies wholly on the paper's side of zero -> reproduced; wholly on the other side, or "
        "inside ± the margin where the paper reports an effect -> not reproduced; for 'no difference' findings, "
        "inside ± the margin -> reproduced, wholly outside -> not reproduced; for 'costs little' findings, above "
        "-margin -> reproduced, wholly below -> not reproduced; otherwise, or with fewer than "
        f"{MIN_PAIRS} paired seeds, inconclusive.")


def by_seed(group: Sequence[Mapping], metric: str) -> dict[int, float]:
    """``{seed: value}`` of a variant's finished rows (a sweep's ``seed`` axis pairs rows across variants)."""
    return {int(r["seed"]): float(r[metric]) for r in group if r.get(metric) is not None and "seed" in r}


def variant_verdicts(groups: Mapping[str, Sequence[Mapping]], baseline: str, findings: Mapping[str, Finding],
                     metric: str, label: str, preset_hint: str = "quick"):
    """The verdict table of findings that each compare one variant with ``baseline`` (``groups``: variant -> its
    finished rows), paired by seed in ``metric``; None when the baseline or every compared variant is missing."""
    from attn_lab.reporting.tables import Table

    if baseline not in groups:
        return None
    base = by_seed(groups[baseline], metric)
    checks = [(f, paired_bootstrap(base, by_seed(groups[v], metric))) for v, f in findings.items() if v in groups]
    if not checks:
        return None
    return Table("Verdicts", VERDICT_HEADER, verdict_rows(checks), verdict_note(checks, label, preset_hint))


def verdict_rows(checks: Sequence[tuple[Finding, Interval | None]], digits: int = 3) -> list[list[str]]:
    return [verdict_row(finding, diff, digits) for finding, diff in checks]


def verdict_note(checks: Sequence[tuple[Finding, Interval | None]], metric: str, preset_hint: str = "quick") -> str:
    """The rule, the metric and margins, and -- when no comparison had enough seeds -- that the run decides nothing."""
    margins = "; ".join(sorted({f"{f.margin:g}" for f, _ in checks}))
    note = f"Differences in {metric} (compared row minus baseline, paired by seed), margin {margins}. {RULE}"
    if all(diff is None or diff.pairs < MIN_PAIRS for _, diff in checks):
        note += (f" This run has fewer than {MIN_PAIRS} paired seeds per comparison, so it decides nothing: run "
                 f"the '{preset_hint}' preset for verdicts.")
    return note
