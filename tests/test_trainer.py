"""The trainer end to end on tiny real data: outputs, resume-equals-uninterrupted, compile count, NaN, errors."""

import glob
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from attn_lab.data import load_task
from attn_lab.train.checkpoint import Checkpointer
from attn_lab.train.config import validate_config
from attn_lab.train.trainer import Run, train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_config(name, arg=""):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def tiny_numbers(data_dir, **train):
    c = _load_config("numbers", "quick")
    c.task.data_dir, c.task.max_value = data_dir, 299
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.num_heads = 1, 32, 64, 4
    c.model.dropout = 0.1  # exercise dropout keys on resume
    c.train.update(dict(num_steps=12, batch_size=16, warmup_steps=4, log_every=2, eval_every=6,
                        checkpoint_every=6, max_eval_batches=2))
    c.train.update(train)
    return c


def _lines(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k != "time" and "per_sec" not in k} for line in f]


def test_one_run_writes_results_metrics_wandb_and_checkpoints(tmp_path, data_dir):
    results = train_and_evaluate(tiny_numbers(data_dir), str(tmp_path))
    on_disk = json.load(open(tmp_path / "results.json"))
    assert on_disk["steps"] == 12 and on_disk["num_params"] == results["num_params"] > 0
    for split in ("validation", "test"):
        assert {"loss", "accuracy", "bleu", "exact_match"} <= set(on_disk["final"][split])
    assert on_disk["config"]["model"]["num_heads"] == 4 and on_disk["steps_per_sec"] > 0
    steps = [line["step"] for line in _lines(tmp_path)]
    assert steps == sorted(steps) and steps[-1] == 12
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    records = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", run_file], capture_output=True, text=True,
                             timeout=60).stdout  # the real offline W&B log: config, metrics, summary
    assert '"num_heads":4' in records and "train/loss" in records and f'"num_params":{results["num_params"]}' in records
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 12


def _with_attention(config, attention):
    config.model.attention.name = attention
    if attention == "performer":  # stateful kernel: its redrawn features must be checkpointed too
        config.model.attention.performer.update(dict(num_features=16, redraw_every=2))
    return config


@pytest.mark.parametrize("attention", ["dense", "performer"])
def test_resume_equals_uninterrupted(tmp_path, data_dir, attention):
    config = lambda: _with_attention(tiny_numbers(data_dir), attention)
    full = train_and_evaluate(config(), str(tmp_path / "full"))
    partial = train_and_evaluate(config(), str(tmp_path / "resumed"), stop_after=6)
    assert partial == {"step": 6, "finished": False}
    assert not (tmp_path / "resumed" / "results.json").exists()
    resumed = train_and_evaluate(config(), str(tmp_path / "resumed"))
    assert resumed["final"] == full["final"] and resumed["best"] == full["best"]
    assert _lines(tmp_path / "resumed") == _lines(tmp_path / "full")


def test_train_step_compiles_once_per_bucket(tmp_path, data_dir):
    config = tiny_numbers(data_dir, num_steps=30, eval_every=30, checkpoint_every=30)
    results = train_and_evaluate(config, str(tmp_path))
    task = load_task(config.task, data_dir)
    train = task.dataset("train", config.train.batch_size, train=True, seed=config.seed)
    shapes = {(train[s]["inputs"].shape, train[s]["targets"].shape) for s in range(30)}
    assert results["compilations"]["train_step"] == len(shapes)


def test_classification_run(tmp_path, data_dir):
    c = _load_config("listops", "quick")
    c.task.data_dir, c.task.num_train, c.task.num_validation, c.task.num_test = data_dir, 200, 40, 40
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.pooling = 1, 32, 64, "cls"
    c.train.update(dict(num_steps=4, batch_size=16, log_every=2, eval_every=4, checkpoint_every=4))
    results = train_and_evaluate(c, str(tmp_path))
    assert 0.0 <= results["final"]["test"]["accuracy"] <= 1.0 and "bleu" not in results["final"]["test"]


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, data_dir):
    config = tiny_numbers(data_dir, learning_rate=1e36, warmup_steps=1, grad_clip=1e30, checkpoint_every=1,
                          weight_decay=0.0)
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        train_and_evaluate(config, str(tmp_path))
    assert not (tmp_path / "results.json").exists()
    run = Run(config, str(tmp_path))  # restores the last checkpoint, as a rerun would
    try:
        assert int(run.state["step"]) >= 1
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(run.state["params"]))
    finally:
        run.close()


BAD = [
    ("model.num_heads", 3, "model.num_heads=3 does not divide model.d_model=32"),
    ("model.d_model", 0, "model.d_model must be positive"),
    ("train.batch_size", -1, "train.batch_size must be positive"),
    ("model.attention.name", "nope", "unknown model.attention.name 'nope'"),
    ("task.name", "nope", "unknown task.name 'nope'"),
    ("model.norm", "mid", "model.norm='mid' is not one of"),
    ("model.attention.dense.implementation", "bogus", "model.attention.dense: attention.implementation"),
    ("wandb.mode", "bogus", "wandb.mode='bogus'"),
    ("model.kinds.decoder_self.head_mask", "1,1", "model.kinds.decoder_self.head_mask"),
]


@pytest.mark.parametrize("key,value,message", BAD)
def test_bad_config_is_one_clear_line(data_dir, key, value, message):
    config = tiny_numbers(data_dir)
    *path, last = key.split(".")
    node = config
    for p in path:
        node = node[p]
    node[last] = value
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
        validate_config(config)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("override,message", [("--config.model.bogus=1", "unknown config key 'config.model.bogus'"),
                                               ("--config.model.num_heads=3", "does not divide")])
def test_cli_rejects_bad_overrides_in_one_line(tmp_path, override, message):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config",
                           os.path.join(ROOT, "configs", "numbers.py:quick"), "--workdir", str(tmp_path / "w"),
                           override], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [f"error: {proc.stderr.strip()[len('error: '):]}"]
    assert message in proc.stderr and not (tmp_path / "w").exists()


@pytest.mark.parametrize("name", sorted(__import__("attn_lab.attention", fromlist=["KERNELS"]).KERNELS))
def test_listops_trains_with_every_kernel(tmp_path, data_dir, name):
    """Long Range Arena use: the classification config trains with any registered kernel, chosen by override."""
    c = _load_config("listops", "quick")
    c.task.data_dir, c.task.num_train, c.task.num_validation, c.task.num_test = data_dir, 64, 16, 16
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.attention.name = 1, 32, 64, name
    c.train.update(dict(num_steps=2, batch_size=16, log_every=1, eval_every=2, checkpoint_every=2))
    results = train_and_evaluate(c, str(tmp_path))
    assert results["config"]["model"]["attention"]["name"] == name
    assert np.isfinite(results["final"]["test"]["loss"])


def test_translation_with_a_kernel_that_cannot_decode_from_a_cache(tmp_path, data_dir):
    """Local attention in encoder and decoder (exact cross-attention): trains, and BLEU comes from uncached decoding."""
    c = tiny_numbers(data_dir, num_steps=2, eval_every=2, checkpoint_every=2)
    c.model.attention.name, c.model.kinds.cross.attention = "local", "dense"
    c.model.attention.local.window = 8
    results = train_and_evaluate(c, str(tmp_path))
    assert "bleu" in results["final"]["test"] and np.isfinite(results["final"]["test"]["loss"])
