"""The one trainer: config -> trained model, metrics.jsonl, W&B run, checkpoints and results.json.

Resumable by construction: the batch for step ``s`` is ``dataset[s - 1]`` (random access) and dropout keys are
``fold_in(seed, s)``, so restoring the step-``s`` checkpoint replays exactly what an uninterrupted run does.

Asynchronous: the loop never waits on the device between log, eval and checkpoint steps (metrics stay on the device
until then, batches are prefetched by a background thread, the state is donated); see :func:`_train_loop`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
import tqdm
from flax import nnx, traverse_util

from attn_lab.attention.dispatch import describe_dispatch
from attn_lab.data import load_task
from attn_lab.environment import environment
from attn_lab.io import write_json_atomic
from attn_lab.models import build_model, count_params, supports_cached_decoding
from attn_lab.models.gates import binary_gates
from attn_lab.train import learned as learned_lib
from attn_lab.train import metrics as metrics_lib
from attn_lab.train.capture import as_layers, capture_step, track_summary
from attn_lab.train.checkpoint import Checkpointer, CheckpointError
from attn_lab.train.config import validate_config
from attn_lab.train.decode import compile_decode, split_beam_size
from attn_lab.train.logging import METRICS_FILE, MetricLogger
from attn_lab.train.parallel import DataParallel, main_process_first
from attn_lab.train.prefetch import Prefetcher
from attn_lab.train.restore import load_finished_run
from attn_lab.train.seeds import seed_map, stack, stack_batches, unstack
from attn_lab.train.steps import compile_steps, init_state, make_optimizer, merge, model_state
from attn_lab.train.workdir import (
    RESULTS_FILE,
    TRAINING_FILE,
    RunError,
    describe,
    finished_results,
    lock_workdirs,
    read_record,
)


class ResumeError(RunError):
    """The seeds' checkpoints share no step to resume from (their folders were edited by hand)."""


class TaskError(RunError):
    """The task's data cannot be loaded, or its training split is smaller than one batch."""


class Run:
    """One config trained for one or more seeds: task, compiled steps, state, loggers and checkpointers.

    The state has a leading seed axis; with several seeds every step is ``jax.vmap``-ed over it (one compiled
    program for all seeds, see :mod:`attn_lab.train.seeds`), and each seed still gets its own folder with
    metrics.jsonl, W&B run, checkpoints and results.json, exactly as a separate run writes them.
    """

    def __init__(self, config: Any, workdirs: str | Sequence[str], seeds: Sequence[int] | None = None, *,
                 log: bool = True):
        """``log=False``: no metrics.jsonl or W&B run is opened (a re-evaluation writes neither)."""
        self.workdirs = [workdirs] if isinstance(workdirs, str) else list(workdirs)
        self.seeds = [int(config.seed)] if seeds is None else list(seeds)
        self.configs = [_with_seed(config, s, len(self.seeds)) for s in self.seeds]
        self.config, self.main = config, jax.process_index() == 0
        self.parallel = DataParallel(config.parallel.shard_params)
        self.parallel.check_batch_size(config.train.batch_size)
        self.task = _load_task(config)
        # Folders are made (and locked) only once the data loaded: a failed load leaves nothing behind. With several
        # processes on one shared folder, process 0 holds the lock for all of them.
        self.locks = lock_workdirs(self.workdirs) if self.main else []
        self.ckpts, self.loggers = [], []
        try:
            self._build(config, log)
        except BaseException:
            self.close()
            raise

    def _build(self, config: Any, log: bool) -> None:
        """Models, compiled steps, the restored (or initialized) state and the loggers."""
        max_len = max(self.task.max_input_length, self.task.max_target_length or 0) + 1
        models = [build_model(config.model, kind=self.task.kind, vocab_size=self.task.vocab.size, max_len=max_len,
                              num_classes=self.task.num_classes, seed=s, gates=config.heads.gates)
                  for s in self.seeds]
        self.num_params = count_params(models[0])
        self.learns_shape = bool(learned_lib.per_head(models[0]))  # some kernel learns spans / alphas
        self.dispatch = describe_dispatch(models[0])  # which implementation each attention kind gets, for the log
        self.graphdef = nnx.split(models[0], nnx.Param, ...)[0]
        tx, n = make_optimizer(config.train, config.heads.gates), len(self.seeds)
        self.train_step, self.eval_step = compile_steps(self.graphdef, tx,
                                                        config.train.label_smoothing, num_seeds=n,
                                                        diversity=config.loss.diversity,
                                                        gates=config.heads.gates,
                                                        num_steps=config.train.num_steps,
                                                        loss_cfg=config.loss)
        self.decoders = _decoders(self.graphdef, self.task.max_target_length, models[0], n, config.eval)
        self.capture = (jax.jit(seed_map(capture_step(self.graphdef), n, (0, None)))
                        if config.heads.track else None)
        states = [init_state(nnx.to_pure_dict(nnx.state(m, nnx.Param)), model_state(m), tx, s)
                  for m, s in zip(models, self.seeds)]
        self.ckpts = [Checkpointer(os.path.join(w, "checkpoints")) for w in self.workdirs]
        states, self.start_step = _restore(self.ckpts, states, self.main)
        if config.train.init_from and not self.start_step:
            states = _init_from(config.train.init_from, states, self.main)
        self.state = self.parallel.state(stack(states))  # replicated (or FSDP-sharded) over the devices
        self.environment = environment()  # versions, devices and commit: in results.json and the W&B config
        self.loggers = [MetricLogger(w, c.to_dict() | {"environment": self.environment}, mode=c.wandb.mode,
                                     project=c.wandb.project, group=c.wandb.group, tags=tuple(c.wandb.tags),
                                     name=c.wandb.name, resume_step=self.start_step, is_main_process=self.main)
                        for w, c in zip(self.workdirs, self.configs)] if log else []

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Logs seed i's slice of each ``[S]`` metric to seed i's logger."""
        for i, logger in enumerate(self.loggers):
            logger.log(step, {k: float(np.asarray(v)[i]) for k, v in metrics.items()})

    def evaluate(self, split: str) -> list[dict[str, float]]:
        """Per seed: loss and accuracy on ``split``; translation adds BLEU and exact match of the decoded outputs
        (greedy, or beam search with ``eval.beam_size > 1``; validation with ``eval.validation_beam_size`` if set)."""
        tcfg, state, n = self.config.train, self.state, len(self.seeds)
        decode = self.decoders.get(split, self.decoders.get("test"))
        sums, hyps = {k: np.zeros(n) for k in ("loss", "correct", "weight")}, [[] for _ in range(n)]
        batches = self.task.dataset(split, tcfg.batch_size, train=False, shard=self.parallel.shard)  # this host's rows
        for i, batch in enumerate(batches):
            if tcfg.max_eval_batches and i >= tcfg.max_eval_batches:
                break
            placed = self.parallel.batch(batch)
            step_sums = self.parallel.fetch(self.eval_step(state, placed))
            sums = {k: sums[k] + np.asarray(v, np.float64) for k, v in step_sums.items()}
            if decode is not None:
                ids = self.parallel.fetch(decode(state, placed["inputs"]))  # (S, B, T)
                for seed_hyps, rows in zip(hyps, ids):
                    seed_hyps += [self.task.decode(row) for row in rows]
        results = [metrics_lib.summarize({k: float(v[i]) for k, v in sums.items()}) for i in range(n)]
        if decode is not None:
            refs = self.task.references(split)[: len(hyps[0])]
            for result, seed_hyps in zip(results, hyps):
                result.update(metrics_lib.translation_scores(seed_hyps[: len(refs)], refs,
                                                             self.config.eval.bleu_tokenize))
        return results

    def head_stats(self) -> dict[str, list[float]]:
        """Per-head diagnostics on the first validation batch, per seed (``config.heads.track``)."""
        batch = self.task.dataset("validation", self.config.train.batch_size, train=False)[0]
        captured = self.capture(self.state, batch)  # each array (S, ...)
        per_seed = [track_summary(as_layers(unstack(captured, i))) for i in range(len(self.seeds))]
        return {k: [s[k] for s in per_seed] for k in per_seed[0]}

    def learned_heads(self, i: int) -> dict[str, dict[str, list[float]]]:
        """Seed i's per-head values of kernels that learn their shape (spans, alphas), ``{'<kind>/<layer>': ...}``;
        {} without such kernels (then nothing is fetched from the device)."""
        if not self.learns_shape:
            return {}
        seed = unstack({k: self.state[k] for k in ("params", "model_state")}, i)  # no optimizer state
        model = merge(self.graphdef, self.parallel.fetch(seed))
        return {layer: {k: v.tolist() for k, v in values.items()}
                for layer, values in learned_lib.per_head(model).items()}

    def learned_stats(self) -> dict[str, list[float]]:
        """Per seed, as log scalars: what the kernels learn per head; {} when no kernel learns its shape."""
        per_seed = [learned_lib.scalars(self.learned_heads(i)) for i in range(len(self.seeds))]
        return {k: [s[k] for s in per_seed] for k in per_seed[0]}

    def save(self, step: int) -> None:
        """Checkpoints each seed whose parameters are finite, so a NaN never overwrites its last good checkpoint."""
        for i, ckpt in enumerate(self.ckpts):
            state = unstack(self.state, i)
            finite = all(bool(np.isfinite(x).all()) for x in jax.tree.leaves(self.parallel.fetch(state["params"])))
            if finite and ckpt.latest_step() != step:
                ckpt.save(step, state)

    def compilations(self) -> dict[str, int]:
        """How many times each jitted function compiled in this process (one per padded shape bucket)."""
        fns = {"train_step": self.train_step, "eval_step": self.eval_step, "decode": self.decoders.get("test"),
               "decode_validation": self.decoders.get("validation")}
        return {k: f._cache_size() for k, f in fns.items() if f is not None}

    def close(self) -> None:
        """Closes the loggers and checkpointers, then releases the workdir locks (also after a failed start)."""
        try:
            for closable in [*self.loggers, *self.ckpts]:
                closable.close()
        finally:
            for lock in self.locks:
                lock.release()


def _decoders(graphdef: Any, max_len: int, model: nnx.Module, num_seeds: int, ecfg: Any) -> dict[str, Any]:
    """The jitted decoder per split of a generating model ({} otherwise): ``test`` decodes with
    ``eval.beam_size``; ``validation`` gets its own program only when ``eval.validation_beam_size`` differs (greedy
    validation keeps a beam-4 run's periodic evaluations at about a sixth of their decoding time, and reported test
    numbers still come from the beam), else it shares the test decoder."""
    if not model.GENERATES:
        return {}
    cached = supports_cached_decoding(model)

    def decoder(beam_size: int) -> Any:
        return compile_decode(graphdef, max_len, cached, num_seeds=num_seeds, beam_size=beam_size,
                              length_penalty=ecfg.length_penalty)
    test, validation = split_beam_size(ecfg, "test"), split_beam_size(ecfg, "validation")
    return {"test": decoder(test)} | ({"validation": decoder(validation)} if validation != test else {})


def _load_task(config: Any) -> Any:
    """The task's data (prepared the first time), checked against the batch size -- for tasks whose training split
    is only known once loaded (bible, sentiment without a limit, tfds:) -- or a one-line :class:`TaskError`."""
    name = config.task.name
    try:
        task = main_process_first(lambda: load_task(config.task, config.task.data_dir), "attn_lab_data")
    except ValueError as e:  # the data modules' own one-line errors (offline, no such dataset, ...)
        raise TaskError(str(e)) from e
    except Exception as e:  # noqa: BLE001 (preparation fails in many ways: network, disk, a bad source)
        raise TaskError(f"task '{name}': its data could not be loaded ({describe(e)})") from e
    batch, examples = config.train.batch_size, task.num_examples("train")
    if batch > examples:
        raise TaskError(f"train.batch_size={batch} exceeds the training split of task '{name}' ({examples} "
                        "examples); lower it")
    return task


def use_compile_cache(path: str | None) -> None:
    """Turns on JAX's persistent compilation cache in ``path`` ('' or None: leave it off), so a repeated sweep trial
    (same model, same shapes) loads its compiled steps from disk instead of compiling them again. JAX fixes the
    folder at the process's first compilation; a later, different ``path`` in the same process is not applied."""
    if path and jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)  # skip trivial programs


def _with_seed(config: Any, seed: int, num_seeds: int) -> Any:
    """A copy of ``config`` for one seed (a W&B display name gets a ``-seed<N>`` suffix when seeds share it)."""
    c = config.copy_and_resolve_references()
    c.seed = seed
    if c.wandb.name and num_seeds > 1:
        c.wandb.name = f"{c.wandb.name}-seed{seed}"
    return c


def _restore(ckpts: list[Checkpointer], states: list[dict], main: bool) -> tuple[list[dict], int]:
    """Each seed's state at the newest step every seed has an intact checkpoint of (seeds save together), or fresh.

    A step some seed cannot read (a truncated or missing file) is set aside as ``<step>.corrupt-<time>`` -- kept,
    never deleted -- with one line saying so, and the run resumes from the next older common step. When no common
    step can be read (all damaged, or a changed config: then every step fails) the run stops with one line and
    nothing is renamed.
    """
    have = [set(c.all_steps()) for c in ckpts]
    if not any(have):
        return states, 0
    common = sorted(set.intersection(*have), reverse=True)
    if not common:
        raise ResumeError(f"the seeds' checkpoints share no step ({[sorted(h) for h in have]}); "
                          "delete the checkpoints folders to start again")
    unreadable: list[tuple[Checkpointer, int, str]] = []
    for step in common:
        attempts = [c.try_restore(s, step) for c, s in zip(ckpts, states)]
        unreadable += [(c, step, reason) for c, (_, reason) in zip(ckpts, attempts) if reason]
        if not any(reason for _, reason in attempts):
            _set_aside(unreadable, step, main)
            return [state for state, _ in attempts], step
    found = "; ".join(f"step {s} in {c.directory}: {reason}" for c, s, reason in unreadable)
    raise CheckpointError(f"no checkpoint to resume from can be read ({found}): damaged, or written with another "
                          "config; move the checkpoints folder away to start again")


def _set_aside(unreadable: list[tuple[Checkpointer, int, str]], step: int, main: bool) -> None:
    """Renames the unreadable steps (process 0; the others list the folder again once it has) and says so."""
    for ckpt, bad, reason in unreadable:
        if main:
            name = ckpt.set_aside(bad)
            print(f"checkpoint step {bad} in {ckpt.directory} is unreadable ({reason}); set aside as {name}, "
                  f"resuming from step {step}", flush=True)
    if unreadable and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("attn_lab_set_aside")
        for ckpt, _, _ in unreadable:
            ckpt.reload()


def _init_from(path: str, states: list[dict], verbose: bool) -> list[dict]:
    """Each seed's state with every parameter that the finished run in ``path`` also has (same path, same shape)
    taken from it; parameters it lacks (e.g. new head gates) keep their initialization; the optimizer starts fresh.
    The source run is loaded once for all seeds, its model rebuilt from its own config."""
    source = traverse_util.flatten_dict(load_finished_run(path).state["params"])
    out = []
    for state in states:
        params = traverse_util.flatten_dict(state["params"])
        for p, v in params.items():
            if p in source and source[p].shape != v.shape:
                raise ValueError(f"train.init_from: parameter {'/'.join(map(str, p))} is {source[p].shape} in "
                                 f"{path}, {v.shape} here")
        out.append({**state, "params": traverse_util.unflatten_dict({p: source.get(p, v) for p, v in params.items()})})
    if verbose:
        new = sorted({"/".join(map(str, p[:2])) for p in params if p not in source})
        print(f"init_from {path}: {sum(p in source for p in params)} of {len(params)} parameter arrays loaded"
              + (f"; new: {', '.join(new)}" if new else ""), flush=True)
    return out


def _eval_history(workdir: str) -> tuple[dict[str, float], dict[str, float]]:
    """(last, best) validation value of each eval metric, read back from metrics.jsonl (so resumes count)."""
    last: dict[str, float] = {}
    best: dict[str, float] = {}
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):  # only the main process writes metrics
        return last, best
    with open(path) as f:
        for line in f:
            for key, value in json.loads(line).items():
                if key.startswith("eval/"):
                    name = key[len("eval/"):]
                    better = min if name == "loss" else max
                    last[name] = value
                    best[name] = value if name not in best else better(best[name], value)
    return last, best


@dataclasses.dataclass
class LoopStats:
    """What one call of :func:`_train_loop` measured in this process (a resumed run measures only its own part).

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

    def sync(self, run: Run) -> None:
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


def _log_window(run: Run, window: _Window, bar: tqdm.tqdm) -> None:
    """Logs the window's last step's metrics (as an unbuffered loop logged them) and its speed: steps/s and tokens/s
    over all of the window's steps."""
    last, seconds = window.fetched[-1], max(window.seconds, 1e-9)
    tokens = np.sum([np.asarray(m["tokens"]) for m in window.fetched], axis=0)  # (S,)
    rates = {"train/steps_per_sec": np.full(len(run.seeds), len(window.steps) / seconds),
             "train/tokens_per_sec": tokens / seconds}
    run.log(window.steps[-1], {f"train/{k}": v for k, v in last.items() if k != "tokens"} | rates)
    bar.set_postfix(loss=f"{np.mean(last['loss']):.3f}", steps_per_s=f"{len(window.steps) / seconds:.1f}")


def _batch_reader(run: Run, datasets: Sequence[Any]) -> tuple[Callable[[int], dict], Callable[[dict], dict]]:
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


def _train_loop(run: Run, stop_after: int | None, prefetch: int = 2) -> LoopStats:
    """Steps from the restored step to ``num_steps`` (or ``stop_after``), never waiting on the device between syncs.

    Steps are dispatched asynchronously (the state is donated, so each step updates it in place); the next
    ``prefetch`` batches are read and placed by a background thread. The host waits only at a sync -- log, eval and
    checkpoint steps -- where the window's metrics are fetched together and a non-finite loss stops the run.
    """
    tcfg = run.config.train
    datasets = [run.task.dataset("train", tcfg.batch_size, train=True, seed=s, shard=run.parallel.shard)
                for s in run.seeds]  # this process's rows of each batch
    end = tcfg.num_steps if stop_after is None else min(stop_after, tcfg.num_steps)
    bar = tqdm.tqdm(total=tcfg.num_steps, initial=run.start_step, disable=not run.main, mininterval=1.0,
                    desc="train", dynamic_ncols=True)
    stats, window, first_window = LoopStats(run.start_step), _Window(), True
    read, place = _batch_reader(run, datasets)
    # The bar closes on errors too, so its last redraw comes before the error line, not after it at exit.
    with bar, Prefetcher(read, range(run.start_step + 1, end + 1), depth=prefetch) as batches:
        for step, batch in batches:
            called = time.perf_counter()
            run.state, m = run.train_step(run.state, place(batch))
            if step == run.start_step + 1:
                stats.compile_seconds = time.perf_counter() - called
            window.add(step, m)
            stats.step = step
            bar.update(1)
            log = step % tcfg.log_every == 0 or step == end
            evaluate = step % tcfg.eval_every == 0 or step == tcfg.num_steps
            save = step % tcfg.checkpoint_every == 0 or step == end
            if not (log or evaluate or save):
                continue
            window.sync(run)
            window.pause()
            if log:
                _log_window(run, window, bar)
                stats.train_seconds += window.seconds
                if not first_window:
                    stats.steady_steps += len(window.steps)
                    stats.steady_seconds += window.seconds
                window, first_window = _Window(), False
            if evaluate:
                scores = run.evaluate("validation")
                run.log(step, {f"eval/{k}": [r[k] for r in scores] for k in scores[0]} | run.learned_stats())
                if run.capture is not None:
                    run.log(step, run.head_stats())
            if save:
                run.save(step)
            window.resume()
    return stats


def train_and_evaluate(config: Any, workdir: str, *, stop_after: int | None = None) -> dict:
    """Trains ``config`` in ``workdir`` (resuming from its last checkpoint) and writes results.json.

    Args:
      config: a ConfigDict shaped like :func:`attn_lab.train.config.base_config`.
      workdir: run folder; created if missing.
      stop_after: stop (with a checkpoint) after this step, as an interruption would; for resume tests.

    Returns:
      The results dict (also in ``workdir/results.json`` when training reached ``num_steps``); for a run that had
      already finished, its results.json, untouched.
    """
    return train_seeds(config, [workdir], [int(config.seed)], stop_after=stop_after)[0]


def train_seeds(config: Any, workdirs: Sequence[str], seeds: Sequence[int], *,
                stop_after: int | None = None) -> list[dict]:
    """Trains ``config`` once per seed, all seeds in one vmapped program; seed i writes into ``workdirs[i]``.

    Each folder ends up as a separate run with that seed would leave it (metrics.jsonl, W&B run, checkpoints,
    results.json); results also record ``seeds_vectorized``, the number of seeds that shared the program. A folder
    whose run already finished (it has results.json) is left untouched -- no file written, no W&B run started -- and
    its results.json is returned: what a finished run wrote is never rewritten by a rerun.
    """
    validate_config(config)
    results = [finished_results(w) for w in workdirs]
    for workdir, done in zip(workdirs, results):
        if done is not None and jax.process_index() == 0:
            print(_finished_line(workdir, done["steps"], config.train.num_steps), flush=True)
    todo = [i for i, done in enumerate(results) if done is None]
    if todo:
        trained = _train(config, [workdirs[i] for i in todo], [seeds[i] for i in todo], stop_after)
        for i, result in zip(todo, trained):
            results[i] = result
    return results


def _finished_line(workdir: str, steps: int, num_steps: int) -> str:
    """What a rerun of a finished run says; a longer ``train.num_steps`` does not extend it (that would rewrite its
    results), and the line says how to train on."""
    more = (f" (train.num_steps={num_steps} here: to train on, move its {RESULTS_FILE} away and rerun)"
            if num_steps != steps else "")
    return f"{workdir}: finished at step {steps} ({RESULTS_FILE}); nothing to do{more}"


def reevaluate_seeds(config: Any, workdirs: Sequence[str], seeds: Sequence[int]) -> list[str]:
    """Evaluates each run's newest intact checkpoint again (validation and test, with this config's evaluation
    settings) into ``results.reeval-<time>.json`` beside its results.json; writes nothing else -- no metrics.jsonl
    line, no W&B run, no results.json. Returns the files written.

    Raises:
      RunError: a folder has no checkpoint.
    """
    validate_config(config)
    for w in workdirs:
        if not os.path.isdir(os.path.join(w, "checkpoints")):
            raise RunError(f"{w} has no checkpoints to re-evaluate")
    use_compile_cache(config.get("compile_cache"))
    run = Run(config, workdirs, seeds, log=False)
    try:
        if not run.start_step:
            raise RunError(f"{run.workdirs[0]}/checkpoints holds no checkpoint to re-evaluate")
        scores = {split: run.evaluate(split) for split in ("validation", "test")}
        stamp = time.strftime("%Y%m%d-%H%M%S")
        paths = [_new_file(os.path.join(w, f"results.reeval-{stamp}"), ".json") for w in run.workdirs]
        for i, (w, path) in enumerate(zip(run.workdirs, paths)):
            record = {"step": run.start_step, "finished": os.path.exists(os.path.join(w, RESULTS_FILE)),
                      "final": {split: scores[split][i] for split in scores}, "reevaluated_at": stamp,
                      "environment": run.environment, "config": run.configs[i].to_dict()}
            if run.main:
                write_json_atomic(path, record)
        return paths
    finally:
        run.close()


def _new_file(stem: str, suffix: str) -> str:
    """``stem + suffix``, or ``stem-2 + suffix``, ...: a name no earlier re-evaluation holds."""
    path, n = stem + suffix, 1
    while os.path.exists(path):
        n += 1
        path = f"{stem}-{n}{suffix}"
    return path


def _train(config: Any, workdirs: list[str], seeds: list[int], stop_after: int | None) -> list[dict]:
    """:func:`train_seeds` for folders whose run has not finished."""
    use_compile_cache(config.get("compile_cache"))
    start = time.time()
    run = Run(config, workdirs, seeds)
    try:
        for logger in run.loggers:
            logger.summary({"num_params": run.num_params})
        if run.main:
            for w, c in zip(run.workdirs, run.configs):
                write_json_atomic(os.path.join(w, "config.json"), c.to_dict())
            resumed = f", resuming at step {run.start_step}" if run.start_step else ""
            vectorized = f", seeds {run.seeds} in one program" if len(run.seeds) > 1 else ""
            print(f"{config.task.name}: {run.task.kind} model, {run.num_params:,} parameters{vectorized}{resumed}",
                  flush=True)
            print(run.dispatch, flush=True)
        stats = _train_loop(run, stop_after)
        step = stats.step
        if step < config.train.num_steps:
            return [{"step": step, "finished": False} for _ in run.seeds]
        trainings, tested_from = _training_records(run, stats, start), time.time()
        tests = run.evaluate("test")
        return [_finish(run, i, step, test, trainings[i] | {"environment": run.environment}, tested_from)
                for i, test in enumerate(tests)]
    finally:
        run.close()


def _training_records(run: Run, stats: LoopStats, start: float) -> list[dict]:
    """Per seed, what training measured: written to training.json (before the final test) by a process that trained
    up to the last step; read back by one that only finishes the final test, because the process that trained was
    stopped during it -- so results.json gets the original run's speed, not this process's (which trained nothing)."""
    if run.start_step < stats.step:
        record = {"num_params": run.num_params, "steps": stats.step, "compilations": run.compilations(),
                  "wall_time_sec": time.time() - start, **_speed(stats, stats.step - run.start_step),
                  "seeds_vectorized": len(run.seeds)}
        if run.main:
            for w in run.workdirs:
                write_json_atomic(os.path.join(w, TRAINING_FILE), record)
        return [record] * len(run.seeds)
    return [_recorded_training(run, w, stats.step) for w in run.workdirs]


def _recorded_training(run: Run, workdir: str, step: int) -> dict:
    """training.json of a run whose final test was interrupted (``final_test_resumed``); speed fields None when the
    process was stopped before writing it (between its last checkpoint and the test)."""
    try:
        record = read_record(workdir, TRAINING_FILE)
    except ValueError:
        record = None
    unknown = dict.fromkeys(("compilations", "wall_time_sec", "steps_per_sec", "steady_steps_per_sec",
                             "compile_seconds", "train_time_sec"))
    return {**unknown, "num_params": run.num_params, "steps": step, "seeds_vectorized": len(run.seeds),
            **(record or {}), "final_test_resumed": True}


def _speed(stats: LoopStats, steps: int) -> dict[str, float | None]:
    """Speed fields of results.json, all over this process's part of the run (the part after a resume).

    ``steps_per_sec``: every step over all training seconds, compilation and warm-up included (the tables' speed
    column, kept comparable with older runs); ``steady_steps_per_sec``: the steps after the first log window over
    their training seconds (None when the run had a single log window); ``compile_seconds``: see
    :class:`LoopStats`; ``train_time_sec``: the training seconds (no evaluation, logging or checkpoints).
    """
    steady = stats.steady_steps / stats.steady_seconds if stats.steady_steps and stats.steady_seconds > 0 else None
    return {"steps_per_sec": steps / max(stats.train_seconds, 1e-9), "steady_steps_per_sec": steady,
            "compile_seconds": stats.compile_seconds, "train_time_sec": stats.train_seconds}


def _finish(run: Run, i: int, step: int, test: dict[str, float], common: dict, tested_from: float) -> dict:
    """Seed i's results: logged to its W&B run and written atomically to its results.json.

    ``wall_time_sec``: the training wall time of ``common`` plus this process's test. A test line already in
    metrics.jsonl (the process that trained was stopped after logging it) is not logged twice.
    """
    last, best = _eval_history(run.workdirs[i])
    wall = common["wall_time_sec"]
    results = {"final": {"validation": last, "test": test}, "best": best, **common,
               "wall_time_sec": None if wall is None else wall + time.time() - tested_from,
               "config": run.configs[i].to_dict()}
    gates = binary_gates(run.parallel.fetch(unstack(run.state, i)["params"]), run.config.heads.gates.target)
    if gates is not None:  # which heads the binarized test-time gates keep
        total = sum(np.size(g) for g in gates.values())
        results["gates"] = {"binary": gates, "kept": int(sum(np.sum(g) for g in gates.values())), "total": total}
    learned = run.learned_heads(i)
    if learned:  # per-head spans / alphas of kernels that learn their shape
        results["learned"] = learned
    if not _test_logged(run.workdirs[i], step):
        run.loggers[i].log(step, {f"test/{k}": v for k, v in test.items()})
    run.loggers[i].summary({"final/" + k: v for k, v in test.items()})
    if run.main:
        write_json_atomic(os.path.join(run.workdirs[i], RESULTS_FILE), results)
    return results


def _test_logged(workdir: str, step: int) -> bool:
    """Whether metrics.jsonl already has a ``test/`` line at ``step``."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.exists(path):
        return False
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:  # a line torn by a kill
                continue
            if record.get("step") == step and any(k.startswith("test/") for k in record):
                return True
    return False
