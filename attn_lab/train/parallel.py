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

    def batch(self, batch: dict[str, np.ndarray], axis: int = 0) -> dict:
        """Splits every array along ``axis`` (the example axis) over the devices; each process contributes the
        slice of the global batch that its own devices hold."""
        if not self.active:
            return batch
        spec = PartitionSpec(*([None] * axis), "data")
        return {k: self._put(np.asarray(v), NamedSharding(self.mesh, spec), axis) for k, v in batch.items()}

    @staticmethod
    def _put(x: np.ndarray, sharding: NamedSharding, axis: int) -> jax.Array:
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        per = x.shape[axis] // jax.process_count()
        local = np.take(x, np.arange(jax.process_index() * per, (jax.process_index() + 1) * per), axis=axis)
        return jax.make_array_from_process_local_data(sharding, local, x.shape)

    @staticmethod
    def fetch(tree: Any) -> Any:
        """Arrays -> numpy on this host; with several processes, gathered from all of them (a batch-sharded
        output such as decoded ids is concatenated back along its sharded axis)."""
        if jax.process_count() == 1:
            return jax.tree.map(np.asarray, tree)
        from jax.experimental import multihost_utils

        return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)

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
