"""The one trainer: config -> trained model, metrics.jsonl, W&B run, checkpoints and results.json.

Resumable by construction: the batch for step ``s`` is ``dataset[s - 1]`` (random access) and dropout keys are
``fold_in(seed, s)``, so restoring the step-``s`` checkpoint replays exactly what an uninterrupted run does.

Asynchronous: the loop never waits on the device between log, eval and checkpoint steps (metrics stay on the device
until then, batches are prefetched by a background thread, the state is donated); see :mod:`attn_lab.train.loop`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx, traverse_util

from attn_lab import results
from attn_lab.attention.dispatch import describe_dispatch
from attn_lab.checks import RunError, describe
from attn_lab.environment import environment
from attn_lab.models import build_model, count_params
from attn_lab.models.sites import decoding_attentions
from attn_lab.train import identity
from attn_lab.train import learned as learned_lib
from attn_lab.train import metrics as metrics_lib
from attn_lab.train.announce import announce
from attn_lab.train.capture import as_layers, capture_step, track_summary
from attn_lab.train.checkpoint import Checkpointer, restore_common
from attn_lab.train.decode import split_decoders
from attn_lab.train.finish import finish, training_records
from attn_lab.train.logging import MetricLogger
from attn_lab.train.loop import train_loop
from attn_lab.train.parallel import DataParallel
from attn_lab.train.restore import check_warm_starts, warm_starts
from attn_lab.train.sample import continuations
from attn_lab.train.seeds import seed_map, stack, unstack
from attn_lab.train.spec import RunSpec, as_spec
from attn_lab.train.state import merge, model_state
from attn_lab.train.steps import compile_steps, init_state, make_optimizer
from attn_lab.train.task_data import TaskError, load_run_task
from attn_lab.train.workdir import lock_workdirs

__all__ = ["Run", "RunSpec", "TaskError", "reevaluate_seeds", "train_and_evaluate", "train_seeds"]


class FinishedMeanwhile(RunError):
    """A folder's run finished (another process wrote its results.json) between the check and the lock."""


class Run:
    """One config trained for one or more seeds: task, compiled steps, state, loggers and checkpointers.

    The state has a leading seed axis; with several seeds every step is ``jax.vmap``-ed over it (one compiled
    program for all seeds, see :mod:`attn_lab.train.seeds`), and each seed still gets its own folder with
    metrics.jsonl, W&B run, checkpoints and results.json, exactly as a separate run writes them.
    """

    def __init__(self, spec: RunSpec | Any, workdirs: str | Sequence[str], seeds: Sequence[int] | None = None, *,
                 log: bool = True):
        """``spec``: a :class:`~attn_lab.train.spec.RunSpec` (a config is resolved into one for ``seeds``).
        ``log=False``: no metrics.jsonl or W&B run is opened (a re-evaluation writes neither). With ``log``
        (training), each folder's identity is checked again once its lock is held: a run another process finished
        meanwhile raises :class:`FinishedMeanwhile` before anything is written."""
        self.spec = spec = as_spec(spec, seeds)
        self.workdirs = [workdirs] if isinstance(workdirs, str) else list(workdirs)
        self.seeds, self.configs, self.config = list(spec.seeds), list(spec.per_seed), spec.config
        self.main = jax.process_index() == 0
        self.parallel = DataParallel(spec.config.parallel.shard_params)
        self.parallel.check_batch_size(spec.config.train.batch_size)
        self.task = load_run_task(spec.config)
        if spec.config.train.init_from and not any(identity.has_checkpoint(w) for w in self.workdirs):
            check_warm_starts(self.configs, self._shapes())
        # Folders are made (and locked) only once the data loaded and a warm start's shapes fit: a failure leaves
        # nothing behind. With several processes on one shared folder, process 0 holds the lock for all of them.
        self.locks = lock_workdirs(self.workdirs) if self.main else []
        self.ckpts, self.loggers = [], []
        try:
            if log and self.main:
                _check_identities(self.workdirs, self.configs, under_lock=True)
            self._build(spec, log)
        except BaseException:
            self.close()
            raise

    def _model(self, seed: int) -> nnx.Module:
        config = self.config
        max_len = max(self.task.max_input_length, self.task.max_target_length or 0) + 1
        return build_model(config.model, kind=self.task.kind, vocab_size=self.task.vocab.size, max_len=max_len,
                           num_classes=self.task.num_classes, seed=seed, gates=config.heads.gates)

    def _shapes(self) -> dict[tuple, tuple]:
        """This model's flat parameter shapes, built abstractly (nothing is computed or written), so a warm-start
        source of another size is one line before the folder exists."""
        abstract = nnx.eval_shape(lambda: self._model(0))
        return {p: v.shape for p, v in traverse_util.flatten_dict(
            nnx.to_pure_dict(nnx.state(abstract, nnx.Param))).items()}

    def _build(self, spec: RunSpec, log: bool) -> None:
        """Models, compiled steps, the restored (or initialized) state and the loggers."""
        config, models = spec.config, [self._model(s) for s in self.seeds]
        self.num_params = count_params(models[0])
        self.learns_shape = bool(learned_lib.per_head(models[0]))  # some kernel learns spans / alphas
        self.dispatch = describe_dispatch(models[0])  # which implementation each attention kind gets, for the log
        self.graphdef = nnx.split(models[0], nnx.Param, ...)[0]
        tx, n = make_optimizer(config.train, config.heads.gates), len(self.seeds)
        self.train_step, self.eval_step = compile_steps(self.graphdef, tx, config.train.label_smoothing, num_seeds=n,
                                                        objectives=spec.objectives,
                                                        num_steps=config.train.num_steps)
        self.decoders = split_decoders(self.graphdef, self.task.max_target_length, models[0], n, config.eval)
        self.example: list[dict] | None = None  # per seed, the test split's first example decoded (evaluate)
        self.uncached = sorted({a.kernel.name for a in decoding_attentions(models[0]) if not a.kernel.supports_decode}
                               ) if models[0].GENERATES else []  # kernels that make generation re-run the prefix
        self.capture = (jax.jit(seed_map(capture_step(self.graphdef), n, (0, None)))
                        if config.heads.track else None)
        states = [init_state(nnx.to_pure_dict(nnx.state(m, nnx.Param)), model_state(m), tx, s)
                  for m, s in zip(models, self.seeds)]
        self.ckpts = [Checkpointer(os.path.join(w, "checkpoints")) for w in self.workdirs]
        states, self.start_step = restore_common(self.ckpts, states, self.main)
        if config.train.init_from and not self.start_step:
            states = warm_starts(self.configs, states, self.main)
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
        examples = 0  # sequences (or examples) scored: what a rate at a floor or ceiling is counted in
        batches = self.task.dataset(split, tcfg.batch_size, train=False, shard=self.parallel.shard)  # this host's rows
        for i, batch in enumerate(batches):
            if tcfg.max_eval_batches and i >= tcfg.max_eval_batches:
                break
            placed = self.parallel.batch(batch)
            step_sums = self.parallel.fetch(self.eval_step(state, placed))
            targets = np.asarray(batch["targets"])
            examples += int(np.any(targets != 0, axis=-1).sum()) if targets.ndim > 1 else 0
            sums = {k: sums[k] + np.asarray(v, np.float64) for k, v in step_sums.items()}
            if decode is not None:
                ids = self.parallel.fetch(decode(state, placed["inputs"]))  # (S, B, T)
                for seed_hyps, rows in zip(hyps, ids):
                    seed_hyps += [self.task.decode(row) for row in rows]
        examples = self.parallel.total(examples)  # this host counted its own rows
        results = [metrics_lib.summarize({k: float(v[i]) for k, v in sums.items()}) for i in range(n)]
        if decode is not None:
            refs = self.task.references(split)[: len(hyps[0])]
            if split == "test" and refs:  # the summary's decoded example: the split's first, per seed
                self.example = [{"source": self.task.source_text(split, 0), "reference": refs[0], "ours": h[0]}
                                for h in hyps]
            for result, seed_hyps in zip(results, hyps):
                result.update(metrics_lib.translation_scores(seed_hyps[: len(refs)], refs,
                                                             self.config.eval.bleu_tokenize))
        if split == "test":  # what each rate was measured on, in examples: a verdict at a floor or ceiling needs it
            for i, result in enumerate(results):  # (positions in one sequence are not independent trials)
                result["accuracy_count"] = examples or int(sums["weight"][i])  # a classifier's weight is examples
                if "exact_match" in result:
                    result["exact_match_count"] = len(refs)
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


def use_compile_cache(path: str | None) -> None:
    """Turns on JAX's persistent compilation cache in ``path`` ('' or None: leave it off), so a repeated sweep trial
    (same model, same shapes) loads its compiled steps from disk instead of compiling them again. JAX fixes the
    folder at the process's first compilation; a later, different ``path`` in the same process is not applied."""
    if path and jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)  # skip trivial programs


def train_and_evaluate(config: RunSpec | Any, workdir: str, *, stop_after: int | None = None,
                       allow_unfinished: bool = False) -> dict:
    """Trains ``config`` in ``workdir`` (resuming from its last checkpoint) and writes results.json.

    Args:
      config: a :class:`RunSpec` of one seed, or a ConfigDict shaped like
        :func:`attn_lab.train.config.base_config` (resolved here, for ``config.seed``).
      workdir: run folder; created if missing.
      stop_after: stop (with a checkpoint) after this step, as an interruption would; for resume tests.
      allow_unfinished: ``train.init_from`` may name a run that has not finished (see :func:`train_seeds`).

    Returns:
      The results dict (also in ``workdir/results.json`` when training reached ``num_steps``); for a run that had
      already finished, its results.json, untouched.
    """
    return train_seeds(config, [workdir], stop_after=stop_after, allow_unfinished=allow_unfinished)[0]


def train_seeds(config: RunSpec | Any, workdirs: Sequence[str], seeds: Sequence[int] | None = None, *,
                stop_after: int | None = None, allow_unfinished: bool = False) -> list[dict]:
    """Trains the run once per seed, all seeds in one vmapped program; seed i writes into ``workdirs[i]``.

    ``config``: a :class:`RunSpec` (as the command resolves it, once) or a ConfigDict, resolved here for ``seeds``
    (default ``config.seed``). Each folder ends up as a separate run with that seed would leave it (metrics.jsonl,
    W&B run, checkpoints, results.json); results also record ``seeds_vectorized``, the number of seeds that shared
    the program. A folder whose run already finished (it has results.json) is left untouched -- no file written, no
    W&B run started -- and its results.json is returned: what a finished run wrote is never rewritten by a rerun. A
    folder trained with another config (:mod:`attn_lab.train.identity`) stops the run in one line.
    ``train.init_from`` must name a finished run unless ``allow_unfinished`` (then its newest checkpoint is used,
    and named).
    """
    spec = as_spec(config, seeds)
    while True:
        done = _check_identities(workdirs, spec.per_seed)
        for workdir, record in zip(workdirs, done):
            if record is not None and jax.process_index() == 0:
                print(f"{workdir}: finished at step {results.steps(record)} ({results.RESULTS_FILE}); nothing to do",
                      flush=True)
        todo = [i for i, record in enumerate(done) if record is None]
        if not todo:
            return done
        if spec.config.train.init_from and not any(identity.has_checkpoint(workdirs[i]) for i in todo):
            for source in dict.fromkeys(spec.per_seed[i].train.init_from for i in todo):  # per seed with {seed}
                identity.check_finished(source, f"train.init_from='{source}'", allow_unfinished)
        try:
            trained = _train(spec.only(todo), [workdirs[i] for i in todo], stop_after)
        except FinishedMeanwhile:  # another process finished one of them while this one loaded: check again
            continue
        for i, record in zip(todo, trained):
            done[i] = record
        return done


def _check_identities(workdirs: Sequence[str], configs: Sequence[Any], under_lock: bool = False) -> list:
    """Per folder: its results.json when it finished with this config, None when it is new or resumes with it;
    a one-line RunError when it was trained with another config (see :mod:`attn_lab.train.identity`). ``under_lock``:
    a finished one raises :class:`FinishedMeanwhile` (it finished after the first check)."""
    done = [identity.check_same_run(w, c.to_dict()) for w, c in zip(workdirs, configs)]
    finished = [w for w, record in zip(workdirs, done) if record is not None]
    if under_lock and finished:
        raise FinishedMeanwhile(f"{finished[0]} finished meanwhile")
    return done


def reevaluate_seeds(config: RunSpec | Any, workdirs: Sequence[str], seeds: Sequence[int] | None = None) -> list[str]:
    """Evaluates each run's newest intact checkpoint again (validation and test, with this config's evaluation
    settings) into ``results.reeval-<time>.json`` beside its results.json; writes nothing else -- no metrics.jsonl
    line, no W&B run, no results.json. Returns the files written.

    Raises:
      RunError: a folder has no checkpoint.
    """
    spec = as_spec(config, seeds)
    for w in workdirs:
        if not os.path.isdir(os.path.join(w, "checkpoints")):
            raise RunError(f"{w} has no checkpoints to re-evaluate")
    use_compile_cache(spec.config.get("compile_cache"))
    run = Run(spec, workdirs, log=False)
    try:
        if not run.start_step:
            raise RunError(f"{run.workdirs[0]}/checkpoints holds no checkpoint to re-evaluate")
        scores = {split: run.evaluate(split) for split in ("validation", "test")}
        stamp = results.stamp()
        paths = [results.reevaluation_path(w, stamp) for w in run.workdirs]  # the same names on every process
        for i, path in enumerate(paths):
            if run.main:
                results.write_reevaluation(path, run.start_step, {k: v[i] for k, v in scores.items()}, stamp,
                                           run.environment, run.configs[i].to_dict())
        return paths
    finally:
        run.close()


def _train(spec: RunSpec, workdirs: list[str], stop_after: int | None) -> list[dict]:
    """:func:`train_seeds` for folders whose run has not finished."""
    use_compile_cache(spec.config.get("compile_cache"))
    start = time.time()
    run = Run(spec, workdirs)
    try:
        announce(run)
        stats = train_loop(run, stop_after)
        if stats.step < spec.config.train.num_steps:
            return [{"step": stats.step, "finished": False} for _ in run.seeds]
        trainings, tested_from = training_records(run, stats, start), time.time()
        tests = run.evaluate("test")
        run.example = run.example or _continuations(run)
        return [finish(run, i, stats.step, test, trainings[i] | {"environment": run.environment}, tested_from)
                for i, test in enumerate(tests)]
    finally:
        run.close()


def _continuations(run: Run) -> list[dict] | None:
    """A language model's greedy continuations for the summary; one that fails is a note (the scores stand)."""
    try:
        return continuations(run)
    except Exception as e:  # noqa: BLE001 (an example is a courtesy: the run's numbers are written either way)
        print(f"note: no sampled continuation for the summary ({describe(e)})", flush=True)
        return None
