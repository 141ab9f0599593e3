"""Run an ablation sweep from one experiment file (``python -m attn_lab.sweep``; ``scripts/sweep.py`` and
``attn-sweep`` run this).

  python -m attn_lab.sweep --experiment experiments/head_count.py:quick --workdir runs/head_count
  python -m attn_lab.sweep --experiment experiments/head_count.py:quick --workdir runs/head_count --dry-run
  python -m attn_lab.sweep ... --parallel 2 --shard 0/4 --config.train.num_steps=100
  python -m attn_lab.sweep ... --seeds 0,1,2 --vmap-seeds
  python -m attn_lab.sweep ... --export-wandb sweep.yaml   # then: wandb sweep sweep.yaml; wandb agent <id>

Every trial runs ``python -m attn_lab.train`` in its own folder; finished trials are skipped (resume), failures are
recorded and the rest go on; ``results.csv`` and a summary table are written at the end. Exit code 0 only if every
selected trial succeeded. Extra ``--config.key=value`` flags are passed to every trial, checked first against the
base config (key and type, as a trial would parse them); one that sets a key the sweep varies (an axis, a variant's
key, the seed) stops the sweep before it starts.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time

from absl import flags

from attn_lab import results, signals
from attn_lab.checks import check_path_lengths, check_seed, check_writable
from attn_lab.cli import (
    DEFINE_integer_list,
    check_config_overrides,
    main_args,
    parse_flags,
    run_entry_point,
    split_config_overrides,
)
from attn_lab.io import write_json_atomic
from attn_lab.reporting.stats import INTERVAL
from attn_lab.reporting.verdicts import EXPLORATORY, file_sha256, plan_text, registration
from attn_lab.sweep import pilot as pilot_lib
from attn_lab.sweep import plans
from attn_lab.sweep.runner import (
    check_trials,
    child_env,
    collect,
    format_table,
    override_flags,
    run_sweep,
    write_csv,
)
from attn_lab.sweep.spec import Experiment, Trial, load_config_file, load_experiment
from attn_lab.sweep.wandb_sweep import sweep_definition, trial_from_wandb, write_sweep_yaml
from attn_lab.train.workdir import WorkdirBusy, WorkdirLock

_EXPERIMENT = flags.DEFINE_string("experiment", None, "Experiment file, with ':preset' (default quick).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep folder: one sub-folder per trial, results.csv.")
_DRY_RUN = flags.DEFINE_bool("dry-run", False, "List the trials and their overrides, run nothing.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Trial processes at once.", lower_bound=1)
_SHARD = flags.DEFINE_string("shard", "0/1", "I/N: run every N-th trial starting at I (scheduler arrays).")
_SEEDS = DEFINE_integer_list("seeds", None, "Comma-separated seeds replacing the experiment's.")
_STATUS_EVERY = flags.DEFINE_integer("status-every", 60, "Seconds between the status lines of the running trials "
                                     "(step, loss, steps/s); 0: none; at most a day.", lower_bound=0,
                                     upper_bound=86400)
_TABLES = flags.DEFINE_bool("tables", True, "At the end, write and print the experiment's tables (mean +- sd over "
                            "seeds; its verdicts where it has a design), as make_tables does.")
_VMAP_SEEDS = flags.DEFINE_bool("vmap-seeds", False, "Train the seeds of each trial in one process (jax.vmap).")
_EXPORT_WANDB = flags.DEFINE_string("export-wandb", None, "Write the sweep as a W&B grid sweep YAML and exit.")
_WANDB_TRIAL = flags.DEFINE_string("wandb-trial", None, "(W&B agent) run the one trial with these JSON parameters.")
_PILOT = flags.DEFINE_bool("pilot", False, "Train the preset's pilot seeds (or --seeds) and write its plan, "
                           "plans/<sweep name>.json beside the experiment file, from each finding's paired difference.")
_PILOT_AND_VERDICT = flags.DEFINE_bool("pilot-and-verdict", False, "Pilot the preset into <workdir>/pilot unless its "
                                       "plan is current, print the plan, then run the verdict in <workdir>/verdict; "
                                       "rerun to resume whichever stage is unfinished.")
_MAX_SEEDS = flags.DEFINE_integer("max-seeds", None, "With --pilot-and-verdict: verdict seeds as many as the plan "
                                  "needs, at most this many (default: the preset's).", lower_bound=3)
flags.mark_flags_as_required(["experiment", "workdir"])


def parse_sweep_flags(argv: list[str]) -> list[str]:
    """:func:`attn_lab.cli.parse_flags` for the sweep, whose ``--config.key=value`` flags go to the trials: returns
    ``[program, *those flags]``. ``--config`` alone would name a config, which a sweep takes from its experiment."""
    rest, overrides = split_config_overrides(argv)
    for i, arg in enumerate(rest):
        if arg == "--config" or arg.startswith("--config="):
            value = arg.partition("=")[2] or (rest[i + 1] if i + 1 < len(rest) else "")
            sys.exit(f"error: --config={value}: the sweep takes its experiment file as --experiment FILE[:preset] "
                     "(the base config is the experiment's 'config')")
    program, *positional = parse_flags(rest)
    main_args([program, *positional])
    return [program, *overrides]


def _check_overrides(exp: Experiment, extra: list[str]) -> None:
    """Pass-through ``--config.x=y`` flags must parse against the base config (known key, right type) and leave the
    keys the sweep varies alone (checked before anything runs)."""
    check_config_overrides(load_config_file(exp.config), extra)
    exp.check_pass_through(dict(flag[len("--config."):].split("=", 1) for flag in extra))


def select(exp: Experiment) -> list[Trial]:
    """The trials this invocation runs: the W&B agent's one trial, or this shard of all of them."""
    if _WANDB_TRIAL.value:
        return [trial_from_wandb(exp, _WANDB_TRIAL.value)]
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", _SHARD.value)
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise ValueError(f"--shard={_SHARD.value!r}: give I/N with 0 <= I < N, e.g. 0/4")
    index, count = int(match.group(1)), int(match.group(2))
    return exp.trials()[index::count]


def _check_workdir(exp: Experiment, workdir: str, extra: list[str]) -> None:
    """The sweep folder can be written, and every trial's records there can be read and were made by the config
    this sweep gives it (a rerun skips or resumes those trials and tabulates them at the end:
    :func:`attn_lab.sweep.runner.check_trials`)."""
    if "{" in workdir or "}" in workdir:  # the trials' per-seed folders are templated inside it ({seed})
        raise ValueError(f"--workdir='{workdir}': a sweep folder cannot hold '{{' or '}}' (each trial's folder is "
                         "named per seed inside it: the sweep's folder is one for all seeds)")
    check_writable(workdir, "--workdir")
    for trial in exp.trials():
        check_path_lengths(os.path.join(workdir, trial.name), f"trial '{trial.name[:40]}' in --workdir")
    check_trials(exp, workdir, extra)


def _load(spec: str | None = None, stage: str = "") -> tuple[Experiment, list[Trial]]:
    """The experiment (with ``--seeds``; ``stage`` 'pilot': its pilot, 'verdict': capped by ``--max-seeds``) and
    this invocation's trials, every input checked; writes nothing."""
    spec = spec or _EXPERIMENT.value
    exp = load_experiment(spec)
    if stage == "pilot":
        exp = pilot_lib.pilot_experiment(exp, spec, _SEEDS.value)
    elif stage == "verdict" and _MAX_SEEDS.value:
        exp = dataclasses.replace(exp, seeds=pilot_lib.capped_seeds(exp, _MAX_SEEDS.value))
    if _SEEDS.value and stage != "pilot":
        exp = dataclasses.replace(exp, seeds=_SEEDS.value)
        for seed in exp.seeds:
            check_seed(seed, "--seeds")
        twice = sorted({s for s in exp.seeds if exp.seeds.count(s) > 1})
        if twice:
            raise ValueError(f"--seeds: seed {twice[0]} is given twice; give each seed once")
    return exp, select(exp)


def design_text(exp: Experiment) -> str:
    """What the preset can decide, per finding, before anything runs (``--dry-run`` prints it)."""
    if exp.design is None:
        return "design: none (this experiment declares no findings to judge)"
    d = exp.design
    lines = [f"design: {len(exp.seeds)} seeds, {INTERVAL} interval at {d.level:.0%}; pilot effects and sds from: "
             f"{d.pilot or 'no pilot'} (pilot seeds {', '.join(map(str, d.pilot_seeds)) or 'none'})"]
    for key, plan in d.plan(len(exp.seeds)).items():
        finding = d.findings[key]
        role = "confirmatory" if plan["confirmatory"] else EXPLORATORY
        lines.append(f"  {key}: {finding.direction} (margin {finding.margin:g}), {plan_text(plan, finding.margin)}"
                     f" -> {role}" + (" (formed on the pilot's seeds)" if finding.exploratory else ""))
    overlap = sorted(set(exp.seeds) & set(d.pilot_seeds))
    if overlap:
        lines.append(f"  seeds {', '.join(map(str, overlap))} are the pilot's: this run is a pilot, not a verdict run")
    return "\n".join(lines)


SWEEP_KEYS = ("experiment", "name")  # what every sweep.json holds ('registration' too, since sweeps register)
KEPT = ("it holds the registration this sweep keeps when resumed; restore it, or move it away to register the sweep "
        "anew (the trials' folders are kept)")


def _sweep_info(workdir: str) -> dict | None:
    """This folder's sweep.json (None: none yet). A damaged one (unreadable, truncated, not an object, a key
    missing) is refused in one line, never replaced: it holds the registration a resumed sweep promises to keep."""
    try:
        old = results.read_record(workdir, "sweep.json")
    except ValueError as e:
        raise ValueError(f"{e}: {KEPT}") from None
    path = os.path.join(workdir, "sweep.json")
    missing = [k for k in SWEEP_KEYS if old is not None and k not in old]
    if missing:
        raise ValueError(f"{path} lacks '{missing[0]}': {KEPT}")
    if old is not None and "registration" in old and not isinstance(old["registration"], dict):
        raise ValueError(f"{path} holds registration={old['registration']!r}, not a record: {KEPT}")
    return old


def _registered(spec: str, workdir: str) -> dict | None:
    """The registration this folder's sweep.json holds (None: a new sweep); :func:`_check_owner` made sure it is
    this experiment's."""
    return ((_sweep_info(workdir) or {}).get("registration") or None)


def _check_owner(exp: Experiment, spec: str, workdir: str) -> None:
    """A sweep folder belongs to one experiment: the same name and preset, from the same file (its path, or its
    content where the file moved). Another one stops in one line -- its trials would be tabulated as this one's."""
    old = _sweep_info(workdir)
    if old is None:
        return
    path, _, preset = spec.partition(":")
    was, now = old.get("experiment", ""), f"{os.path.abspath(path)}:{preset or 'quick'}"
    same_file = was.rpartition(":")[0] == os.path.abspath(path) or (
        (old.get("registration") or {}).get("experiment_sha256") == file_sha256(path))
    if old.get("name") != exp.name or not same_file:  # a sweep is known by its name (a renamed preset keeps it)
        raise ValueError(f"--workdir={workdir} holds the sweep '{old.get('name')}' ({was}); this is '{exp.name}' "
                         f"({now}): give each experiment its own --workdir")


def _check_registration(exp: Experiment, spec: str, workdir: str, extra: list[str]) -> None:
    """A resumed sweep runs what it registered: the same seeds and command-line overrides (else its tables would
    judge trials the registration does not describe)."""
    _check_owner(exp, spec, workdir)
    reg = _registered(spec, workdir)
    if reg is None:
        return
    if list(exp.seeds) != list(reg.get("seeds", exp.seeds)):
        raise ValueError(f"--seeds={','.join(map(str, exp.seeds))}: {workdir}/sweep.json registered seeds "
                         f"{','.join(map(str, reg['seeds']))} when this sweep started; use a new --workdir")
    now, then = _result_overrides(extra), _result_overrides(reg.get("command_line", []))
    if now != then:
        key = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))[0]
        raise ValueError(f"--config.{key}={now.get(key, '(not given)')}: {workdir}/sweep.json registered "
                         f"{then.get(key, '(not given)')} when this sweep started; use a new --workdir")


# Command-line overrides that leave a trial's results as they are: where data, caches and logs go.
NEUTRAL = ("task.data_dir", "compile_cache", "wandb.")


def _result_overrides(extra: list[str]) -> dict[str, str]:
    """``--config.KEY=VALUE`` overrides that can change a trial's results, as {KEY: VALUE}."""
    pairs = (a[len("--config."):].partition("=") for a in extra if a.startswith("--config."))
    return {k: v for k, _, v in pairs if not k.startswith(NEUTRAL)}


def register(exp: Experiment, spec: str, workdir: str, extra: list[str], pilot: bool = False) -> None:
    """``sweep.json``: where the experiment is (for make_tables) and, written once when the sweep first starts, its
    registration -- the file's sha256, design, seeds, budgets and command-line overrides -- which a resumed sweep
    keeps."""
    path, _, preset = spec.partition(":")
    experiment = f"{os.path.abspath(path)}:{preset or 'quick'}"
    info_path = os.path.join(workdir, "sweep.json")
    keep = _registered(spec, workdir)
    reg = keep or registration(exp, path, extra)
    if keep and reg.get("experiment_sha256") != file_sha256(path):
        print(f"note: {path} changed since this sweep started; its tables judge the design registered then")
    if not keep and os.path.exists(info_path):  # an older sweep's, or one whose registration was removed: said
        print(f"note: {info_path} holds no registration (a sweep older than registrations, or the key was removed): "
              "this rerun registers the experiment as it is now")
    if not keep:  # the plan it was planned from (a later re-pilot leaves this copy as it was), and whether a pilot
        reg = {**reg, "plan": None if pilot else exp.plan, "pilot": pilot}
    write_json_atomic(info_path, {"experiment": experiment, "root": exp.root, "name": exp.name, "registration": reg})


def main(argv: list[str]) -> int:
    """Checks everything, then lists (``--dry-run``), exports (``--export-wandb``) or runs the trials: the verdict
    run, the pilot (``--pilot``) or both in turn (``--pilot-and-verdict``)."""
    extra, spec, workdir = argv[1:], _EXPERIMENT.value, _WORKDIR.value
    if _PILOT.value and _PILOT_AND_VERDICT.value:
        sys.exit("error: --pilot and --pilot-and-verdict: give one (the second runs the first when it is needed)")
    if _MAX_SEEDS.value is not None and not _PILOT_AND_VERDICT.value:
        sys.exit(f"error: --max-seeds={_MAX_SEEDS.value}: it caps the verdict seeds of --pilot-and-verdict; a plain "
                 "run takes --seeds")
    if _PILOT_AND_VERDICT.value:
        return _pilot_and_verdict(spec, workdir, extra)
    return _stage(spec, workdir, extra, "pilot" if _PILOT.value else "verdict")


def _pilot_and_verdict(spec: str, workdir: str, extra: list[str]) -> int:
    """The pilot into ``<workdir>/pilot`` unless the preset's plan is current, then the verdict into
    ``<workdir>/verdict`` (each stage resumes where a rerun finds it)."""
    if _DRY_RUN.value or _EXPORT_WANDB.value or _WANDB_TRIAL.value or _SEEDS.value:
        sys.exit("error: --pilot-and-verdict runs both stages; --dry-run, --export-wandb, --wandb-trial and --seeds "
                 "go with --pilot or a plain run")
    try:
        exp = load_experiment(spec)
        pilot_lib.pilot_experiment(exp, spec, None)  # a preset that can be piloted: one line otherwise
    except ValueError as e:
        sys.exit(f"error: {e}")
    if exp.plan is None or exp.plan_problem:
        code = _stage(spec, os.path.join(workdir, "pilot"), extra, "pilot")
        if code:
            return code
    else:
        print(f"plan {exp.plan_path} is current (pilot seeds {','.join(map(str, exp.plan['pilot']['seeds']))}): no "
              "pilot (--pilot pilots again)")
    return _stage(spec, os.path.join(workdir, "verdict"), extra, "verdict", summary=True)


def _stage(spec: str, workdir: str, extra: list[str], stage: str, summary: bool = False) -> int:
    """One sweep: ``stage`` 'verdict' (needs a current plan where the preset has one) or 'pilot' (writes it)."""
    try:
        exp, trials = _load(spec, stage)
        _check_overrides(exp, extra)
        if stage == "verdict":
            pilot_lib.check_verdict(exp, spec)
        if not (_EXPORT_WANDB.value or _DRY_RUN.value):
            _check_workdir(exp, workdir, extra)
            _check_registration(exp, spec, workdir, extra)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if _EXPORT_WANDB.value:
        try:
            definition = sweep_definition(exp, spec, workdir, extra)
        except ValueError as e:
            sys.exit(f"error: {e}")
        write_sweep_yaml(_EXPORT_WANDB.value, definition)
        print(f"wrote {_EXPORT_WANDB.value}: {len(exp.trials())} trials; run `wandb sweep {_EXPORT_WANDB.value}`, "
              "then `wandb agent <sweep id>` on each machine")
        return 0
    if _DRY_RUN.value:
        for t in trials:
            print(t.name, " ".join(override_flags(t.overrides)))
        print(f"every trial also gets: {' '.join(extra)}" if extra else "every trial also gets: no pass-through "
              "overrides")
        print(design_text(exp) if stage == "verdict" else f"pilot: writes {exp.plan_path} from seeds "
              f"{','.join(map(str, exp.seeds))}")
        return 0
    if summary and exp.plan:
        print(pilot_lib.plan_summary(exp, exp.plan, list(exp.seeds)))
    lock = None if _WANDB_TRIAL.value else _lock(workdir)  # W&B agents share one folder by design
    try:
        start, git = time.monotonic(), plans.git_now() if stage == "pilot" else None  # the code the pilot runs
        code, statuses = _run(exp, spec, trials, workdir, extra, pilot=stage == "pilot")
        if stage != "pilot" or code:
            return code
        wall = time.monotonic() - start if all(s == "ok" for s in statuses.values()) else None  # resumed: partial
        return _write_plan(exp, spec, workdir, wall, git)
    finally:
        if lock is not None:
            lock.release()


def _write_plan(exp: Experiment, spec: str, workdir: str, wall: float | None, git: dict | None) -> int:
    """The finished pilot's plan, written beside the experiment file and printed; none when it cannot be measured."""
    try:
        path, plan = pilot_lib.write_from_pilot(exp, spec, collect(exp, workdir), workdir, sys.argv, wall, git)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    planned = load_experiment(spec)
    print(f"wrote {path}")
    print(pilot_lib.plan_summary(planned, plan, list(planned.seeds)))
    return 0


def _lock(workdir: str) -> WorkdirLock:
    """The sweep folder's lock for this shard: a second sweep of the same trials stops in one line (shards of one
    sweep run side by side; each trial folder has its own lock as well)."""
    lock = WorkdirLock(workdir, name=f".sweep-{_SHARD.value.replace('/', 'of').replace(' ', '')}.lock")
    try:
        lock.acquire()
    except WorkdirBusy as e:
        sys.exit(f"error: {e}")
    return lock


def _run(exp: Experiment, spec: str, trials: list[Trial], workdir: str, extra: list[str],
         pilot: bool = False) -> tuple[int, dict]:
    """Registers and runs the trials, then writes results.csv and the table (also after SIGINT / SIGTERM: then one
    line says so and the exit code is 130 / 143); returns (exit code, each trial's status)."""
    register(exp, spec, workdir, extra, pilot=pilot)
    statuses, signum = run_sweep(exp, trials, workdir, parallel=_PARALLEL.value, extra=extra,
                                 vmap_seeds=_VMAP_SEEDS.value, status_every=_STATUS_EVERY.value)
    rows = collect(exp, workdir, statuses)
    write_csv(rows, os.path.join(workdir, "results.csv"))
    if signum is not None:
        done = sum(s in ("ok", "skipped") for s in statuses.values())
        print(f"stopped by {signals.NAMES.get(signum, signum)}: {done} of {len(trials)} trials finished, "
              f"{os.path.join(workdir, 'results.csv')} written; the same command resumes the rest", file=sys.stderr)
        return 128 + signum, statuses
    print(format_table(rows))
    finished = all(s in ("ok", "skipped") for s in statuses.values())
    if _TABLES.value and finished:
        _print_tables(exp, workdir)
    return (0 if finished else 1), statuses


def _print_tables(exp: Experiment, workdir: str) -> None:
    """The experiment's tables -- mean +- sd over seeds per variant and, with a design, the verdict rows -- written
    and printed by the reporting command (a subprocess: the sweep does not import the reporting layer's entry)."""
    again = f"python -m attn_lab.reporting --workdir {workdir}"  # scripts/make_tables.py runs the same
    proc = subprocess.run([sys.executable, "-m", "attn_lab.reporting", "--workdir", workdir], capture_output=True,
                          text=True, env=child_env())
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"tables not written ({reason}); {again} retries", file=sys.stderr)
        return
    print(proc.stdout.split("Environments of these runs:")[0].rstrip())
    print(f"tables, plots and environments in {os.path.join(workdir, 'tables')} ({again} rewrites them)")


def run() -> None:
    """The ``attn-sweep`` console script."""
    run_entry_point(main, __name__, parse_sweep_flags)


if __name__ == "__main__":
    run()
