"""scripts/bench_train.py end to end on a tiny model, run as a user runs it (absl flags): the figures it reports are
consistent with each other; ``--loop`` runs and reports every figure; a bad flag is one line."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


BENCH = [sys.executable, os.path.join(ROOT, "scripts", "bench_train.py")]


@pytest.mark.slow
def test_bench_train_reports_tokens_per_second_and_utilization(tmp_path):
    out = tmp_path / "bt"
    proc = subprocess.run([*BENCH, "--d-model", "32", "--layers", "1", "--heads", "2", "--batch", "4", "--length", "8",
                           "--vocab", "50", "--steps", "2", "--peak-sizes", "256,128", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.with_suffix(".json").read_text())
    assert r["tokens_per_sec"] == 4 * 8 / r["seconds_per_step"] and r["peak_matmul_size"] in (256, 128)
    assert r["args"]["peak_sizes"] == [256, 128] and r["args"]["d_model"] == 32 and r["args"]["dtype"] == "float32"
    assert r["mfu"] == r["model_flops_per_step"] / r["seconds_per_step"] / r["peak_flops_per_sec"] > 0
    assert r["xla_flops_per_step"] > r["model_flops_per_step"] / 10  # XLA counted the real step, same order
    assert "| matmul peak |" in out.with_suffix(".md").read_text()


@pytest.mark.slow
def test_bench_train_loop_reports_trainer_over_bare_and_decoding_speedups(tmp_path):
    """``--loop`` at a tiny size, as a user runs it: every reported figure exists and is positive (ratios of wall
    times are benchmarks, not asserted here), and cached and uncached greedy decoding agree token for token."""
    out = tmp_path / "loop"
    proc = subprocess.run([*BENCH, "--loop", "--d-model", "16",
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
    lm = r["lm"]  # the decoder-only LM: its loop and its generation, the same figures
    assert lm["trainer_over_bare"] > 0 and lm["params"] > 0 and len(lm["rounds"]) == 2
    assert [g["length"] for g in lm["generate"]] == [8] and all(g["same_tokens"] for g in lm["generate"])
    md = out.with_suffix(".md").read_text()
    assert md.count("| trainer loop | bare jitted step |") == 2 and "## Decoder-only LM" in md


@pytest.mark.slow
def test_bad_bench_train_flags_are_one_line_and_write_nothing(tmp_path):
    cases = [(["--dtype", "fp16"], "--dtype=fp16: value should be one of <float32|bfloat16>"),
             (["--peak-sizes", "256,x"], "--peak-sizes=256,x: give comma-separated integers"),
             (["--peak-sizes", "0,256"], "--peak-sizes=0,256: give positive integers"),
             (["--steps", "0"], "--steps=0: 0 is not a positive integer"),
             (["--loop", "--log-every", "8", "--loop-steps", "8"], "--log-every=8: must be below --loop-steps (8)"),
             (["--d_model", "32"], "unknown flag --d_model"),
             (["bench/x"], "unexpected arguments ['bench/x']")]
    procs = [subprocess.Popen([*BENCH, *args, "--out", str(tmp_path / "b")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)) for args, _ in cases]
    for (args, message), p in zip(cases, procs):
        _, err = p.communicate(timeout=300)
        assert p.returncode != 0 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, (args, err)
        assert message in err, (args, err)
    assert not os.listdir(tmp_path)
