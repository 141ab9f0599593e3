"""Every record a finished sweep is read from -- sweep.json, and each trial's results.json, config.json,
metrics.jsonl and training.json -- truncated, emptied, with a key removed or with null where a number belongs: a
rerun of the sweep and ``make_tables`` either go on (a log they can do without) or stop in one line naming the
file; neither prints a traceback, and a refusal changes nothing in the folder (no tables/, the record as it was)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.test_sweep import BASE, _experiment
from tests.test_sweep_after import TINY

pytestmark = pytest.mark.slow
TRIAL = "variant=a,seed=0"
RECORDS = {"sweep.json": "sweep.json", "results.json": f"{TRIAL}/results.json", "config.json": f"{TRIAL}/config.json",
           "metrics.jsonl": f"{TRIAL}/metrics.jsonl", "training.json": f"{TRIAL}/training.json"}
# What a damaged record must do to each command: 'refuse' (one line, nothing written) or 'either'.
MUST_REFUSE = {("sweep.json", "sweep"), ("results.json", "sweep"), ("results.json", "tables")}


def _damage(path: str, how: str) -> None:
    """Truncate, empty, drop the first key (of every line of a .jsonl) or set ``null:<dotted key>`` to null."""
    text = open(path).read()
    if how == "truncated":
        out = text[: len(text) // 2]
    elif how == "emptied":
        out = ""
    elif how == "key removed":
        records = [json.loads(line) for line in text.splitlines()] if path.endswith(".jsonl") else [json.loads(text)]
        for record in records:
            record.pop(next(iter(record)))
        out = "".join(json.dumps(r) + "\n" for r in records) if path.endswith(".jsonl") else json.dumps(records[0])
    else:  # 'null:a.b'
        record, (*parents, last) = json.loads(text), how[len("null:"):].split(".")
        node = record
        for key in parents:
            node = node[key]
        node[last] = None
        out = json.dumps(record)
    with open(path, "w") as f:
        f.write(out)


CASES = [(name, how) for name in RECORDS for how in ("truncated", "emptied", "key removed")]
CASES += [("results.json", f"null:{key}") for key in ("steps", "num_params", "final.test", "best", "config")]
CASES += [("sweep.json", "null:registration")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-trial sweep (a few steps each) and its command."""
    root = tmp_path_factory.mktemp("damaged")
    path = _experiment(root, {**BASE, "overrides": {**TINY, "train.num_steps": 4, "train.eval_every": 2},
                              "variants": {"a": {}, "b": {"model.num_heads": 2}}, "seeds": [0]})
    data = f"--config.task.data_dir={root / 'data'}"
    sweep = [sys.executable, "-m", "attn_lab.sweep", "--experiment", path]
    proc = subprocess.run([*sweep, "--workdir", str(root / "runs"), data], capture_output=True, text=True,
                          timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(root / "runs" / "tables")
    return root, sweep, data, path


def _snapshot(folder: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                out[os.path.relpath(os.path.join(dirpath, name), folder)] = f.read()
    return out


@pytest.mark.parametrize("name,how", CASES, ids=[f"{n}-{h}" for n, h in CASES])
def test_a_damaged_record_is_one_line_or_read_past_never_a_traceback(finished, tmp_path, name, how):
    root, sweep, data, _ = finished
    folders = {}
    for command in ("sweep", "tables"):
        folder = tmp_path / command
        shutil.copytree(root / "runs", folder, symlinks=True)
        _damage(str(folder / RECORDS[name]), how)
        folders[command] = (folder, _snapshot(str(folder)))
    commands = {"sweep": [*sweep, "--workdir", str(folders["sweep"][0]), data],
                "tables": [sys.executable, "-m", "attn_lab.reporting", "--workdir", str(folders["tables"][0])]}
    procs = {c: subprocess.Popen(a, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c, a in commands.items()}  # together: most of each is importing
    for command, p in procs.items():
        proc = subprocess.CompletedProcess(p.args, p.wait(timeout=600), *p.communicate())
        folder, before = folders[command]
        assert "Traceback" not in proc.stdout + proc.stderr, (command, proc.stderr[-3000:])
        if (name, command) in MUST_REFUSE:
            assert proc.returncode != 0, (command, proc.stdout[-2000:])
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: ") and name in lines[0], (command, proc.stderr)
            assert _snapshot(str(folder)) == before, command  # nothing written, the damaged record as it was


RESUMED = [(name, how) for name in ("config.json", "metrics.jsonl", "training.json")
           for how in ("truncated", "emptied", "key removed")]


@pytest.mark.parametrize("name,how", RESUMED, ids=[f"{n}-{h}" for n, h in RESUMED])
def test_the_trainer_resuming_a_run_with_a_damaged_record_says_one_line_or_finishes(finished, tmp_path, name, how):
    """A run stopped after its last checkpoint (no results.json) whose config.json, metrics.jsonl or training.json
    was damaged: the trainer's rerun finishes it (a log it can do without; training.json's speed then unknown) or
    refuses in one line naming the file (config.json records which config trained it) -- never a traceback."""
    from attn_lab.sweep.runner import trial_command
    from attn_lab.sweep.spec import load_experiment

    root, _, data, path = finished
    run = tmp_path / TRIAL
    shutil.copytree(root / "runs" / TRIAL, run, symlinks=True)
    os.remove(run / "results.json")
    _damage(str(run / name), how)
    exp = load_experiment(path)
    trial = next(t for t in exp.trials() if t.name == TRIAL)
    proc = subprocess.run(trial_command(exp, trial, str(run), [data]), capture_output=True, text=True, timeout=600,
                          cwd=root)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and name in lines[0], proc.stderr
    else:
        assert json.load(open(run / "results.json"))["steps"] == 4
