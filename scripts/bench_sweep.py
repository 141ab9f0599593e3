"""Trials per hour of a sweep with and without vectorized seeds, measured in one run (same machine, same load).

  python scripts/bench_sweep.py                       # quick head-count sweep, seeds 0,1,2: separate vs --vmap-seeds
  python scripts/bench_sweep.py --modes separate,vmap,separate-parallel2,vmap-parallel2 --out docs/bench_sweep.md

Each mode runs the real sweep (``python -m attn_lab.sweep``) into a fresh folder and is timed end to end (process
start, data, compilation, training, evaluation, W&B, results), so the ratio is what a user of the sweep gets. Also
reports each mode's mean test metric, which must agree across modes (the same trials were trained). Extra
``--config.key=value`` flags go to every sweep.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from absl import app, flags

from attn_lab.cli import DEFINE_integer_list, main_args, parse_flags, split_config_overrides
from attn_lab.markdown import markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {"separate": [], "vmap": ["--vmap-seeds"], "separate-parallel2": ["--parallel", "2"],
         "vmap-parallel2": ["--vmap-seeds", "--parallel", "2"]}


_EXPERIMENT = flags.DEFINE_string("experiment", "experiments/head_count.py:numbers", "Experiment file[:preset].")
_SEEDS = DEFINE_integer_list("seeds", [10, 11, 12], "Comma-separated seeds of every mode's sweep (not the preset's "
                             "pilot seeds: a sweep on those is refused, they belong to its plan).")
_MODES = flags.DEFINE_list("modes", ["separate", "vmap"], f"Comma-separated, from {', '.join(MODES)}.")
_WORKDIR = flags.DEFINE_string("workdir", "bench/sweep", "Folder of the sweeps, one per mode, and bench_sweep.json.")
_OUT = flags.DEFINE_string("out", None, "Also write the Markdown table here.")
flags.register_validator("modes", lambda modes: set(modes) <= set(MODES),
                         f"give comma-separated modes from {', '.join(MODES)}")


def run_mode(mode: str, extra: list[str]) -> dict:
    """One timed sweep in ``<workdir>/<mode>``; returns wall time, trials/hour and the mean test metric."""
    workdir = os.path.join(_WORKDIR.value, mode)
    shutil.rmtree(workdir, ignore_errors=True)
    cmd = [sys.executable, "-m", "attn_lab.sweep", "--experiment", _EXPERIMENT.value, "--workdir", workdir,
           "--seeds", ",".join(map(str, _SEEDS.value)), *MODES[mode], *extra]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"error: {mode} sweep failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    rows = list(csv.DictReader(open(os.path.join(workdir, "results.csv"))))
    metric = next(k for k in ("test_exact_match", "test_accuracy") if k in rows[0])
    values = [float(r[metric]) for r in rows]
    return {"mode": mode, "trials": len(rows), "wall_sec": wall, "trials_per_hour": len(rows) * 3600 / wall,
            "metric": metric, "mean": statistics.mean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0}


def table(results: list[dict]) -> str:
    base = results[0]["trials_per_hour"]
    header = ["mode", "trials", "wall (s)", "trials/hour", f"vs {results[0]['mode']}", f"mean {results[0]['metric']}"]
    rows = [[r["mode"], str(r["trials"]), f"{r['wall_sec']:.0f}", f"{r['trials_per_hour']:.1f}",
             f"{r['trials_per_hour'] / base:.2f}x", f"{r['mean']:.4f} +- {r['std']:.4f}"] for r in results]
    return markdown_table(header, rows)


def parse_bench_flags(argv: list[str]) -> list[str]:
    """absl flags (one-line errors); the ``--config.key=value`` flags are returned for the sweeps."""
    rest, overrides = split_config_overrides(argv)
    main_args(parse_flags(rest))
    return [rest[0], *overrides]


def main(argv: list[str]) -> int:
    extra = argv[1:]
    results = []
    for mode in _MODES.value:
        results.append(run_mode(mode, extra))
        print(f"{mode}: {results[-1]['wall_sec']:.0f} s, {results[-1]['trials_per_hour']:.1f} trials/hour", flush=True)
    text = table(results)
    header = (f"`python scripts/bench_sweep.py --experiment {_EXPERIMENT.value} --seeds "
              f"{','.join(map(str, _SEEDS.value))} --modes {','.join(_MODES.value)}` ({os.cpu_count()} CPU cores)\n\n")
    print(text)
    with open(os.path.join(_WORKDIR.value, "bench_sweep.json"), "w") as f:
        json.dump(results, f, indent=2)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            f.write(header + text + "\n")
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_bench_flags)
