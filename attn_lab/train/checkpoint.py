"""Checkpointing of training state with Orbax.

Typed PRNG keys (``jax.random.key``) are not supported well by Orbax; callers
store the raw ``uint32`` key data instead and rebuild the key on restore::

    state = {"params": ..., "step": 10, "rng": jax.random.key_data(key)}
    ...
    key = jax.random.wrap_key_data(restored["rng"])
"""

from __future__ import annotations

import pathlib
from typing import Any

import orbax.checkpoint as ocp


class Checkpointer:
    """Orbax ``CheckpointManager`` wrapper: synchronous atomic saves, keep the last N.

    Atomicity: Orbax writes each step into a temporary directory and renames
    it to its final name only once every file is written, and only finalised
    steps are listed. A crash mid-save therefore leaves the previous
    checkpoint restorable; the stray temp dir is removed the next time a
    ``Checkpointer`` is opened on the directory.
    """

    def __init__(self, directory: str, max_to_keep: int = 2) -> None:
        """Open (or create) a checkpoint directory.

        Args:
            directory: Where step subdirectories (``<directory>/<step>``) live;
                made absolute because Orbax requires absolute paths.
            max_to_keep: Number of most recent steps kept on disk; older ones
                are deleted after each successful save to bound disk usage.
        """
        self._manager = ocp.CheckpointManager(
            pathlib.Path(directory).absolute(),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                create=True,
                # Saves block so that a later crash cannot catch one half-written.
                enable_async_checkpointing=False,
                # Remove temp dirs left behind by a save that was interrupted.
                cleanup_tmp_directories=True,
            ),
        )

    def latest_step(self) -> int | None:
        """Return the newest fully written step, or None if there is none (fresh run)."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Return all fully written steps on disk, ascending."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any) -> None:
        """Write ``state`` as checkpoint ``step`` and block until it is on disk.

        Args:
            step: Training step; names the checkpoint subdirectory.
            state: Pytree (nested dicts) of jax/numpy arrays and Python
                scalars. PRNG keys must be raw ``jax.random.key_data``.
        """
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self._manager.wait_until_finished()

    def restore(self, state_like: Any, step: int | None = None) -> Any:
        """Read a checkpoint into the structure of ``state_like``.

        Args:
            state_like: Pytree with the same structure as the saved state;
                its leaves (concrete arrays or ``jax.ShapeDtypeStruct``) give
                the shapes/dtypes (and shardings) to restore into.
            step: Step to restore; defaults to the latest one.

        Returns:
            A pytree with the structure of ``state_like`` holding the saved values.

        Raises:
            FileNotFoundError: If there is no checkpoint to restore.
        """
        if step is None:
            step = self.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self._manager.directory}")
        return self._manager.restore(step, args=ocp.args.StandardRestore(state_like))

    def close(self) -> None:
        """Wait for pending work and release Orbax resources (threads)."""
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
