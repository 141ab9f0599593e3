"""Signals stop commands cleanly: Ctrl-C of a training run is one line and a checkpoint it resumes from exactly;
SIGINT / SIGTERM of a sweep stop its trials, write results.csv and exit 130 / 143; a SIGKILLed sweep leaves no trial
running; and an interrupted sweep resumes to the numbers of an uninterrupted one.

Real processes on tiny numbers runs (tests/helpers.py: tiny_numbers_flags), so these are marked slow.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from attn_lab import signals
from attn_lab.sweep.runner import PROGRESS, screen_lines
from attn_lab.train.workdir import WorkdirBusy, WorkdirLock
from tests.helpers import ROOT, tiny_numbers_flags

pytestmark = pytest.mark.slow
TRAIN = [sys.executable, "-m", "attn_lab.train", "--config", os.path.join(ROOT, "configs", "numbers.py:quick")]


def _lines(stderr: str) -> list[str]:
    return [line for line in screen_lines(stderr) if not PROGRESS.search(line)]


def _wait_for(path: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until ``path`` exists (the process reached that point), failing if it ended first."""
    end = time.time() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < end, f"{path} never appeared"
        time.sleep(0.2)


def _free(workdir: str) -> None:
    """The folder's lock is free (no process trains there): taken and let go, or WorkdirBusy."""
    lock = WorkdirLock(workdir)
    lock.acquire()
    lock.release()


def _test_metrics(workdir: str) -> dict:
    with open(os.path.join(workdir, "results.json")) as f:
        return json.load(f)["final"]["test"]


def _flags(data_dir: str, steps: int = 40) -> list[str]:
    return [*tiny_numbers_flags(data_dir, num_steps=steps, checkpoint_every=4, eval_every=steps),
            "--config.compile_cache=", "--config.wandb.mode=disabled"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signalled_training_run_checkpoints_says_one_line_and_resumes_to_the_uninterrupted_numbers(
        tmp_path, data_dir, signum):
    stopped, whole = str(tmp_path / "stopped"), str(tmp_path / "whole")
    proc = subprocess.Popen([*TRAIN, "--workdir", stopped, *_flags(data_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(os.path.join(stopped, "checkpoints", "4"), proc)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum and "Traceback" not in stderr
    (line,) = _lines(stderr)
    step = int(line.split(" at step ")[1].split(",")[0])
    assert line == (f"stopped by {signals.NAMES[signum]} at step {step}, checkpointed in {stopped}; rerun the same "
                    "command to resume")
    assert str(step) in os.listdir(os.path.join(stopped, "checkpoints")) and step < 40
    _free(stopped)
    resumed = subprocess.run([*TRAIN, "--workdir", stopped, *_flags(data_dir)], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0 and f"resuming at step {step}" in resumed.stdout, resumed.stderr
    subprocess.run([*TRAIN, "--workdir", whole, *_flags(data_dir)], check=True, capture_output=True, timeout=300)
    assert _test_metrics(stopped) == pytest.approx(_test_metrics(whole), rel=1e-6)


def _experiment(tmp_path, data_dir: str) -> tuple[list[str], str]:
    """A two-trial sweep of tiny numbers runs (the sweep command, its workdir)."""
    flags = dict(f[len("--config."):].split("=", 1) for f in _flags(data_dir))
    overrides = {k: (int(v) if v.lstrip("-").isdigit() else float(v) if "." in v else v) for k, v in flags.items()
                 if k not in ("task.data_dir", "compile_cache", "model.num_heads")}
    path = tmp_path / "tiny.py"
    path.write_text(textwrap.dedent(f"""
        def get_experiment(preset="quick"):
            return {{"name": "tiny", "config": {os.path.join(ROOT, "configs", "numbers.py:quick")!r},
                    "overrides": {overrides!r}, "grid": {{"model.num_heads": [2, 4]}}, "seeds": [0]}}
    """))
    workdir = str(tmp_path / "sweep")
    return ([sys.executable, "-m", "attn_lab.sweep", "--experiment", str(path), "--workdir", workdir,
             f"--config.task.data_dir={data_dir}", "--config.compile_cache="], workdir)


def _rows(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "results.csv")) as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signalled_sweep_stops_its_trials_writes_results_csv_and_resumes_to_the_same_numbers(
        tmp_path, data_dir, signum):
    cmd, workdir = _experiment(tmp_path, data_dir)
    first = os.path.join(workdir, "num_heads=2,seed=0")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(os.path.join(first, "checkpoints", "4"), proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum and "Traceback" not in err, err
    assert _lines(err) == [f"stopped by {signals.NAMES[signum]}: 0 of 2 trials finished, {workdir}/results.csv "
                           "written; the same command resumes the rest"]
    assert [r["status"] for r in _rows(workdir)] == ["interrupted", "not run"]
    assert not os.path.exists(os.path.join(first, "error.txt"))  # an interrupted trial did not fail
    _free(first)  # its process has ended
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert [r["status"] for r in _rows(workdir)] == ["ok", "ok"]
    (tmp_path / "whole").mkdir()
    whole_cmd, whole = _experiment(tmp_path / "whole", data_dir)
    subprocess.run(whole_cmd, check=True, capture_output=True, timeout=600)
    for name in ("num_heads=2,seed=0", "num_heads=4,seed=0"):
        assert _test_metrics(os.path.join(workdir, name)) == pytest.approx(
            _test_metrics(os.path.join(whole, name)), rel=1e-6), name


def test_a_killed_sweep_leaves_no_trial_running(tmp_path, data_dir):
    """SIGKILL cannot be caught: the trial notices its parent is gone, checkpoints and stops within seconds."""
    cmd, workdir = _experiment(tmp_path, data_dir)
    first = os.path.join(workdir, "num_heads=2,seed=0")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(os.path.join(first, "checkpoints", "4"), proc)
    proc.kill()
    proc.wait()
    end = time.time() + 60
    while True:  # the trial holds its folder's lock for as long as it runs
        try:
            _free(first)
            break
        except WorkdirBusy:
            assert time.time() < end, "the trial outlived its sweep"
            time.sleep(0.5)
    assert not os.path.exists(os.path.join(first, "results.json"))
