"""A run's spec: its config validated once, frozen, and resolved into what the run uses.

The command line gives a mutable ConfigDict; every later reader -- the trainer, the steps, the loop, decoding,
restore, the finish -- reads a :class:`RunSpec` instead, resolved once per process right after validation:
the task (resolved), the model, per attention kind its kernel and options, the active training objectives with
their sections, the seeds and each seed's own config. The config it holds is a ``FrozenConfigDict`` copy, so a
change to the raw config after resolution cannot reach the run, and nothing downstream can change it either
(``tests/test_spec.py`` resolves from a config that raises on any later read).

A run's identity (:mod:`attn_lab.train.identity`) is computed from the per-seed configs held here.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from typing import Any, Mapping, Sequence

import ml_collections

from attn_lab import objectives
from attn_lab.data.tasks import ResolvedTask
from attn_lab.models import model_class
from attn_lab.models.transformer import attention_spec
from attn_lab.train.workdir import SEED_FIELD


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One resolved run: what the trainer needs, read from the config exactly once."""

    config: ml_collections.FrozenConfigDict  # the validated config, frozen (sections read as ``spec.config.train``)
    seeds: tuple[int, ...]  # trained together (one vmapped program), in this order
    per_seed: tuple[ml_collections.FrozenConfigDict, ...]  # per seed: its seed, init_from and W&B name set
    task: ResolvedTask  # the task's declaration and options (its data is loaded by the trainer)
    model: str  # the registered model's name (attn_lab/models)
    kernels: Mapping[str, str]  # attention kind -> kernel name
    kernel_options: Mapping[str, Mapping[str, Any]]  # attention kind -> the spec its kernel is built from
    objectives: tuple[tuple[objectives.LossTerm, Any], ...]  # active training objectives with their sections
    notes: tuple[str, ...] = ()  # what the run prints before it starts (e.g. options no kernel uses)

    def only(self, indices: Sequence[int]) -> RunSpec:
        """The same run for a subset of its seeds (those whose folders still need training)."""
        return dataclasses.replace(self, seeds=tuple(self.seeds[i] for i in indices),
                                   per_seed=tuple(self.per_seed[i] for i in indices))


def resolve_run(config: Any, seeds: Sequence[int] | None = None) -> RunSpec:
    """Validates ``config`` (a one-line ValueError naming the bad key) and resolves it into a :class:`RunSpec`
    for ``seeds`` (default: ``config.seed`` alone). The only function that reads the raw config."""
    from attn_lab.train.config import validated  # jax-heavy: after the command's flags parsed

    notes, task, kernels = validated(config)
    frozen = ml_collections.FrozenConfigDict(config)
    seeds = (int(frozen.seed),) if seeds is None else tuple(int(s) for s in seeds)
    m = frozen.model
    return RunSpec(
        config=frozen, seeds=seeds, per_seed=tuple(_with_seed(frozen, s, len(seeds)) for s in seeds), task=task,
        model=model_class(task.kind, m.name).NAME, kernels=_frozen({k: attention_spec(m, k)["name"] for k in kernels}),
        kernel_options=_frozen({k: _frozen(attention_spec(m, k)) for k in kernels}),
        objectives=objectives.configured(frozen), notes=tuple(notes))


def as_spec(config: Any, seeds: Sequence[int] | None = None) -> RunSpec:
    """``config`` if it is a :class:`RunSpec` (its seeds must be ``seeds`` when given), else resolved."""
    if not isinstance(config, RunSpec):
        return resolve_run(config, seeds)
    if seeds is not None and tuple(seeds) != config.seeds:
        raise ValueError(f"seeds {list(seeds)} differ from the spec's {list(config.seeds)}")
    return config


def _frozen(mapping: dict) -> Mapping:
    return types.MappingProxyType(mapping)


def _with_seed(config: ml_collections.FrozenConfigDict, seed: int, num_seeds: int
               ) -> ml_collections.FrozenConfigDict:
    """The config of one seed: ``seed`` set, a ``{seed}`` in ``train.init_from`` filled in (a sweep's uptraining:
    each seed from its own run), and a W&B display name shared by several seeds suffixed ``-seed<N>``."""
    c = copy.deepcopy(config.as_configdict())  # as_configdict shares the frozen config's nodes
    c.seed = seed
    if c.train.init_from and SEED_FIELD in c.train.init_from:
        c.train.init_from = c.train.init_from.replace(SEED_FIELD, str(seed))
    if c.wandb.name and num_seeds > 1:
        c.wandb.name = f"{c.wandb.name}-seed{seed}"
    return ml_collections.FrozenConfigDict(c)
