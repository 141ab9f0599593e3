"""A finished run reads at a glance (attn_lab/train/summary.py): the command prints one summary line (the full
record with --print-json), and the run writes curves.png from its metrics.jsonl."""

import json
import os
import subprocess
import sys

import pytest

from attn_lab import results
from attn_lab.train import summary
from tests.helpers import ROOT, tiny_numbers_flags

TRAIN = [sys.executable, "-m", "attn_lab.train", "--config", os.path.join(ROOT, "configs", "numbers.py:quick")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A tiny run trained by the command, as a user starts one: (workdir, its stdout)."""
    workdir = str(tmp_path_factory.mktemp("summary") / "run")
    proc = subprocess.run([*TRAIN, "--workdir", workdir, *tiny_numbers_flags(data_dir), "--config.compile_cache="],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": ROOT, "WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return workdir, proc.stdout


def test_the_command_ends_with_one_summary_line_naming_the_scores_speed_and_files(trained):
    workdir, stdout = trained
    record = json.load(open(os.path.join(workdir, "results.json")))
    last = stdout.strip().splitlines()[-1]
    test = record["final"]["test"]
    assert last == summary.summary_line(workdir, record)
    assert last.startswith(f"{workdir}: 12 steps in ") and "steps/s after compilation" in last
    assert f"test loss {test['loss']:.4f}" in last and f"exact match {test['exact_match']:.4g}" in last
    assert last.endswith("files: results.json, metrics.jsonl, curves.png")
    assert "{" not in stdout  # no JSON dump
    (example,) = [line for line in stdout.splitlines() if line.startswith("example: ")]
    shown = record["example"]  # the test split's first example: its source, reference and our decoded output
    assert example == f"example: source {shown['source']!r} | reference {shown['reference']!r} | ours {shown['ours']!r}"
    assert stdout.splitlines().index(example) == len(stdout.strip().splitlines()) - 2


def test_the_decoded_example_is_the_test_split_s_first_and_counts_in_exact_match(trained, data_dir):
    """The example is what the final test decoded for the first test sentence (ours), beside that sentence's source
    and reference as the dataset holds them (read here through the task, not from the run)."""
    from attn_lab.data.tasks import load_task
    from tests.helpers import tiny_numbers

    workdir, _ = trained
    record = json.load(open(os.path.join(workdir, "results.json")))
    task = load_task(tiny_numbers(data_dir).task)
    assert record["example"]["reference"] == task.references("test")[0]
    assert record["example"]["source"] == task.source_text("test", 0) != record["example"]["reference"]
    assert isinstance(record["example"]["ours"], str)


def test_off_a_terminal_the_run_prints_a_plain_line_per_log_window_and_its_speed_after_compilation(trained):
    """Captured output is not a terminal (a sweep's trial log, CI): no redrawn bar, a line per log window (every 2
    steps here) with the window's loss and steps/s from metrics.jsonl, and, after the first window (which holds the
    compilation), the speed a user can compare with docs/install.md."""
    workdir, stdout = trained
    windows = [r for r in results.metric_lines(workdir) if "train/loss" in r]
    expected = [f"step {r['step']}/12: loss {r['train/loss']:.3f}, {r['train/steps_per_sec']:.1f} steps/s"
                for r in windows]
    assert [line for line in stdout.splitlines() if line.startswith("step ")] == expected
    (speed,) = [line for line in stdout.splitlines() if line.startswith("speed after compilation: ")]
    assert f"{windows[1]['train/steps_per_sec']:.1f} steps/s (first compile " in speed
    assert stdout.index(expected[1]) < stdout.index(speed) < stdout.index(expected[2])


def test_curves_hold_the_logged_losses_and_validation_metric(trained):
    workdir, _ = trained
    assert os.path.getsize(os.path.join(workdir, summary.CURVES_FILE)) > 0
    points = summary.curve_points(workdir)
    lines = list(results.metric_lines(workdir))
    train_loss = [(r["step"], r["train/loss"]) for r in lines if "train/loss" in r]
    assert list(zip(*points["loss"]["train"])) == train_loss
    evals = [(r["step"], r["eval/bleu"]) for r in lines if "eval/bleu" in r]
    assert [s for s, _ in evals] == [6, 12] and list(zip(*points["bleu"]["validation"])) == evals
    assert set(points) == {"loss", "bleu"}  # one task metric: a translation run's BLEU


def test_print_json_prints_the_record_instead(trained, data_dir, tmp_path):
    workdir, _ = trained
    copy = str(tmp_path / "run")
    subprocess.run(["cp", "-r", workdir, copy], check=True)
    os.remove(os.path.join(copy, "results.json"))  # the final test again: prints what a finished run prints
    proc = subprocess.run([*TRAIN, "--workdir", copy, *tiny_numbers_flags(data_dir), "--config.compile_cache=",
                           "--print-json"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": ROOT, "WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert printed["workdir"] == copy and printed["steps"] == 12 and "test" in printed["final"]


def test_make_tables_tables_a_run_s_folder_and_a_folder_of_runs(trained, tmp_path):
    """No sweep.json: a row per finished run, each metric named in its column; the run's own folder or its parent."""
    workdir, _ = trained
    record = json.load(open(os.path.join(workdir, "results.json")))
    for folder in (workdir, os.path.dirname(workdir)):
        out = str(tmp_path / os.path.basename(folder))
        proc = subprocess.run([sys.executable, "-m", "attn_lab.reporting", "--workdir", folder, "--out", out],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
        assert proc.returncode == 0, proc.stderr[-2000:]
        table = open(os.path.join(out, "runs.md")).read()
        header = "| run | steps | params | test loss | token accuracy | exact match | BLEU | perplexity | steps/s |"
        assert header in table
        test = record["final"]["test"]
        assert f"| run | 12 | {record['num_params']} | {test['loss']:.4g} | {test['accuracy']:.4g} |" in table
        assert os.path.exists(os.path.join(out, "runs.tex"))


def test_a_language_model_s_example_line_is_its_prompt_and_continuation_each_cut_to_the_width():
    record = {"example": {"prompt": "In the beginning", "ours": "x" * 150}}
    assert summary.example_line(record) == f"example: prompt 'In the beginning' | ours '{'x' * 97}...'"
    assert summary.example_line({"final": {}}) is None
