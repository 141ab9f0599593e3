"""Tests for attn_lab.train.logging (real offline W&B) and attn_lab.train.checkpoint (real Orbax)."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_lab.io import write_json_atomic
from attn_lab.train.checkpoint import Checkpointer
from attn_lab.train.logging import MetricLogger, check_wandb_mode


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Point HOME (and the dirs wandb derives from it) at a fresh dir, with no W&B key.

    Returns the fake HOME so tests can assert that W&B wrote nothing there.
    """
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / ".netrc"))
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_DIR",
                "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR",
                "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)
    return home


def _read_jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- write_json_atomic -------------------------------------------------------------


def test_write_json_atomic_roundtrip_and_failure_keeps_old(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "state.json"
    write_json_atomic(path, {"a": 1, "b": [1.5, "x"]})
    assert json.loads(path.read_text()) == {"a": 1, "b": [1.5, "x"]}

    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # json cannot encode object()
    assert json.loads(path.read_text()) == {"a": 1, "b": [1.5, "x"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "state.json"]  # no temp files


# --- check_wandb_mode --------------------------------------------------------------


def test_check_wandb_mode(isolated_home: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_wandb_mode("offline")
    check_wandb_mode("disabled")
    with pytest.raises(ValueError, match="offline"):
        check_wandb_mode("bogus")
    with pytest.raises(ValueError, match=r"needs a W&B API key"):
        check_wandb_mode("online")
    # A netrc entry for the W&B host (what `wandb login` writes) is accepted ...
    netrc = isolated_home / ".netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    check_wandb_mode("online")
    # ... and so is the env var.
    netrc.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    check_wandb_mode("online")


# --- MetricLogger ------------------------------------------------------------------


def test_metric_logger_offline_writes_jsonl_and_wandb_run(
    tmp_path: pathlib.Path, isolated_home: pathlib.Path
) -> None:
    workdir = tmp_path / "run"
    with MetricLogger(str(workdir), {"model": {"d": 8}}, tags=("t",), group="g", name="n") as logger:
        logger.log(1, {"train/loss": np.float32(2.5), "eval/bleu": jnp.array(3.0)})
        logger.log(2, {"train/loss": 1.25})
        logger.summary({"num_params": np.int64(123)})
        logger.close()  # idempotent with __exit__

    records = _read_jsonl(workdir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["train/loss"] == 2.5 and records[0]["eval/bleu"] == 3.0
    assert all(isinstance(r["time"], float) for r in records)

    run_files = list((workdir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1 and run_files[0].stat().st_size > 0
    run_id = (workdir / "wandb_run_id.txt").read_text().strip()
    assert run_files[0].name == f"run-{run_id}.wandb"
    # Nothing from W&B lands in HOME.
    assert not (isolated_home / ".cache" / "wandb").exists()
    assert not (isolated_home / ".config" / "wandb").exists()


def test_metric_logger_resume_truncates_and_reuses_run_id(tmp_path: pathlib.Path) -> None:
    workdir = tmp_path / "run"
    with MetricLogger(str(workdir), {}) as logger:
        for step in (1, 2, 3, 4):
            logger.log(step, {"train/loss": float(step)})
    first_id = (workdir / "wandb_run_id.txt").read_text().strip()
    # Simulate a crash that tore the last line.
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "train/lo')

    with MetricLogger(str(workdir), {}, resume_step=2) as logger:
        assert [r["step"] for r in _read_jsonl(workdir / "metrics.jsonl")] == [1, 2]
        logger.log(3, {"train/loss": 30.0})

    records = _read_jsonl(workdir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[-1]["train/loss"] == 30.0
    assert (workdir / "wandb_run_id.txt").read_text().strip() == first_id
    # Both segments write to offline-run-<timestamp>-<same id> (one dir if started in the same second).
    run_files = list((workdir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert run_files and {f.name for f in run_files} == {f"run-{first_id}.wandb"}


def test_metric_logger_disabled_and_non_main_process(tmp_path: pathlib.Path) -> None:
    disabled = tmp_path / "disabled"
    with MetricLogger(str(disabled), {}, mode="disabled") as logger:
        logger.log(1, {"train/loss": 1.0})
        logger.summary({"num_params": 1})
    assert [r["step"] for r in _read_jsonl(disabled / "metrics.jsonl")] == [1]
    assert not (disabled / "wandb").exists()
    assert not (disabled / "wandb_run_id.txt").exists()

    worker = tmp_path / "worker"
    with MetricLogger(str(worker), {}, is_main_process=False) as logger:
        logger.log(1, {"train/loss": 1.0})
    assert not worker.exists()


def test_metric_logger_rejects_bad_mode_before_writing(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError):
        MetricLogger(str(tmp_path / "run"), {}, mode="online")  # no key in isolated HOME
    assert not (tmp_path / "run").exists()


# --- Checkpointer ------------------------------------------------------------------


def _state(step: int) -> dict:
    return {
        "params": {"w": jnp.full((3, 4), float(step)), "b": np.arange(4, dtype=np.float32) + step},
        "step": step,
        "rng": jax.random.key_data(jax.random.key(step)),  # raw uint32 key data, not a typed key
    }


def _assert_state_equal(actual: dict, expected: dict) -> None:
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))
        assert np.asarray(a).dtype == np.asarray(e).dtype


def test_checkpointer_save_restore_and_max_to_keep(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "ckpt"
    with Checkpointer(str(directory), max_to_keep=2) as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(FileNotFoundError):
            ckpt.restore(_state(0))
        for step in (10, 20, 30):
            ckpt.save(step, _state(step))
        assert ckpt.latest_step() == 30
        assert ckpt.all_steps() == [20, 30]  # step 10 pruned
        assert sorted(p.name for p in directory.iterdir()) == ["20", "30"]

        restored = ckpt.restore(_state(0))
        _assert_state_equal(restored, _state(30))
        assert restored["step"] == 30
        key = jax.random.wrap_key_data(restored["rng"])
        np.testing.assert_array_equal(jax.random.normal(key, (2,)), jax.random.normal(jax.random.key(30), (2,)))

        # Older step still restorable after a newer save, from abstract shapes.
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), _state(0))
        _assert_state_equal(ckpt.restore(abstract, step=20), _state(20))


def test_checkpointer_ignores_interrupted_save(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "ckpt"
    with Checkpointer(str(directory)) as ckpt:
        ckpt.save(1, _state(1))
    # What a crash mid-save of step 2 leaves behind: an unfinalised orbax temp dir.
    stray = directory / "2.orbax-checkpoint-tmp-1234567"
    (stray / "default").mkdir(parents=True)
    (stray / "default" / "partial").write_text("garbage")

    with Checkpointer(str(directory)) as ckpt:
        assert ckpt.latest_step() == 1
        _assert_state_equal(ckpt.restore(_state(0)), _state(1))
    assert not stray.exists()  # cleaned up on open
