"""scripts/bench_train.py end to end on a tiny model: the figures it reports are consistent with each other; ``--loop``
runs and reports every figure."""

import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_train_reports_tokens_per_second_and_utilization(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_train", os.path.join(ROOT, "scripts", "bench_train.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bt"
    assert bench.main(["--d-model", "32", "--layers", "1", "--heads", "2", "--batch", "4", "--length", "8",
                       "--vocab", "50", "--steps", "2", "--peak-sizes", "256", "--out", str(out)]) == 0
    r = json.loads(out.with_suffix(".json").read_text())
    assert r["tokens_per_sec"] == 4 * 8 / r["seconds_per_step"] and r["peak_matmul_size"] == 256
    assert r["mfu"] == r["model_flops_per_step"] / r["seconds_per_step"] / r["peak_flops_per_sec"] > 0
    assert r["xla_flops_per_step"] > r["model_flops_per_step"] / 10  # XLA counted the real step, same order
    assert "| matmul peak |" in out.with_suffix(".md").read_text()


def test_bench_train_loop_reports_trainer_over_bare_and_decoding_speedups(tmp_path):
    """``--loop`` at a tiny size, as a user runs it: every reported figure exists and is positive (ratios of wall
    times are benchmarks, not asserted here), and cached and uncached greedy decoding agree token for token."""
    out = tmp_path / "loop"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_train.py"), "--loop", "--d-model", "16",
                           "--layers", "1", "--heads", "2", "--batch", "4", "--loop-steps", "6", "--log-every", "3",
                           "--rounds", "2", "--decode-lengths", "8", "--decode-batch", "2", "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.with_suffix(".json").read_text())
    for key in ("trainer_steps_per_sec", "bare_steps_per_sec", "trainer_over_bare", "params"):
        assert r[key] > 0, key
    assert len(r["rounds"]) == 2 and r["steady_steps"] == 3 and all(x["ratio"] > 0 for x in r["rounds"])
    assert [d["length"] for d in r["decode"]] == [8]
    for d in r["decode"]:
        assert d["cached_seconds"] > 0 and d["uncached_seconds"] > 0 and d["cached_speedup"] > 0 and d["same_tokens"]
    assert "| trainer loop | bare jitted step |" in out.with_suffix(".md").read_text()
