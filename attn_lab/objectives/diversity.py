"""Head-diversity regularizers, computed inside the jitted train step from what the forward pass captured.

Each regularizer is a *similarity* between the heads of one attention layer (0 for disjoint / orthogonal heads,
largest for identical heads); the training loss adds ``weight x`` its mean over the chosen layers and the examples
of the batch, so minimizing the loss pushes heads apart. None loops over heads or head pairs.

Li et al. 2018 ("Multi-Head Attention with Disagreement Regularization", EMNLP; Eq. 4-7) maximize
``L(y|x) + lambda D`` with, for one sentence and one attention layer of ``N`` heads,

    D_subspace = -(1/N^2) sum_i sum_j cos(V^i, V^j)      V^i: head i's values, [S, d_v]
    D_position = -(1/N^2) sum_i sum_j |A^i (.) A^j|       A^i: head i's attention matrix, [T, S]; |.| sums entries
    D_output   = -(1/N^2) sum_i sum_j cos(O^i, O^j)      O^i: head i's outputs, [T, d_v]

over *all* ordered pairs, ``i = j`` included. ``subspace``, ``position`` and ``output`` here are exactly ``-D`` (the
cosine of two matrices is that of the flattened matrices: the Frobenius inner product over the norms), so
``weight = 1`` is the paper's ``lambda = 1`` when its likelihood is read, as its Transformer trainer computes it, as
the mean token log-likelihood of a batch and ``D`` as the mean over the batch's sentences (and over the regularized
layers). Only real rows and positions count: padded query rows are zeroed (their outputs are never used), padded
keys have no value, and in the map terms a query row that sees a single key (the causal decoder's row 0) is left
out -- its map is the same one-hot in every head, a constant that would only raise the similarity floor.
``tests/test_diversity_scale.py`` writes the paper's double sums out naively and checks them against these.

The sums over pairs collapse: ``(1/N^2) sum_ij <u_i, u_j> = ||mean_i u_i||^2`` (u_i unit vectors, or maps).

- ``map_cosine``: ``sum_{i<j} relu(cos(A_i, A_j) - tau)`` on the flattened maps of real rows -- a hinge on
  near-duplicate maps (source article 002, weight 0.01, tau 0.5); not from Li et al.;
- ``qk_orthogonal``: mean over pairs of the overlap of the per-head query (and key) projection subspaces, 0 when
  orthogonal, 1 when identical (this lab's own).

Grouped key/value heads (``num_kv_heads < num_heads``): each query head's value subspace is its group's, so
``subspace`` repeats the shared heads (pairs within a group are constant 1); with a single key/value head every
head shares one subspace and the term is a constant: the config refuses it (:func:`check_config`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from attn_lab.checks import NON_NEGATIVE, check_value
from attn_lab.models import attention_kinds
from attn_lab.objectives.base import Layer, LossTerm, ModelFacts, TermInputs, captured_layers, register_term

# each regularizer: what the forward pass must capture for it (True: maps too; 'heads': per-head values / outputs)
REGULARIZERS = {"map_cosine": True, "subspace": "heads", "position": True, "output": "heads", "qk_orthogonal": False}


def pairwise_cosine(x: jax.Array) -> jax.Array:
    """``[..., N, D]`` -> cosine similarity of every pair of rows ``[..., N, N]``."""
    unit = unit_rows(x)
    return unit @ jnp.swapaxes(unit, -1, -2)


def unit_rows(x: jax.Array) -> jax.Array:
    """``x`` with each last-axis row scaled to unit length (a zero row stays 0, with a finite gradient)."""
    return x * jax.lax.rsqrt(jnp.maximum((x * x).sum(-1, keepdims=True), 1e-18))


def pair_sum(sim: jax.Array) -> jax.Array:
    """Sum over head pairs i < j of ``[..., N, N]`` -> ``[...]``."""
    n = sim.shape[-1]
    return (sim * jnp.triu(jnp.ones((n, n), sim.dtype), k=1)).sum((-1, -2))


def pair_mean(sim: jax.Array) -> jax.Array:
    n = sim.shape[-1]
    return pair_sum(sim) / max(n * (n - 1) // 2, 1)


def map_rows(valid_queries: jax.Array, valid_keys: jax.Array) -> jax.Array:
    """``[B, T]`` 1.0 for the query rows a map term counts: real rows that see at least two keys."""
    return (valid_queries & (valid_keys.sum(-1) >= 2)).astype(jnp.float32)


def map_cosine(weights: jax.Array, rows: jax.Array, tau: float = 0.5) -> jax.Array:
    """``weights [B, N, T, S]``, ``rows [B, T]`` -> hinge on map cosine above ``tau``, summed over pairs i < j,
    mean over the batch."""
    b, n = weights.shape[:2]
    kept = weights * rows[:, None, :, None].astype(weights.dtype)  # (B, N, T, S): other rows zeroed
    sim = pairwise_cosine(kept.reshape(b, n, -1))  # (B, N, N)
    return pair_sum(jax.nn.relu(sim - tau)).mean()


def position(weights: jax.Array, rows: jax.Array) -> jax.Array:
    """``-D_position``: ``(1/N^2) sum_ij sum_{t,s} A_i A_j`` over the counted rows ``rows [B, T]``, mean over the
    batch (weights are non-negative, so ``|.|`` is the plain sum)."""
    mean_map = weights.mean(1)  # (B, T, S): (1/N) sum_i A_i
    return ((mean_map * mean_map).sum(-1) * rows.astype(mean_map.dtype)).sum(-1).mean()


def matrix_cosine(per_head: jax.Array, valid: jax.Array) -> jax.Array:
    """``-D_subspace`` / ``-D_output``: ``per_head [B, L, N, H]`` (values or outputs), ``valid [B, L]`` -> the mean
    over the batch of ``(1/N^2) sum_ij cos(X_i, X_j)``, X_i head i's ``[L, H]`` matrix on the valid positions."""
    b, length, n, h = per_head.shape
    x = per_head * valid[:, :, None, None].astype(per_head.dtype)  # (B, L, N, H)
    unit = unit_rows(jnp.moveaxis(x, 2, 1).reshape(b, n, length * h))  # (B, N, L*H)
    centre = unit.mean(1)  # (B, L*H)
    return (centre * centre).sum(-1).mean()


def pair_similarity(per_head: jax.Array, valid: jax.Array) -> jax.Array:
    """The mean cosine over distinct pairs i != j of the heads' matrices (for the logs): ``matrix_cosine`` without
    its diagonal, ``(N^2 c - N) / (N (N - 1))``."""
    n = per_head.shape[2]
    return (n * n * matrix_cosine(per_head, valid) - n) / max(n * (n - 1), 1)


def repeat_kv(values: jax.Array, num_heads: int) -> jax.Array:
    """``[B, S, K, H]`` -> ``[B, S, N, H]``: query head n reads key/value head ``n // (N / K)`` (dense.group_heads)."""
    return jnp.repeat(values, num_heads // values.shape[2], axis=2)


def qk_orthogonal(query_kernel: jax.Array, key_kernel: jax.Array) -> jax.Array:
    """Per-head projection kernels ``[d, N, H]`` (query) and ``[d, K, H]`` (key) -> mean subspace overlap.

    The overlap of heads i, j is the cosine between their projection Gram matrices ``W W^T``:
    ``||W_i^T W_j||_F^2 / (||W_i^T W_i||_F ||W_j^T W_j||_F)``, 0 for orthogonal subspaces, 1 for identical ones.
    """
    def overlap(w):  # (d, N, H)
        cross = (jnp.einsum("dih,dje->ijhe", w, w) ** 2).sum((-1, -2))  # (N, N): ||W_i^T W_j||_F^2
        norms = jnp.sqrt(jnp.maximum(jnp.diagonal(cross), 1e-12))  # (N,): ||W_i^T W_i||_F; floor: finite gradient at 0
        return pair_mean(cross / (norms[:, None] * norms[None, :]))
    return (overlap(query_kernel) + overlap(key_kernel)) / 2


@register_term
class Diversity(LossTerm):
    """``config.loss.diversity``: a weight per regularizer (0 = off; several > 0 combine), options, and where."""

    name, order = "diversity", 10

    def default_config(self) -> ml_collections.ConfigDict:
        c = ml_collections.ConfigDict({name: {"weight": 0.0} for name in REGULARIZERS})
        c.map_cosine.tau = 0.5
        c.kinds = ",".join(attention_kinds())  # which attention kinds are regularized (a model's others are skipped)
        c.layers = ""  # comma-separated layer indices; empty: all
        return c

    def check(self, cfg: Any, facts: ModelFacts) -> None:
        check_config(cfg, facts.kernels)
        bad = [i for i in selected_layers(cfg) if not 0 <= i < facts.depth]
        if bad:  # layer indices past the model's depth would regularize nothing, silently
            raise ValueError(f"loss.diversity.layers={cfg.layers!r}: layer {bad[0]} does not exist; the model's "
                             f"layers are 0..{facts.depth - 1}")

    def active(self, cfg: Any) -> bool:
        return active(cfg)

    def capture(self, cfg: Any) -> bool | str:
        return needs_capture(cfg)

    def identity(self, section: dict[str, Any], model_kinds: tuple[str, ...] | None) -> dict[str, Any]:
        """``kinds`` as the kinds of the run's model it selects: its default lists every kind of every registered
        model, so a new model kind changes the list but not what a run regularizes."""
        if model_kinds is None:
            return section
        chosen = [k.strip() for k in str(section.get("kinds", "")).split(",")]
        return section | {"kinds": ",".join(k for k in model_kinds if k in chosen)}

    def __call__(self, cfg: Any, inputs: TermInputs) -> tuple[jax.Array, dict[str, jax.Array]]:
        total, means = weighted(cfg, inputs.layers, inputs.rows)
        return total, {f"diversity/{name}": value for name, value in means.items()}


def check_config(dcfg: Any, kernels: dict[str, Any]) -> None:
    """One line naming the bad ``loss.diversity`` key; map-based regularizers need kernels that materialize maps."""
    for name in REGULARIZERS:
        check_value(f"loss.diversity.{name}.weight", dcfg[name].weight, NON_NEGATIVE)
    if not -1.0 <= dcfg.map_cosine.tau <= 1.0:
        raise ValueError(f"loss.diversity.map_cosine.tau must be in [-1, 1], got {dcfg.map_cosine.tau}")
    kinds = selected_kinds(dcfg)
    bad = [k for k in kinds if k not in attention_kinds()]
    if bad or not kinds:
        raise ValueError(f"loss.diversity.kinds={dcfg.kinds!r}: choose among {', '.join(attention_kinds())}")
    try:
        selected_layers(dcfg)
    except ValueError:
        raise ValueError(f"loss.diversity.layers={dcfg.layers!r}: give comma-separated layer indices") from None
    if active(dcfg) and not set(kinds) & set(kernels):
        raise ValueError(f"loss.diversity.kinds={dcfg.kinds!r}: the model has none of these attention kinds (its "
                         f"kinds: {', '.join(kernels)}), so the diversity terms would regularize nothing")
    for name in (n for n, needs in REGULARIZERS.items() if needs is True):
        for kind in kinds:
            kernel = kernels.get(kind)
            if dcfg[name].weight > 0 and kernel is not None and not kernel.supports_weights:
                raise ValueError(f"loss.diversity.{name} needs attention maps, which attention "
                                 f"'{kernel.name}' ({kind}) does not materialize")
    for kind in kinds:
        kernel = kernels.get(kind)
        if dcfg.subspace.weight > 0 and kernel is not None and kernel.num_kv_heads == 1 < kernel.num_heads:
            raise ValueError(f"loss.diversity.subspace.weight={dcfg.subspace.weight}: {kind} shares one key/value "
                             f"head among its {kernel.num_heads} query heads (num_kv_heads=1), so every head has the "
                             "same value subspace and the term is a constant; use num_kv_heads >= 2 there, leave "
                             f"{kind} out of loss.diversity.kinds, or use another regularizer")


def active(dcfg: Any) -> bool:
    return any(dcfg[name].weight > 0 for name in REGULARIZERS)


def needs_capture(dcfg: Any) -> bool | str:
    """What the forward pass must capture: True (maps and heads), 'heads' (per-head values/outputs) or False."""
    needs = [REGULARIZERS[name] for name in REGULARIZERS if dcfg[name].weight > 0]
    return True if True in needs else ("heads" if "heads" in needs else False)


def selected_kinds(dcfg: Any) -> list[str]:
    """``loss.diversity.kinds`` as a list (written comma-separated, so one ``--config`` flag overrides it)."""
    return [k.strip() for k in str(dcfg.kinds).split(",") if k.strip()]


def selected_layers(dcfg: Any) -> list[int]:
    """``loss.diversity.layers`` as a list of indices (empty: every layer); ValueError on a non-integer."""
    return [int(x) for x in str(dcfg.layers).split(",") if x.strip()]


def selected(dcfg: Any, kind: str, layer: int) -> bool:
    layers = selected_layers(dcfg)
    return kind in selected_kinds(dcfg) and (not layers or layer in layers)


def layer_terms(dcfg: Any, attn: nnx.Module, captured: dict, rows: tuple[jax.Array, jax.Array]) -> dict:
    """Each active regularizer's value on one attention layer, plus the heads' output similarity (for the logs).
    ``rows``: the layer's real query rows ``[B, T]`` and the keys each sees ``[B, T, S]`` (the model's
    ``attention_rows``)."""
    queries, keys = rows
    maps = captured.get("attention_weights")
    counted = map_rows(queries, keys) if maps is not None else None  # (B, T)
    value_positions = keys.any(1)  # (B, S): keys some real row sees
    terms = {
        "map_cosine": lambda: map_cosine(maps, counted, dcfg.map_cosine.tau),
        "position": lambda: position(maps, counted),
        "output": lambda: matrix_cosine(captured["head_outputs"], queries),
        "subspace": lambda: matrix_cosine(repeat_kv(captured["values"], attn.num_heads), value_positions),
        "qk_orthogonal": lambda: qk_orthogonal(attn.query.kernel[...], attn.key.kernel[...]),
    }
    out = {name: terms[name]() for name in REGULARIZERS if dcfg[name].weight > 0}
    if "head_outputs" in captured:
        out["similarity"] = pair_similarity(captured["head_outputs"], queries)
    return out


def weighted(dcfg: Any, layers: tuple[Layer, ...], rows: dict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(weighted total, per-name mean over the chosen layers); ``rows``: the model's ``attention_rows(batch)``."""
    per_name: dict[str, list[jax.Array]] = {}
    for layer in layers:
        if selected(dcfg, layer.kind, layer.index):
            for name, value in layer_terms(dcfg, layer.module, layer.captured, rows[layer.kind]).items():
                per_name.setdefault(name, []).append(value)
    means = {name: jnp.mean(jnp.stack(values)) for name, values in per_name.items()}
    total = sum((dcfg[name].weight * means[name] for name in REGULARIZERS if name in means), jnp.zeros(()))
    return total, means


def regularizer(model: nnx.Module, dcfg: Any, rows: dict) -> tuple[jax.Array, dict[str, jax.Array]]:
    """:func:`weighted` after a forward pass with capture on, popping what every attention layer captured."""
    return weighted(dcfg, captured_layers(model, popped=True), rows)
