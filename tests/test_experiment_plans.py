"""Experiments as declarations (attn_lab.experiment) and the plans their pilots write (attn_lab.sweep.plans, .pilot):
the recipe of docs/extending.md followed from an experiment file outside the package -- one command from pilot to
plan to verdict, rerun to resume -- and every refusal in one line before anything is written: a stale plan, seeds
shared by pilot and verdict, a pilot of fewer than 3 seeds, a pilot whose metric is not finite, a damaged plan."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from attn_lab.experiment import Finding, Metric, Powered, Preset, fingerprint
from attn_lab.reporting.stats import paired
from attn_lab.reporting.verdicts import Design
from attn_lab.sweep import plans
from attn_lab.sweep.spec import load_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"task.max_value": 199, "model.d_model": 32, "model.mlp_dim": 64, "model.num_layers": 1,
        "train.num_steps": 4, "train.batch_size": 16, "train.log_every": 2, "train.eval_every": 4,
        "train.checkpoint_every": 4, "train.max_eval_batches": 1, "wandb.mode": "disabled"}


def _write(folder, margin=0.5, seeds="[10, 11, 12]", extra=""):
    """An experiment file of a researcher's own, outside the repository: two arms, one finding, a tiny budget."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mine.py"
    path.write_text(textwrap.dedent(f"""
        from attn_lab.experiment import Finding, Metric, Powered, Preset

        FINDING = {{"h1": Finding("one head matches two", "-", "same", {margin})}}
        ARMS = {{"h1": {{"model.num_heads": 1, "model.head_dim": 32}}, "h2": {{"model.num_heads": 2}}}}
        PRESETS = {{"quick": Preset("mine_quick", "configs/numbers.py:quick", ARMS, {seeds}, FINDING, "h2",
                                    Metric("test_loss", "minus the test loss (nats)", -1.0), pilot_seeds=(0, 1, 2),
                                    overrides={TINY!r}){extra}}}
    """))
    return str(path)


def _sweep(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "attn_lab.sweep", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_the_fingerprint_follows_what_a_pilot_measures_not_the_words_or_the_seeds():
    finding = Finding("a claim", "paper", "down", 0.02)
    base = Preset("x", "configs/numbers.py:quick", {"a": {"model.num_heads": 1}, "b": {}}, [10, 11, 12],
                  {"a": finding}, "b", Metric("test_loss", "loss", -1.0))
    same = [base.replace(seeds=[20, 21, 22]), base.replace(pilot_seeds=(5, 6, 7)), base.replace(name="y"),
            base.replace(findings={"a": Finding("reworded", "other paper text", "down", 0.02)})]
    moved = [base.replace(overrides={"train.num_steps": 3}), base.replace(arms={"a": {"model.num_heads": 2}, "b": {}}),
             base.replace(findings={"a": Finding("a claim", "paper", "down", 0.03)}), base.replace(baseline="a"),
             base.replace(metric=Metric("test_accuracy", "acc")), base.replace(config="configs/numbers.py")]
    assert all(fingerprint(p) == fingerprint(base) for p in same)
    assert len({fingerprint(p) for p in [base, *moved]}) == len(moved) + 1


@pytest.mark.parametrize("field,value,message", [
    ("arms", {}, "arms={}; allowed: a non-empty dict"), ("seeds", [1, 1], "seeds=[1, 1]; give each seed once"),
    ("seeds", "0,1", "seeds='0,1'; allowed: a list of integer seeds"),
    ("baseline", "h4", "baseline='h4' is not an arm"),
    ("metric", "test_loss", "metric='test_loss'; allowed: an attn_lab.experiment.Metric"),
    ("findings", {"h1": 0.02}, "findings['h1']=0.02; allowed: an attn_lab.experiment.Finding"),
    ("pilot_seeds", [-1], "pilot_seeds=[-1]; allowed: a list of integer seeds"),
    ("seeds", Powered(10, 64), None)])
def test_a_preset_is_checked_field_by_field_when_its_file_loads(field, value, message):
    given = {"arms": {"h1": {"model.num_heads": 1}, "h2": {}}, field: value}
    if message is None:
        assert Preset("x", "c.py", **given).seeds == value
        return
    with pytest.raises(ValueError, match=re.escape(f"Preset('x'): {message}")):
        Preset("x", "c.py", **given)
    with pytest.raises(ValueError, match="Powered: cap=2; allowed"):
        Powered(10, 2)
    with pytest.raises(ValueError, match="sign=0.5; allowed: 1.0"):
        Metric("test_loss", "loss", 0.5)


def test_a_plan_edited_into_another_shape_is_one_line_naming_it(tmp_path):
    path = _write(tmp_path / "outside")
    exp = load_experiment(f"{path}:quick")
    for body in ({"findings": {"h1": 3}, "experiment_hash": "x"}, {"findings": {}, "experiment_hash": "x", "pilot": 3},
                 {"findings": {"h1": {"sd": "wide", "effect": 0.1}}, "experiment_hash": fingerprint(exp.preset),
                  "pilot": {"seeds": [0, 1, 2]}}):
        plans.write_plan(exp.plan_path, body)
        with pytest.raises(ValueError, match=re.escape(exp.plan_path) + ".*re-pilot"):
            load_experiment(f"{path}:quick")


def test_a_pilot_without_enough_finite_pairs_writes_no_plan_and_a_flat_one_stays_exploratory():
    design = Design.of({"a": Finding("c", "p", "down", 0.02)}, None, "", (0, 1, 2))
    good = paired({0: 1.0, 1: 1.1, 2: 1.3}, {0: 0.9, 1: 1.05, 2: 1.1})
    numbers = plans.pilot_numbers(design, {"a": good}, {}, "test_loss")["a"]
    assert numbers["effect"] == pytest.approx(good.mean, abs=1e-6) and numbers["sd"] == pytest.approx(good.sd, abs=1e-6)
    assert numbers["pairs"] == 3 and set(numbers["values"]) == {"0", "1", "2"}
    with pytest.raises(ValueError, match="'a': test_loss is not finite on seed 2: no plan is written"):
        plans.pilot_numbers(design, {"a": good}, {"a": [2]}, "test_loss")
    with pytest.raises(ValueError, match="'a' has 2 paired seeds in test_loss; a plan needs at least 3"):
        plans.pilot_numbers(design, {"a": paired({0: 1.0, 1: 2.0}, {0: 1.5, 1: 2.2})}, {}, "test_loss")
    with pytest.raises(ValueError, match="has 0 paired seeds"):
        plans.pilot_numbers(design, {"a": None}, {}, "test_loss")
    flat = paired({0: 1.0, 1: 1.0, 2: 1.0}, {0: 0.5, 1: 0.5, 2: 0.5})
    assert plans.pilot_numbers(design, {"a": flat}, {}, "test_loss")["a"]["sd"] is None


def test_every_refusal_is_one_line_before_anything_is_written(tmp_path):
    """Stale plan (another fingerprint), a damaged plan, verdict seeds that are the pilot's, a pilot on the verdict's
    seeds or on fewer than 3, Powered seeds without a plan: each refused by --dry-run as a run would be."""
    path = _write(tmp_path / "outside")
    exp = load_experiment(f"{path}:quick")
    plan = plans.build_plan(exp.preset, f"{path}:quick", {"h1": {"effect": 0.01, "sd": 0.02, "pilot_collapsed": 0}},
                            {"seeds": [0, 1, 2], "commit": "abc", "wall_seconds": 30.0}, 3)
    plans.write_plan(exp.plan_path, plan)
    work = tmp_path / "runs"
    ok = _sweep("--experiment", f"{path}:quick", "--workdir", work, "--dry-run", timeout=300)
    assert ok.returncode == 0 and "plans/mine_quick.json (pilot seeds 0-2, commit abc)" in ok.stdout, ok.stderr
    cases = [(["--seeds", "0,1,2"], "error: seeds: seed 0 is one of the pilot's"),
             (["--pilot", "--seeds", "5,6"], "error: --pilot: seeds 5,6: a pilot needs at least 3 seeds"),
             (["--pilot", "--seeds", "10,11,12"], "error: --pilot: seed 10 is one of"),
             (["--max-seeds", "4"], "error: --max-seeds=4: it caps the verdict seeds of --pilot-and-verdict")]
    for args, line in cases:
        proc = _sweep("--experiment", f"{path}:quick", "--workdir", work, "--dry-run", *args, timeout=300)
        assert proc.returncode == 1 and proc.stderr.startswith(line) and proc.stderr.count("\n") == 1, proc.stderr
    _write(tmp_path / "outside", margin=0.4)  # the finding's margin changed after the pilot
    stale = _sweep("--experiment", f"{path}:quick", "--workdir", work, "--dry-run", timeout=300)
    assert stale.returncode == 1 and stale.stderr.count("\n") == 1, stale.stderr
    assert f"was planned for another version of {path}:quick (experiment hash {plan['experiment_hash']} in the plan, " \
           f"{fingerprint(load_experiment(f'{path}:quick').preset)} now)" in stale.stderr
    assert "re-pilot: python -m attn_lab.sweep --experiment" in stale.stderr and "--pilot" in stale.stderr
    with open(exp.plan_path, "w") as f:
        f.write('{"findings": ')  # damaged: named, never replaced by a verdict run
    damaged = _sweep("--experiment", f"{path}:quick", "--workdir", work, "--dry-run", timeout=300)
    assert damaged.returncode == 1 and "cannot be read" in damaged.stderr and "re-pilot" in damaged.stderr
    assert open(exp.plan_path).read() == '{"findings": '
    os.remove(exp.plan_path)
    powered = _write(tmp_path / "powered", seeds="Powered(10)")
    unplanned = _sweep("--experiment", f"{powered}:quick", "--workdir", work, "--dry-run", timeout=300)
    assert unplanned.returncode == 1 and "takes as many seeds as its plan needs" in unplanned.stderr
    assert "pilot it first" in unplanned.stderr and not work.exists()


def test_a_pilot_measures_each_finding_and_writes_its_plan_only_once_every_trial_finished(tmp_path):
    """The plan from a pilot's rows: each finding's paired difference in the preset's metric (minus the test loss:
    h1 minus h2), the plan at the verdict seeds, where the numbers came from; a pilot with an unfinished trial
    (another shard's) writes nothing."""
    from attn_lab.sweep import pilot

    path = _write(tmp_path / "outside")
    exp = pilot.pilot_experiment(load_experiment(f"{path}:quick"), f"{path}:quick", None)
    losses = {("h1", 0): 1.30, ("h1", 1): 1.24, ("h1", 2): 1.29, ("h2", 0): 1.20, ("h2", 1): 1.20, ("h2", 2): 1.21}
    rows = [{"variant": arm, "seed": seed, "trial": f"variant={arm},seed={seed}", "status": "ok", "test_loss": loss,
             "steps_per_sec": 4.0} for (arm, seed), loss in losses.items()]
    waiting = [*rows[:-1], {**rows[-1], "status": "not run"}]
    with pytest.raises(ValueError, match="1 of 6 trials have not finished .*no plan is written"):
        pilot.write_from_pilot(exp, f"{path}:quick", waiting, str(tmp_path), ["cmd"], 10.0)
    assert not os.path.exists(exp.plan_path)
    written, plan = pilot.write_from_pilot(exp, f"{path}:quick", rows, str(tmp_path), ["cmd"], 10.0)
    diffs = [-(1.30 - 1.20), -(1.24 - 1.20), -(1.29 - 1.21)]  # minus the loss: h1's higher loss is negative
    mean = sum(diffs) / 3
    sd = (sum((d - mean) ** 2 for d in diffs) / 2) ** 0.5
    assert written == exp.plan_path and json.load(open(written)) == plan
    assert plan["findings"]["h1"]["effect"] == pytest.approx(mean, abs=1e-6)
    assert plan["findings"]["h1"]["sd"] == pytest.approx(sd, abs=1e-6) and plan["findings"]["h1"]["pairs"] == 3
    assert plan["pilot"]["seeds"] == [0, 1, 2] and plan["pilot"]["wall_seconds"] == 10.0
    assert plan["pilot"]["steps_per_sec"] == {"h1": 4.0, "h2": 4.0} and plan["plan"]["verdict_seeds"] == 3
    assert set(plan["plan"]["findings"]["h1"]) >= {"chance", "confirmatory", "seeds_needed", "sd_plan"}
    planned = load_experiment(f"{path}:quick")
    assert planned.plan_problem is None and planned.design.effect["h1"] == pytest.approx(mean, abs=1e-6)
    assert plans.estimated_seconds(plan, 6) == pytest.approx(20.0)  # the wall time, scaled by seeds
    resumed = {**plan, "pilot": {**plan["pilot"], "wall_seconds": None, "steps": {"h1": 8, "h2": 8}}}
    assert plans.estimated_seconds(resumed, 3) == pytest.approx(8 / 4.0 + 8 / 4.0)  # arms in turn at their speed


@pytest.mark.slow
def test_one_command_from_an_outside_experiment_to_its_verdict_resumes_and_a_re_pilot_keeps_the_verdict(tmp_path):
    """--pilot-and-verdict on a file outside the package: the pilot (seeds 0-2) writes plans/mine_quick.json beside
    the file, the plan is printed with the time it estimates, the verdict runs on seeds 10-12 and registers the
    plan; a rerun resumes (no pilot, nothing trained); after an edit the verdict run refuses the stale plan, a
    re-pilot writes a new one, and the recorded verdict keeps the plan it was judged under."""
    path = _write(tmp_path / "outside")
    work, data = tmp_path / "runs", f"--config.task.data_dir={tmp_path / 'data'}"
    cmd = ["--experiment", f"{path}:quick", "--workdir", work, "--pilot-and-verdict", "--vmap-seeds", data,
           f"--config.compile_cache={tmp_path / 'cache'}"]
    first = _sweep(*cmd)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    plan_file = tmp_path / "outside" / "plans" / "mine_quick.json"
    plan = json.loads(plan_file.read_text())
    assert plan["pilot"]["seeds"] == [0, 1, 2] and plan["experiment_hash"] == fingerprint(
        load_experiment(f"{path}:quick").preset)
    assert plan["findings"]["h1"]["pairs"] == 3 and plan["pilot"]["wall_seconds"] > 0
    assert "wrote " + str(plan_file) in first.stdout and "estimated time:" in first.stdout
    assert "verdict seeds 10,11,12" in first.stdout and "### Verdicts" in first.stdout
    registered = json.load(open(work / "verdict" / "sweep.json"))["registration"]
    assert registered["plan"] == plan and registered["seeds"] == [10, 11, 12] and not registered["pilot"]
    assert json.load(open(work / "pilot" / "sweep.json"))["registration"]["pilot"]
    again = _sweep(*cmd)
    assert again.returncode == 0 and "is current" in again.stdout and again.stdout.count(": skipped") == 6
    assert json.loads(plan_file.read_text()) == plan  # a verdict run never writes a plan
    _write(tmp_path / "outside", margin=0.4)
    refused = _sweep("--experiment", f"{path}:quick", "--workdir", work / "verdict", "--vmap-seeds", data)
    assert refused.returncode == 1 and "was planned for another version" in refused.stderr
    repilot = _sweep("--experiment", f"{path}:quick", "--workdir", work / "pilot", "--pilot", "--vmap-seeds", data)
    assert repilot.returncode == 0, repilot.stderr[-3000:]
    assert json.loads(plan_file.read_text())["experiment_hash"] != plan["experiment_hash"]
    assert json.load(open(work / "verdict" / "sweep.json"))["registration"]["plan"] == plan
