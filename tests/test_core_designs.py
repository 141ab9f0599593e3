"""The core tables on the papers' tasks (issue 59): head count, pruning and diversity judge French -> English
translation in their ``quick`` presets, head count and pruning have a tweet-classification preset, every one of
them has a plan its pilot wrote, and each task kind runs end to end (train, analysis, verdict table) at a tiny
size through the real preset."""

import json
import os
import subprocess
import sys

import pytest

from attn_lab.experiment import Powered, fingerprint
from attn_lab.sweep.spec import load_config_file, load_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRANSLATION = ["experiments/head_count.py:quick", "experiments/pruning.py:quick", "experiments/diversity.py:quick",
               "experiments/gqa.py:translation"]
CLASSIFICATION = ["experiments/head_count.py:sentiment", "experiments/pruning.py:sentiment"]
NOT_PILOTED: list[str] = []  # a design declared and not yet piloted refuses a plain run in one line (none now)


def _task(spec: str) -> str:
    return load_config_file(load_experiment(spec).config).task.name


@pytest.mark.parametrize("spec", TRANSLATION + CLASSIFICATION)
def test_each_core_design_is_on_a_real_language_task_judged_in_nats_with_a_current_plan(spec):
    exp = load_experiment(os.path.join(ROOT, spec))
    assert _task(os.path.join(ROOT, spec)) == ("bible" if spec in TRANSLATION else "sentiment")
    assert exp.preset.metric.key in ("test_loss", "log_likelihood")  # nats: the quantity that pairs tightly
    assert exp.preset.metric.sign == (-1.0 if exp.preset.metric.key == "test_loss" else 1.0)
    if spec in NOT_PILOTED:  # a plain run refuses in one line with the command that pilots it
        assert exp.plan is None and "does not exist; pilot it first" in exp.plan_problem
        return
    assert exp.plan is not None and exp.plan_problem is None, spec  # the pilot command wrote it, for this design
    assert exp.plan["experiment_hash"] == fingerprint(exp.preset) and exp.plan["pilot"]["commit"]
    assert not set(exp.seeds) & set(exp.plan["pilot"]["seeds"])  # verdict seeds are never the pilot's
    assert set(exp.plan["findings"]) == set(exp.preset.findings)


def test_the_language_model_and_numbers_designs_stay_under_their_own_names():
    for table in ("head_count", "pruning", "diversity"):
        assert _task(os.path.join(ROOT, f"experiments/{table}.py:lm")) == "bible_lm"
        assert _task(os.path.join(ROOT, f"experiments/{table}.py:numbers")) == "numbers"
    quick, kv = (load_experiment(os.path.join(ROOT, f"experiments/{p}")).preset
                 for p in ("head_count.py:quick", "gqa.py:translation"))
    assert isinstance(quick.seeds, Powered) and quick.baseline == kv.baseline == "A-h8" and quick.config == kv.config
    assert set(quick.findings) == {"A-h1", "A-h16"}  # Table 3 A; multi-query from scratch, both uptrained (5%)
    assert set(kv.findings) == {"MQA-h8", "MQA-h8-up", "GQA-h8-kv2-up"}
    for arm in ("MQA-h8-up", "GQA-h8-kv2-up"):  # Ainslie et al.: each seed's 8-head run pooled, then 5% of its steps
        assert kv.arms[arm]["train.init_from"] == "{trial:A-h8}" and kv.arms[arm]["train.num_steps"] == 30


TINY = {  # a few verses and steps: the preset's own arms, analysis and report at the smallest size
    "bible": ["--config.task.books=33,57,31", "--config.task.vocab_size=300"],
    "sentiment": ["--config.task.limit=500", "--config.task.vocab_size=400"],
}
COMMON = ["--config.train.num_steps=4", "--config.train.eval_every=4", "--config.train.checkpoint_every=4",
          "--config.train.batch_size=8", "--config.train.log_every=2", "--config.train.max_eval_batches=1",
          "--config.wandb.mode=disabled"]


@pytest.mark.slow
@pytest.mark.parametrize("spec,task", [("experiments/head_count.py:quick", "bible"),
                                       ("experiments/pruning.py:sentiment", "sentiment")])
def test_a_core_design_runs_end_to_end_on_its_task_at_a_tiny_size(tmp_path, spec, task):
    """Translation (five arms, BLEU beside the nats) and classification (one arm, then the head analysis and the
    orders' comparison), each through its real preset, three verdict seeds: every trial finishes and the verdict
    table is printed."""
    work = tmp_path / "runs"
    cmd = [sys.executable, "-m", "attn_lab.sweep", "--experiment", spec, "--workdir", str(work), "--vmap-seeds",
           "--seeds", "100,101,102", f"--config.task.data_dir={tmp_path / 'data'}",
           f"--config.compile_cache={tmp_path / 'cache'}", *TINY[task], *COMMON]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    exp = load_experiment(os.path.join(ROOT, spec))
    tests = [json.load(open(os.path.join(work, d, "results.json")))["final"]["test"] for d in os.listdir(work)
             if "seed=" in d]
    assert len(tests) == 3 * len(exp.variants)
    assert all(t["loss"] > 0 for t in tests) and (task != "bible" or all("bleu" in t for t in tests))
    if exp.preset.analyze:
        assert all(os.path.exists(os.path.join(work, d, "analysis", "prune.json")) for d in os.listdir(work)
                   if "seed=" in d)
    assert "### Verdicts" in done.stdout


def test_metric_spread_pairs_each_arm_with_the_baseline_by_seed(tmp_path):
    """scripts/metric_spread.py, how a design's deciding metric is picked from its pilot: the mean and sd of the
    per-seed differences, against numpy's, over the seeds both arms finished (a failed trial does not pair)."""
    import numpy as np

    rng = np.random.default_rng(0)
    base, other = rng.normal(5, 0.3, 5), rng.normal(5, 0.3, 5)
    lines = ["variant,seed,trial,status,test_loss,test_bleu,test_accuracy_count"]
    lines += [f"A-h8,{s},t,ok,{base[s]},{2 * base[s]},128" for s in range(5)]
    lines += [f"A-h1,{s},t,{'failed' if s == 4 else 'ok'},{other[s]},{3 * other[s]},128" for s in range(5)]
    (tmp_path / "results.csv").write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "metric_spread.py"), "--workdir",
                           str(tmp_path), "--baseline", "A-h8"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    diffs = other[:4] - base[:4]
    row = next(line for line in done.stdout.splitlines() if "| test_loss |" in line).split("|")
    assert int(row[3]) == 4 and float(row[4]) == pytest.approx(diffs.mean(), abs=1e-4)
    assert float(row[5]) == pytest.approx(diffs.std(ddof=1), abs=1e-4) and "count" not in done.stdout
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "metric_spread.py"), "--workdir",
                          str(tmp_path), "--baseline", "A-h2"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.strip().endswith("arms: A-h1, A-h8") and "Traceback" not in bad.stderr
