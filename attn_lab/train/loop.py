"""The training loop: steps from the restored step to ``num_steps``, never waiting on the device between syncs.

Steps are dispatched asynchronously (the state is donated, so each step updates it in place); the next batches are
read and placed by a background thread (:mod:`attn_lab.train.prefetch`). The host waits only at a sync -- log, eval
and checkpoint steps -- where the window's metrics are fetched together and a non-finite loss stops the run. Speed
is measured here too (:class:`LoopStats`, :func:`speed`): training seconds exclude evaluation, logging and
checkpoints.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
import tqdm

from attn_lab import signals
from attn_lab.train.prefetch import Prefetcher
from attn_lab.train.seeds import stack_batches


@dataclasses.dataclass
class LoopStats:
    """What one call of :func:`train_loop` measured in this process (a resumed run measures only its own part).

    ``train_seconds`` excludes evaluation, head statistics, logging and checkpoints. ``compile_seconds``: how long
    the first train_step call took to return -- tracing plus XLA compilation (or a persistent-cache load); the step
    itself runs asynchronously after the call returns, so no device time is in it. ``steady_*``: the steps after
    the first log window and their training seconds, i.e. the speed without compilation and warm-up.
    """

    step: int
    train_seconds: float = 0.0
    compile_seconds: float = 0.0
    steady_steps: int = 0
    steady_seconds: float = 0.0
    windows: int = 0  # log windows closed so far


class _Window:
    """The steps since the last log: their metrics, on the device until a sync fetches them, and the training
    seconds they took (a stopwatch paused while evaluating, logging and checkpointing)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.pending: list[dict] = []  # device metrics of steps not fetched yet
        self.fetched: list[dict] = []  # host (numpy) metrics, one dict of [S] arrays per step
        self.seconds, self.started = 0.0, time.perf_counter()

    def add(self, step: int, metrics: dict) -> None:
        self.steps.append(step)
        self.pending.append(metrics)

    def sync(self, run: Any) -> None:
        """Fetches the pending metrics (this waits for their steps to finish) and stops the run at the first step
        whose loss is not finite -- before anything is logged, evaluated or checkpointed from its state."""
        first = len(self.fetched)
        self.fetched += run.parallel.fetch(self.pending)  # one fetch per sync, not per step
        self.pending = []
        for step, m in zip(self.steps[first:], self.fetched[first:]):
            loss = np.asarray(m["loss"])  # (S,)
            if not np.isfinite(loss).all():
                seeds = [s for s, x in zip(run.seeds, loss) if not np.isfinite(x)]
                raise FloatingPointError(f"non-finite loss ({loss.tolist()}) at step {step} (seed {seeds}); "
                                         f"stopped at step {self.steps[-1]}, the last good checkpoint is step "
                                         f"{run.ckpts[0].latest_step()} in {run.workdirs[0]}/checkpoints")

    def pause(self) -> None:
        self.seconds += time.perf_counter() - self.started

    def resume(self) -> None:
        self.started = time.perf_counter()


def _log_window(run: Any, window: _Window, bar: tqdm.tqdm) -> None:
    """Logs the window's last step's metrics (as an unbuffered loop logged them) and its speed: steps/s and tokens/s
    over all of the window's steps."""
    last, seconds = window.fetched[-1], max(window.seconds, 1e-9)
    tokens = np.sum([np.asarray(m["tokens"]) for m in window.fetched], axis=0)  # (S,)
    rates = {"train/steps_per_sec": np.full(len(run.seeds), len(window.steps) / seconds),
             "train/tokens_per_sec": tokens / seconds}
    run.log(window.steps[-1], {f"train/{k}": v for k, v in last.items() if k != "tokens"} | rates)
    loss, rate = f"{np.mean(last['loss']):.3f}", f"{len(window.steps) / seconds:.1f}"
    bar.set_postfix(loss=loss, steps_per_s=rate)
    if run.main and bar.disable:  # a log, not a terminal: one plain line per window instead of a redrawn bar
        print(f"step {window.steps[-1]}/{run.config.train.num_steps}: loss {loss}, {rate} steps/s", flush=True)


def _terminal() -> bool:
    """A live bar on a terminal; a log (a sweep's trial log, CI, a pipe) gets plain lines (:func:`_log_window`)."""
    return sys.stderr.isatty()


def _batch_reader(run: Any, datasets: Sequence[Any]) -> tuple[Callable[[int], dict], Callable[[dict], dict]]:
    """(read, place) for the prefetch worker and the loop: ``read(s)`` is every seed's ``dataset[s - 1]`` padded
    to one shape, ``(S, B, ...)``; with one process it is also placed on the device(s) in the worker. With several
    processes placement pads across hosts with a collective, which must run in the same order on every host, so it
    stays on the main thread (``place``)."""
    def put(batch: dict) -> dict:
        return run.parallel.batch(batch, axis=1) if run.parallel.active else jax.device_put(batch)

    def read(step: int) -> dict:
        batch = stack_batches([d[step - 1] for d in datasets])  # (S, B, ...)
        return put(batch) if jax.process_count() == 1 else batch

    return read, (lambda b: b) if jax.process_count() == 1 else put


def train_loop(run: Any, stop_after: int | None, prefetch: int = 2) -> LoopStats:
    """Steps from the restored step to ``num_steps`` (or ``stop_after``), never waiting on the device between syncs
    (``prefetch``: batches read ahead by the background thread)."""
    tcfg = run.config.train
    datasets = [run.task.dataset("train", tcfg.batch_size, train=True, seed=s, shard=run.parallel.shard)
                for s in run.seeds]  # this process's rows of each batch
    end = tcfg.num_steps if stop_after is None else min(stop_after, tcfg.num_steps)
    bar = tqdm.tqdm(total=tcfg.num_steps, initial=run.start_step, disable=not (run.main and _terminal()),
                    mininterval=1.0, desc="train", dynamic_ncols=True)
    stats, window = LoopStats(run.start_step), _Window()
    read, place = _batch_reader(run, datasets)
    # The bar closes on errors too, so its last redraw comes before the error line, not after it at exit.
    with bar, Prefetcher(read, range(run.start_step + 1, end + 1), depth=prefetch) as batches, signals.deferred():
        for step, batch in batches:
            called = time.perf_counter()
            run.state, m = run.train_step(run.state, place(batch))
            if step == run.start_step + 1:
                stats.compile_seconds = time.perf_counter() - called
            window.add(step, m)
            stats.step = step
            bar.update(1)
            window = _at_sync(run, window, stats, bar, end)
            if signals.requested() is not None:
                _stop(run, window, stats)
    return stats


def _stop(run: Any, window: _Window, stats: LoopStats) -> None:
    """A signal arrived: checkpoint this step (its loss checked first, as at any sync) and raise
    :class:`attn_lab.signals.Interrupted` naming it, so a rerun resumes exactly here."""
    window.sync(run)
    run.save(stats.step)
    raise signals.Interrupted(signals.requested(), step=stats.step)


def _at_sync(run: Any, window: _Window, stats: LoopStats, bar: tqdm.tqdm, end: int) -> _Window:
    """At a log, eval or checkpoint step: fetch the window, then log / evaluate / save with the stopwatch paused;
    returns the window the next steps add to (a new one after a log)."""
    tcfg, step = run.config.train, stats.step
    log = step % tcfg.log_every == 0 or step == end
    evaluate = step % tcfg.eval_every == 0 or step == tcfg.num_steps
    save = step % tcfg.checkpoint_every == 0 or step == end
    if not (log or evaluate or save):
        return window
    window.sync(run)
    window.pause()
    if log:
        _log_window(run, window, bar)
        stats.train_seconds += window.seconds
        if stats.windows:  # the first window holds compilation and warm-up: not steady
            stats.steady_steps += len(window.steps)
            stats.steady_seconds += window.seconds
            if stats.windows == 1 and run.main:  # the first speed a user can compare (docs/install.md: healthy ones)
                tqdm.tqdm.write(f"speed after compilation: {len(window.steps) / max(window.seconds, 1e-9):.1f} "
                                f"steps/s (first compile {stats.compile_seconds or 0:.0f} s)")
        stats.windows += 1
    if evaluate:
        scores = run.evaluate("validation")
        run.log(step, {f"eval/{k}": [r[k] for r in scores] for k in scores[0]} | run.learned_stats())
        if run.capture is not None:
            run.log(step, run.head_stats())
    if save:
        run.save(step)
    if log:
        return _Window()
    window.resume()
    return window


def speed(stats: LoopStats, steps: int) -> dict[str, float | None]:
    """Speed fields of results.json, all over this process's part of the run (the part after a resume).

    ``steps_per_sec``: every step over all training seconds, compilation and warm-up included (the tables' speed
    column, kept comparable with older runs); ``steady_steps_per_sec``: the steps after the first log window over
    their training seconds (None when the run had a single log window); ``compile_seconds``: see
    :class:`LoopStats`; ``train_time_sec``: the training seconds (no evaluation, logging or checkpoints).
    """
    steady = stats.steady_steps / stats.steady_seconds if stats.steady_steps and stats.steady_seconds > 0 else None
    return {"steps_per_sec": steps / max(stats.train_seconds, 1e-9), "steady_steps_per_sec": steady,
            "compile_seconds": stats.compile_seconds, "train_time_sec": stats.train_seconds}
