"""From a finding to its verdict: the pilot that writes a preset's plan, and the checks a verdict run makes of it.

``--pilot`` trains the preset's pilot seeds (or ``--seeds``: at least ``MIN_PAIRS``, none of the verdict's), measures
each finding's paired difference in its deciding metric and writes ``plans/<sweep name>.json``
(:mod:`attn_lab.sweep.plans`); a pilot whose metric is not finite, or whose findings lack pairs, writes nothing.
``--pilot-and-verdict`` runs that pilot when the preset has no current plan, prints the plan, then the verdict run on
fresh seeds (up to ``--max-seeds``): rerunning it resumes whichever stage is unfinished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from attn_lab.experiment import Powered
from attn_lab.reporting import default
from attn_lab.reporting.plan import MIN_PAIRS
from attn_lab.reporting.verdicts import EXPLORATORY, Design, plan_text
from attn_lab.sweep import plans
from attn_lab.sweep.spec import Experiment

PILOT = "this run is the pilot"  # the pilot's design names its source so (no plan judges a pilot)


def verdict_seeds(exp: Experiment) -> set[int]:
    """The seeds a verdict run of the preset may use: its declared ones, or every seed Powered may reach."""
    seeds = exp.preset.seeds
    return set(range(seeds.first, seeds.first + seeds.cap)) if isinstance(seeds, Powered) else set(seeds)


def pilot_experiment(exp: Experiment, spec: str, seeds: Sequence[int] | None) -> Experiment:
    """The pilot of ``exp``'s preset: its pilot seeds (or ``seeds``), judged under no plan (exploratory, labelled a
    pilot); one-line ValueErrors for a file without declared presets, a preset without findings, fewer than
    ``MIN_PAIRS`` seeds, or seeds of the verdict's."""
    if exp.preset is None:
        raise ValueError(f"--pilot: {spec} declares no PRESETS (attn_lab.experiment.Preset); a pilot writes the plan "
                         "of a declared preset")
    if not exp.preset.findings:
        raise ValueError(f"--pilot: {spec} judges no findings: there is nothing to plan")
    seeds = list(seeds or exp.preset.pilot_seeds)
    if len(seeds) < MIN_PAIRS:
        raise ValueError(f"--pilot: seeds {','.join(map(str, seeds))}: a pilot needs at least {MIN_PAIRS} seeds (an sd "
                         f"from fewer plans nothing)")
    overlap = sorted(set(seeds) & verdict_seeds(exp))
    if overlap:
        raise ValueError(f"--pilot: seed {overlap[0]} is one of {spec}'s verdict seeds; a pilot runs on seeds the "
                         "verdict never uses (give --seeds others)")
    design = Design(dict(exp.preset.findings), dict.fromkeys(exp.preset.findings), PILOT, tuple(seeds))
    return dataclasses.replace(exp, seeds=seeds, design=design)


def check_verdict(exp: Experiment, spec: str) -> None:
    """A verdict run needs a current plan where it has one (or needs one, for Powered seeds), and seeds its pilot
    did not use: one line otherwise."""
    if exp.plan_problem:
        raise ValueError(exp.plan_problem)
    pilot = set((exp.plan or {}).get("pilot", {}).get("seeds", ()))
    overlap = sorted(set(exp.seeds) & pilot)
    if overlap:
        raise ValueError(f"seeds: seed {overlap[0]} is one of the pilot's ({exp.plan_path}); a verdict runs on fresh "
                         f"seeds (to pilot again: {plans.pilot_command(spec)})")


def write_from_pilot(exp: Experiment, spec: str, rows: list[dict], workdir: str, command: Sequence[str],
                     wall: float | None, git: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """Measures the finished pilot and writes its plan (nothing when a finding cannot be measured, or while a trial
    of the pilot -- another shard's -- has not finished: the invocation that finishes the last one writes it)."""
    waiting = [r["trial"] for r in rows if r.get("status") not in ("ok", "skipped")]
    if waiting:
        raise ValueError(f"pilot: {len(waiting)} of {len(rows)} trials have not finished (e.g. {waiting[0]}: "
                         f"{rows[[r['trial'] for r in rows].index(waiting[0])].get('status')}); no plan is written "
                         "until every one has (rerun the pilot, or the shards still running, to finish them)")
    measured = exp.measures_fn(rows, workdir, exp) if exp.measures_fn else {}
    measuring = dataclasses.replace(exp, plan={**(exp.plan or {}), "measured": measured})
    diffs, diverged = default.differences(rows, workdir, measuring)
    label = exp.preset.metric.key if exp.preset.metric else "the deciding metric"
    numbers = plans.pilot_numbers(exp.design, diffs, diverged, label)
    speeds: dict[str, list[float]] = {}
    steps: dict[str, int] = {}
    for row in rows:
        if row.get("steps_per_sec"):
            arm = str(row.get("variant", row["trial"]))
            speeds.setdefault(arm, []).append(float(row["steps_per_sec"]))
            steps[arm] = int(row.get("steps") or 0)
    record = plans.pilot_record(exp.seeds, workdir, command, wall, {k: sum(v) / len(v) for k, v in speeds.items()},
                                git, steps)
    count = len(exp.preset.seeds) if not isinstance(exp.preset.seeds, Powered) else MIN_PAIRS
    plan = plans.build_plan(exp.preset, spec, numbers, record, count, measured)
    plans.write_plan(exp.plan_path, plan)
    return exp.plan_path, plan


def capped_seeds(exp: Experiment, cap: int | None) -> list[int]:
    """The verdict seeds: the preset's; with ``cap``, as many as the plan needs for every finding with a pilot,
    from the preset's first verdict seed, at most ``cap`` (at least ``MIN_PAIRS``)."""
    if cap is None or exp.design is None:
        return list(exp.seeds)
    first = exp.preset.seeds.first if isinstance(exp.preset.seeds, Powered) else min(exp.preset.seeds)
    try:
        needed = exp.design.powered_seeds(first)
    except ValueError:  # a finding without pilot numbers: it stays exploratory, the cap decides
        needed = list(range(first, first + cap))
    return needed[:max(cap, MIN_PAIRS)]


def plan_summary(exp: Experiment, plan: dict[str, Any], seeds: list[int]) -> str:
    """What the verdict run will judge: each finding's role and chance at these seeds, and the time it may take."""
    lines = [f"plan {exp.plan_path}: pilot seeds {','.join(map(str, plan['pilot']['seeds']))}, commit "
             f"{str(plan['pilot'].get('commit'))[:10]}; verdict seeds {','.join(map(str, seeds))}"]
    for key, entry in exp.design.plan(len(seeds)).items():
        finding = exp.design.findings[key]
        role = "confirmatory" if entry["confirmatory"] else EXPLORATORY
        lines.append(f"  {key}: {finding.claim} -- {plan_text(entry, finding.margin)} -> {role}")
    estimate = plans.estimated_seconds(plan, len(seeds))
    lines.append("  estimated time: " + (f"{estimate / 60:.1f} minutes (the pilot's {plans.estimate_basis(plan)} "
                                         "scaled by seeds; vectorized seeds cost less)" if estimate else
                                         "unknown (the pilot measured neither its wall time nor its steps/s)"))
    return "\n".join(lines)
