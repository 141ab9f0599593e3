"""The README's Quickstart, as a new user runs it: its main job at tiny size, and its test command as CI runs it.

The commands are read from README.md, not copied here, so a README edit that breaks them fails this test.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _quickstart_commands() -> list[str]:
    """The shell commands of the Quickstart section's ```bash blocks, in order."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_quickstart_is_two_commands_install_then_run():
    main_job, tests = _quickstart_commands()
    assert main_job.startswith('pip install -e ".[bible]" && python scripts/sweep.py ')  # the demo's LM reads verses
    assert tests == 'pip install -e ".[test]" && python -m pytest'
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "README.md" in ci and "--system-site-packages" not in ci  # CI runs the README's command in a new venv


@pytest.mark.slow
def test_quickstart_main_job_runs_at_tiny_size_then_tabulates(tmp_path):
    """The README's sweep command (its own config and flags; workdir moved to tmp; three books of verses, as the task
    tests prepare) with a --shard of half its trials and a few steps, which ends by writing and printing the
    experiment's tables with their verdicts: the path a new user runs first."""
    main_job, _ = _quickstart_commands()
    _, sweep = [shlex.split(part) for part in main_job.split(" && ")]
    assert sweep[:2] == ["python", "scripts/sweep.py"]
    assert "--experiment" in sweep  # the sweep's experiment flag (--config would name a config)
    workdir = sweep[sweep.index("--workdir") + 1]
    runs = str(tmp_path / "runs")
    sweep = [runs if a == workdir else a for a in sweep]
    tiny = ["--shard", "0/2", f"--config.task.data_dir={tmp_path / 'data'}", "--config.task.books=(33,57,31)",
            "--config.task.vocab_size=300", "--config.train.num_steps=4", "--config.train.eval_every=4",
            "--config.train.checkpoint_every=4",
            "--config.train.log_every=2", "--config.train.batch_size=16", "--config.train.max_eval_batches=1",
            "--config.wandb.mode=disabled", f"--config.compile_cache={tmp_path / 'cache'}"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    first = subprocess.run([sys.executable, *sweep[1:], *tiny], cwd=ROOT, capture_output=True, text=True,
                           timeout=600, env=env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    finished = [d for d in os.listdir(runs) if os.path.exists(os.path.join(runs, d, "results.json"))]
    assert len(finished) == 3  # trials 0, 2 and 4 of the demo's 6 (2 rows x 3 seeds)
    results = json.load(open(os.path.join(runs, finished[0], "results.json")))
    example = results["example"]  # a language model's summary continues the test split's first verse
    assert example["prompt"] and isinstance(example["ours"], str) and set(example) == {"prompt", "ours"}
    logs = "".join(open(os.path.join(runs, "logs", f)).read() for f in os.listdir(os.path.join(runs, "logs")))
    assert f"example: prompt {example['prompt']!r}" in logs
    env_block = results["environment"]
    assert env_block["packages"]["jax"] and env_block["backend"] == "cpu" and env_block["device_count"] >= 1
    assert env_block["python"] == ".".join(map(str, sys.version_info[:3]))
    table = open(os.path.join(runs, "tables", "head_count.md")).read()
    assert "### Verdicts" in table and "'A-h16' (confirmatory)" in table  # planned from its pilot before it ran
    assert "undecidable" not in table
    assert "'A-h16' (confirmatory)" in first.stdout  # the sweep ends with its tables
    assert f"tables, plots and environments in {runs}/tables" in first.stdout
    assert f"learning curves per variant (mean over seeds, band min-max): {runs}/tables/curves.png" in first.stdout
    environments = open(os.path.join(runs, "tables", "environments.md")).read()
    assert "3 runs: python " in environments and f"jax {env_block['packages']['jax']}" in environments
