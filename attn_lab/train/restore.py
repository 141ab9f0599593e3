"""A finished run, restored: its config, task, model graph and latest checkpointed state (no logger, no W&B); and
warm starts from one (``train.init_from``: :func:`warm_start`).

In ``train`` because training starts from one (``train.init_from``) and the head analysis of finished runs
(:mod:`attn_lab.analysis`) loads them too; analysis imports it from here, so imports only point down.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx, traverse_util

from attn_lab.checks import RunError
from attn_lab.data import Task, load_task
from attn_lab.models import build_model, model_class, supports_cached_decoding
from attn_lab.results import read_config
from attn_lab.train import identity, uptrain
from attn_lab.train.checkpoint import Checkpointer, restore_common
from attn_lab.train.decode import compile_decode, split_beam_size
from attn_lab.train.identity import checkpoint_steps
from attn_lab.train.metrics import translation_scores
from attn_lab.train.state import merge, model_state
from attn_lab.train.steps import init_state, make_optimizer


@dataclasses.dataclass
class FinishedRun:
    """A restored run: what training wrote (config, latest state) plus the task and graph to use them."""

    config: ml_collections.ConfigDict
    task: Task
    graphdef: Any
    state: dict
    step: int

    @property
    def kind(self) -> str:
        return self.task.kind

    @property
    def generates(self) -> bool:
        """Whether the model decodes text (then BLEU and exact match score it, not only accuracy)."""
        return model_class(self.kind, self.config.model.get("name")).GENERATES

    def decode_scorer(self, batches: list[dict], split: str, metric: str) -> Callable:
        """A :data:`~attn_lab.analysis.importance.Scorer` that decodes ``batches`` (the first batches of ``split``)
        under head masks as the run's evaluation of that split did (``eval.beam_size``, or for validation
        ``eval.validation_beam_size`` when set; ``eval.length_penalty``; runs from before those keys decoded
        greedily): per-example exact match, and the corpus value ``metric`` ('bleu' or 'exact_match')."""
        decode = compile_decode(self.graphdef, self.task.max_target_length,
                                supports_cached_decoding(merge(self.graphdef, self.state)),
                                beam_size=split_beam_size(self.config.eval, split),
                                length_penalty=self.config.eval.get("length_penalty", 0.6))
        refs = self.task.references(split)

        def score(state, masks):
            masks = {k: jnp.asarray(v, jnp.float32) for k, v in masks.items()}
            hyps = [self.task.decode(row) for b in batches for row in np.asarray(decode(state, b["inputs"], masks))]
            hyps = hyps[: len(refs)]  # the last batch's padding rows have no reference
            scores = translation_scores(hyps, refs[: len(hyps)], self.config.eval.bleu_tokenize)
            return np.array([h == r for h, r in zip(hyps, refs)], np.float64), scores[metric]
        return score

    def batches(self, split: str, max_batches: int | None = None) -> list[dict]:
        ds = self.task.dataset(split, self.config.train.batch_size, train=False)
        n = len(ds) if max_batches is None else min(len(ds), max_batches)
        return [ds[i] for i in range(n)]


def with_legacy_keys(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``config`` (a run's config.json) with every :data:`attn_lab.train.identity.RECORDED_BEFORE` key it lacks at its
    old behaviour (so a run from before restores with its own optimizer state, and its derived runs -- gates,
    fine-tuning -- validate); the identity comparison fills the same values."""
    for dotted, value in identity.RECORDED_BEFORE.items():
        *parents, leaf = dotted.split(".")
        node = config
        for name in parents:
            node = node[name]
        if leaf not in node:
            with node.unlocked():
                node[leaf] = value
    return config


def load_finished_run(workdir: str) -> FinishedRun:
    """Rebuilds the model from ``workdir/config.json`` and restores its newest readable checkpoint (a newer one that
    cannot be read is named in one line and left as it is: an analysis renames nothing). Whether the run finished
    is the caller's check (:func:`attn_lab.train.identity.check_finished`). Every failure is one line naming the file
    (a ValueError, or a :class:`~attn_lab.train.checkpoint.CheckpointError` when no checkpoint can be read)."""
    if not os.path.isdir(workdir):
        raise ValueError(f"{workdir} is not a folder")
    config = with_legacy_keys(ml_collections.ConfigDict(read_config(workdir)))
    if not checkpoint_steps(workdir):
        raise ValueError(f"{workdir} has no checkpoint to analyze ({os.path.join(workdir, 'checkpoints')} holds "
                         "none)")
    task = load_task(config.task, config.task.data_dir)
    max_len = max(task.max_input_length, task.max_target_length or 0) + 1
    gates = config.get("heads", {}).get("gates")
    model = build_model(config.model, kind=task.kind, vocab_size=task.vocab.size, max_len=max_len,
                        num_classes=task.num_classes, seed=config.seed, gates=gates)
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    state = init_state(nnx.to_pure_dict(params), model_state(model), make_optimizer(config.train, gates), config.seed)
    with Checkpointer(os.path.join(workdir, "checkpoints")) as ckpt:  # the newest readable step, nothing renamed
        (state,), step = restore_common([ckpt], [state], main=True, set_aside=False)
    return FinishedRun(config, task, graphdef, state, int(step))


def _pooled(path: str, p: tuple, source: Any, shape: tuple, kv_heads: str) -> bool:
    """Whether parameter ``p`` (``shape`` here) is mean-pooled from the source's array: False when the shapes
    agree or the source lacks it; a one-line RunError for any other shape difference."""
    if source is None or tuple(source.shape) == tuple(shape):
        return False
    if kv_heads == "mean_pool" and uptrain.poolable(p, source.shape, shape):
        return True
    hint = ("; train.init_kv_heads='mean_pool' pools key/value heads into groups (GQA uptraining)"
            if kv_heads == "same" and uptrain.poolable(p, source.shape, shape) else "")
    raise RunError(f"train.init_from: parameter {'/'.join(map(str, p))} is {tuple(source.shape)} in {path}, "
                   f"{tuple(shape)} here{hint}")


def source_params(path: str) -> dict:
    """The finished run's parameters in ``path``, flat (``{(module, ..., name): array}``)."""
    return traverse_util.flatten_dict(load_finished_run(path).state["params"])


def check_warm_start(path: str, shapes: dict, kv_heads: str = "same") -> None:
    """The shape check of :func:`warm_start` alone (``shapes``: this model's flat parameter shapes), so a source run
    of another size, or one with nothing to pool under ``mean_pool``, is refused in one line before the run's folder
    is made."""
    source = source_params(path)
    pooled = [p for p, shape in shapes.items() if _pooled(path, p, source.get(p), shape, kv_heads)]
    if kv_heads == "mean_pool" and not pooled:  # e.g. a per-seed source: config validation could not read it
        raise RunError(f"train.init_kv_heads='mean_pool': {path} has as many key/value heads as this model in every "
                       "attention; pooling needs fewer groups here (set model.num_kv_heads below the source's)")


def warm_start(path: str, states: list[dict], verbose: bool, kv_heads: str = "same") -> list[dict]:
    """Each seed's state with every parameter that the finished run in ``path`` also has (same path, same shape)
    taken from it; parameters it lacks (e.g. new head gates) keep their initialization; the optimizer starts fresh.
    The source run is loaded once for all seeds, its model rebuilt from its own config.

    ``kv_heads='mean_pool'``: a key/value projection with more heads in the source than here is mean-pooled into
    this model's groups (GQA uptraining, :mod:`attn_lab.train.uptrain`); any other shape difference is refused."""
    source = source_params(path)
    out, pooled = [], set()
    for state in states:
        params = traverse_util.flatten_dict(state["params"])
        pooled |= {p for p, v in params.items() if _pooled(path, p, source.get(p), v.shape, kv_heads)}
        taken = {p: (uptrain.mean_pool_heads(source[p], v.shape[-2]).astype(source[p].dtype) if p in pooled
                     else source.get(p, v)) for p, v in params.items()}
        out.append({**state, "params": traverse_util.unflatten_dict(taken)})
    if verbose:
        new = sorted({"/".join(map(str, p[:2])) for p in params if p not in source})
        print(f"init_from {path}: {sum(p in source for p in params)} of {len(params)} parameter arrays loaded"
              + (f" ({len(pooled)} key/value arrays mean-pooled into groups)" if pooled else "")
              + (f"; new: {', '.join(new)}" if new else ""), flush=True)
    return out


def check_warm_starts(configs: Sequence[Any], shapes: dict) -> None:
    """Each seed's ``train.init_from`` run checked once against this model's flat parameter ``shapes``."""
    for source in dict.fromkeys(c.train.init_from for c in configs):
        check_warm_start(source, shapes, configs[0].train.init_kv_heads)


def warm_starts(configs: Sequence[Any], states: list[dict], verbose: bool) -> list[dict]:
    """Each seed's state warm-started from its own ``train.init_from`` (one load per distinct source run)."""
    out = list(states)
    for source in dict.fromkeys(c.train.init_from for c in configs):
        idx = [i for i, c in enumerate(configs) if c.train.init_from == source]
        for i, state in zip(idx, warm_start(source, [states[i] for i in idx], verbose,
                                            configs[idx[0]].train.init_kv_heads)):
            out[i] = state
    return out
