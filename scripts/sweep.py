"""Run an ablation sweep from one experiment file.

  python scripts/sweep.py --config experiments/head_count.py:quick --workdir runs/head_count
  python scripts/sweep.py --config experiments/head_count.py:quick --workdir runs/head_count --dry-run
  python scripts/sweep.py ... --parallel 2 --shard 0/4 --config.train.num_steps=100

Every trial runs ``scripts/train.py`` in its own folder; finished trials are skipped (resume), failures are recorded
and the rest go on; ``results.csv`` and a summary table are written at the end. Exit code 0 only if every selected
trial succeeded. Extra ``--config.key=value`` flags are passed to every trial.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from attn_lab.sweep.runner import collect, format_table, override_flags, run_sweep, write_csv
from attn_lab.sweep.spec import load_config_file, load_experiment


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="experiment file, with ':preset' (default quick)")
    p.add_argument("--workdir", required=True)
    p.add_argument("--dry-run", action="store_true", help="list the trials and their overrides, run nothing")
    p.add_argument("--parallel", type=int, default=1, help="trial processes at once")
    p.add_argument("--shard", default="0/1", help="I/N: run every N-th trial starting at I (scheduler arrays)")
    args, extra = p.parse_known_args(argv)
    bad = [a for a in extra if not re.match(r"--config\.[\w.]+=", a)]
    if bad:
        p.error(f"unrecognized arguments: {' '.join(bad)}")
    return args, extra


def main(argv: list[str]) -> int:
    args, extra = parse(argv)
    try:
        exp = load_experiment(args.config)
        base = load_config_file(exp.config)
        for flag in extra:  # validate pass-through overrides against the base config before anything runs
            key = flag[len("--config."):].split("=", 1)[0]
            node = base
            for part in key.split("."):
                if not hasattr(node, "keys") or part not in node:
                    raise ValueError(f"unknown config key 'config.{key}'")
                node = node[part]
        index, count = (int(x) for x in args.shard.split("/"))
        if not 0 <= index < count:
            raise ValueError(f"--shard {args.shard}: need 0 <= I < N")
    except ValueError as e:
        sys.exit(f"error: {e}")
    trials = exp.trials()[index::count]
    if args.dry_run:
        for t in trials:
            print(t.name, " ".join(override_flags(t.overrides)))
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    statuses = run_sweep(exp, trials, args.workdir, parallel=args.parallel, extra=extra)
    rows = collect(exp, args.workdir, statuses)
    write_csv(rows, os.path.join(args.workdir, "results.csv"))
    print(format_table(rows))
    return 0 if all(s in ("ok", "skipped") for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
