"""Pure train and eval steps, compiled in one place (:func:`compile_steps`).

The state is a plain pytree ``{'step', 'params', 'model_state', 'opt_state', 'rng'}`` (params and the model's
non-trainable variables -- e.g. Performer's random features and redraw counter -- as pure dicts, rng as raw key
data) so it checkpoints with orbax, vmaps over seeds and shards over devices without special cases. The model is
rebuilt from its static ``graphdef`` inside each step (``nnx.merge`` costs nothing after tracing).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from attn_lab import objectives as objectives_lib
from attn_lab.attention.registry import AttentionKernel
from attn_lab.models import Ctx
from attn_lab.train import losses
from attn_lab.train.seeds import seed_map
from attn_lab.train.state import merge, model_state  # noqa: F401 (re-exported: forks import them from here)


def learning_rate_schedule(tcfg: Any) -> optax.Schedule:
    """Linear warmup, then inverse square root (Vaswani et al.) or cosine decay to zero at ``num_steps``."""
    warmup = max(int(tcfg.warmup_steps), 1)
    peak = tcfg.learning_rate
    if tcfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(tcfg.num_steps, warmup + 1))
    return lambda step: peak * jnp.minimum((step + 1) / warmup, jnp.sqrt(warmup / jnp.maximum(step + 1, 1)))


NOT_DECAYED = ("bias", "scale")  # parameter names that are never weight matrices, whatever their shape


def decayed(params: Any, on: str = "matrices") -> Any:
    """Which parameters weight decay shrinks: with ``on='matrices'`` the weight matrices only -- parameters with two
    or more axes (projection kernels, embeddings, learned position tables, Linformer's projections) other than
    biases (per-head biases are ``[N, H]``) and norm scales --, as nanoGPT's ``configure_optimizers`` and
    big_vision do; ``'all'`` decays every parameter (the behaviour before).

    Why not the rest: biases and LayerNorm scales are not weights whose size regularization is about, and the
    one-axis parameters of kernels that learn their shape (adaptive span's ``span_fraction``, entmax's alpha
    logits) would be pulled towards 0 -- towards a span of 0 and alpha 1.5 -- by the optimizer, not by the data.
    Under ``--seeds`` the step is vmapped, so ``ndim`` is a single seed's.
    """
    def matrix(path, p):
        name = getattr(path[-1], "key", getattr(path[-1], "name", None)) if path else None
        return on == "all" or (p.ndim >= 2 and name not in NOT_DECAYED)
    return jax.tree_util.tree_map_with_path(matrix, params)


def make_optimizer(tcfg: Any, gates: Any = None) -> optax.GradientTransformation:
    """AdamW (b2=0.98 as in the Transformer paper) after global-norm gradient clipping; weight decay on
    ``train.weight_decay_on`` (:func:`decayed`: weight matrices by default).

    With head gates (``config.heads.gates.enabled``) their ``log_alpha`` get plain Adam at the constant
    ``gates.lr`` and no weight decay: decay would pull every gate towards half-open, and at the model's learning rate
    a gate needs thousands of steps to close.
    """
    on = tcfg.get("weight_decay_on", "all")  # a run config from before the key existed decayed everything
    mask = None if on == "all" else (lambda params: decayed(params, on))  # None: the unmasked optimizer state
    model_tx = optax.adamw(learning_rate_schedule(tcfg), b1=0.9, b2=0.98, eps=1e-9, weight_decay=tcfg.weight_decay,
                           mask=mask)
    if gates is None or not gates.enabled:
        return optax.chain(optax.clip_by_global_norm(tcfg.grad_clip), model_tx)
    labels = lambda params: {k: jax.tree.map(lambda _, label="gates" if k == "gates" else "model": label, v)
                             for k, v in params.items()}
    return optax.chain(optax.clip_by_global_norm(tcfg.grad_clip),
                       optax.multi_transform({"model": model_tx, "gates": optax.adam(gates.lr)}, labels))


def init_state(params: Any, model_state: Any, tx: optax.GradientTransformation, seed: int) -> dict:
    """The training state for ``params`` and non-trainable ``model_state`` (pure dicts)."""
    return {"step": jnp.zeros((), jnp.int32), "params": params, "model_state": model_state,
            "opt_state": tx.init(params), "rng": jax.random.key_data(jax.random.key(seed))}


def train_step(state: dict, batch: dict, *, graphdef: Any, tx: optax.GradientTransformation, label_smoothing: float,
               objectives: tuple = (), num_steps: int = 1) -> tuple[dict, dict]:
    """One optimizer step; dropout keys are ``fold_in(rng, step)`` so a resumed run replays the same noise.

    ``objectives``: the active loss terms and their config sections (:func:`attn_lab.objectives.configured`); the
    forward pass captures what they need and the loss is task loss + their values, each logged under its own
    names (plus ``total_loss``). ``num_steps``: the run's length, for terms that follow training's progress.
    """
    key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
    capture = objectives_lib.capture_mode(objectives)

    def loss_fn(params):
        model = merge(graphdef, state, params)
        logits, labels, weights = model.forward_batch(batch, Ctx(deterministic=False, rngs=nnx.Rngs(dropout=key),
                                                                 capture=capture))
        loss_sum, weight_sum = losses.cross_entropy(logits, labels, weights, label_smoothing)
        task_loss = loss_sum / jnp.maximum(weight_sum, 1.0)
        reg, terms = objectives_lib.total(objectives, model, batch, state["step"] / num_steps)
        aux = (task_loss, terms, losses.correct(logits, labels, weights), weight_sum, model_state(model))
        return task_loss + reg, aux

    (total, (loss, terms, hits, count, new_model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    params = project(graphdef, state, optax.apply_updates(state["params"], updates))
    new_state = {**state, "step": state["step"] + 1, "params": params, "model_state": new_model_state,
                 "opt_state": opt_state}
    metrics = {"loss": loss, "accuracy": hits / jnp.maximum(count, 1.0), "grad_norm": optax.global_norm(grads),
               "tokens": count, **({"total_loss": total} if terms else {}), **terms}
    return new_state, metrics


def project(graphdef: Any, state: dict, params: Any) -> Any:
    """``params`` after each attention kernel's projection (:meth:`AttentionKernel.project`, e.g. adaptive span's
    ``clamp``), applied after the optimizer's update: a projected gradient step, as the papers' code does it after
    ``optimizer.step()``. The very same leaves when no kernel projects: runs without one compute what they did."""
    model = merge(graphdef, state, params)
    kernels = [m for _, m in nnx.iter_modules(model) if isinstance(m, AttentionKernel) and m.projects]
    if not kernels:
        return params
    for kernel in kernels:
        kernel.project()
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def eval_step(state: dict, batch: dict, *, graphdef: Any) -> dict:
    """Sums (not means) of loss, hits and weights, so batches of any fill combine exactly."""
    model = merge(graphdef, state)
    logits, labels, weights = model.forward_batch(batch, Ctx())
    loss_sum, weight_sum = losses.cross_entropy(logits, labels, weights)
    return {"loss": loss_sum, "correct": losses.correct(logits, labels, weights), "weight": weight_sum}


def compile_steps(graphdef: Any, tx: optax.GradientTransformation, label_smoothing: float,
                  num_seeds: int = 1, objectives: tuple = (), num_steps: int = 1) -> tuple[Callable, Callable]:
    """The jitted train step (state donated: updated in place) and eval step, over a leading seed axis of the state
    (and of the train batch; eval batches are shared by all seeds). No task kind: the model in ``graphdef`` lays out
    its own batch (``forward_batch``)."""
    train = functools.partial(train_step, graphdef=graphdef, tx=tx, label_smoothing=label_smoothing,
                              objectives=tuple(objectives), num_steps=num_steps)
    evaluate = functools.partial(eval_step, graphdef=graphdef)
    return (jax.jit(seed_map(train, num_seeds, (0, 0)), donate_argnums=(0,)),
            jax.jit(seed_map(evaluate, num_seeds, (0, None))))
