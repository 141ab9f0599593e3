"""Plan files: what a pilot measured, written by the pilot and read by the verdict run.

``<experiment folder>/plans/<sweep name>.json`` holds, per finding, the pilot's mean paired difference (effect), the
sd of its per-seed differences and how many pilot seeds collapsed; the pilot's seeds, commit, wall time and
steps/s; the plan at the preset's verdict seeds (the sd planned with, the chance of a verdict, the seeds each
finding needs, which are confirmatory); and the fingerprint of the preset it was made for
(:func:`attn_lab.experiment.fingerprint`). Only ``--pilot`` writes one (:func:`write_plan`, atomically); a verdict
run reads it (:func:`read_plan`) and copies it into its ``sweep.json``, so a later re-pilot changes no recorded
verdict. A plan whose fingerprint is not the preset's is stale (:func:`plan_problem`): the verdict run refuses it.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from attn_lab.experiment import Preset, fingerprint
from attn_lab.io import write_json_atomic
from attn_lab.reporting import stats
from attn_lab.reporting.plan import MIN_PAIRS
from attn_lab.reporting.verdicts import Design
from attn_lab.results import read_record

PLANS = "plans"  # the folder beside the experiment file
FIELDS = ("effect", "sd", "pilot_collapsed")


def plan_path(experiment_path: str, name: str) -> str:
    """``<folder of the experiment file>/plans/<sweep name>.json``."""
    return os.path.join(os.path.dirname(os.path.abspath(experiment_path)), PLANS, f"{name}.json")


def read_plan(path: str) -> dict[str, Any] | None:
    """The plan at ``path`` (None: no plan yet); a damaged one is a one-line ValueError naming it (never
    replaced: a pilot writes a new one in its place only when asked)."""
    try:
        plan = read_record(os.path.dirname(path), os.path.basename(path))
    except ValueError as e:
        raise ValueError(f"{e}; re-pilot the preset (--pilot) to write it again") from None
    if plan is not None and (not isinstance(plan.get("findings"), dict) or "experiment_hash" not in plan
                             or not all(isinstance(v, dict) for v in plan["findings"].values())
                             or not isinstance(plan.get("pilot", {}), dict)
                             or not isinstance(plan.get("pilot", {}).get("seeds", []), list)):
        raise ValueError(f"{path}: not a plan file (its 'findings', 'pilot' or 'experiment_hash' is missing or of "
                         "another shape); re-pilot the preset (--pilot) to write it again")
    return plan


def pilot_command(spec: str) -> str:
    """The command that pilots ``spec`` (``FILE:PRESET``) into a pilot folder of its own."""
    stem = os.path.splitext(os.path.basename(spec.partition(":")[0]))[0]
    return (f"python -m attn_lab.sweep --experiment {spec} --workdir runs/pilot/{stem}_{spec.partition(':')[2]} "
            "--pilot --vmap-seeds")


def plan_problem(plan: Mapping[str, Any] | None, preset: Preset, path: str, spec: str) -> str | None:
    """Why ``plan`` cannot plan ``preset`` now (one line naming both fingerprints and the re-pilot command), or
    None. A plan for other findings, or one made before the preset's trials or margins changed, is stale."""
    if plan is None:
        return None
    now, then = fingerprint(preset), plan.get("experiment_hash")
    if then != now:
        return (f"{path} was planned for another version of {spec} (experiment hash {then} in the plan, {now} "
                f"now): its trials or findings changed since the pilot; re-pilot: {pilot_command(spec)}")
    missing = sorted(set(preset.findings) - set(plan["findings"]))
    if missing:
        return f"{path} has no pilot numbers for finding '{missing[0]}'; re-pilot: {pilot_command(spec)}"
    return None


def design_of(preset: Preset, plan: Mapping[str, Any] | None, path: str) -> Design | None:
    """The preset's design: its findings with the plan's numbers (no plan: every finding exploratory, the preset's
    own pilot seeds named)."""
    if not preset.findings:
        return None
    if plan is None:
        return Design.of(preset.findings, None, "", tuple(preset.pilot_seeds))
    found = plan["findings"]
    pilot = plan.get("pilot", {})
    where = f"{os.path.join(PLANS, os.path.basename(path))} (pilot seeds {_seeds_text(pilot.get('seeds', []))}" + \
            (f", commit {_short(str(pilot['commit']))}" if pilot.get("commit") else "") + \
            (", migrated" if pilot.get("migrated") else "") + ")"
    values = {f: {k: (found.get(k) or {}).get(f) for k in preset.findings} for f in FIELDS}
    return Design.of(preset.findings, values["sd"], where, tuple(pilot.get("seeds", ())), effect=values["effect"],
                     pilot_collapsed={k: v or 0 for k, v in values["pilot_collapsed"].items()})


def _short(commit: str) -> str:
    """A commit (or range 'a-b') shortened to 10 characters per sha."""
    return "-".join(part[:10] for part in commit.split("-"))


def _seeds_text(seeds: Sequence[int]) -> str:
    seeds = list(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds)) or "none"


def pilot_numbers(design: Design, diffs: Mapping[str, stats.Interval | None],
                  diverged: Mapping[str, Sequence[int]], metric: str) -> dict[str, dict[str, Any]]:
    """Per finding, the pilot's effect, sd, pairs and collapsed seeds from its paired differences; a one-line
    ValueError -- before any plan is written -- for a finding without at least ``MIN_PAIRS`` finite pairs or with a
    seed whose metric is not finite. A difference with no spread over the seeds is kept with sd None: the plan
    cannot size it, so the finding stays exploratory."""
    out = {}
    for key, finding in design.findings.items():
        diff = diffs.get(key)
        bad = list((diverged or {}).get(key, ()))
        if bad:
            raise ValueError(f"pilot: finding '{key}': {metric} is not finite on seed {bad[0]}: no plan is written "
                             "from a diverged pilot (fix the run or the budget, then pilot again)")
        if diff is None or diff.pairs < MIN_PAIRS:
            pairs = 0 if diff is None else diff.pairs
            raise ValueError(f"pilot: finding '{key}' has {pairs} paired seeds in {metric}; a plan needs at least "
                             f"{MIN_PAIRS} (give the pilot {MIN_PAIRS}+ seeds and let every arm finish)")
        if not (math.isfinite(diff.mean) and math.isfinite(diff.sd)):
            raise ValueError(f"pilot: finding '{key}': the paired difference in {metric} is not finite (mean "
                             f"{diff.mean}, sd {diff.sd}): no plan is written")
        collapsed = stats.collapsed(dict(zip(diff.seeds, diff.values)), None, finding.margin) if diff.values else []
        out[key] = {"effect": round(float(diff.mean), 6), "sd": round(float(diff.sd), 6) if diff.sd > 0 else None,
                    "pilot_collapsed": len(collapsed), "pairs": diff.pairs,
                    "values": {str(s): round(float(v), 6) for s, v in zip(diff.seeds, diff.values)}}
    return out


def build_plan(preset: Preset, spec: str, numbers: Mapping[str, dict], pilot: Mapping[str, Any],
               verdict_seeds: int, measured: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The plan file's content: the pilot's numbers, where they came from, and the plan at ``verdict_seeds``."""
    file, _, preset_name = spec.partition(":")
    plan = {"experiment": os.path.basename(file), "preset": preset_name, "name": preset.name,
            "experiment_hash": fingerprint(preset), "level": stats.LEVEL,
            "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "pilot": dict(pilot), "findings": {k: dict(v) for k, v in numbers.items()},
            "measured": dict(measured or {})}
    design = design_of(preset, plan, plan_path(file, preset.name))
    plan["plan"] = {"verdict_seeds": verdict_seeds, "findings": design.plan(verdict_seeds)}
    return plan


def git_now() -> dict[str, Any]:
    """The checkout's commit and whether it is dirty (taken when a pilot starts: the code it runs)."""
    from attn_lab.environment import git_state  # imports jax: only when a pilot runs

    return git_state()


def pilot_record(seeds: Sequence[int], workdir: str, command: Sequence[str], wall_seconds: float | None,
                 steps_per_sec: Mapping[str, float], git: Mapping[str, Any] | None = None,
                 steps: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Where the pilot's numbers come from: its seeds, folder, command, commit (``git``: as the pilot started),
    wall time, and steps/s and steps per arm."""
    git = git or git_now()
    return {"seeds": list(seeds), "workdir": os.path.abspath(workdir), "command": " ".join(command),
            "commit": git["commit"], "dirty": git["dirty"],
            "wall_seconds": None if wall_seconds is None else round(wall_seconds, 1),
            "steps_per_sec": {k: round(v, 3) for k, v in steps_per_sec.items()}, "steps": dict(steps or {})}


def write_plan(path: str, plan: Mapping[str, Any]) -> None:
    """Writes the plan atomically (a crash leaves the old one or the new one, never half of either)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, plan)


def estimated_seconds(plan: Mapping[str, Any], seeds: int) -> float | None:
    """The verdict run's time scaled from the pilot's by seeds (a vectorized seed costs less: an upper estimate):
    its wall time, else (a pilot that ran in several invocations) its arms one after another at their measured
    steps/s; None when it measured neither."""
    pilot = plan.get("pilot", {})
    count, wall = len(pilot.get("seeds", ())), pilot.get("wall_seconds")
    speeds, steps = pilot.get("steps_per_sec") or {}, pilot.get("steps") or {}
    serial = sum(steps[a] / v for a, v in speeds.items() if v and steps.get(a)) if speeds else 0.0
    base = wall or serial
    return None if not base or not count else base * seeds / count


def estimate_basis(plan: Mapping[str, Any]) -> str:
    """What :func:`estimated_seconds` scaled: the pilot's wall time, or its arms' steps at their steps/s."""
    return "wall time" if plan.get("pilot", {}).get("wall_seconds") else "arms run one after another at its steps/s"
