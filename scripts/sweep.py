"""Run an ablation sweep from one experiment file.

  python scripts/sweep.py --config experiments/head_count.py:quick --workdir runs/head_count
  python scripts/sweep.py --config experiments/head_count.py:quick --workdir runs/head_count --dry-run
  python scripts/sweep.py ... --parallel 2 --shard 0/4 --config.train.num_steps=100
  python scripts/sweep.py ... --seeds 0,1,2 --vmap-seeds
  python scripts/sweep.py ... --export-wandb sweep.yaml   # then: wandb sweep sweep.yaml; wandb agent <id>

Every trial runs ``scripts/train.py`` in its own folder; finished trials are skipped (resume), failures are recorded
and the rest go on; ``results.csv`` and a summary table are written at the end. Exit code 0 only if every selected
trial succeeded. Extra ``--config.key=value`` flags are passed to every trial; one that sets a key the sweep varies
(an axis, a variant's key, the seed) stops the sweep before it starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys

from attn_lab.checks import check_seed, check_writable
from attn_lab.sweep.runner import collect, format_table, override_flags, run_sweep, write_csv
from attn_lab.sweep.spec import Experiment, Trial, load_config_file, load_experiment
from attn_lab.sweep.wandb_sweep import sweep_definition, trial_from_wandb, write_sweep_yaml
from attn_lab.io import write_json_atomic
from attn_lab.train.seeds import parse_seeds


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        sys.exit(f"error: {message}")  # one line, like every other bad input (argparse adds its usage lines)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = _Parser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="experiment file, with ':preset' (default quick)")
    p.add_argument("--workdir", required=True)
    p.add_argument("--dry-run", action="store_true", help="list the trials and their overrides, run nothing")
    p.add_argument("--parallel", type=int, default=1, help="trial processes at once")
    p.add_argument("--shard", default="0/1", help="I/N: run every N-th trial starting at I (scheduler arrays)")
    p.add_argument("--seeds", help="comma-separated seeds replacing the experiment's")
    p.add_argument("--vmap-seeds", action="store_true",
                   help="train the seeds of each trial in one process, vectorized with jax.vmap")
    p.add_argument("--export-wandb", metavar="YAML", help="write the sweep as a W&B grid sweep definition and exit")
    p.add_argument("--wandb-trial", metavar="JSON", help="(W&B agent) run the one trial with these parameters")
    args, extra = p.parse_known_args(argv)
    bad = [a for a in extra if not re.match(r"--config\.[\w.]+=", a)]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    return args, extra


def _check_overrides(exp: Experiment, extra: list[str]) -> None:
    """Pass-through ``--config.x=y`` flags must name keys of the base config that the sweep does not vary (checked
    before anything runs)."""
    base = load_config_file(exp.config)
    overrides = dict(flag[len("--config."):].split("=", 1) for flag in extra)
    for key in overrides:
        node = base
        for part in key.split("."):
            if not hasattr(node, "keys") or part not in node:
                raise ValueError(f"unknown config key 'config.{key}'")
            node = node[part]
    exp.check_pass_through(overrides)


def select(args: argparse.Namespace, exp: Experiment) -> list[Trial]:
    """The trials this invocation runs: the W&B agent's one trial, or this shard of all of them."""
    if args.wandb_trial:
        return [trial_from_wandb(exp, args.wandb_trial)]
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", args.shard)
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise ValueError(f"--shard={args.shard!r}: give I/N with 0 <= I < N, e.g. 0/4")
    index, count = int(match.group(1)), int(match.group(2))
    return exp.trials()[index::count]


def _check_workdir(exp: Experiment, workdir: str) -> None:
    """The sweep folder can be written, and every finished trial's results.json there can be read (a rerun skips
    those trials and tabulates them at the end)."""
    check_writable(workdir, "--workdir")
    for trial in exp.trials():
        path = os.path.join(workdir, trial.name, "results.json")
        if not os.path.exists(path):
            continue
        try:
            with open(path) as f:
                json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} cannot be read ({type(e).__name__}: {str(e)[:80]}); delete it to rerun the "
                             "trial") from None


def main(argv: list[str]) -> int:
    args, extra = parse(argv)
    try:
        if args.parallel < 1:
            raise ValueError(f"--parallel={args.parallel}: give at least 1 trial process")
        exp = load_experiment(args.config)
        if args.seeds:
            exp = dataclasses.replace(exp, seeds=parse_seeds(args.seeds))
            for seed in exp.seeds:
                check_seed(seed, "--seeds")
        _check_overrides(exp, extra)
        trials = select(args, exp)
        if not (args.export_wandb or args.dry_run):
            _check_workdir(exp, args.workdir)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if args.export_wandb:
        write_sweep_yaml(args.export_wandb, sweep_definition(exp, args.config, args.workdir, extra))
        print(f"wrote {args.export_wandb}: {len(exp.trials())} trials; run `wandb sweep {args.export_wandb}`, "
              "then `wandb agent <sweep id>` on each machine")
        return 0
    if args.dry_run:
        for t in trials:
            print(t.name, " ".join(override_flags(t.overrides)))
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    path, _, preset = args.config.partition(":")  # for scripts/make_tables.py
    write_json_atomic(os.path.join(args.workdir, "sweep.json"), {
        "experiment": f"{os.path.abspath(path)}:{preset or 'quick'}", "root": exp.root, "name": exp.name})
    statuses = run_sweep(exp, trials, args.workdir, parallel=args.parallel, extra=extra, vmap_seeds=args.vmap_seeds)
    rows = collect(exp, args.workdir, statuses)
    write_csv(rows, os.path.join(args.workdir, "results.csv"))
    print(format_table(rows))
    return 0 if all(s in ("ok", "skipped") for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
