"""scripts/device_check.sh and its report helper, scripts/device_report.py.

The report is tested on synthetic step results (the files each step writes), and the shell script's orchestration
-- order, timing, logs, a failing step that does not stop the rest, the skipped --loop, the exit code -- with a stand-in
``python`` that writes those files instantly. Running the real steps, even at the tiniest sizes, takes minutes on 2
CPU cores, so that end-to-end smoke runs only with ATTN_LAB_DEVICE_CHECK_SMOKE=1.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "device_check.sh")


def _load_report():
    spec = importlib.util.spec_from_file_location("device_report", os.path.join(ROOT, "scripts", "device_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _load_report()


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _synthetic_outputs(out):
    """What each step writes, at a GPU's sizes: the numbers the report must carry through."""
    _write(os.path.join(out, "environment.json"), json.dumps(
        {"backend": "gpu", "device_kind": "NVIDIA H200", "device_count": 1, "python": "3.12.1",
         "packages": {"jax": "0.12.0.1", "jaxlib": "0.12.0.1", "flax": "0.12.12"},
         "git": {"commit": "0123456789abcdef", "dirty": False}}))
    _write(os.path.join(out, "bench_attention.md"), textwrap.dedent("""\
        # Attention fwd+bwd benchmark

        batch 4, heads 8, head_dim 64, bfloat16, backend gpu.

        ## Time (median, speedup vs XLA / vs cuDNN)

        | kernel | options | 4096 |
        |---|---|---|
        | dense | `{}` | 1.6 ms (3.75x / 0.97x) |

        ## Memory (compiled temp MiB, reduction vs XLA / vs cuDNN)

        | kernel | options | 4096 |
        |---|---|---|
        | dense | `{}` | 50 MiB (102.40x / 1.00x) |

        ## Targets

        - SKIP linear at 4096: >=10x faster (not registered / not selected)
        - PASS dense within 1.1x of cuDNN's time and memory at 4096: cuDNN time / time 0.97x
        - FAIL local (w=256) >= 5x faster than cuDNN full attention at 16384: cuDNN time / time 2.90x

        ## Not run / notes

        - jax.nn.dot_product_attention @ 65536: skipped: T x T estimate
        """))
    train = {"device": "gpu NVIDIA H200 x1", "params": 209_000_000, "seconds_per_step": 0.25, "tokens_per_sec": 131072,
             "mfu": 0.489, "hfu": 0.52, "peak_flops_per_sec": 5.54e14,
             "args": {"dtype": "bfloat16", "d_model": 1024, "layers": 6, "batch": 64, "length": 512}}
    _write(os.path.join(out, "bench_train_large.json"), json.dumps(train))
    _write(os.path.join(out, "bench_loop.json"), json.dumps(
        {"trainer_over_bare": 0.95, "trainer_steps_per_sec": 95.0, "bare_steps_per_sec": 100.0,
         "decode": [{"length": 64, "cached_speedup": 2.5}, {"length": 256, "cached_speedup": 7.5}]}))
    one = {"steps": 600, "steady_steps_per_sec": 40.0, "steps_per_sec": 20.0, "compile_seconds": 9.0,
           "wall_time_sec": 29.0, "final": {"test": {"exact_match": 0.9}}}
    _write(os.path.join(out, "numbers_1seed", "results.json"), json.dumps(one))
    for seed in range(8):
        _write(os.path.join(out, "numbers_8seeds", f"seed={seed}", "results.json"),
               json.dumps({**one, "steady_steps_per_sec": 16.5, "final": {"test": {"exact_match": 0.8}}}))
    _write(os.path.join(out, "tests.xml"), '<?xml version="1.0"?><testsuites><testsuite tests="5" failures="1" '
           'errors="0" skipped="1"><testcase classname="tests.test_a" name="test_x"><failure/></testcase>'
           '</testsuite></testsuites>')
    _write(os.path.join(out, "logs", "tests.log"), "F...s\nFAILED tests/test_a.py::test_x - tolerance\n")


def test_report_gathers_each_steps_status_time_and_key_numbers(tmp_path):
    out = str(tmp_path)
    _synthetic_outputs(out)
    for name, rc, seconds in (("environment", 0, 2.0), ("attention", 0, 150.0), ("train_large", 0, 60.0),
                              ("loop", 0, 40.0), ("numbers_1seed", 0, 30.0), ("numbers_8seeds", 0, 70.0),
                              ("tests", 1, 200.0)):
        report.record(out, {"name": name, "status": report.step_status(rc), "rc": rc, "seconds": seconds,
                            "command": ["python", f"{name}.py"], "log": os.path.join(out, "logs", f"{name}.log")})
    report.record(out, {"name": "train_default", "status": "timed out", "rc": 124, "seconds": 90.0, "limit": 90,
                        "command": ["python", "x"], "log": os.path.join(out, "logs", "missing.log")})
    assert report.write(out) == 1  # a failed and a timed-out step: the script exits non-zero
    md = (tmp_path / "device_check.md").read_text()
    assert "gpu NVIDIA H200 x1; python 3.12.1, jax 0.12.0.1" in md and "commit 0123456789" in md
    assert "**2 failed**: tests, train_default" in md and "8 steps in 642 s" in md
    assert "| train_default | **timed out** (limit 90 s) | 90.0 | – |" in md  # no output: '–', not a crash
    assert ("| attention | ok | 150.0 | PASS dense within 1.1x of cuDNN's time and memory at 4096; FAIL local (w=256) "
            ">= 5x faster than cuDNN full attention at 16384 (all targets: 1 pass, 1 fail, 1 skip) |") in md
    assert "#### Time (median" in md and "| dense | `{}` | 1.6 ms (3.75x / 0.97x) |" in md and "Not run" not in md
    assert "209,000,000 params, bfloat16, 250 ms/step, 131,072 tokens/s, MFU 48.9%" in md
    assert "- FAIL 209M-parameter model bfloat16 MFU >= 50%: 48.9%" in md and "554.0 TFLOP/s" in md
    assert "trainer_over_bare 0.950; decoding speed-up length 64: 2.5x, length 256: 7.5x" in md
    assert "- PASS trainer_over_bare >= 0.9: 0.950" in md and "- PASS KV-cache decoding >= 5x faster at 256" in md
    assert "| numbers_1seed | ok | 30.0 | 1 seed, 600 steps, steady steps/s 40, compile 9.0 s, wall 29.0 s |" in md
    assert "8 seeds, 600 steps, steady steps/s 16.5, seed-steps/s 132" in md
    assert "- seed-steps/s vs one seed: 3.30x (8 x 16.5 / 40)" in md
    assert "| tests | **failed** (rc 1) | 200.0 | 3 passed, 1 failed, 0 errors, 1 skipped |" in md
    assert "- failed: `tests.test_a::test_x`" in md and "FAILED tests/test_a.py::test_x - tolerance" in md
    targets = md.split("## Targets\n\n", 1)[1].split("\n\n", 1)[0].splitlines()  # every goal, gathered on top
    assert [t.split(" ", 2)[1] for t in targets] == ["PASS", "FAIL", "FAIL", "PASS", "PASS", "FAIL"]
    assert "SKIP linear" not in md.split("## Steps")[0] and "the GPU-relevant tests pass: 3 passed" in targets[-1]


def test_report_of_a_cpu_run_without_cudnn_or_loop(tmp_path):
    out = str(tmp_path)
    _write(os.path.join(out, "bench_attention.md"), "# A\n\nintro\n\n## Targets\n\n"
           "- SKIP dense within 1.1x of cuDNN's time and memory at 4096: not measured (no cuDNN: not detected)\n")
    _write(os.path.join(out, "bench_train_large.json"), json.dumps(
        {"device": "cpu cpu x1", "params": 500_000, "mfu": 0.05, "peak_flops_per_sec": 4.5e11, "args": {}}))
    _write(os.path.join(out, "numbers_1seed", "results.json"), json.dumps({"steps": 10, "steps_per_sec": 2.0}))
    report.record(out, {"name": "attention", "status": "ok", "rc": 0, "seconds": 20.0})
    report.record(out, {"name": "train_large", "status": "ok", "rc": 0, "seconds": 20.0})
    report.record(out, {"name": "loop", "status": "skipped", "reason": "no --loop yet", "seconds": 0.0})
    report.record(out, {"name": "numbers_1seed", "status": "ok", "rc": 0, "seconds": 20.0})
    report.record(out, {"name": "numbers_1seed", "status": "ok", "rc": 0, "seconds": 25.0})  # a rerun: last wins
    assert report.write(out) == 0  # a skipped step is not a failure
    md = (tmp_path / "device_check.md").read_text()
    assert "| cuDNN targets not measured (no cuDNN) (all targets: 0 pass, 0 fail, 1 skip) |" in md
    assert "MFU >= 50%" not in md and "450.0 GFLOP/s" in md  # the MFU target is an accelerator's
    assert "| loop | skipped (no --loop yet) | 0.0 | – |" in md
    assert "steps/s (incl. compilation) 2" in md and md.count("| numbers_1seed |") == 1 and "| 25.0 |" in md


def test_step_status_and_flattening():
    assert [report.step_status(rc) for rc in (0, 1, 124, 137)] == ["ok", "failed", "timed out", "timed out"]
    assert report.step_status(None, skipped="why") == "skipped"
    assert report.flat({"a": {"b": 1}, "d": [{"length": 8, "x": 2}, {"y": 3}]}) == {"a.b": 1, "d[8].length": 8,
                                                                                  "d[8].x": 2, "d[1].y": 3}
    assert report.num(None) == "–" and report.num(True) == "–" and report.num(1234567, ",") == "1,234,567"


FAKE_PYTHON = '''#!{python}
"""Stands in for python in device_check.sh: answers the backend probe and writes each step's output at once."""
import json, os, runpy, sys

args = sys.argv[1:]
def value(flag):
    return args[args.index(flag) + 1]
if args and args[0].endswith("device_report.py"):
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
elif args[:1] == ["-c"] and "default_backend" in args[1]:
    print("cpu")
elif args[:1] == ["-c"]:  # the environment step
    json.dump({{"backend": "cpu", "device_kind": "fake", "device_count": 1,
               "pythonpath": os.environ["PYTHONPATH"]}}, open(args[-1], "w"))
elif "--help" in args:
    print("usage: bench_train.py [--steps STEPS] [--out OUT]")  # no --loop: the step is skipped
elif args[0].endswith("bench_attention.py"):
    open(value("--out") + ".md", "w").write("# A\\n\\n## Targets\\n\\n- PASS fake target\\n")
elif args[0].endswith("bench_train.py"):
    json.dump({{"params": 1000, "mfu": 0.1, "args": {{"dtype": value("--dtype")}}}},
              open(value("--out") + ".json", "w"))
elif args[:2] == ["-m", "attn_lab.train"]:
    seeds = value("--seeds").split(",") if "--seeds" in args else ["0"]
    for seed in seeds:
        workdir = value("--workdir").replace("{{seed}}", seed)
        os.makedirs(workdir, exist_ok=True)
        json.dump({{"steps": 4, "steady_steps_per_sec": 2.0}}, open(os.path.join(workdir, "results.json"), "w"))
elif args[0].endswith("fused_check.py"):
    json.dump({{"matrix": [{{"tile": 32, "head_dim": 64, "dtype": "bfloat16", "stages": 2, "rule": "tile 32: fits",
                            "compile_s": 1.5, "errors": {{"dq": 0.01}}}},
                           {{"tile": 128, "head_dim": 128, "dtype": "float32", "stages": 1,
                            "rule": "refused: too big", "compile_s": 0.1, "error": "out of shared memory"}}],
               "timings": {{"length": 16384, "local_fused_speedup": 6.1}}}}, open(value("--out"), "w"))
elif args[:2] == ["-m", "pytest"]:
    print("1 failed, 2 passed in 0.1s")
    sys.exit(1)
'''


@pytest.mark.slow
def test_script_runs_every_step_records_a_failure_and_exits_nonzero(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(fake), "DEVICE_CHECK_SIZE": "tiny", "PYTHONPATH": "/elsewhere"}
    proc = subprocess.run(["bash", SCRIPT, str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the failing test step
    steps = report.read_steps(str(out))
    assert [s["name"] for s in steps] == ["environment", "attention", "train_default", "train_large", "loop",
                                          "numbers_1seed", "numbers_8seeds", "fused", "tests"]
    assert [s["status"] for s in steps] == ["ok"] * 4 + ["skipped"] + ["ok"] * 3 + ["failed"]
    assert json.loads((out / "environment.json").read_text())["pythonpath"] == f"{ROOT}:/elsewhere"
    md = (out / "device_check.md").read_text()
    assert "sizes: tiny" in md and "**1 failed**: tests" in md and "PASS fake target" in md
    assert "| loop | skipped (scripts/bench_train.py has no --loop option yet) |" in md
    assert "8 seeds, 4 steps, steady steps/s 2, seed-steps/s 16" in md and "1 failed, 2 passed" in md
    assert "--seeds 0,1,2,3,4,5,6,7" in md and "bench_attention.py --dtype bfloat16" in md
    assert "-m attn_lab.train --config configs/numbers.py:quick" in md
    assert "1/1 allowed cases compile (1 refused by the tile rule); largest error 0.01; vs cuDNN at 16384: " \
           "local 6.1x" in md and "scripts/fused_check.py --smoke" in md

    (out / "tests.xml").write_text("stale")
    env.update(DEVICE_CHECK_STEPS="tests,numbers_8seeds", DEVICE_CHECK_PYTEST_ARGS="-k nothing")  # a partial rerun
    proc = subprocess.run(["bash", SCRIPT, str(out)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # still failing tests
    rerun = report.read_steps(str(out))
    assert [s["name"] for s in rerun] == [s["name"] for s in steps] and rerun[:6] == steps[:6]  # the rest kept
    assert rerun[7] == steps[7] and rerun[8]["command"][-2:] == ["-k", "nothing"]  # the new record, in its place
    assert not (out / "tests.xml").exists()  # the rerun step's old output is gone before it runs


@pytest.mark.skipif(not os.environ.get("ATTN_LAB_DEVICE_CHECK_SMOKE"),
                    reason="minutes on 2 CPU cores; set ATTN_LAB_DEVICE_CHECK_SMOKE=1 to run the real steps")
def test_device_check_end_to_end_at_tiny_sizes(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE_CHECK_SIZE": "tiny"}
    proc = subprocess.run(["bash", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=900)
    md = (tmp_path / "device_check.md").read_text()
    assert proc.returncode == 0, md
    assert "all steps ran" in md and "**failed**" not in md and "timed out" not in md
    assert "No cuDNN row" in md or "jax.nn.dot_product_attention/cudnn" in md


@pytest.mark.slow
def test_fused_check_smoke_runs_end_to_end_on_a_cpu(tmp_path):
    """scripts/fused_check.py --smoke: the compile matrix (interpret mode, tiny tiles) and the timings, one report;
    every case within float32 / bf16 rounding of naive attention."""
    out = tmp_path / "fused.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "fused_check.py"), "--smoke", "--out",
                           str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["smoke"] and len(result["matrix"]) == 8 and all("error" not in c for c in result["matrix"])
    for case in result["matrix"]:
        assert max(case["errors"].values()) < (5e-5 if case["dtype"] == "float32" else 5e-2), case
    assert {"xla_dense_s", "local_fused_s", "bigbird_fused_s"} <= set(result["timings"])
    key, rows = report.fused_summary(str(tmp_path), {})
    assert key.startswith("8/8 allowed cases compile (0 refused by the tile rule); largest error ")
    assert len(rows) == 2 + 8 + 2


def test_a_fused_check_case_the_tile_rule_refuses_is_recorded_not_compiled(monkeypatch):
    """Nothing beyond the tile rule's estimate is compiled, not even by the compile matrix: the case keeps the
    rule's one line and no compile time; an allowed case names what the rule itself would launch."""
    spec = importlib.util.spec_from_file_location("fused_check", os.path.join(ROOT, "scripts", "fused_check.py"))
    fused_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fused_check)
    monkeypatch.setattr(fused_check, "block_sparse_flash", lambda *a, **k: pytest.fail("compiled a refused case"))
    case = fused_check.compile_case(128, 128, "bfloat16", 2, interpret=True)
    assert case == {"tile": 128, "head_dim": 128, "dtype": "bfloat16", "stages": 2, "rule": (
        "refused: fused kernel: tile 128 with head dim 128 in bfloat16 at 2 stage(s) does not fit in 227 KiB of "
        "shared memory (dkdv: 352 KiB)")}

