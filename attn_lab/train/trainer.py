"""The one trainer: config -> trained model, metrics.jsonl, W&B run, checkpoints and results.json.

Resumable by construction: the batch for step ``s`` is ``dataset[s]`` (random access) and dropout keys are
``fold_in(seed, s)``, so restoring the step-``s`` checkpoint replays exactly what an uninterrupted run does.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import numpy as np
import tqdm
from flax import nnx

from attn_lab.data import load_task
from attn_lab.models import build_model, count_params
from attn_lab.train import metrics as metrics_lib
from attn_lab.train.checkpoint import Checkpointer
from attn_lab.train.config import validate_config
from attn_lab.train.decode import compile_decode, supports_cached_decoding
from attn_lab.train.logging import METRICS_FILE, MetricLogger, write_json_atomic
from attn_lab.train.steps import compile_steps, init_state, make_optimizer, model_state


class Run:
    """Everything one training run holds: task, compiled steps, state, logger and checkpointer."""

    def __init__(self, config: Any, workdir: str):
        self.config, self.workdir = config, workdir
        self.main = jax.process_index() == 0
        self.task = load_task(config.task, config.task.data_dir)
        max_len = max(self.task.max_input_length, self.task.max_target_length or 0) + 1
        model = build_model(config.model, kind=self.task.kind, vocab_size=self.task.vocab.size, max_len=max_len,
                            num_classes=self.task.num_classes, seed=config.seed)
        self.num_params = count_params(model)
        self.graphdef, params, _ = nnx.split(model, nnx.Param, ...)
        tx = make_optimizer(config.train)
        self.train_step, self.eval_step = compile_steps(self.graphdef, tx, self.task.kind,
                                                        config.train.label_smoothing)
        self.decode = (compile_decode(self.graphdef, self.task.max_target_length, supports_cached_decoding(model))
                       if self.task.kind == "translation" else None)
        self.state = init_state(nnx.to_pure_dict(params), model_state(model), tx, config.seed)
        self.ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
        if self.ckpt.latest_step() is not None:
            self.state = self.ckpt.restore(self.state)
        self.start_step = int(self.state["step"])
        self.logger = MetricLogger(workdir, config.to_dict(), mode=config.wandb.mode, project=config.wandb.project,
                                   group=config.wandb.group, tags=tuple(config.wandb.tags), name=config.wandb.name,
                                   resume_step=self.start_step, is_main_process=self.main)

    def evaluate(self, split: str) -> dict[str, float]:
        """Loss and accuracy on ``split``; translation adds greedy-decoded BLEU and exact match."""
        tcfg, state = self.config.train, self.state
        sums, hyps = {"loss": 0.0, "correct": 0.0, "weight": 0.0}, []
        for i, batch in enumerate(self.task.dataset(split, tcfg.batch_size, train=False)):
            if tcfg.max_eval_batches and i >= tcfg.max_eval_batches:
                break
            sums = {k: sums[k] + float(v) for k, v in self.eval_step(state, batch).items()}
            if self.decode is not None:
                hyps += [self.task.decode(row) for row in np.asarray(self.decode(state, batch["inputs"]))]
        result = metrics_lib.summarize(sums)
        if self.decode is not None:
            refs = self.task.references(split)[: len(hyps)]
            result.update(metrics_lib.translation_scores(hyps[: len(refs)], refs, self.config.eval.bleu_tokenize))
        return result

    def save(self, step: int) -> None:
        """Checkpoints only finite parameters, so a NaN never overwrites the last good checkpoint."""
        finite = all(bool(np.isfinite(x).all()) for x in jax.tree.leaves(self.state["params"]))
        if finite and self.ckpt.latest_step() != step:
            self.ckpt.save(step, self.state)

    def compilations(self) -> dict[str, int]:
        """How many times each jitted function compiled in this process (one per padded shape bucket)."""
        fns = {"train_step": self.train_step, "eval_step": self.eval_step, "decode": self.decode}
        return {k: f._cache_size() for k, f in fns.items() if f is not None}

    def close(self) -> None:
        self.logger.close()
        self.ckpt.close()


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


def _train_loop(run: Run, stop_after: int | None) -> tuple[int, float]:
    """Steps from the restored step to ``num_steps`` (or ``stop_after``); returns (last step, train seconds)."""
    tcfg = run.config.train
    dataset = run.task.dataset("train", tcfg.batch_size, train=True, seed=run.config.seed)
    end = tcfg.num_steps if stop_after is None else min(stop_after, tcfg.num_steps)
    bar = tqdm.tqdm(total=tcfg.num_steps, initial=run.start_step, disable=not run.main, mininterval=1.0,
                    desc="train", dynamic_ncols=True)
    train_time, window_start, window_tokens, step = 0.0, time.time(), 0.0, run.start_step
    for step in range(run.start_step + 1, end + 1):
        run.state, m = run.train_step(run.state, dataset[step - 1])
        loss = float(m["loss"])
        if not np.isfinite(loss):
            raise FloatingPointError(f"non-finite loss ({loss}) at step {step}; stopped, last good checkpoint "
                                     f"is step {run.ckpt.latest_step()} in {run.workdir}/checkpoints")
        window_tokens += float(m["tokens"])
        bar.update(1)
        if step % tcfg.log_every == 0 or step == end:
            elapsed = time.time() - window_start
            steps = step - max(run.start_step, step - tcfg.log_every)
            train_time += elapsed
            rates = {"train/steps_per_sec": steps / elapsed, "train/tokens_per_sec": window_tokens / elapsed}
            run.logger.log(step, {f"train/{k}": float(v) for k, v in m.items() if k != "tokens"} | rates)
            bar.set_postfix(loss=f"{loss:.3f}", steps_per_s=f"{rates['train/steps_per_sec']:.1f}")
            window_start, window_tokens = time.time(), 0.0
        if step % tcfg.eval_every == 0 or step == tcfg.num_steps:
            run.logger.log(step, {f"eval/{k}": v for k, v in run.evaluate("validation").items()})
            window_start = time.time()
        if step % tcfg.checkpoint_every == 0 or step == end:
            run.save(step)
            window_start = time.time()
    bar.close()
    return step, train_time


def train_and_evaluate(config: Any, workdir: str, *, stop_after: int | None = None) -> dict:
    """Trains ``config`` in ``workdir`` (resuming from its last checkpoint) and writes results.json.

    Args:
      config: a ConfigDict shaped like :func:`attn_lab.train.config.base_config`.
      workdir: run folder; created if missing.
      stop_after: stop (with a checkpoint) after this step, as an interruption would; for resume tests.

    Returns:
      The results dict (also in ``workdir/results.json`` when training reached ``num_steps``).
    """
    validate_config(config)
    os.makedirs(workdir, exist_ok=True)
    start = time.time()
    run = Run(config, workdir)
    try:
        run.logger.summary({"num_params": run.num_params})
        if run.main:
            write_json_atomic(os.path.join(workdir, "config.json"), config.to_dict())
            resumed = f", resuming at step {run.start_step}" if run.start_step else ""
            print(f"{config.task.name}: {run.task.kind} model, {run.num_params:,} parameters{resumed}", flush=True)
        step, train_time = _train_loop(run, stop_after)
        if step < config.train.num_steps:
            return {"step": step, "finished": False}
        last, best = _eval_history(workdir)
        final = {"validation": last, "test": run.evaluate("test")}
        done = step - run.start_step
        results = {"final": final, "best": best, "num_params": run.num_params, "steps": step,
                   "compilations": run.compilations(), "wall_time_sec": time.time() - start,
                   "steps_per_sec": done / max(train_time, 1e-9), "config": config.to_dict()}
        run.logger.log(step, {f"test/{k}": v for k, v in final["test"].items()})
        run.logger.summary({"final/" + k: v for k, v in final["test"].items()})
        if run.main:
            write_json_atomic(os.path.join(workdir, "results.json"), results)
        return results
    finally:
        run.close()
