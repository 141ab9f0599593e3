"""Sweeps: experiment validation, trial naming, dry run, resume, failure recording and results.csv."""

import csv
import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from attn_lab.sweep.runner import collect, failed_status, recorded_status, screen_lines
from attn_lab.sweep.spec import PROJECT_ROOT, load_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "scripts", "sweep.py")


def _experiment(tmp_path, body: dict, report: str | None = None) -> str:
    """An experiment file in a fake repository root (tmp/experiments/x.py) whose base config is the real one; with
    ``report``, the shipped ``experiments/<report>.py`` (its tables) with this ``get_experiment`` instead of its own."""
    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "configs").mkdir(exist_ok=True)
    for name in ("numbers.py", "listops.py"):
        target = tmp_path / "configs" / name
        if not target.exists():
            target.symlink_to(os.path.join(ROOT, "configs", name))
    # no scripts/ folder: trials and the analysis run the package's entry points (python -m attn_lab.train/.analysis)
    path = tmp_path / "experiments" / "x.py"
    shipped = open(os.path.join(ROOT, "experiments", f"{report}.py")).read() if report else ""
    shipped += "\n\ndel PRESETS  # this test's get_experiment builds the sweep\n" if "PRESETS" in shipped else ""
    path.write_text(shipped + textwrap.dedent(f"""

        from attn_lab.reporting.verdicts import Design, Finding  # what a design's repr names


        def get_experiment(preset="quick"):
            return {body!r}
    """))
    return str(path)


BASE = {"name": "t", "config": "configs/numbers.py:quick"}


def test_grid_zip_and_seeds_make_named_trials(tmp_path):
    exp = load_experiment(_experiment(tmp_path, {**BASE, "grid": {"model.num_layers": [1, 2]},
                                                 "zip": [{"model.num_heads": [2, 4], "model.head_dim": [32, 16]}],
                                                 "seeds": [0, 1]}))
    names = [t.name for t in exp.trials()]
    assert len(names) == 2 * 2 * 2 and len(set(names)) == 8
    assert "num_layers=1,num_heads=4,head_dim=16,seed=1" in names
    trial = exp.trials()[-1]
    assert trial.overrides == {"model.num_layers": 2, "model.num_heads": 4, "model.head_dim": 16, "seed": 1}


@pytest.mark.parametrize("body,message", [
    ({"grid": {"model.bogus": [1]}}, "unknown config key 'model.bogus'"),
    ({"grid": {"model.num_heads": []}}, "axis 'model.num_heads' is empty"),
    ({"zip": [{"model.num_heads": [1, 2], "model.head_dim": [8]}]}, "unequal lengths"),
    ({"grid": {"model.num_heads": [2, 2]}}, "duplicate trial 'num_heads=2,seed=0'"),
    ({"grids": {}}, "unknown experiment key 'grids'"),
])
def test_bad_experiment_is_one_line_before_any_trial(tmp_path, body, message):
    path = _experiment(tmp_path, {**BASE, **body})
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load_experiment(path)
    proc = subprocess.run([sys.executable, SWEEP, "--experiment", path, "--workdir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_sweep_runs_records_failures_resumes_and_collects(tmp_path):
    """Two trials, one invalid (3 heads do not divide d_model 32): the other finishes, the failure is recorded,
    the exit code says so, and a rerun skips the finished trial."""
    data = str(tmp_path / "data")
    path = _experiment(tmp_path, {**BASE, "grid": {"model.num_heads": [2, 3]}, "overrides": {
        "task.max_value": 199, "model.d_model": 32, "model.mlp_dim": 64, "model.num_layers": 1,
        "train.num_steps": 4, "train.batch_size": 16, "train.log_every": 2, "train.eval_every": 4,
        "train.checkpoint_every": 4, "train.max_eval_batches": 1, "wandb.mode": "disabled"}})
    cmd = [sys.executable, SWEEP, "--experiment", path, "--workdir", str(tmp_path / "runs"),
           f"--config.task.data_dir={data}", f"--config.compile_cache={tmp_path / 'cache'}"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 1, first.stderr
    assert (tmp_path / "runs" / "num_heads=2,seed=0" / "results.json").exists()
    assert "does not divide" in (tmp_path / "runs" / "num_heads=3,seed=0" / "error.txt").read_text()
    rows = list(csv.DictReader(open(tmp_path / "runs" / "results.csv")))
    assert [r["num_heads"] for r in rows] == ["2", "3"] and rows[0]["status"] == "ok"
    assert rows[1]["status"].startswith("failed: model.num_heads=3 does not divide model.d_model=32")
    assert float(rows[0]["num_params"]) > 0
    assert "test_exact_match" in rows[0] and "| num_heads |" in first.stdout
    logs = tmp_path / "runs" / "logs"  # every trial's output kept, a success's as well as a failure's
    ok_log, failed_log = (logs / f"num_heads={h},seed=0.train.log" for h in (2, 3))
    assert ok_log.read_text().startswith("# ") and "num_heads=2,seed=0: 4 steps in " in ok_log.read_text()
    assert "does not divide" in failed_log.read_text()
    second = subprocess.run(cmd + ["--shard", "0/2"], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and "num_heads=2,seed=0: skipped" in second.stdout
    cached = sorted(os.listdir(tmp_path / "cache"))  # the trials compiled into the persistent compilation cache
    assert any(name.startswith("jit_train_step") for name in cached)
    shutil.rmtree(tmp_path / "runs" / "num_heads=2,seed=0")
    third = subprocess.run(cmd + ["--shard", "0/2"], capture_output=True, text=True, timeout=600)
    assert third.returncode == 0 and "num_heads=2,seed=0: ok" in third.stdout
    # the repeated trial's steps were cache hits: no second entry for a step program already cached (a step whose
    # first compile was under the 0.5 s threshold may join the cache now, when a loaded machine makes it slower)
    added = set(os.listdir(tmp_path / "cache")) - set(cached)
    stems = {name.split("-")[0] for name in cached}
    assert not [name for name in added if name.startswith(("jit_train_step", "jit_eval_step"))
                and name.split("-")[0] in stems], added
    again = json.load(open(tmp_path / "runs" / "num_heads=2,seed=0" / "results.json"))
    assert again["final"]["test"]["loss"] == pytest.approx(float(rows[0]["test_loss"]), rel=1e-6)


@pytest.mark.slow
def test_vmap_seeds_sweep_writes_each_seed_like_a_separate_trial_then_analyzes_and_tabulates(tmp_path):
    """--vmap-seeds: one process per group of trials differing only in seed; each seed's folder gets its own
    results.json (seed recorded, seeds_vectorized=2) and a results.csv row; the experiment's ``analyze`` runs on
    each finished trial; make_tables turns the folder into tables over both seeds; a rerun trains only what is
    missing."""
    path = _experiment(tmp_path, {**BASE, "variants": {"two": {"model.num_heads": 2}}, "seeds": [0, 1],
                                  "analyze": {"what": "ablate", "max_batches": 1}, "overrides": {
        "task.max_value": 199, "model.d_model": 32, "model.mlp_dim": 64, "model.num_layers": 1,
        "train.num_steps": 4, "train.batch_size": 16, "train.log_every": 2, "train.eval_every": 4,
        "train.checkpoint_every": 4, "train.max_eval_batches": 1, "wandb.mode": "disabled"}}, report="pruning")
    cmd = [sys.executable, "-m", "attn_lab.sweep", "--experiment", path, "--workdir", str(tmp_path / "runs"),
           "--vmap-seeds", f"--config.task.data_dir={tmp_path / 'data'}"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    for seed in (0, 1):
        results = json.load(open(tmp_path / "runs" / f"variant=two,seed={seed}" / "results.json"))
        assert results["config"]["seed"] == seed and results["seeds_vectorized"] == 2
        assert results["config"]["model"]["num_heads"] == 2
        assert (tmp_path / "runs" / f"variant=two,seed={seed}" / "analysis" / "ablate.json").exists()
    rows = list(csv.DictReader(open(tmp_path / "runs" / "results.csv")))
    assert [(r["variant"], r["seed"], r["status"]) for r in rows] == [("two", "0", "ok"), ("two", "1", "ok")]
    assert rows[0]["test_exact_match"] != "" and rows[0]["test_loss"] != rows[1]["test_loss"]
    tables = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tables.py"),
                             "--workdir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=300)
    assert tables.returncode == 0, tables.stderr
    md = (tmp_path / "runs" / "tables" / "x.md").read_text()  # named after the experiment file
    assert "All-but-one head per layer" in md and "± " in md and "(2)" in md  # mean ± std over the 2 seeds
    assert "-1.31*" in md and (tmp_path / "runs" / "tables" / "x.tex").exists()  # Michel et al. beside ours
    os.remove(tmp_path / "runs" / "variant=two,seed=1" / "results.json")
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and "seed=0: skipped" in second.stdout and "seed=1: ok" in second.stdout


def _experiment_module(path: str):
    """An experiment file imported as a module (its constants and ``get_experiment``), outside sys.modules."""
    spec = importlib.util.spec_from_file_location(f"_presets_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shipped_presets() -> list[str]:
    """Every ``<file>:<preset>`` of experiments/, read from each file's declared ``PRESETS``, so a new experiment or
    preset is checked without editing this file."""
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py"))):
        module = _experiment_module(path)
        found += [f"{os.path.basename(path)[:-3]}:{name}" for name in getattr(module, "PRESETS", {})]
    return found


@pytest.mark.parametrize("experiment", _shipped_presets())
def test_every_shipped_experiment_preset_builds_valid_trials(experiment):
    """Every trial of every preset passes the config validation a run does first (a preset that cannot run --
    e.g. a ListOps length the depth cannot reach -- fails here, not an hour into a sweep)."""
    from attn_lab.sweep.spec import load_config_file
    from attn_lab.train.config import validate_config

    name, preset = experiment.split(":")
    exp = load_experiment(os.path.join(ROOT, "experiments", f"{name}.py:{preset}"))
    # a stale plan fails here; a preset not piloted yet says so in one line, with the command that pilots it
    assert exp.preset is not None and exp.trials() and (not exp.plan_problem or (
        "does not exist; pilot it first: python -m attn_lab.sweep" in exp.plan_problem and exp.plan is None))
    for trial in exp.trials()[:: len(exp.seeds)]:  # seeds do not change validity
        config = load_config_file(exp.config)
        for key, value in trial.overrides.items():
            *path, last = key.split(".")
            node = config
            for part in path:
                node = node[part]
            node[last] = value
        validate_config(config)


BAR = "train:  50%|#####     | 6/12 [00:03<00:03,  2.0it/s, loss=3.1]"
NAN = "error: non-finite loss ([nan]) at step 6 (seed [0]); stopped at step 6, the last good checkpoint is step 4 in x"


@pytest.mark.parametrize("stderr,line", [
    (f"W1130 absl warning\n{BAR}\r{BAR}\r{NAN}\n", NAN[7:]),  # the error line printed over the bar's line
    (f"{BAR}\r{BAR}\n{NAN}\n{BAR}\r{BAR}\n", NAN[7:]),  # a bar redrawn after the error (at interpreter exit)
    (f"{BAR}\rTraceback (most recent call last):\n  File x\nFloatingPointError: {NAN[7:]}\n",  # no 'error:'
     f"FloatingPointError: {NAN[7:]}"),
])
def test_a_failed_trial_s_status_is_its_error_line_not_a_progress_bar(tmp_path, stderr, line):
    expected = f"failed: {line}"
    assert failed_status(screen_lines(stderr)) == expected
    (tmp_path / "error.txt").write_text(stderr)  # an error.txt written before progress bars were stripped
    assert recorded_status(str(tmp_path)) == expected


def test_a_pass_through_override_of_a_swept_key_is_refused(tmp_path):
    exp = load_experiment(_experiment(tmp_path, {**BASE, "grid": {"model.num_layers": [1, 2]}, "variants": {
        "MQA": {"model.num_kv_heads": 1}, "MHA": {}}, "overrides": {"train.num_steps": 10}}))
    exp.check_pass_through({"train.num_steps": "5", "model.num_heads": "8"})  # fixed overrides may be changed
    for key, where in [("model.num_layers", "an axis"), ("model.num_kv_heads", "variant 'MQA'"),
                       ("seed", "the seeds; use --seeds"), ("model", None)]:
        with pytest.raises(ValueError) as info:
            exp.check_pass_through({key: "2"})
        assert str(info.value).startswith(f"--config.{key}=2: '") and "\n" not in str(info.value)
        assert where is None or f"is varied by this sweep ({where})" in str(info.value)


def test_an_experiment_file_anywhere_resolves_its_config_next_to_itself_then_in_the_project_root(tmp_path):
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    (elsewhere / "mine.py").write_text(open(os.path.join(ROOT, "configs", "numbers.py")).read())
    listops = os.path.join(ROOT, "configs", "listops.py")
    for config, expected in [("configs/numbers.py:quick", os.path.join(PROJECT_ROOT, "configs", "numbers.py")),
                             ("mine.py:quick", str(elsewhere / "mine.py")), (listops, listops)]:
        path = elsewhere / "x.py"
        path.write_text(f"def get_experiment(preset='quick'):\n    return {{'name': 'x', 'config': {config!r}}}\n")
        exp = load_experiment(str(path))
        assert exp.config.partition(":")[0] == expected and exp.root == PROJECT_ROOT
    path.write_text("def get_experiment(preset='quick'):\n    return {'name': 'x', 'config': 'nope.py'}\n")
    with pytest.raises(ValueError, match=f"config='nope.py': config file not found in {elsewhere} or {PROJECT_ROOT}$"):
        load_experiment(str(path))


@pytest.mark.slow
def test_a_trial_that_dies_of_nan_keeps_its_error_line_in_results_csv_and_the_tables(tmp_path):
    """One variant trains, one diverges: the sweep exits 1, the NaN trial's status is its one error line (not a
    progress bar), it stays in results.csv, and make_tables marks its row failed and lists it with that line."""
    nan = {"model.num_heads": 4, "train.learning_rate": 1e36, "train.warmup_steps": 1, "train.grad_clip": 1e30,
           "train.weight_decay": 0.0, "train.checkpoint_every": 1}
    path = _experiment(tmp_path, {**BASE, "variants": {"A-h2": {"model.num_heads": 2}, "A-h4": nan}, "overrides": {
        "task.max_value": 199, "model.d_model": 32, "model.mlp_dim": 64, "model.num_layers": 1,
        "train.num_steps": 4, "train.batch_size": 16, "train.log_every": 2, "train.eval_every": 4,
        "train.max_eval_batches": 1, "wandb.mode": "disabled"}}, report="head_count")
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, SWEEP, "--experiment", path, "--workdir", str(runs),
                           f"--config.task.data_dir={tmp_path / 'data'}", "--config.compile_cache="],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr
    rows = list(csv.DictReader(open(runs / "results.csv")))
    assert [(r["variant"], r["status"][:40]) for r in rows] == [
        ("A-h2", "ok"), ("A-h4", "failed: non-finite loss ([nan]) at step ")]
    assert "%|" not in (runs / "variant=A-h4,seed=0" / "error.txt").read_text()
    exp = load_experiment(path)
    assert collect(exp, str(runs))[1]["status"] == rows[1]["status"]  # the same line read back from error.txt
    tables = subprocess.run([sys.executable, "-m", "attn_lab.reporting", "--workdir", str(runs)],
                            capture_output=True, text=True, timeout=300)
    assert tables.returncode == 0, tables.stderr
    md = (runs / "tables" / "x.md").read_text()
    assert "| A-h4 | 4 | – | 4 | – | – | – | – | – | 5.0 / 25.5 | failed (1 of 1 seeds) |" in md, md
    assert "| status |" in md and "| A-h2 | 2 |" in md and "| ok |" in md
    assert f"| variant=A-h4,seed=0 | {rows[1]['status']} |" in md


def test_wandb_grid_export_maps_every_agent_run_to_exactly_one_trial(tmp_path):
    """The exported W&B grid, expanded as the sweep server does (the product of every parameter's values), each run
    turned into the agent's ``${args_json}`` by wandb's own ``create_sweep_command_args``, maps back to exactly one
    trial, and together the runs cover every trial once (zipped groups travel as one parameter)."""
    import itertools

    import yaml
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    from attn_lab.sweep.wandb_sweep import sweep_definition, trial_from_wandb

    path = _experiment(tmp_path, {**BASE, "grid": {"model.num_layers": [1, 2]},
                                  "zip": [{"model.num_heads": [2, 4], "model.head_dim": [32, 16]}],
                                  "seeds": [0, 1, 2]})
    exp = load_experiment(path)
    definition = yaml.safe_load(yaml.safe_dump(sweep_definition(exp, f"{path}:quick", str(tmp_path / "runs"))))
    names = list(definition["parameters"])
    assert "model.num_heads+model.head_dim" in names and "seed" in names
    runs = [dict(zip(names, values)) for values in
            itertools.product(*(definition["parameters"][n]["values"] for n in names))]
    mapped = []
    for params in runs:
        (args_json,) = create_sweep_command_args({"args": {k: {"value": v} for k, v in params.items()}})["args_json"]
        mapped.append(trial_from_wandb(exp, args_json).name)
    assert len(runs) == len(exp.trials()) == 2 * 2 * 3
    assert sorted(mapped) == sorted(t.name for t in exp.trials())  # a bijection: each trial exactly once
    assert "--wandb-trial" in definition["command"] and "${args_json}" in definition["command"]
    assert definition["command"][2:6] == ["-m", "attn_lab.sweep", "--experiment", f"{path}:quick"]


def test_trials_run_the_package_entry_point_not_a_script_path(tmp_path):
    """A trial is ``python -m attn_lab.train`` (the library needs no scripts/ folder), one seed group is one such
    command with ``--seeds``, an experiment's analysis is ``python -m attn_lab.analysis`` with its ``analyze`` keys
    as flags (lists comma-separated), and the child finds this attn_lab first on its path."""
    from attn_lab.sweep.runner import analysis_command, child_env, group_command, trial_command

    exp = load_experiment(_experiment(tmp_path, {**BASE, "seeds": [0, 1], "analyze": {
        "what": ["ablate", "prune"], "max_batches": 1, "gate_targets": "0.5,0.25"}}))
    assert analysis_command(exp, "w/t") == [sys.executable, "-m", "attn_lab.analysis", "--workdir", "w/t",
                                            "--what=ablate,prune", "--max-batches=1", "--gate-targets=0.5,0.25"]
    first, second = exp.trials()
    one = trial_command(exp, first, "w", ["--config.train.num_steps=2"])
    assert one[:3] == [sys.executable, "-m", "attn_lab.train"] and one[3:5] == ["--config", exp.config]
    assert "--config.seed=0" in one and one[-1] == "--config.train.num_steps=2"
    group = group_command(exp, [first, second], "runs", [])
    assert group[:3] == one[:3] and group[group.index("--seeds") + 1] == "0,1"
    assert group[group.index("--workdir") + 1] == os.path.join("runs", "seed={seed}")
    assert child_env()["PYTHONPATH"].split(os.pathsep)[0] == ROOT


QUICK = ["head_count", "pruning", "diversity", "dynamic", "variants", "recall", "gqa"]
NOT_PILOTED: dict[str, str] = {}  # a quick preset not piloted yet: its last decided design instead (none now)


@pytest.mark.slow
def test_every_quick_preset_declares_a_design_on_seeds_its_pilot_did_not_use_and_dry_run_prints_its_power():
    """Pre-registration: each verdict preset names its findings, margins and what its pilot measured, its seeds are
    disjoint from the pilot's, and --dry-run says per finding its chance of a verdict and whether it is in the
    confirmatory family, before anything runs."""
    for name in QUICK:
        path = os.path.join(ROOT, "experiments", f"{name}.py:quick")
        if name in NOT_PILOTED:  # its dry run says so in one line, with the command that pilots it
            proc = subprocess.run([sys.executable, SWEEP, "--experiment", path, "--workdir", "unused", "--dry-run"],
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 1 and "pilot it first: python -m attn_lab.sweep" in proc.stderr, name
            path = os.path.join(ROOT, "experiments", f"{name}.py:{NOT_PILOTED[name]}")
        exp = load_experiment(path)
        assert exp.design is not None and exp.design.findings, name
        assert not set(exp.seeds) & set(exp.design.pilot_seeds), name
        proc = subprocess.run([sys.executable, SWEEP, "--experiment", path, "--workdir", "unused", "--dry-run"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        design = proc.stdout[proc.stdout.index("design:"):].splitlines()
        assert f"design: {len(exp.seeds)} seeds, t + bootstrap-t hull interval at 95%" in design[0], name
        plan = exp.design.plan(len(exp.seeds))
        for key in exp.design.findings:
            line = next(line for line in design if line.startswith(f"  {key}: "))
            assert ("chance of a verdict" in line or "no pilot effect" in line), line
            assert line.endswith("-> confirmatory" if plan[key]["confirmatory"] else "-> exploratory"), line
        assert not os.path.exists("unused")  # a dry run writes nothing


@pytest.mark.slow
def test_a_sweep_registers_its_design_when_it_starts_and_the_table_says_when_margins_changed(tmp_path):
    """sweep.json records the experiment file's sha256, design, seeds and budgets before the first trial; a rerun
    keeps that registration; after the margins are edited the table judges the registered design and says so."""
    from attn_lab.reporting.verdicts import Design, Finding

    def body(margin):
        finding = Finding("one head is worse than eight", "24.9 vs 25.8 BLEU", "down", margin)
        return {**BASE, "variants": {"A-h1": {"model.num_heads": 1}, "A-h8": {"model.num_heads": 4}},
                "seeds": [5, 6, 7], "design": Design({"A-h1": finding}, {"A-h1": 0.001}, "a pilot", (0, 1)),
                "overrides": {"task.max_value": 199, "model.d_model": 32, "model.mlp_dim": 64, "model.num_layers": 1,
                              "train.num_steps": 4, "train.batch_size": 16, "train.log_every": 2,
                              "train.eval_every": 4, "train.checkpoint_every": 4, "train.max_eval_batches": 1,
                              "wandb.mode": "disabled"}}
    path = _experiment(tmp_path, body(0.02), report="head_count")
    runs = tmp_path / "runs"
    cmd = [sys.executable, SWEEP, "--experiment", path, "--workdir", str(runs), "--vmap-seeds",
           f"--config.task.data_dir={tmp_path / 'data'}", f"--config.compile_cache={tmp_path / 'cache'}"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    reg = json.load(open(runs / "sweep.json"))["registration"]
    from attn_lab.reporting.verdicts import file_sha256

    assert reg["experiment_sha256"] == file_sha256(path) and reg["seeds"] == [5, 6, 7]
    assert reg["overrides"]["train.num_steps"] == 4
    assert reg["design"]["findings"]["A-h1"]["margin"] == 0.02 and reg["design"]["pilot_seeds"] == [0, 1]
    _experiment(tmp_path, body(0.5), report="head_count")  # margins widened after the run
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0 and "changed since this sweep started" in second.stdout
    assert json.load(open(runs / "sweep.json"))["registration"] == reg  # the first registration stands
    tables = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tables.py"), "--workdir", str(runs)],
                            capture_output=True, text=True, timeout=300)
    assert tables.returncode == 0, tables.stderr[-2000:]
    md = (runs / "tables" / "x.md").read_text()
    verdict = md[md.index("### Verdicts"):]
    assert "margins changed after the run" in verdict and "The experiment file changed" in verdict
    assert "| one head is worse than eight | 24.9 vs 25.8 BLEU | 0.02 |" in verdict  # judged as registered


@pytest.mark.slow
def test_make_tables_tabulates_the_seeds_a_sweep_ran_with_seeds(tmp_path):
    """A pilot runs the preset on other seeds (--seeds): make_tables reads those from the registration, not the
    experiment file's."""
    path = _experiment(tmp_path, {**BASE, "variants": {"two": {"model.num_heads": 2}}, "seeds": [0], "overrides": {
        "task.max_value": 199, "model.d_model": 32, "model.mlp_dim": 64, "model.num_layers": 1,
        "train.num_steps": 4, "train.batch_size": 16, "train.log_every": 2, "train.eval_every": 4,
        "train.checkpoint_every": 4, "train.max_eval_batches": 1, "wandb.mode": "disabled"}}, report="variants")
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, SWEEP, "--experiment", path, "--workdir", str(runs), "--seeds", "3,4",
                           "--vmap-seeds", f"--config.task.data_dir={tmp_path / 'data'}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tables = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tables.py"), "--workdir", str(runs)],
                            capture_output=True, text=True, timeout=300)
    assert tables.returncode == 0, tables.stderr[-2000:]
    assert "(2) |" in (runs / "tables" / "x.md").read_text()  # both seeds, 3 and 4


@pytest.mark.slow
def test_a_resumed_sweep_must_run_the_seeds_and_overrides_it_registered(tmp_path):
    """sweep.json's registration names the seeds and the command-line overrides a sweep started with; a rerun in the
    same folder with other seeds, a repeated seed or another budget stops with one line before anything runs
    (where data, caches and logs go may change)."""
    path = _experiment(tmp_path, {**BASE, "variants": {"two": {"model.num_heads": 2}}, "seeds": [5, 6]})
    runs = tmp_path / "runs"
    runs.mkdir()
    reg = {"experiment_sha256": "0" * 64, "seeds": [5, 6], "overrides": {}, "design": None,
           "command_line": ["--config.train.num_steps=4", f"--config.task.data_dir={tmp_path / 'data'}"]}
    (runs / "sweep.json").write_text(json.dumps({"experiment": f"{path}:quick", "root": str(tmp_path), "name": "t",
                                                 "registration": reg}))
    base = [sys.executable, SWEEP, "--experiment", path, "--workdir", str(runs)]
    cases = [(["--seeds", "5,6,7", "--config.train.num_steps=4"], "--seeds=5,6,7: .*registered seeds 5,6"),
             (["--config.train.num_steps=8"], "--config.train.num_steps=8: .*registered 4 when this sweep started"),
             ([], r"--config.train.num_steps=\(not given\): .*registered 4"),
             (["--seeds", "5,5", "--dry-run"], "--seeds: seed 5 is given twice")]
    for args, message in cases:
        proc = subprocess.run(base + args, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
        assert re.search(message, proc.stderr), proc.stderr
    assert sorted(os.listdir(runs)) == ["sweep.json"]  # nothing started


def _finished_trials(exp, workdir, extra):
    """Each trial's folder as a finished run trained with the config this sweep gives it (no training: the record
    the trainer writes, with that config), so a sweep over them only checks and tabulates."""
    from attn_lab.sweep.runner import trial_config

    for trial in exp.trials():
        folder = os.path.join(workdir, trial.name)
        os.makedirs(folder)
        record = {"final": {"validation": {"loss": 1.0}, "test": {"loss": 1.0, "accuracy": 0.5}},
                  "best": {"loss": 1.0}, "steps": 4, "num_params": 10, "steps_per_sec": 1.0,
                  "config": trial_config(exp, trial, extra)}
        with open(os.path.join(folder, "results.json"), "w") as f:
            json.dump(record, f)


def _tree(folder) -> dict:
    return {os.path.join(d, f): open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(folder) for f in fs}


@pytest.mark.slow
def test_a_sweep_never_reuses_a_trial_trained_with_another_config_or_a_folder_of_another_experiment(tmp_path):
    """Finished trials are skipped only when their recorded config is the one this sweep gives them: a changed
    pass-through override or a changed experiment file stops the sweep in one line naming the trial, the key and
    both values; another experiment run into the same folder is refused; a second sweep of the same trials waits
    for none (one line); --dry-run shows the pass-through overrides and writes nothing."""
    from attn_lab.train.workdir import WorkdirLock

    body = {**BASE, "grid": {"model.num_heads": [2, 4]}, "overrides": {"train.num_steps": 4}}
    path, workdir = _experiment(tmp_path, body), str(tmp_path / "runs")
    extra = [f"--config.task.data_dir={tmp_path / 'data'}"]
    _finished_trials(load_experiment(path), workdir, extra)
    cmd = [sys.executable, SWEEP, "--experiment", path, "--workdir", workdir, *extra]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and first.stdout.count(": skipped") == 2, first.stdout + first.stderr
    assert "[2/2] num_heads=4,seed=0: skipped | running 0, left 0, elapsed 0m" in first.stdout  # the progress line
    before = _tree(workdir)
    other = str(tmp_path / "other.py")
    shutil.copy(path, other)
    with open(other, "a") as f:
        f.write("\n_base = get_experiment\nget_experiment = lambda preset='quick': {**_base(preset), 'name': 'u'}\n")
    trial = os.path.join(workdir, "num_heads=2,seed=0")
    cases = [
        (cmd + ["--config.train.learning_rate=0.005"],
         f"error: {trial} was trained with train.learning_rate=0.002 ({trial}/results.json), this config has "
         "train.learning_rate=0.005; give the sweep a new --workdir (or move the trial's folder away)"),
        ([sys.executable, SWEEP, "--experiment", other, "--workdir", workdir, *extra],
         f"error: --workdir={workdir} holds the sweep 't' ({os.path.abspath(path)}:quick); this is 'u' "
         f"({os.path.abspath(other)}:quick): give each experiment its own --workdir"),
    ]
    for args, line in cases:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and proc.stderr.strip() == line, proc.stderr
    _experiment(tmp_path, {**body, "overrides": {"train.num_steps": 8}})  # the experiment file edited
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.startswith(f"error: {trial} was trained with train.num_steps=4 ("), \
        proc.stderr
    _experiment(tmp_path, body)
    lock = WorkdirLock(workdir, name=".sweep-0of1.lock")
    lock.acquire()
    try:
        busy = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    finally:
        lock.release()
    assert busy.returncode == 1 and busy.stderr.startswith(f"error: workdir {workdir} is in use by pid {os.getpid()}")
    assert _tree(workdir) == before
    new = str(tmp_path / "new")
    dry = subprocess.run([sys.executable, SWEEP, "--experiment", path, "--workdir", new, "--dry-run",
                          "--config.train.learning_rate=0.005"], capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0 and "every trial also gets: --config.train.learning_rate=0.005" in dry.stdout
    assert not os.path.exists(new)


@pytest.mark.parametrize("code,status,error_txt", [
    (75, "busy: another process is training it", False),  # WorkdirBusy: another sweep trains it
    (3, "failed: boom", True)])
def test_a_trial_s_exit_code_sets_its_status_and_a_finished_folder_never_gets_error_txt(tmp_path, code, status,
                                                                                        error_txt):
    from attn_lab.sweep import runner

    folder = str(tmp_path / "trial")
    cmd = [sys.executable, "-c", f"import sys; print('error: boom', file=sys.stderr); sys.exit({code})"]
    assert runner._run(cmd, [folder]) == status
    assert os.path.exists(os.path.join(folder, "error.txt")) == error_txt
    if error_txt:
        os.remove(os.path.join(folder, "error.txt"))
    os.makedirs(folder, exist_ok=True)  # (a busy trial's folder is the other process's to make)
    with open(os.path.join(folder, "results.json"), "w") as f:  # another process finished it meanwhile
        json.dump({"final": {}, "steps": 1}, f)
    assert runner._run(cmd, [folder]) == "ok" and not os.path.exists(os.path.join(folder, "error.txt"))


def test_status_lines_read_each_running_trial_s_step_loss_and_speed(tmp_path):
    """The periodic status: a trial still preparing says so; one training names step / steps, loss and steps/s
    from its config.json and metrics.jsonl; the estimate counts a running trial by its share of steps done."""
    from attn_lab.sweep.runner import Progress, Trial, trial_progress

    progress = Progress(4, str(tmp_path))
    progress.started([Trial("a,seed=0", {"seed": 0}, {}), Trial("a,seed=1", {"seed": 1}, {})])
    progress.started([Trial("b,seed=0", {"seed": 0}, {})])
    assert progress.status_lines() == ["  a,seed=0 (+1 seeds): preparing data and compiling",
                                       "  b,seed=0: preparing data and compiling"]
    trial = tmp_path / "a,seed=0"
    trial.mkdir()
    (trial / "config.json").write_text(json.dumps({"train": {"num_steps": 400}}))
    assert trial_progress(str(trial)) == (0.0, "compiling, first steps")
    (trial / "metrics.jsonl").write_text(
        json.dumps({"step": 100, "train/loss": 5.84, "train/steps_per_sec": 2.94}) + "\n"
        + json.dumps({"step": 100, "eval/loss": 5.9}) + "\n" + '{"step": 150, "train/lo')  # a line being written
    assert trial_progress(str(trial)) == (0.25, "step 100/400, loss 5.84, 2.94 steps/s")
    assert progress.status_lines()[0] == "  a,seed=0 (+1 seeds): step 100/400, loss 5.84, 2.94 steps/s"


def test_a_renamed_preset_keeps_its_recorded_folder_resumable_and_tabulated_and_is_refused_otherwise(tmp_path):
    """A sweep is known by its name: a preset renamed after a sweep ran (':quick' became ':numbers' when the LM table
    took the quick name) keeps the folder recorded under its old name -- the new name skips its finished trials and
    make_tables tabulates them -- with no map of old names in the file; a folder whose sweep no preset builds any
    more is refused in one line, and a retired shipped preset's names the last commit that builds it."""
    from attn_lab.sweep.spec import RETIRED_AT, recorded_preset

    body = {**BASE, "grid": {"model.num_heads": [2, 4]}, "overrides": {"train.num_steps": 4}}
    path, workdir = _experiment(tmp_path, body), str(tmp_path / "runs")
    extra = [f"--config.task.data_dir={tmp_path / 'data'}"]
    _finished_trials(load_experiment(path), workdir, extra)
    sweep = [sys.executable, SWEEP, "--workdir", workdir, *extra, "--experiment"]
    first = subprocess.run(sweep + [f"{path}:quick"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and first.stdout.count(": skipped") == 2, first.stdout + first.stderr
    renamed = {**body, "name": "new", "grid": {"model.num_heads": [8]}}
    with open(path, "w") as f:  # 'quick' now builds another sweep; the old one is 'numbers'
        f.write(f"def get_experiment(preset='quick'):\n    return {renamed!r} if preset == 'quick' else {body!r}\n")
    again = subprocess.run(sweep + [f"{path}:numbers"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count(": skipped") == 2, again.stdout + again.stderr
    made = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_tables.py"), "--workdir", workdir],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    assert "num_heads=2" in open(os.path.join(workdir, "tables", "x.md")).read()
    other = subprocess.run(sweep + [f"{path}:quick"], capture_output=True, text=True, timeout=300)
    assert other.returncode == 1 and other.stderr.strip() == (
        f"error: --workdir={workdir} holds the sweep 't' ({os.path.abspath(path)}:numbers); this is 'new' "
        f"({os.path.abspath(path)}:quick): give each experiment its own --workdir"), other.stderr
    declared = tmp_path / "declared.py"  # a declared file: the preset whose sweep has the recorded name
    declared.write_text("from attn_lab.experiment import Preset\n\nOLD = Preset('sweep_old', 'c.py', {'a': {}})\n"
                        "PRESETS = {'new': OLD, 'other': Preset('sweep_other', 'c.py', {'a': {}})}\n")
    assert recorded_preset(str(declared), "old", "sweep_old") == "new"
    with pytest.raises(ValueError) as info:
        recorded_preset(str(declared), "new", "sweep_gone")
    assert str(info.value) == (f"the sweep 'sweep_gone' was recorded from {declared}:new, and no preset of that file "
                               "builds it now ('new' builds 'sweep_old')")
    shipped = os.path.join(ROOT, "experiments", "head_count.py")
    with pytest.raises(ValueError, match=f"'head_count_powered' .* retired after commit {RETIRED_AT}: tabulate"):
        recorded_preset(shipped, "powered", "head_count_powered")


def test_the_sharp_head_count_designs_run_on_seeds_their_pilots_did_not_use_and_judge_against_their_baseline():
    """The D-retrieval head-count presets with a verdict: each runs on seeds its pilot did not use (':sharp_powered'
    plans from every seed the earlier sharp runs used, so none of those may come back), one head is judged against
    the row the preset names, and ':sharp_powered''s pooled pilot is what the recorded runs give (docs/head_count.md):
    its effect their pooled mean, its sd at least their pooled sd with each summary-only run's paired sd at the sum of
    its rows' sds -- and its plan confirmatory at the seeds it asks for."""
    for preset, baseline in (("sharp", "A-h2"), ("sharp_h4", "A-h4"), ("sharp_powered", "A-h4")):
        exp = load_experiment(os.path.join(ROOT, "experiments", f"head_count.py:{preset}"))
        assert not set(exp.seeds) & set(exp.design.pilot_seeds), preset
        assert exp.preset.baseline == baseline and baseline in exp.variants and "A-h1" in exp.variants
        assert exp.preset.metric.key == "test_accuracy"
    powered = load_experiment(os.path.join(ROOT, "experiments", "head_count.py:sharp_powered"))
    assert set(powered.design.pilot_seeds) == {0, 1, 2, 3, 4, 100, 101, 102, 110, 111, 112, 200, 201}
    # (seeds, mean of one head minus four, paired sd bound) per summary-only run; single seeds by value.
    summaries = [(5, 0.3442 - 0.9400, 0.0314 + 0.0132), (3, 0.3687 - 0.9377, 0.0241 + 0.0266)]
    single = [0.334 - 0.916, 0.366 - 0.941, 0.903 - 0.944, 0.442 - 0.942, 0.346 - 0.943]
    n = sum(k for k, _, _ in summaries) + len(single)
    mean = (sum(k * m for k, m, _ in summaries) + sum(single)) / n
    squares = sum((k - 1) * sd**2 + k * (m - mean) ** 2 for k, m, sd in summaries)
    squares += sum((d - mean) ** 2 for d in single)
    assert n == len(powered.design.pilot_seeds)
    assert powered.design.effect["A-h1"] == pytest.approx(mean, abs=5e-4)
    assert powered.design.sd["A-h1"] >= (squares / (n - 1)) ** 0.5 - 5e-4
    plan = powered.design.plan(len(powered.seeds))["A-h1"]
    assert plan["confirmatory"] and plan["seeds_needed"] == len(powered.seeds) == 5
