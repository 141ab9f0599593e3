"""A run folder is safe: a finished run is never rewritten, one process at a time, corrupt checkpoints set aside.

One tiny run is trained once for the module (killed during its final test, then finished by a rerun); each test
works on a copy of its folder.
"""

import errno
import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
from test_logging_checkpoint import _assert_state_equal, _state

from attn_lab import results as results_lib
from attn_lab.checks import RunError
from attn_lab.sweep.runner import PROGRESS, screen_lines
from attn_lab.train import config as train_config
from attn_lab.train import task_data, trainer
from attn_lab.train.checkpoint import Checkpointer, CheckpointError, restore_common
from attn_lab.train.trainer import Run, TaskError, train_and_evaluate
from attn_lab.train.workdir import WorkdirBusy, WorkdirLock, lock_workdirs
from tests.helpers import ROOT, tiny_numbers, tiny_numbers_flags

# A failed restore's abandoned TensorStore reads finish after the test that caused them at times; the library drops
# their 'Event loop is closed' reports, but pytest swaps in its own unraisable hook per test and would warn.
ABANDONED_READS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

TRAIN = [sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config",
         os.path.join(ROOT, "configs", "numbers.py:quick")]


def _snapshot(folder) -> dict[str, tuple[str, int]]:
    """Every file under ``folder`` (hidden ones too): its content hash and modification time."""
    out = {}
    for d, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(d, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, folder)] = (hashlib.md5(fh.read()).hexdigest(), os.stat(path).st_mtime_ns)
    return out


def _test_lines(workdir) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if any(k.startswith("test/") for k in r)]


class _Killed(BaseException):
    """What a SIGKILL during the final test leaves: the test line logged, results.json not yet written."""


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """A run killed right after logging its final test (before results.json), then finished by a rerun."""
    workdir = str(tmp_path_factory.mktemp("finished") / "run")
    config = tiny_numbers(data_dir)
    config.compile_cache = ""
    real_write = results_lib.write_json_atomic

    def killed_at_results(path, obj):
        if str(path).endswith("results.json"):
            raise _Killed
        real_write(path, obj)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(results_lib, "write_json_atomic", killed_at_results)
        with pytest.raises(_Killed):
            train_and_evaluate(config, workdir)
    assert not os.path.exists(os.path.join(workdir, "results.json")) and len(_test_lines(workdir)) == 1
    with open(os.path.join(workdir, "training.json")) as f:
        training = json.load(f)
    results = train_and_evaluate(config, workdir)
    return {"workdir": workdir, "config": config, "training": training, "results": results}


def _copy(finished, tmp_path) -> str:
    workdir = str(tmp_path / "run")
    shutil.copytree(finished["workdir"], workdir, symlinks=True)
    return workdir


def test_a_final_test_cut_short_is_finished_once_with_the_original_speed(finished):
    """The rerun writes results.json once: the original run's speed fields (from training.json, written before the
    test), not zeros; the test line already logged is not logged again; the lock was released."""
    workdir, results, training = finished["workdir"], finished["results"], finished["training"]
    assert json.load(open(os.path.join(workdir, "results.json"))) == json.loads(json.dumps(results))
    assert results["final_test_resumed"] is True and results["steps"] == 12
    for key in ("steps_per_sec", "steady_steps_per_sec", "compile_seconds", "train_time_sec", "compilations"):
        assert results[key] == training[key], key
    assert results["steps_per_sec"] > 0 and results["compilations"]["train_step"] >= 1
    assert results["wall_time_sec"] > training["wall_time_sec"] > 0
    (line,) = _test_lines(workdir)
    for key, value in results["final"]["test"].items():
        assert line[f"test/{key}"] == pytest.approx(value, rel=1e-6), key
    assert open(os.path.join(workdir, ".lock")).read() == ""  # released (emptied) by both processes


def test_rerunning_a_finished_run_says_so_and_changes_nothing(finished, tmp_path, capsys):
    workdir = _copy(finished, tmp_path)
    before = _snapshot(workdir)
    again = train_and_evaluate(finished["config"], workdir)
    assert capsys.readouterr().out == f"{workdir}: finished at step 12 (results.json); nothing to do\n"
    assert again == json.load(open(os.path.join(workdir, "results.json")))
    proc = subprocess.run([*TRAIN, "--workdir", workdir, *tiny_numbers_flags(finished["config"].task.data_dir),
                           "--config.compile_cache="], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{workdir}: finished at step 12 (results.json); nothing to do\n"
    assert _snapshot(workdir) == before  # no file written, touched or added (no W&B run either)


def test_finished_seeds_are_left_alone_while_the_others_train(finished, tmp_path, capsys):
    """``--seeds 0,1`` where seed 0's folder holds a finished run: only seed 1 trains (alone); a longer
    train.num_steps is another run: refused in one line naming the key and both values, nothing written."""
    done, fresh = _copy(finished, tmp_path), str(tmp_path / "seed1")
    before = _snapshot(done)
    config = finished["config"].copy_and_resolve_references()
    config.wandb.mode = "disabled"
    results = trainer.train_seeds(config, [done, fresh], [0, 1])
    assert results[0] == json.load(open(os.path.join(done, "results.json"))) and _snapshot(done) == before
    assert results[1]["config"]["seed"] == 1 and results[1]["seeds_vectorized"] == 1 and results[1]["steps"] == 12
    assert capsys.readouterr().out.startswith(f"{done}: finished at step 12 (results.json); nothing to do\n")
    config.train.num_steps = 20
    with pytest.raises(RunError) as info:
        train_and_evaluate(config, done)
    assert str(info.value) == (f"{done} was trained with train.num_steps=12 ({done}/results.json), this config has "
                               "train.num_steps=20; give a new --workdir to train this config from scratch")
    assert _snapshot(done) == before and capsys.readouterr().out == ""


@pytest.mark.parametrize("change", [{"learning_rate": 5e-3}, {"num_steps": 20}, {"eval_every": 4}])
def test_resuming_with_another_config_stops_in_one_line_and_writes_nothing(finished, tmp_path, change):
    """A run stopped before its end (no results.json) resumes only with the config it was trained with (its
    config.json); a key that cannot change results (logging cadence, W&B, paths) may differ."""
    workdir = _copy(finished, tmp_path)
    for name in ("results.json", "training.json"):
        os.remove(os.path.join(workdir, name))
    before = _snapshot(workdir)
    config = finished["config"].copy_and_resolve_references()
    config.train.update(change)
    (key, value), = change.items()
    with pytest.raises(RunError) as info:
        train_and_evaluate(config, workdir)
    assert str(info.value).startswith(f"{workdir} was trained with train.{key}={finished['config'].train[key]!r} "
                                      f"({workdir}/config.json), this config has train.{key}={value!r}; give a new")
    assert _snapshot(workdir) == before
    neutral = finished["config"].copy_and_resolve_references()
    neutral.train.log_every, neutral.wandb.mode, neutral.heads.track = 3, "disabled", True
    assert train_and_evaluate(neutral, workdir)["steps"] == 12  # resumed: its test, then results.json


def test_a_rerun_started_while_the_run_finishes_its_test_leaves_the_finished_run_as_it_wrote_it(finished, tmp_path,
                                                                                              monkeypatch, capsys):
    """The race: a rerun checks the folder (not finished yet) and loads its data while the first process, in its
    test evaluation, finishes and writes results.json. Under the lock the rerun finds the run finished and writes
    nothing -- no second results.json (no ``final_test_resumed`` rewrite), no W&B run, no metrics line."""
    workdir = _copy(finished, tmp_path)
    os.remove(os.path.join(workdir, "results.json"))  # the first process is in its final test
    config, real_load, seen = finished["config"], trainer.load_run_task, {}

    def load_while_the_first_finishes(cfg):
        if not seen:
            seen["started"] = True
            seen["first"] = train_and_evaluate(config, workdir)  # the first process finishes meanwhile
            seen["files"] = _snapshot(workdir)
        return real_load(cfg)

    monkeypatch.setattr(trainer, "load_run_task", load_while_the_first_finishes)
    again = train_and_evaluate(config, workdir)
    assert again == json.load(open(os.path.join(workdir, "results.json"))) == json.loads(json.dumps(seen["first"]))
    after = _snapshot(workdir)  # the rerun took the lock and let it go (.lock emptied again): nothing else
    assert {k: v for k, v in after.items() if k != ".lock"} == {k: v for k, v in seen["files"].items() if k != ".lock"}
    assert after[".lock"][0] == seen["files"][".lock"][0]
    assert capsys.readouterr().out.endswith(f"{workdir}: finished at step 12 (results.json); nothing to do\n")


@pytest.mark.slow
def test_reevaluate_writes_a_separate_file_only(finished, tmp_path):
    workdir = _copy(finished, tmp_path)
    before = _snapshot(workdir)
    flags = [f"--config.{k}={v}" for k, v in [("task.data_dir", finished["config"].task.data_dir),
                                              ("compile_cache", ""), ("task.max_value", 299), ("model.num_layers", 1),
                                              ("model.d_model", 32), ("model.mlp_dim", 64),
                                              ("train.batch_size", 16), ("train.max_eval_batches", 2)]]
    proc = subprocess.run([*TRAIN, "--workdir", workdir, "--reevaluate", *flags], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    (path,) = glob.glob(os.path.join(workdir, "results.reeval-*.json"))
    assert proc.stdout.strip() == f"wrote {path}"
    after = _snapshot(workdir)  # the lock was taken and released (.lock rewritten, empty again): nothing else
    assert {k: v for k, v in after.items() if k not in (os.path.basename(path), ".lock")} == {
        k: v for k, v in before.items() if k != ".lock"}
    assert after[".lock"][0] == before[".lock"][0]
    record = json.load(open(path))
    assert record["step"] == 12 and record["finished"] is True
    for key, value in finished["results"]["final"]["test"].items():
        assert record["final"]["test"][key] == pytest.approx(value, rel=1e-6), key


def _truncate_data(step_dir) -> None:
    """Truncates the checkpoint's largest array data file, as a full disk or a torn copy leaves it."""
    files = glob.glob(os.path.join(step_dir, "default", "ocdbt.process_0", "d", "*"))
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.truncate(100)


@ABANDONED_READS
def test_a_corrupt_latest_checkpoint_is_set_aside_and_the_run_resumes_from_the_newest_intact_one(finished, tmp_path,
                                                                                              capsys):
    workdir = _copy(finished, tmp_path)
    for name in ("results.json", "training.json"):  # a run that has not finished
        os.remove(os.path.join(workdir, name))
    _truncate_data(os.path.join(workdir, "checkpoints", "12"))
    results = train_and_evaluate(finished["config"], workdir)
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("checkpoint step")]
    assert line.startswith(f"checkpoint step 12 in {workdir}/checkpoints is unreadable (ValueError: ")
    assert ", resuming from step 6" in line and "resuming at step 6" in out
    (aside,) = glob.glob(os.path.join(workdir, "checkpoints", "12.corrupt-*"))
    assert f"set aside as {os.path.basename(aside)}" in line
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12", os.path.basename(aside), "6"]
    for key, value in finished["results"]["final"]["test"].items():  # resumed exactly from step 6
        assert results["final"]["test"][key] == pytest.approx(value, rel=1e-6), key


@ABANDONED_READS
def test_no_readable_checkpoint_stops_in_one_line_and_renames_nothing(finished, tmp_path):
    workdir = _copy(finished, tmp_path)
    os.remove(os.path.join(workdir, "results.json"))
    for step in ("12", "6"):
        _truncate_data(os.path.join(workdir, "checkpoints", step))
    with pytest.raises(CheckpointError) as info:
        Run(finished["config"], workdir)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"no checkpoint to resume from can be read (step 12 in {workdir}/")
    assert f"; step 6 in {workdir}/checkpoints: ValueError: " in message
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12", "6"]
    WorkdirLock(workdir).acquire()  # the failed start released the lock


@ABANDONED_READS
@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_seeds_resume_from_their_newest_common_intact_step(tmp_path, capsys, damage):
    """Seed b's step 2 is damaged (its data truncated, or a partial copy without the database manifest): both seeds
    resume from step 1, only b's step 2 is set aside, a's step 2 stays."""
    ckpts = [Checkpointer(str(tmp_path / seed)) for seed in ("a", "b")]
    for ckpt in ckpts:
        for step in (1, 2):
            ckpt.save(step, _state(step))
    data = tmp_path / "b" / "2" / "default"  # small arrays live in the merged database's nodes (default/d)
    if damage == "truncated":
        for f in (data / "d").iterdir():
            f.write_bytes(f.read_bytes()[:10])
    else:
        (data / "manifest.ocdbt").unlink()
    states, step = restore_common(ckpts, [_state(0), _state(0)], main=True)
    assert step == 1
    for state in states:
        _assert_state_equal(state, _state(1))
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"checkpoint step 2 in {tmp_path / 'b'} is unreadable (") and line.endswith(
        ", resuming from step 1")
    assert sorted(os.listdir(tmp_path / "a")) == ["1", "2"]
    assert [n.split(".corrupt-")[0] for n in sorted(os.listdir(tmp_path / "b"))] == ["1", "2"]
    assert ckpts[1].all_steps() == [1] and ckpts[0].all_steps() == [1, 2]
    ckpts[1].save(2, _state(2))  # the same step saved again does not collide with the one set aside
    for ckpt in ckpts:
        ckpt.close()


HOLD = """
import sys, time
from attn_lab.train.workdir import WorkdirLock
WorkdirLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_process_on_a_workdir_stops_in_one_line_and_a_dead_holder_s_lock_is_taken_over(
        tmp_path, data_dir, capsys):
    workdir = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, workdir], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        busy = f"workdir {workdir} is in use by pid {holder.pid} on host {socket.gethostname()} (started "
        with pytest.raises(WorkdirBusy, match=busy.replace("(", r"\(")):
            WorkdirLock(workdir).acquire()
        proc = subprocess.run([*TRAIN, "--workdir", workdir, f"--config.task.data_dir={data_dir}",
                               "--config.compile_cache=", "--config.task.max_value=299"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 75 and "Traceback" not in proc.stderr  # EX_TEMPFAIL: a sweep tells it apart
        assert proc.stderr.splitlines()[-1].startswith(f"error: {busy}"), proc.stderr
        assert os.listdir(workdir) == [".lock"]  # the second process wrote nothing
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = WorkdirLock(workdir)  # the kernel dropped the dead holder's flock; its pid is still in the file
    lock.acquire()
    out = capsys.readouterr().out
    assert out.startswith(f"{workdir}: taking over the lock of pid {holder.pid} on host {socket.gethostname()} "
                          "(started ") and out.endswith("), which is no longer running\n"), out
    assert json.load(open(os.path.join(workdir, ".lock")))["pid"] == os.getpid()
    lock.release()
    assert open(os.path.join(workdir, ".lock")).read() == ""


def test_a_busy_seed_refuses_the_run_leaving_no_other_seed_s_folder_or_lock(tmp_path):
    """Seeds 0, 1, 2 where seed 1's folder is held: the refusal names seed 1 and leaves seed 0's and seed 2's folders
    as they were -- not made (seed 0) and no .lock left in one that existed (seed 2)."""
    (tmp_path / "seed=2").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "seed=1")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(WorkdirBusy, match=f"workdir {tmp_path / 'seed=1'} is in use by pid {holder.pid}"):
            lock_workdirs([str(tmp_path / f"seed={s}") for s in (0, 1, 2)])
        assert sorted(os.listdir(tmp_path)) == ["seed=1", "seed=2"] and os.listdir(tmp_path / "seed=2") == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    locks = lock_workdirs([str(tmp_path / f"seed={s}") for s in (0, 1, 2)])  # free now: all three taken
    assert all(os.path.exists(tmp_path / f"seed={s}" / ".lock") for s in (0, 1, 2))
    for lock in locks:
        lock.release()


def test_a_task_that_fails_to_load_leaves_no_workdir(tmp_path, data_dir, monkeypatch):
    def broken(*args):
        raise OSError("disk on fire")

    monkeypatch.setattr(task_data, "load_task", broken)
    with pytest.raises(TaskError, match=r"^task 'numbers': its data could not be loaded \(OSError: disk on fire\)$"):
        train_and_evaluate(tiny_numbers(data_dir), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_batch_size_is_checked_against_a_training_split_known_only_once_loaded(tmp_path, data_dir, monkeypatch):
    """Run checks the loaded split itself (for bible, sentiment without a limit and tfds: tasks validation cannot);
    numbers with 240 training examples stands in, its validation's batch-size check skipped."""
    monkeypatch.setattr(train_config, "_check_batch_size", lambda *args: None)
    config = tiny_numbers(data_dir, batch_size=256)
    with pytest.raises(TaskError, match=r"^train.batch_size=256 exceeds the training split of task 'numbers' \(240 "
                                        r"examples\); lower it$"):
        Run(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


ANALYZE = [sys.executable, "-m", "attn_lab.analysis"]


def _lines(stderr: str) -> list[str]:
    """What a terminal shows of stderr, progress bars left out."""
    return [line for line in screen_lines(stderr) if not PROGRESS.search(line)]


@pytest.mark.slow
def test_analysis_reads_only_finished_runs_unless_allowed_and_shows_only_its_own_lines(finished, tmp_path):
    """An unfinished run is refused in one line naming its newest checkpoint (``--allow-unfinished`` analyzes it
    and says so), a folder without checkpoints is refused before anything is built, and a successful analysis
    prints nothing on stderr (orbax / TFDS / jax INFO lines are routed away; ``-v 0`` shows them)."""
    done, unfinished, empty = _copy(finished, tmp_path), str(tmp_path / "unfinished"), str(tmp_path / "empty")
    shutil.copytree(done, unfinished)
    os.remove(os.path.join(unfinished, "results.json"))
    os.makedirs(empty)
    shutil.copy(os.path.join(done, "config.json"), empty)
    before = {w: _snapshot(w) for w in (unfinished, empty)}
    quick = ["--what", "importance", "--max-batches", "1"]
    cases = [([*ANALYZE, "--workdir", unfinished, *quick],
              f"error: --workdir: {unfinished} has not finished (no results.json; its newest checkpoint is step 12); "
              "wait for it to finish, or pass --allow-unfinished to use step 12"),
             ([*ANALYZE, "--workdir", empty, *quick, "--allow-unfinished"],
              f"error: --workdir: {empty} has no checkpoint (the run has not saved one yet)")]
    for cmd, line in cases:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and proc.stderr.strip() == line, proc.stderr
    assert {w: _snapshot(w) for w in before} == before
    ok = subprocess.run([*ANALYZE, "--workdir", done, *quick], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and _lines(ok.stderr) == [], ok.stderr
    allowed = subprocess.run([*ANALYZE, "--workdir", unfinished, *quick, "--allow-unfinished"],
                             capture_output=True, text=True, timeout=300)
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.startswith(f"note: {unfinished} has not finished; using its newest checkpoint (step 12)")


@ABANDONED_READS
def test_analysis_of_a_run_whose_newest_checkpoint_is_corrupt_uses_the_previous_one_and_renames_nothing(
        finished, tmp_path, capsys):
    from attn_lab.train.restore import load_finished_run

    workdir = _copy(finished, tmp_path)
    _truncate_data(os.path.join(workdir, "checkpoints", "12"))
    before = _snapshot(workdir)
    run = load_finished_run(workdir)
    assert run.step == 6 and _snapshot(workdir) == before
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"note: checkpoint step 12 in {workdir}/checkpoints is unreadable (ValueError: ")
    assert line.endswith("; using step 6")
    _truncate_data(os.path.join(workdir, "checkpoints", "6"))
    before = _snapshot(workdir)
    with pytest.raises(CheckpointError, match=r"^no checkpoint to restore from can be read \(step 12 in .*; step 6 "):
        load_finished_run(workdir)
    assert _snapshot(workdir) == before


# The train entry point with every checkpoint save from step 12 on failing as a full disk fails, with the noise
# orbax and tensorstore make first (measured on a 4 MB tmpfs: ~1,200 lines): an ERROR record with the traceback per
# failed write, native callbacks into the save's closed event loop, and a write task whose exception nobody reads.
DISK_FULL = """
import asyncio, errno, logging, sys
from attn_lab.train import checkpoint
real = checkpoint.Checkpointer.save
FAILED = 'RESOURCE_EXHAUSTED: Error writing "w" in OCDBT database: Failed to write 17 bytes: No space left on device'
async def write():
    raise ValueError(FAILED)
def save(self, step, state):
    if step >= 12:
        try:
            raise ValueError(FAILED)
        except ValueError:
            logging.getLogger("absl").exception("_SignalingThread.run() raised an exception: " + FAILED)
        sys.excepthook(RuntimeError, RuntimeError("Event loop is closed"), None)
        loop = asyncio.new_event_loop()
        task = loop.create_task(write())
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        raise OSError(errno.ENOSPC, "No space left on device", self.directory + f"/{step}")
    real(self, step, state)
checkpoint.Checkpointer.save = save
sys.argv = ["attn-train", *sys.argv[1:]]
from attn_lab.train.__main__ import run
run()
"""


@pytest.mark.slow
def test_a_full_disk_stops_training_in_one_line_and_the_rerun_resumes_from_the_last_checkpoint(finished, tmp_path):
    workdir, data = str(tmp_path / "run"), finished["config"].task.data_dir
    args = ["--config", os.path.join(ROOT, "configs", "numbers.py:quick"), "--workdir", workdir,
            *tiny_numbers_flags(data), "--config.compile_cache=", "--config.wandb.mode=disabled"]
    full = subprocess.run([sys.executable, "-c", DISK_FULL, *args], capture_output=True, text=True, timeout=300)
    assert full.returncode == 1 and "Traceback" not in full.stderr
    assert _lines(full.stderr) == [f"error: disk full writing {workdir}/checkpoints/12 (No space left on device); "
                                   "the newest checkpoint, step 6, is intact: free space and rerun the same command "
                                   "to resume"]
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["6"]
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    again = subprocess.run([*TRAIN, *args[2:]], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "resuming at step 6" in again.stdout, again.stderr
    record = json.load(open(os.path.join(workdir, "results.json")))
    for key, value in finished["results"]["final"]["test"].items():  # exactly the uninterrupted run's numbers
        assert record["final"]["test"][key] == pytest.approx(value, rel=1e-6), key


def test_held_closed_loop_tracebacks_are_printed_at_exit_when_the_command_did_not_stop_for_a_full_disk():
    """Only a full disk discards them: any other ending prints what was held, and other exceptions are untouched."""
    script = ("import sys\nfrom attn_lab import diskfull\ndiskfull.quiet_full_disk()\n"
              "sys.excepthook(RuntimeError, RuntimeError('Event loop is closed'), None)\n"
              "sys.excepthook(KeyError, KeyError('other'), None)\nprint('done')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdout == "done\n"
    assert proc.stderr.index("KeyError: 'other'") < proc.stderr.index("RuntimeError: Event loop is closed")


def test_a_wrapped_full_disk_error_names_its_file():
    from attn_lab.diskfull import disk_full

    wrapped = ValueError('RESOURCE_EXHAUSTED: Error writing "k" in OCDBT database at local file "/r/checkpoints/20.tmp/'
                         'ocdbt/": Failed writing: "/r/checkpoints/20.tmp/ocdbt/d/ab": Failed to write 1727928 bytes '
                         "to file 24: No space left on device [os_error_code='28']")
    assert disk_full(RuntimeError("save failed")) is None
    try:
        raise RuntimeError("save failed") from wrapped
    except RuntimeError as e:
        full = disk_full(e)
    assert (full.errno, full.filename) == (errno.ENOSPC, "/r/checkpoints/20.tmp/ocdbt/d/ab")


def test_a_checkpoint_folder_that_became_unwritable_is_one_line_too():
    """orbax and tensorstore wrap the OS error; a folder made read-only mid-run (EACCES, EROFS) gets the full disk's
    one line, worded for permissions, naming the file and what is intact."""
    from attn_lab.diskfull import disk_full, disk_full_line

    wrapped = ValueError('PERMISSION_DENIED: Error writing "k" in OCDBT database at local file "/r/checkpoints/20.tmp/'
                         'ocdbt/": Failed writing: "/r/checkpoints/20.tmp/ocdbt/d/ab": Permission denied '
                         "[os_error_code='13']")
    try:
        raise RuntimeError("save failed") from wrapped
    except RuntimeError as e:
        denied = disk_full(e)
    assert (denied.errno, denied.filename) == (errno.EACCES, "/r/checkpoints/20.tmp/ocdbt/d/ab")
    assert disk_full_line(denied, "the newest checkpoint, step 6, is intact") == (
        "error: cannot write /r/checkpoints/20.tmp/ocdbt/d/ab (Permission denied); the newest checkpoint, step 6, is "
        "intact: make the folder writable again and rerun the same command to resume")
    read_only = disk_full(OSError(errno.EROFS, "Read-only file system", "/r/checkpoints/7"))
    assert disk_full_line(read_only).startswith("error: cannot write /r/checkpoints/7 (Read-only file system); ")
    assert disk_full(KeyError("other")) is None


def test_a_signal_inside_the_loop_waits_for_the_step_and_a_second_one_stops_at_once():
    """signals.deferred: the first signal only sets the flag the loop polls (it checkpoints, then stops); a second
    one -- Ctrl-C pressed twice -- raises at once; outside, the first raises."""
    from attn_lab import signals

    signals._state["signum"] = None
    try:
        with signals.deferred():
            signals._handler(signal.SIGINT, None)
            assert signals.requested() == signal.SIGINT
            with pytest.raises(signals.Interrupted) as info:
                signals._handler(signal.SIGINT, None)
        assert info.value.exit_code == 130
        with pytest.raises(signals.Interrupted):  # a signal already given stops the next deferred block at once
            with signals.deferred():
                pass
        signals._state["signum"] = None
        with pytest.raises(signals.Interrupted) as info:
            signals._handler(signal.SIGTERM, None)
        assert info.value.exit_code == 143 and str(info.value) == "SIGTERM"
    finally:
        signals._state["signum"] = None

