"""Data parallelism over every device with ``jax.sharding``, and multi-host start-up with ``jax.distributed``.

One mesh axis, ``data``, spans the devices of all processes. Each batch is split along its example axis; parameters
and optimizer state are replicated, or with ``config.parallel.shard_params`` split FSDP-style along the first axis
the device count divides. The step functions do not change: jit follows the arrays' shardings and XLA inserts the
gradient all-reduce (or the all-gathers and reduce-scatters of sharded parameters). With one device nothing is placed
and a run is exactly the single-device program.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from attn_lab.data.tokenizers import PAD_ID


def initialize_distributed(pcfg: Any) -> None:
    """``jax.distributed.initialize`` when ``parallel.distributed``; address, process count and id come from the
    config or, left unset, from the environment JAX understands (SLURM, TPU pods, Open MPI). Call it before any
    other JAX work."""
    if not pcfg.distributed:
        return
    kwargs = {k: pcfg[k] for k in ("coordinator_address", "num_processes", "process_id") if pcfg[k] is not None}
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU hosts talk over gloo (GPU/TPU unaffected)
    jax.distributed.initialize(**kwargs)


def main_process_first(fn: Callable[[], Any], name: str) -> Any:
    """``fn()`` on process 0, then on the others once it is done (e.g. preparing a dataset into a shared folder,
    which concurrent builders would race on)."""
    if jax.process_count() == 1:
        return fn()
    from jax.experimental import multihost_utils

    out = fn() if jax.process_index() == 0 else None
    multihost_utils.sync_global_devices(name)
    return fn() if jax.process_index() != 0 else out


class DataParallel:
    """Places training states and batches on a ``data`` mesh over ``jax.devices()``."""

    def __init__(self, shard_params: bool = False):
        self.devices = jax.devices()
        self.mesh = Mesh(np.array(self.devices), ("data",))
        self.shard_params = shard_params

    @property
    def active(self) -> bool:
        return len(self.devices) > 1

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size % len(self.devices):
            raise ValueError(f"train.batch_size={batch_size} must be divisible by the {len(self.devices)} devices "
                             "(data parallel)")

    @property
    def shard(self) -> tuple[int, int]:
        """(process index, process count): which rows of every global batch this process reads."""
        return jax.process_index(), jax.process_count()

    def batch(self, batch: dict[str, np.ndarray], axis: int = 0) -> dict:
        """Places this process's rows of a batch (all of it with one process; ``Task.dataset(..., shard=
        self.shard)`` otherwise) as one global array per key, split along ``axis`` (the example axis) over the
        devices."""
        if not self.active:
            return batch
        sharding = NamedSharding(self.mesh, PartitionSpec(*([None] * axis), "data"))
        if jax.process_count() == 1:
            return {k: jax.device_put(np.asarray(v), sharding) for k, v in batch.items()}
        local = _pad_to_common_shape({k: np.asarray(v) for k, v in batch.items()})
        return {k: jax.make_array_from_process_local_data(sharding, v, _global_shape(v.shape, axis))
                for k, v in local.items()}

    @staticmethod
    def fetch(tree: Any) -> Any:
        """Arrays -> numpy on this host; with several processes, gathered from all of them (a batch-sharded
        output such as decoded ids is concatenated back along its sharded axis)."""
        if jax.process_count() == 1:
            return jax.tree.map(np.asarray, tree)
        from jax.experimental import multihost_utils

        return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)

    @staticmethod
    def total(count: int) -> int:
        """A count taken on this host's rows, summed over every process (a collective: call it on all of them)."""
        if jax.process_count() == 1:
            return int(count)
        from jax.experimental import multihost_utils

        return int(np.asarray(multihost_utils.process_allgather(np.asarray(count, np.int64))).sum())

    def state(self, state: Any) -> Any:
        """Replicates (or FSDP-shards) every leaf of a training state."""
        if not self.active:
            return state
        return jax.tree.map(lambda x: jax.device_put(x, self._leaf_sharding(np.shape(x))), state)

    def _leaf_sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        n = len(self.devices)
        if self.shard_params:
            for axis, size in enumerate(shape[1:], start=1):  # axis 0 is the seed axis
                if size % n == 0 and size >= n:
                    return NamedSharding(self.mesh, PartitionSpec(*([None] * axis), "data"))
        return NamedSharding(self.mesh, PartitionSpec())


def _global_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + (shape[axis] * jax.process_count(),) + shape[axis + 1:]


def _pad_to_common_shape(local: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Pads each process's arrays to the largest shape any process holds (one small all-gather of shapes).

    Each host pads its rows to the bucket of its own longest sequence; the largest of those buckets is the one the
    whole batch gets on one process, so extra columns are padding (PAD_ID = 0) exactly as there.
    """
    from jax.experimental import multihost_utils

    dims = np.concatenate([np.asarray(v.shape, np.int64) for v in local.values()])  # every key's shape, flat
    common = np.asarray(multihost_utils.process_allgather(dims)).reshape(jax.process_count(), -1).max(axis=0)
    out, start = {}, 0
    for k, v in local.items():
        target = common[start:start + v.ndim]
        out[k] = np.pad(v, [(0, int(t) - n) for n, t in zip(v.shape, target)], constant_values=PAD_ID)
        start += v.ndim
    return out
