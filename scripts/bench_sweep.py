"""Trials per hour of a sweep with and without vectorized seeds, measured in one run (same machine, same load).

  python scripts/bench_sweep.py                       # quick head-count sweep, seeds 0,1,2: separate vs --vmap-seeds
  python scripts/bench_sweep.py --modes separate,vmap,separate-parallel2,vmap-parallel2 --out docs/bench_sweep.md

Each mode runs the real ``scripts/sweep.py`` into a fresh folder and is timed end to end (process start, data,
compilation, training, evaluation, W&B, results), so the ratio is what a user of the sweep gets. Also reports each
mode's mean test metric, which must agree across modes (the same trials were trained).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {"separate": [], "vmap": ["--vmap-seeds"], "separate-parallel2": ["--parallel", "2"],
         "vmap-parallel2": ["--vmap-seeds", "--parallel", "2"]}


def run_mode(args: argparse.Namespace, mode: str, extra: list[str]) -> dict:
    """One timed sweep in ``<workdir>/<mode>``; returns wall time, trials/hour and the mean test metric."""
    workdir = os.path.join(args.workdir, mode)
    shutil.rmtree(workdir, ignore_errors=True)
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "sweep.py"), "--config", args.experiment, "--workdir",
           workdir, "--seeds", args.seeds, *MODES[mode], *extra]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"error: {mode} sweep failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    rows = list(csv.DictReader(open(os.path.join(workdir, "results.csv"))))
    metric = next(k for k in ("test_exact_match", "test_accuracy") if k in rows[0])
    values = [float(r[metric]) for r in rows]
    return {"mode": mode, "trials": len(rows), "wall_sec": wall, "trials_per_hour": len(rows) * 3600 / wall,
            "metric": metric, "mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0}


def table(results: list[dict]) -> str:
    base = results[0]["trials_per_hour"]
    lines = [f"| mode | trials | wall (s) | trials/hour | vs {results[0]['mode']} | mean {results[0]['metric']} |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['trials']} | {r['wall_sec']:.0f} | {r['trials_per_hour']:.1f} | "
              f"{r['trials_per_hour'] / base:.2f}x | {r['mean']:.4f} +- {r['std']:.4f} |" for r in results]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default="experiments/head_count.py:quick")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--modes", default="separate,vmap", help=f"comma-separated, from {', '.join(MODES)}")
    p.add_argument("--workdir", default="bench/sweep")
    p.add_argument("--out", help="also write the Markdown table here")
    args, extra = p.parse_known_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode {unknown[0]!r}; choose from {', '.join(MODES)}")
    results = []
    for mode in modes:
        results.append(run_mode(args, mode, extra))
        print(f"{mode}: {results[-1]['wall_sec']:.0f} s, {results[-1]['trials_per_hour']:.1f} trials/hour", flush=True)
    text = table(results)
    header = (f"`python scripts/bench_sweep.py --experiment {args.experiment} --seeds {args.seeds} --modes "
              f"{args.modes}` ({os.cpu_count()} CPU cores)\n\n")
    print(text)
    with open(os.path.join(args.workdir, "bench_sweep.json"), "w") as f:
        json.dump(results, f, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(header + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
