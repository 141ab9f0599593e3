"""Runs a sweep's trials as ``python -m attn_lab.train`` processes (and an experiment's analysis as
``python -m attn_lab.analysis``) and collects their results.

Each trial gets its own folder under the sweep's workdir; a trial with a ``results.json`` is skipped, so an
interrupted sweep resumes; every trial process writes its output (stdout and stderr) to
``<sweep>/logs/<trial>.train.log`` (``.analysis.log`` for its analysis; appended on a rerun); a failing trial also
leaves ``error.txt`` (its last lines, progress bars removed) and the others go on. While trials run, a status line
per running trial (step / steps, loss, steps/s, from its metrics.jsonl) is printed every ``status_every`` seconds.
A failed trial's status is its error line (``failed: <line>``), in results.csv and in the tables.
With ``vmap_seeds`` the trials that differ only in seed train in one process, their seeds vmapped (each still writes
its own folder).
"""

from __future__ import annotations

import concurrent.futures
import csv
import io
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from attn_lab import results, signals
from attn_lab.checks import RunError
from attn_lab.cli import check_config_overrides
from attn_lab.io import write_text_atomic
from attn_lab.markdown import markdown_table
from attn_lab.sweep.spec import SWEEP_FIELD, Experiment, Trial, load_config_file
from attn_lab.train import identity
from attn_lab.train.workdir import BUSY_EXIT, SEED_FIELD, WorkdirBusy, WorkdirLock


def override_flags(overrides: dict[str, Any]) -> list[str]:
    """``{'model.num_heads': 4}`` -> ``['--config.model.num_heads=4']`` (tuples as Python literals)."""
    return [f"--config.{k}={v!r}" if isinstance(v, (tuple, list)) else f"--config.{k}={v}"
            for k, v in overrides.items()]


TRAIN = [sys.executable, "-m", "attn_lab.train"]  # the package's entry point: no scripts/ folder needed


def in_sweep(overrides: dict[str, Any], workdir: str, seed: int | None = None) -> dict[str, Any]:
    """``overrides`` with the sweep's folder in place of ``{sweep}`` (a trial another one starts from), and the seed
    in place of ``{seed}`` when given (as the trainer fills it in per seed)."""
    def fill(value: Any) -> Any:
        if not (isinstance(value, str) and SWEEP_FIELD in value):
            return value
        value = value.replace(SWEEP_FIELD, os.path.abspath(workdir))
        return value if seed is None else value.replace(SEED_FIELD, str(seed))
    return {k: fill(v) for k, v in overrides.items()}


def trial_command(exp: Experiment, trial: Trial, trial_dir: str, extra: list[str]) -> list[str]:
    """The ``python -m attn_lab.train`` command of one trial (W&B group = the sweep's name)."""
    overrides = in_sweep(trial.overrides, os.path.dirname(trial_dir))
    return [*TRAIN, "--config", exp.config, "--workdir", trial_dir, f"--config.wandb.group={exp.name}",
            *override_flags(overrides), *extra]


def trial_config(exp: Experiment, trial: Trial, extra: list[str], workdir: str = "") -> dict[str, Any]:
    """The resolved config the trial's ``python -m attn_lab.train`` runs (base config, the trial's overrides, then
    the pass-through ones), as its config.json records it: what a finished or resumable trial is compared with."""
    config = load_config_file(exp.config)
    overrides = in_sweep(trial.overrides, workdir, trial.overrides["seed"])
    check_config_overrides(config, [*override_flags(overrides), *extra])
    return config.copy_and_resolve_references().to_dict()


def check_trials(exp: Experiment, workdir: str, extra: list[str]) -> None:
    """Every trial folder's records can be read, and one that holds a trained run (finished, or with a checkpoint)
    was trained with the config this sweep would give it; else one ValueError line naming the file, or the trial,
    the key and both values."""
    for trial in exp.trials():
        try:
            identity.check_same_run(os.path.join(workdir, trial.name),
                                    lambda t=trial: trial_config(exp, t, extra, workdir),
                                    fresh="give the sweep a new --workdir (or move the trial's folder away)")
        except RunError as e:  # an unreadable record, or another config
            raise ValueError(str(e)) from None


def seed_groups(trials: list[Trial]) -> list[list[Trial]]:
    """Trials that differ only in their seed, grouped (in trial order): what ``--vmap-seeds`` trains together."""
    groups: dict[str, list[Trial]] = {}
    for t in trials:
        groups.setdefault(repr({k: v for k, v in t.overrides.items() if k != "seed"}), []).append(t)
    return list(groups.values())


def group_command(exp: Experiment, group: list[Trial], workdir: str, extra: list[str]) -> list[str]:
    """One ``python -m attn_lab.train --seeds`` command for a group of trials that differ only in seed.

    The workdir is the trials' folder name with ``{seed}`` in place of the seed, so seed i writes into exactly the
    folder its separate trial would have used.
    """
    first = group[0]
    suffix = f"seed={first.overrides['seed']}"
    assert first.name.endswith(suffix), first.name  # the seed is the last axis of every trial name
    template = os.path.join(workdir, first.name[: -len(suffix)] + "seed={seed}")
    fixed = in_sweep({k: v for k, v in first.overrides.items() if k != "seed"}, workdir)
    seeds = ",".join(str(t.overrides["seed"]) for t in group)
    return [*TRAIN, "--config", exp.config, "--workdir", template, "--seeds", seeds,
            f"--config.wandb.group={exp.name}", *override_flags(fixed), *extra]


def run_group(exp: Experiment, group: list[Trial], workdir: str, extra: list[str]) -> dict[str, str]:
    """Runs the unfinished trials of ``group`` -- one process, seeds vmapped when there are several.

    Returns trial name -> 'ok', 'skipped' or 'failed: <last error line>'.
    """
    done = [t for t in group if results.is_finished(os.path.join(workdir, t.name))]
    todo = [t for t in group if t not in done]
    statuses = {t.name: "skipped" for t in done}
    if todo:
        dirs = [os.path.join(workdir, t.name) for t in todo]
        cmd = (trial_command(exp, todo[0], dirs[0], extra) if len(todo) == 1
               else group_command(exp, todo, workdir, extra))
        status = _run(cmd, dirs, log_path(workdir, todo[0].name, "train"))
        statuses.update({t.name: status for t in todo})
    for t in group:
        if exp.analyze and statuses[t.name] in ("ok", "skipped") and not analyzed(exp, os.path.join(workdir, t.name)):
            statuses[t.name] = _run(analysis_command(exp, os.path.join(workdir, t.name)), [],
                                    log_path(workdir, t.name, "analysis"))
    return {t.name: statuses[t.name] for t in group}


ANALYZE = [sys.executable, "-m", "attn_lab.analysis"]  # the analysis entry point, like TRAIN


def _flag_value(value: Any) -> str:
    """An ``analyze`` value as its flag is written: lists and tuples comma-separated (absl list flags)."""
    return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)


def analysis_command(exp: Experiment, trial_dir: str) -> list[str]:
    """``python -m attn_lab.analysis`` on a finished trial with the experiment's ``analyze`` flags (``max_batches``
    -> ``--max-batches``; run with :func:`child_env`, like the trials)."""
    flags = [f"--{k.replace('_', '-')}={_flag_value(v)}" for k, v in exp.analyze.items()]
    return [*ANALYZE, "--workdir", trial_dir, *flags]


def analyzed(exp: Experiment, trial_dir: str) -> bool:
    """Whether every method in the experiment's ``analyze['what']`` has written its JSON for this trial."""
    what = [w.strip() for w in _flag_value(exp.analyze.get("what", "importance")).split(",") if w.strip()]
    return all(os.path.exists(os.path.join(trial_dir, "analysis", f"{w}.json")) for w in what)


def run_trial(exp: Experiment, trial: Trial, workdir: str, extra: list[str]) -> str:
    """Runs one trial unless it already finished; returns 'ok', 'skipped' or 'failed: <last error line>'."""
    return run_group(exp, [trial], workdir, extra)[trial.name]


INTERRUPTED, BUSY, NOT_RUN = "interrupted", "busy: another process is training it", "not run"


class Children:
    """The trial processes running now, so a signal to the sweep can stop them: after :meth:`stop` no new one
    starts and each running one gets SIGTERM (it checkpoints, exits 143, and resumes on the next run)."""

    def __init__(self) -> None:
        self.lock, self.running, self.signum = threading.Lock(), set(), None

    def start(self, cmd: list[str], log: Any = None) -> subprocess.Popen | None:
        """Starts ``cmd`` with its stdout and stderr into the open file ``log`` (stdout dropped and stderr piped
        without one)."""
        with self.lock:
            if self.signum is not None:
                return None
            out = (log, subprocess.STDOUT) if log is not None else (subprocess.DEVNULL, subprocess.PIPE)
            proc = subprocess.Popen(cmd, stdout=out[0], stderr=out[1], text=True, env=child_env())
            self.running.add(proc)
            return proc

    def done(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.running.discard(proc)

    def stop(self, signum: int) -> None:
        with self.lock:
            self.signum = signum
            for proc in self.running:
                proc.terminate()


CHILDREN = Children()


LOGS = "logs"


def log_path(workdir: str, trial: str, what: str) -> str:
    """``<workdir>/logs/<trial>.<what>.log``: a trial process's output (``what``: train or analysis)."""
    return os.path.join(workdir, LOGS, f"{trial}.{what}.log")


def _run(cmd: list[str], dirs: list[str], log: str | None = None) -> str:
    """Runs a command writing into ``dirs``, its output appended to ``log`` (a header line per start): 'ok',
    'interrupted' (the sweep was stopped), 'busy: ...' (another process holds a folder), or ``'failed: <its error
    line>'`` with its last lines in each error.txt -- never in a folder whose run finished meanwhile (another sweep
    finished it: then 'ok')."""
    handle = None
    if log is not None:
        os.makedirs(os.path.dirname(log), exist_ok=True)
        handle = open(log, "a")
        handle.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        handle.flush()
        start = handle.tell()
    try:
        proc = CHILDREN.start(cmd, handle)
        if proc is None:
            return INTERRUPTED
        try:
            _, stderr = proc.communicate()
        finally:
            CHILDREN.done(proc)
    finally:
        if handle is not None:
            handle.close()
    if log is not None:
        with open(log, errors="replace") as f:
            f.seek(start)
            stderr = f.read()
    if proc.returncode == 0 or (dirs and all(results.is_finished(d) for d in dirs)):
        return "ok"  # (a failure in folders another process finished meanwhile: they are finished all the same)
    if CHILDREN.signum is not None and proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM,
                                                           128 + signal.SIGINT, -signal.SIGINT):
        return INTERRUPTED
    if proc.returncode == BUSY_EXIT:
        return BUSY
    lines = [line for line in screen_lines(stderr) if not PROGRESS.search(line)]
    lines = lines or [f"exit code {proc.returncode}"]
    for d in dirs:
        if not results.is_finished(d):
            os.makedirs(d, exist_ok=True)  # a trial that failed before making its folder still gets its error.txt
            write_text_atomic(pathlib.Path(d, "error.txt"), "\n".join(lines[-40:]) + "\n")
    return failed_status(lines)


def child_env() -> dict[str, str]:
    """This process's environment with this attn_lab first on PYTHONPATH, so a trial's ``-m attn_lab.train`` (and
    ``-m attn_lab.analysis``) runs the same code as the sweep whether the package is installed or found on the
    path; and this process's pid, which the child watches (:mod:`attn_lab.signals`: it stops when the sweep
    dies)."""
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": package_parent + (os.pathsep + path if path else ""),
            signals.PARENT_ENV: str(os.getpid())}


# a tqdm progress bar: '... 50%|#####     | 6/12 [...]', or one without a total: '... 0 examples [00:00, ? examples/s]'
PROGRESS = re.compile(r"\d+%\||\[\d\d:\d\d(:\d\d)?, [^\]]*/s\]")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal control sequences (a nested bar's cursor-up)


def screen_lines(text: str) -> list[str]:
    """The non-blank lines a terminal would show for ``text``: a progress bar redraws its line with carriage
    returns, so only each line's last ``\\r`` segment remains; control sequences are dropped."""
    shown = [ANSI.sub("", line.rsplit("\r", 1)[-1]).rstrip() for line in text.split("\n")]
    return [line for line in shown if line.strip()]


def failed_status(lines: list[str]) -> str:
    """``'failed: <error line>'``: the last ``error: ...`` line a script printed, else the last line that is not a
    progress bar (a traceback's exception line), else the last line."""
    said = [line[len("error: "):] for line in lines if line.startswith("error: ")]
    plain = [line for line in lines if not PROGRESS.search(line)]
    line = (said or plain or lines or ["unknown error"])[-1].strip()
    return f"failed: {line[:300]}"


def recorded_status(trial_dir: str) -> str:
    """A trial's status from its folder alone (no sweep process to ask): 'ok' with results.json, its error line
    with error.txt, else 'not run'."""
    if results.is_finished(trial_dir):
        return "ok"
    error = os.path.join(trial_dir, "error.txt")
    if not os.path.exists(error):
        return "not run"
    with open(error, errors="replace") as f:
        return failed_status(screen_lines(f.read()))


def run_sweep(exp: Experiment, trials: list[Trial], workdir: str, *, parallel: int = 1, extra: list[str] = (),
              vmap_seeds: bool = False, status_every: float = 60.0) -> tuple[dict[str, str], int | None]:
    """Runs ``trials`` (``parallel`` processes at once; with ``vmap_seeds`` one process per group of trials that
    differ only in seed); returns (trial name -> status, the signal that stopped the sweep or None).

    SIGINT / SIGTERM stop it: no further trial starts, the running ones get SIGTERM (each checkpoints and exits),
    and their status is 'interrupted'. A line per trial that starts or ends shows the progress.
    """
    units = seed_groups(trials) if vmap_seeds else [[t] for t in trials]
    units.sort(key=lambda unit: any(t.after for t in unit))  # (stable) trials that start from others go last
    progress, CHILDREN.signum = Progress(len(trials), workdir), None
    main = threading.current_thread() is threading.main_thread()  # only there can Python take a signal
    previous = {s: signal.signal(s, lambda signum, _: CHILDREN.stop(signum))
                for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        pool_of = concurrent.futures.ThreadPoolExecutor
        with Ticker(progress, status_every), pool_of(max_workers=max(1, parallel)) as pool:
            by_trial: dict[str, concurrent.futures.Future] = {}
            for unit in units:  # a unit waits for the trials it starts from, submitted before it
                waits = [by_trial[name] for t in unit for name in t.after if name in by_trial]
                future = pool.submit(_unit, exp, unit, workdir, list(extra), progress, waits)
                by_trial |= {t.name: future for t in unit}
            statuses: dict[str, str] = {}
            for future in dict.fromkeys(by_trial.values()):
                statuses |= future.result()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return {t.name: statuses[t.name] for t in trials}, CHILDREN.signum


def _unit(exp: Experiment, unit: list[Trial], workdir: str, extra: list[str], progress: Progress,
          waits: list[concurrent.futures.Future] = ()) -> dict[str, str]:
    """One group of trials, with its start and end on the progress lines (not started once the sweep stops, nor
    when a trial it starts from did not finish)."""
    before = {name: status for future in waits for name, status in future.result().items()}
    for name in dict.fromkeys(n for t in unit for n in t.after if n not in before):  # another shard's trial
        before[name] = _wait_for_shard(os.path.join(workdir, name))
    if CHILDREN.signum is not None:
        return {t.name: NOT_RUN for t in unit}
    later = {t.name: next((f"{NOT_RUN}: starts from {n}, {before[n]}" for n in t.after
                           if before[n] == ANOTHER_SHARD), None) for t in unit}
    if any(later.values()):
        statuses = {t.name: later[t.name] or NOT_RUN for t in unit}
        progress.ended(statuses, 0)
        return statuses
    missing = {t.name: next((f"failed: starts from {n}, which {before[n]}" for n in t.after
                             if before.get(n, "ok") not in ("ok", "skipped")), None) for t in unit}
    if any(missing.values()):
        statuses = {t.name: missing[t.name] or NOT_RUN for t in unit}
        progress.ended(statuses, 0)
        return statuses
    todo = [t for t in unit if not results.is_finished(os.path.join(workdir, t.name))]
    if todo:
        progress.started(todo)
    statuses = run_group(exp, unit, workdir, extra)
    progress.ended(statuses, len(todo))
    return statuses


ANOTHER_SHARD = "another shard's trial that has not finished; rerun this shard once it has"
SHARD_POLL = 10.0  # seconds between looks at a source another shard is training


def _wait_for_shard(folder: str) -> str:
    """The status of a source trial this invocation does not run (another ``--shard``'s): 'ok' once it finished
    (waiting while a live process trains it), else :data:`ANOTHER_SHARD` (never a failure: nothing went wrong)."""
    while not results.is_finished(folder) and CHILDREN.signum is None:
        try:
            WorkdirLock(folder).probe()
        except WorkdirBusy:  # being trained right now: wait for it
            time.sleep(SHARD_POLL)
            continue
        break
    return "ok" if results.is_finished(folder) else ANOTHER_SHARD


class Progress:
    """``[done/total] <trial>: <status> | running R, left L, elapsed 1m20s, about 3m left`` lines, as the trainer's
    bar shows a run's progress (an estimate once a trial finished: the time per trial run so far, with the running
    ones counted by the share of their steps done), and :meth:`status_lines` for the running trials."""

    def __init__(self, total: int, workdir: str = "") -> None:
        self.total, self.done, self.running, self.ran = total, 0, 0, 0
        self.start, self.lock, self.workdir = time.time(), threading.Lock(), workdir
        self.units: dict[str, list[str]] = {}  # running unit (its first trial) -> its trials

    def started(self, unit: list[Trial]) -> None:
        with self.lock:
            self.running += len(unit)
            self.units[unit[0].name] = [t.name for t in unit]
            self._say(f"started {', '.join(t.name for t in unit)}")

    def ended(self, statuses: dict[str, str], ran: int) -> None:
        with self.lock:  # every trial of the unit counted before any line: the estimate sees all of them
            self.running -= ran
            self.units.pop(next(iter(statuses), ""), None)
            self.done += len(statuses)
            self.ran += sum(status not in ("skipped", INTERRUPTED) for status in statuses.values())
            for name, status in statuses.items():
                self._say(f"{name}: {status}")

    def _say(self, what: str) -> None:
        elapsed = time.time() - self.start
        left = self.total - self.done - self.running
        shares = [trial_progress(os.path.join(self.workdir, t))[0] for u in self.units.values() for t in u[:1]]
        running_left = sum(1.0 - s for s in shares) / max(len(shares), 1) * self.running if shares else 0.0
        eta = (f", about {_duration(elapsed / self.ran * (left + running_left))} left"
               if self.ran and left + self.running else "")
        print(f"[{self.done}/{self.total}] {what} | running {self.running}, left {left}, elapsed "
              f"{_duration(elapsed)}{eta}", flush=True)

    def status_lines(self) -> list[str]:
        """One line per running unit: ``  <trial>: step 120/400, loss 5.84, 2.9 steps/s`` (its first seed's
        metrics.jsonl), or that it is still preparing data and compiling."""
        with self.lock:
            units = list(self.units.items())
        lines = []
        for name, trials in units:
            share, said = trial_progress(os.path.join(self.workdir, name))
            seeds = f" (+{len(trials) - 1} seeds)" if len(trials) > 1 else ""
            lines.append(f"  {name}{seeds}: {said}")
        return lines


def trial_progress(trial_dir: str) -> tuple[float, str]:
    """(share of its steps done, what it is doing) from a trial folder's config.json and metrics.jsonl (a file
    being written or replaced as it is read counts as not there yet)."""
    try:
        config = results.read_record(trial_dir, results.CONFIG_FILE) if os.path.isdir(trial_dir) else None
        last = None
        for record in results.metric_lines(trial_dir):
            if "train/loss" in record and isinstance(record.get("step"), int):
                last = record
    except (OSError, ValueError):
        config, last = None, None
    if config is None or last is None:
        return 0.0, "preparing data and compiling" if config is None else "compiling, first steps"
    steps = int(config.get("train", {}).get("num_steps") or 0)
    rate = last.get("train/steps_per_sec")
    share = min(last["step"] / steps, 1.0) if steps else 0.0
    return share, (f"step {last['step']}/{steps}, loss {last['train/loss']:.4g}"
                   + (f", {rate:.3g} steps/s" if isinstance(rate, (int, float)) else ""))


class Ticker:
    """Prints :meth:`Progress.status_lines` every ``every`` seconds while the sweep runs (0: never)."""

    def __init__(self, progress: Progress, every: float) -> None:
        self.progress, self.every, self.stopped = progress, every, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "Ticker":
        if self.every > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stopped.set()

    def _loop(self) -> None:
        while not self.stopped.wait(self.every):
            lines = self.progress.status_lines()
            if lines:
                print("\n".join(lines), flush=True)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


def collect(exp: Experiment, workdir: str, statuses: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per trial: swept values, status, final test and best validation metrics, params, steps/s."""
    rows = []
    for trial in exp.trials():
        row = {k.split(".")[-1]: trial.point[k] for k in exp.swept_keys()}
        row["trial"] = trial.name
        record = results.finished_results(os.path.join(workdir, trial.name))
        if record is not None:  # finished, whatever another process said about it meanwhile
            said = (statuses or {}).get(trial.name, "ok")
            row["status"] = said if said in ("ok", "skipped") else "ok"
            row.update(results.summary_row(record))
        else:
            row["status"] = (statuses or {}).get(trial.name) or recorded_status(os.path.join(workdir, trial.name))
        rows.append(row)
    return rows


def write_csv(rows: list[dict[str, Any]], path: str) -> None:
    """``results.csv`` (atomic): the union of all rows' columns, in first-seen order."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(pathlib.Path(path), buf.getvalue())


def format_table(rows: list[dict[str, Any]], metric_keys: tuple[str, ...] = ("test_exact_match", "test_bleu",
                                                                          "test_accuracy")) -> str:
    """A Markdown table of the trials (swept values, status, the main test metrics, params)."""
    metrics = [k for k in metric_keys if any(k in r for r in rows)]
    cols = [c for c in rows[0] if c not in ("trial", "status")] if rows else []
    cols = [c for c in cols if not c.startswith(("test_", "best_val_")) and c not in ("steps", "steps_per_sec")]
    header = [*cols, *metrics, "status"]
    return markdown_table(header, [[r.get(c, "") for c in header] for r in rows])
