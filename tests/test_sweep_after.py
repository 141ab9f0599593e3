"""Sweeps whose trials start from other trials (``'{trial:<variant>}'``): GQA uptrained from each seed's own
finished multi-head run, run in order, resumed by identity, refused where it cannot hold."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from attn_lab.sweep.runner import trial_command, trial_config
from attn_lab.sweep.spec import load_experiment
from tests.test_sweep import BASE, _experiment

TINY = {"task.max_value": 199, "model.d_model": 32, "model.mlp_dim": 64, "model.num_layers": 1,
        "model.num_heads": 4, "train.batch_size": 16, "train.log_every": 2, "train.max_eval_batches": 1,
        "wandb.mode": "disabled"}
UPTRAIN = {"model.num_kv_heads": 2, "train.init_from": "{trial:mha}", "train.init_kv_heads": "mean_pool"}


def _body(seeds=(0, 1), **variants):
    return {**BASE, "overrides": TINY, "seeds": list(seeds),
            "variants": variants or {"mha": {}, "gqa_up": UPTRAIN}}


def test_a_reference_names_the_same_seed_s_trial_and_orders_it(tmp_path):
    exp = load_experiment(_experiment(tmp_path, _body()))
    trials = {t.name: t for t in exp.trials()}
    up = trials["variant=gqa_up,seed=1"]
    assert up.after == ("variant=mha,seed=1",) and trials["variant=mha,seed=1"].after == ()
    assert up.overrides["train.init_from"] == "{sweep}/variant=mha,seed={seed}"
    runs = str(tmp_path / "runs")
    cmd = trial_command(exp, up, os.path.join(runs, up.name), [])
    assert f"--config.train.init_from={os.path.abspath(runs)}/variant=mha,seed={{seed}}" in cmd  # the trainer fills it
    recorded = trial_config(exp, up, [], runs)["train"]["init_from"]  # what its config.json will hold
    assert recorded == os.path.join(os.path.abspath(runs), "variant=mha,seed=1")


@pytest.mark.parametrize("variants,message", [
    ({"mha": {}, "up": {"train.init_from": "{trial:nope}"}}, "variant 'up': train.init_from='{trial:nope}': no such "
                                                             "variant; name a variant that trains from scratch (mha)"),
    ({"mha": {}, "a": {"train.init_from": "{trial:mha}"}, "b": {"train.init_from": "{trial:a}"}},
     "variant 'b': train.init_from='{trial:a}': it starts from a trial itself"),
    ({"a": {"train.init_from": "{trial:a}"}}, "variant 'a': train.init_from='{trial:a}': it starts from a trial"),
])
def test_a_reference_to_no_variant_or_a_chain_is_one_line(tmp_path, variants, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_experiment(_experiment(tmp_path, _body(**variants)))


@pytest.mark.parametrize("where", [
    {"overrides": TINY | {"train.init_from": "{trial:mha}"}},  # fixed: every trial, the source's own included
    {"grid": {"train.init_from": ["{trial:mha}"]}},  # an axis
    {"variants": {"mha": {}, "up": {"train.init_from": "runs/{trial:mha}"}}},  # inside a longer value
])
def test_a_reference_anywhere_but_a_variant_s_whole_value_is_one_line(tmp_path, where):
    """Outside a variant's whole value, '{trial:...}' reached the trials as a literal path: they started and
    failed on a folder that does not exist. Now the file is refused in one line, before any trial starts."""
    with pytest.raises(ValueError) as info:
        load_experiment(_experiment(tmp_path, _body() | where))
    assert "'{trial:<variant>}' can only be the whole value of a variant's override" in str(info.value)
    assert "\n" not in str(info.value)


def test_wandb_export_refuses_trials_that_must_run_in_order(tmp_path):
    path = _experiment(tmp_path, _body())
    proc = subprocess.run([sys.executable, "-m", "attn_lab.sweep", "--experiment", path, "--workdir",
                           str(tmp_path / "runs"), "--export-wandb", str(tmp_path / "s.yaml")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and not (tmp_path / "s.yaml").exists()
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --export-wandb: trial variant=gqa_up,seed=0 starts from variant=mha,seed=0 (a '{trial:...}' value), "
        "which W&B agents cannot order; run this experiment with attn_lab.sweep")


@pytest.mark.slow
@pytest.mark.parametrize("vmap", [True, False])
def test_uptraining_trials_run_after_their_sources_and_resume_by_identity(tmp_path, vmap):
    """Listed first, the uptrained rows still run after the runs they pool (2 processes at once); each seed starts
    from its own seed's run; a rerun trains nothing; a source that failed leaves its uptrained trial failed with
    the reason."""
    variants = {"gqa_up": {**UPTRAIN, "train.num_steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2},
                "mha": {"train.num_steps": 4, "train.eval_every": 4, "train.checkpoint_every": 4}}
    path = _experiment(tmp_path, _body(**variants))
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "attn_lab.sweep", "--experiment", path, "--workdir", str(runs), "--parallel", "2",
           f"--config.task.data_dir={tmp_path / 'data'}", *(["--vmap-seeds"] if vmap else [])]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    for seed in (0, 1):
        up = json.load(open(runs / f"variant=gqa_up,seed={seed}" / "results.json"))
        assert up["config"]["train"]["init_from"] == str(runs / f"variant=mha,seed={seed}") and up["steps"] == 2
        assert up["config"]["model"]["num_kv_heads"] == 2 and up["config"]["seed"] == seed
        source = os.path.getmtime(runs / f"variant=mha,seed={seed}" / "results.json")
        assert os.path.getmtime(runs / f"variant=gqa_up,seed={seed}" / "config.json") >= source
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0 and second.stdout.count(": skipped") == 4, second.stdout + second.stderr
    moved = tmp_path / "elsewhere" / "runs"  # copied (synced, unpacked): its uptrained trials name the old sources
    shutil.copytree(runs, moved, symlinks=True)
    again = subprocess.run([*cmd[:cmd.index(str(runs))], str(moved), *cmd[cmd.index(str(runs)) + 1:]],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count(": skipped") == 4, again.stdout + again.stderr
    for seed in (0, 1):  # a source that can no longer train: its uptrained trial says why and never starts
        for name in (f"variant=gqa_up,seed={seed}", f"variant=mha,seed={seed}"):
            os.rename(runs / name, tmp_path / f"old-{name}")
    (runs / "variant=mha,seed=0").mkdir()
    (runs / "variant=mha,seed=0" / "checkpoints").write_text("")  # not a folder: the source fails at once
    third = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert third.returncode != 0
    assert "variant=gqa_up,seed=0: failed: starts from variant=mha,seed=0, which failed" in third.stdout


def test_a_moved_sweep_s_reference_compares_relative_to_the_sweep_folder(tmp_path):
    """An uptrained trial records its source's absolute path; copied elsewhere, the same sibling is the same run.
    A source that is not the trial's sibling, or another trial's folder name, still differs."""
    from attn_lab.train.identity import differences, moved_references

    here = str(tmp_path / "new" / "variant=up,seed=0")
    old = {"train": {"init_from": "/old/runs/variant=mha,seed=0"}, "seed": 0}
    new = {"train": {"init_from": str(tmp_path / "new" / "variant=mha,seed=0")}, "seed": 0}
    assert differences(*moved_references(old, new, here)) == []
    other = {"train": {"init_from": "/old/runs/variant=mha,seed=1"}, "seed": 0}  # another seed's source
    assert [d[0] for d in differences(*moved_references(other, new, here))] == ["train.init_from"]
    outside = {"train": {"init_from": "/elsewhere/variant=mha,seed=0"}, "seed": 0}  # a source outside the sweep
    assert moved_references(old, outside, here) == (old, outside)


@pytest.mark.slow
def test_a_trial_whose_source_is_in_another_shard_waits_for_it_or_is_not_run(tmp_path):
    """Shard 1/2 holds the uptrained trial, shard 0/2 its source. Alone, shard 1/2 does not start it (no failure,
    nothing written: 'not run', rerun later); started while shard 0/2 trains the source, it waits and then trains."""
    import time

    from attn_lab.train.workdir import WorkdirBusy, WorkdirLock

    variants = {"mha": {"train.num_steps": 4, "train.eval_every": 4, "train.checkpoint_every": 4},
                "gqa_up": {**UPTRAIN, "train.num_steps": 2, "train.eval_every": 2, "train.checkpoint_every": 2}}
    path = _experiment(tmp_path, _body(seeds=(0,), **variants))
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "attn_lab.sweep", "--experiment", path, "--workdir", str(runs),
           f"--config.task.data_dir={tmp_path / 'data'}"]
    alone = subprocess.run([*cmd, "--shard", "1/2"], capture_output=True, text=True, timeout=600)
    assert alone.returncode == 1, alone.stdout[-2000:] + alone.stderr[-2000:]
    assert ("variant=gqa_up,seed=0: not run: starts from variant=mha,seed=0, another shard's trial that has not "
            "finished; rerun this shard once it has") in alone.stdout, alone.stdout
    assert not (runs / "variant=gqa_up,seed=0").exists() and not (runs / "variant=mha,seed=0").exists()
    source = subprocess.Popen([*cmd, "--shard", "0/2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # shard 0/2 holds the source's folder: start shard 1/2 now
        try:
            WorkdirLock(str(runs / "variant=mha,seed=0")).probe()
        except WorkdirBusy:
            break
        time.sleep(0.2)
    waits = subprocess.run([*cmd, "--shard", "1/2"], capture_output=True, text=True, timeout=900)
    out, err = source.communicate(timeout=600)
    assert source.returncode == 0, out[-2000:] + err[-2000:]
    assert waits.returncode == 0, waits.stdout[-2000:] + waits.stderr[-2000:]
    assert json.load(open(runs / "variant=gqa_up,seed=0" / "results.json"))["steps"] == 2
