"""Vectorized seeds: several runs of one config, differing only in seed, trained as one compiled program.

The trainer always holds its state with a leading seed axis ``[S, ...]``. :func:`seed_map` turns a per-run step
into one over that axis: ``jax.vmap`` when ``S > 1``; for a single run it indexes the axis away and adds it back, so
one seed compiles exactly the program a plain run would. Each seed keeps its own data order (the training set is
shuffled by seed), so one step's batches can fall in different length buckets; :func:`stack_batches` pads them to
a common shape with the pad id, which the models ignore (padding invariance is tested in test_models).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def seed_map(fn: Callable, num_seeds: int, in_axes: tuple[int | None, ...]) -> Callable:
    """``fn`` over a leading seed axis of the arguments whose ``in_axes`` entry is 0 (None: shared by all seeds).

    Outputs always carry the seed axis.
    """
    if num_seeds > 1:
        return jax.vmap(fn, in_axes=in_axes)

    def single(*args):
        args = [a if axis is None else jax.tree.map(lambda x: x[0], a) for a, axis in zip(args, in_axes)]
        return jax.tree.map(lambda x: x[None], fn(*args))

    single.__name__ = getattr(fn, "func", fn).__name__  # jit names its program (and cache entry) after this
    return single


def stack(trees: Sequence[Any]) -> Any:
    """Pytrees with equal structure -> one pytree with a leading seed axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, i: int) -> Any:
    """Seed ``i``'s slice of a stacked pytree."""
    return jax.tree.map(lambda x: x[i], tree)


def stack_batches(batches: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-seed batches -> ``{key: [S, ...]}``, each padded with 0 (the pad id) to the largest shape."""
    out = {}
    for key in batches[0]:
        arrays = [b[key] for b in batches]
        shape = np.max([a.shape for a in arrays], axis=0)
        out[key] = np.stack([np.pad(a, [(0, n - m) for n, m in zip(shape, a.shape)]) for a in arrays])
    return out
