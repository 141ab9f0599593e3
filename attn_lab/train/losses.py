"""Training objectives. The task loss lives here; regularizers (diversity, L0 gates) join as extra terms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array,
                  label_smoothing: float = 0.0) -> tuple[jax.Array, jax.Array]:
    """Weighted, label-smoothed cross-entropy.

    Args:
      logits: ``[..., num_classes]``.
      labels: integer ``[...]``.
      weights: ``[...]``; 0 for padding, so padded tokens and fill rows never count.
      label_smoothing: mass spread uniformly over the other classes (Szegedy et al. 2016).

    Returns:
      ``(sum of weighted losses, sum of weights)``: sums, so batches and devices combine exactly.
    """
    num_classes = logits.shape[-1]
    targets = optax.smooth_labels(jax.nn.one_hot(labels, num_classes), label_smoothing)
    losses = optax.softmax_cross_entropy(logits.astype(jnp.float32), targets)  # (...)
    # subtract the targets' entropy so a perfect model scores 0 whatever the smoothing
    losses = losses + (targets * jnp.log(jnp.where(targets > 0, targets, 1.0))).sum(-1)
    return (losses * weights).sum(), weights.sum()


def correct(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """Weighted count of argmax hits (token accuracy numerator)."""
    return ((logits.argmax(-1) == labels) * weights).sum()
