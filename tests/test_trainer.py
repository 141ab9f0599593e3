"""The trainer end to end on tiny real data: outputs, resume-equals-uninterrupted, compile count, NaN, errors."""

import glob
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from attn_lab.attention import KERNELS
from attn_lab.data import load_task
from attn_lab.train.checkpoint import Checkpointer
from attn_lab.train.config import validate_config
from attn_lab.train.trainer import Run, train_and_evaluate, train_seeds
from tests.helpers import ROOT, tiny_numbers
from tests.helpers import load_config as _load_config


def _lines(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k != "time" and "per_sec" not in k} for line in f]


def test_one_run_writes_results_metrics_wandb_and_checkpoints(tmp_path, data_dir, capsys):
    results = train_and_evaluate(tiny_numbers(data_dir), str(tmp_path))
    # one log line names each attention kind's implementation (float32: XLA on any backend, cuDNN takes bf16/fp16)
    assert "attention: encoder_self=dense/xla, decoder_self=dense/xla, cross=dense/xla" in capsys.readouterr().out
    on_disk = json.load(open(tmp_path / "results.json"))
    assert on_disk["steps"] == 12 and on_disk["num_params"] == results["num_params"] > 0
    for split in ("validation", "test"):
        assert {"loss", "accuracy", "bleu", "exact_match"} <= set(on_disk["final"][split])
    assert on_disk["config"]["model"]["num_heads"] == 4 and on_disk["steps_per_sec"] > 0
    assert on_disk["environment"]["packages"]["flax"] and on_disk["environment"]["device_count"] >= 1
    assert on_disk["compile_seconds"] > 0 and on_disk["steady_steps_per_sec"] > 0 and on_disk["train_time_sec"] > 0
    steps = [line["step"] for line in _lines(tmp_path)]
    assert steps == sorted(steps) and steps[-1] == 12
    (run_file,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    # the real offline W&B log: config, metrics, summary
    records = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", run_file],
                             capture_output=True, text=True, timeout=60).stdout
    assert '"num_heads":4' in records and '"environment"' in records and "train/loss" in records
    assert f'"num_params":{results["num_params"]}' in records
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 12


def _with_attention(config, attention):
    config.model.attention.name = attention
    if attention == "performer":  # stateful kernel: its redrawn features must be checkpointed too
        config.model.attention.performer.update(dict(num_features=16, redraw_every=2))
    return config


@pytest.mark.parametrize("attention", ["dense", pytest.param("performer", marks=pytest.mark.slow)])
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
        assert int(run.state["step"][0]) >= 1
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(run.state["params"]))
    finally:
        run.close()


class _Tripwire:
    """A metric value that records how many train steps had been dispatched when the host first reads it."""

    def __init__(self, value, run):
        self.value, self.run = value, run

    def __array__(self, dtype=None, copy=None):
        self.run.reads.append(("metric", self.run.dispatched))
        return np.asarray(self.value, dtype)


def _spy_runs(monkeypatch, poison_after=None):
    """Makes the trainer build Runs whose train step counts its calls, records each batch, returns metrics that
    record host reads, and (``poison_after``) turns the parameters to NaN after that step; returns the Runs made."""
    from attn_lab.train import trainer

    made = []

    class SpyRun(Run):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.dispatched, self.reads, self.batches = 0, [], []
            step, fetch = self.train_step, self.parallel.fetch

            def counted(state, batch):
                self.dispatched += 1
                self.batches.append(batch)
                state, metrics = step(state, batch)
                if self.dispatched == poison_after:
                    state = {**state, "params": jax.tree.map(lambda x: x * np.nan, state["params"])}
                return state, {k: _Tripwire(v, self) for k, v in metrics.items()}

            def fetched(tree):
                self.reads.append(("fetch", self.dispatched))
                return fetch(tree)

            counted._cache_size = step._cache_size
            self.train_step, self.parallel.fetch = counted, fetched
            made.append(self)

    monkeypatch.setattr(trainer, "Run", SpyRun)
    return made


def test_loop_reads_the_device_only_at_log_eval_and_checkpoint_steps(tmp_path, data_dir, monkeypatch):
    """Steps are dispatched back to back: metrics reach the host only at syncs (log every 4; eval and checkpoint at
    12), never per step, and the prefetched batch of step s is still dataset[s - 1]."""
    from attn_lab.train.seeds import stack_batches

    config = tiny_numbers(data_dir, log_every=4, eval_every=12, checkpoint_every=12)
    config.wandb.mode = "disabled"
    runs = _spy_runs(monkeypatch)
    results = train_and_evaluate(config, str(tmp_path))
    (run,) = runs
    assert run.dispatched == 12 and results["steps"] == 12
    assert {n for _, n in run.reads} == {4, 8, 12} and run.reads[0][1] == 4, run.reads
    train = load_task(config.task, data_dir).dataset("train", 16, train=True, seed=config.seed)
    for s, batch in enumerate(run.batches, start=1):
        expected = stack_batches([train[s - 1]])
        assert set(batch) == set(expected)
        for k in expected:
            np.testing.assert_array_equal(np.asarray(batch[k]), expected[k], err_msg=f"step {s} {k}")


@pytest.mark.parametrize("checkpoint_every,found_at,last_checkpoint", [(4, 8, 4), (3, 6, 3)])
def test_non_finite_loss_is_found_at_the_next_sync_and_never_checkpointed(tmp_path, data_dir, monkeypatch,
                                                                          checkpoint_every, found_at, last_checkpoint):
    """Parameters turn NaN after step 5, so step 6's loss is NaN. It is found at the next log (8) or checkpoint (6)
    step, the one-line error names step 6, nothing from step 6 on is logged, and the last checkpoint is finite."""
    config = tiny_numbers(data_dir, log_every=4, eval_every=12, checkpoint_every=checkpoint_every)
    config.wandb.mode = "disabled"
    _spy_runs(monkeypatch, poison_after=5)
    with pytest.raises(FloatingPointError) as info:
        train_and_evaluate(config, str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and message.startswith("non-finite loss ([nan]) at step 6 (seed [0]); ")
    assert f"stopped at step {found_at}, the last good checkpoint is step {last_checkpoint} in" in message
    assert max(line["step"] for line in _lines(tmp_path)) < 6
    monkeypatch.undo()
    assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == last_checkpoint
    run = Run(config, str(tmp_path))  # restores the last checkpoint, as a rerun would
    try:
        assert int(run.state["step"][0]) == last_checkpoint
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(run.state["params"]))
    finally:
        run.close()


def _prefetch_threads():
    import threading

    return [t for t in threading.enumerate() if t.name.startswith("attn_lab-prefetch")]


def test_prefetch_keeps_order_and_looks_at_most_depth_ahead():
    from attn_lab.train.prefetch import Prefetcher

    started = []

    def read(i):
        started.append(i)
        return i * i

    with Prefetcher(read, range(10), depth=2) as items:
        for consumed, (i, value) in enumerate(items, start=1):
            assert value == i * i and i == consumed - 1
            assert len(started) <= consumed + 2  # never more than depth items ahead
    assert started == list(range(10)) and not _prefetch_threads()


@pytest.mark.parametrize("stop", [ValueError, KeyboardInterrupt])
def test_prefetch_stops_its_thread_on_errors_and_interrupts(stop):
    """An error in the worker re-raises at its item; an exception (or Ctrl-C) in the loop stops the worker even
    when the items never end."""
    import itertools
    import time

    from attn_lab.train.prefetch import Prefetcher

    def read(i):
        if i == 3 and stop is ValueError:
            raise ValueError("bad item 3")
        time.sleep(0.01)
        return i

    seen = []
    with pytest.raises(stop):
        with Prefetcher(read, itertools.count(), depth=3) as items:
            for i, _ in items:
                seen.append(i)
                if i == 5:
                    raise stop("stop")
    assert seen == ([0, 1, 2] if stop is ValueError else [0, 1, 2, 3, 4, 5])
    assert not _prefetch_threads()


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


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_listops_trains_with_every_registered_kernel(tmp_path, data_dir, name):
    """Long Range Arena use: the classification config trains with every registered kernel chosen by override, at
    its default options (a new kernel file is trained here without editing this test)."""
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


@pytest.mark.slow
def test_vectorized_seeds_equal_separate_runs(tmp_path, data_dir):
    """Seeds 0 and 1 trained in one vmapped program (interrupted and resumed on the way) write what two separate
    runs write: the same losses, eval metrics and greedy-decoding scores per step, within float tolerance.

    Dropout is off here: where the seeds' batches fall in different length buckets, the padded seed draws its
    dropout mask at the padded shape (same distribution, different draw). Dropout keys are checked per step below.
    """
    config = tiny_numbers(data_dir, batch_size=4)  # small batches: the seeds' bucket lengths differ at some steps
    config.model.dropout, config.wandb.mode = 0.0, "disabled"
    task = load_task(config.task, data_dir)
    joint_config = config.copy_and_resolve_references()
    joint_config.wandb.mode = "offline"  # each seed must get its own W&B run, in one process
    shapes = [[task.dataset("train", 4, train=True, seed=s)[i]["targets"].shape for s in (0, 1)] for i in range(12)]
    assert any(a != b for a, b in shapes), "the seeds' batches should differ in length (padding is exercised)"
    separate = [train_and_evaluate(_seeded(config, s), str(tmp_path / f"alone{s}")) for s in (0, 1)]
    dirs = [str(tmp_path / f"vmap{s}") for s in (0, 1)]
    assert train_seeds(joint_config, dirs, [0, 1], stop_after=6) == [{"step": 6, "finished": False}] * 2
    together = train_seeds(joint_config, dirs, [0, 1])
    run_ids = [open(os.path.join(d, "wandb_run_id.txt")).read().strip() for d in dirs]
    assert run_ids[0] != run_ids[1]
    for s, (d, run_id) in enumerate(zip(dirs, run_ids)):
        run_files = glob.glob(os.path.join(d, "wandb", "offline-run-*", "run-*.wandb"))  # first part + resumed part
        assert len(run_files) == 2 and all(run_id in f for f in run_files)
        records = "".join(subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", f],
                                         capture_output=True, text=True, timeout=60).stdout for f in run_files)
        assert f'"seed":{s},"task"' in records and f'"seed":{1 - s},"task"' not in records  # its own config
        assert "test/bleu" in records
    assert separate[0]["final"]["test"] != separate[1]["final"]["test"]  # the seeds really differ
    for s, (alone, joint) in enumerate(zip(separate, together)):
        assert joint["config"]["seed"] == s and joint["seeds_vectorized"] == 2
        for split in ("validation", "test"):
            for key, value in alone["final"][split].items():
                np.testing.assert_allclose(joint["final"][split][key], value, rtol=1e-4, err_msg=f"{split} {key}")
        for a, b in zip(_lines(tmp_path / f"alone{s}"), _lines(tmp_path / f"vmap{s}"), strict=True):
            assert a.keys() == b.keys() and a["step"] == b["step"]
            np.testing.assert_allclose([b[k] for k in a], [a[k] for k in a], rtol=1e-4)


def _seeded(config, seed):
    c = config.copy_and_resolve_references()
    c.seed = seed
    return c


def test_vmapped_train_step_equals_one_step_per_seed(attention="performer"):
    """One compiled step over a seed axis == the plain step per seed: dropout keys (fold_in of each seed's rng; the
    config has dropout 0.1), parameters, optimizer state and non-trainable kernel state (Performer's redraws) all
    stay per seed."""
    from flax import nnx

    from attn_lab.models import build_model
    from attn_lab.train.seeds import stack, unstack
    from attn_lab.train.steps import compile_steps, init_state, make_optimizer, model_state

    c = _with_attention(tiny_numbers("unused"), attention)
    c.model.attention.performer.redraw_every = 1
    tx = make_optimizer(c.train)
    states, graphdef = [], None
    for seed in (0, 1):
        model = build_model(c.model, kind="translation", vocab_size=20, max_len=9, seed=seed)
        graphdef, params, _ = nnx.split(model, nnx.Param, ...)
        states.append(init_state(nnx.to_pure_dict(params), model_state(model), tx, seed))
    batches = [{k: np.asarray(jax.random.randint(jax.random.key(10 * seed + i), (3, 8), 1, 20)) for i, k in
                enumerate(("inputs", "targets"))} for seed in (0, 1)]
    one, _ = compile_steps(graphdef, tx, 0.1, num_seeds=1)
    both, _ = compile_steps(graphdef, tx, 0.1, num_seeds=2)
    joint, joint_metrics = both(stack(states), stack(batches))
    for i in (0, 1):
        alone, metrics = one(stack([states[i]]), stack([batches[i]]))
        np.testing.assert_allclose(joint_metrics["loss"][i], metrics["loss"][0], rtol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), unstack(joint, i),
                     unstack(alone, 0))
    assert not np.allclose(joint_metrics["loss"][0], joint_metrics["loss"][1])


DATA_PARALLEL = """
import sys
sys.path.insert(0, {root!r})
import jax
from tests.helpers import tiny_numbers
from attn_lab.train.trainer import Run, train_and_evaluate
assert len(jax.devices()) == 4
for shard_params, workdir in ((False, {replicated!r}), (True, {fsdp!r})):
    c = tiny_numbers({data!r})
    c.wandb.mode, c.parallel.shard_params = "disabled", shard_params
    train_and_evaluate(c, workdir)
    run = Run(c, workdir, log=False)  # the restored state, placed as training placed it (a finished run: no logger)
    leaves = jax.tree.leaves(run.state["params"])
    assert all(len(x.sharding.device_set) == 4 for x in leaves)
    assert any(not x.sharding.is_fully_replicated for x in leaves) == shard_params
    run.close()
"""


MULTI_HOST = """
import sys
sys.path.insert(0, {root!r})
from tests.helpers import tiny_numbers
from attn_lab.train.parallel import initialize_distributed
c = tiny_numbers({data!r})
c.wandb.mode = "disabled"
c.parallel.update(distributed=True, coordinator_address={address!r}, num_processes=2, process_id=int(sys.argv[1]))
initialize_distributed(c.parallel)
import jax
from attn_lab.train.trainer import train_and_evaluate
assert jax.process_count() == 2 and jax.device_count() == 2
train_and_evaluate(c, {workdir!r})
# Hosts whose rows pad to different lengths: both pad to the longer one, and the global batch is their rows stacked.
import numpy as np
from attn_lab.train.parallel import DataParallel
p = jax.process_index()
dp = DataParallel()
whole = dp.fetch(dp.batch({{"inputs": np.full((2, 8 + 4 * p), p + 1, np.int32), "mask": np.ones(2, np.float32)}}))
assert whole["inputs"].shape == (4, 12) and whole["mask"].shape == (4,), whole["inputs"].shape
assert (whole["inputs"][:2, :8] == 1).all() and not whole["inputs"][:2, 8:].any() and (whole["inputs"][2:] == 2).all()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_data_parallel_over_four_devices_and_two_processes_equals_one_device(tmp_path, data_dir):
    """Batch split over 4 (host-platform) devices with parameters replicated or FSDP-sharded, and over two processes
    joined by jax.distributed (multi-host on one machine, each host reading only its rows of every batch): the same
    losses, eval metrics and decoding scores as one device; only process 0 writes metrics and results."""
    load_task(tiny_numbers(data_dir).task, data_dir)  # prepared once, before three processes read it
    dirs = {"replicated": str(tmp_path / "dp"), "fsdp": str(tmp_path / "fsdp")}
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    # Output to files, not pipes: a host blocked on a full pipe that is not being read yet (the test waits on
    # another process first) would stall its peer's collective, and both would hang.
    logs = [tmp_path / f"proc{i}.log" for i in range(3)]
    outs = [log.open("w") for log in logs]
    devices = subprocess.Popen([sys.executable, "-c", DATA_PARALLEL.format(root=ROOT,
                                                                             data=data_dir, **dirs)],
                               stdout=outs[0], stderr=subprocess.STDOUT, env=env)
    code = MULTI_HOST.format(root=ROOT, data=data_dir, address=f"localhost:{_free_port()}",
                             workdir=str(tmp_path / "hosts"))
    hosts = [subprocess.Popen([sys.executable, "-c", code, str(i)], stdout=outs[i + 1],
                              stderr=subprocess.STDOUT) for i in range(2)]
    try:
        for proc, out, log in zip([devices, *hosts], outs, logs):
            proc.wait(timeout=600)
            out.close()
            assert proc.returncode == 0, log.read_text()[-2000:]
    finally:  # a hung or failed process must not leave its peers running after the test
        for proc in [devices, *hosts]:
            if proc.poll() is None:
                proc.kill()
    c = tiny_numbers(data_dir)
    c.wandb.mode = "disabled"
    train_and_evaluate(c, str(tmp_path / "one"))
    one = _lines(tmp_path / "one")
    for workdir in [*dirs.values(), str(tmp_path / "hosts")]:
        many = _lines(workdir)
        assert [line["step"] for line in many] == [line["step"] for line in one]
        for a, b in zip(one, many):
            for key in a:
                if key != "step":
                    np.testing.assert_allclose(b[key], a[key], rtol=2e-4, atol=1e-6, err_msg=key)
    assert json.load(open(tmp_path / "hosts" / "results.json"))["steps"] == 12
