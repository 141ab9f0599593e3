"""scripts/bench_train.py end to end on a tiny model: the figures it reports are consistent with each other."""

import importlib.util
import json
import os

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
