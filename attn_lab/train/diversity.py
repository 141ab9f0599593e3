"""Head-diversity regularizers, computed inside the jitted train step from what the forward pass captured.

Each regularizer is a *similarity* between the heads of one attention layer (0 for disjoint / orthogonal heads,
largest for identical heads); the training loss adds ``weight x`` its mean over the chosen layers, so minimizing the
loss pushes heads apart. All are vectorized over head pairs (one ``[N, N]`` Gram matrix, no loop over heads):

- ``map_cosine``: ``sum_{i<j} relu(cos(A_i, A_j) - tau)``, A_i head i's attention map -- a hinge on near-duplicate
  maps (cosine above ``tau``), this lab's own variant of the map-similarity penalty; not taken from a paper;
- ``subspace``, ``position``, ``output`` (Li et al. 2018, "Multi-Head Attention with Disagreement
  Regularization", EMNLP): mean over pairs of the cosine between heads' value vectors, of ``sum |A_i (.) A_j|`` over key
  positions, and of the cosine between heads' outputs -- the negatives of the paper's disagreement terms;
- ``qk_orthogonal``: mean over pairs of the overlap of the per-head query (and key) projection subspaces, 0 when
  orthogonal, 1 when identical.

Scale against Li et al. (so a weight here maps onto the paper's ``lambda``, which it sets to 1). The paper writes
each disagreement as ``-(1/N^2) sum_i sum_j s_ij`` over *all* ordered head pairs, diagonal included, with ``N`` heads;
here pairs are ``i < j`` and averaged. With ``P = N (N - 1) / 2`` pairs:

- ``subspace``, ``output``: cosine, computed per position and example, then averaged. Since ``s_ii = 1``, the paper's
  similarity is ``1/N + ((N - 1)/N) x`` this value: equal gradients need ``weight = lambda (N - 1) / N``.
- ``position``: ``s_ij = sum_{t,s} |A_i (.) A_j|`` sums over the ``T`` query rows of one example; here the pair
  mean is also averaged over the ``T`` query rows (padded rows included, ``T`` the padded length). So this value
  ``= (sum_{i<j} s_ij) / (P T)``, and the paper's term is ``(1/N^2) sum_i s_ii + (T (N - 1)/N) x`` this value: its
  ``i = j`` part (``sum |A_i|^2``, which rewards diffuse maps) is not computed here, and the pair part equals the
  paper's at ``weight = lambda T (N - 1) / N`` -- a factor that grows with the batch's padded length.
- All terms are means over the examples of the batch.

``tests/test_diversity_scale.py`` checks these relations against the paper's double sums computed naively.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from attn_lab.models import KINDS, attention_layers

REGULARIZERS = ("map_cosine", "subspace", "position", "output", "qk_orthogonal")
NEEDS_MAPS = ("map_cosine", "position")



def pairwise_cosine(x: jax.Array) -> jax.Array:
    """``[..., N, D]`` -> cosine similarity of every pair of rows ``[..., N, N]``."""
    unit = x * jax.lax.rsqrt(jnp.maximum((x * x).sum(-1, keepdims=True), 1e-18))  # finite gradient at 0
    return unit @ jnp.swapaxes(unit, -1, -2)


def pair_sum(sim: jax.Array) -> jax.Array:
    """Sum over head pairs i < j of ``[..., N, N]`` -> ``[...]``."""
    n = sim.shape[-1]
    return (sim * jnp.triu(jnp.ones((n, n), sim.dtype), k=1)).sum((-1, -2))


def pair_mean(sim: jax.Array) -> jax.Array:
    n = sim.shape[-1]
    return pair_sum(sim) / max(n * (n - 1) // 2, 1)


def map_cosine(weights: jax.Array, tau: float = 0.5) -> jax.Array:
    """``weights [B, N, T, S]`` -> hinge on map cosine above ``tau``, summed over pairs, mean over the batch."""
    b, n = weights.shape[:2]
    sim = pairwise_cosine(weights.reshape(b, n, -1))  # (B, N, N)
    return pair_sum(jax.nn.relu(sim - tau)).mean()


def position(weights: jax.Array) -> jax.Array:
    """``weights [B, N, T, S]`` -> mean over pairs of ``sum_s |A_i A_j|``, averaged over batch and queries."""
    overlap = jnp.einsum("bits,bjts->btij", jnp.abs(weights), jnp.abs(weights))  # (B, T, N, N)
    return pair_mean(overlap).mean()


def head_cosine(per_head: jax.Array) -> jax.Array:
    """``[B, T, N, H]`` (head outputs or values) -> mean pairwise cosine over positions and batch."""
    return pair_mean(pairwise_cosine(per_head)).mean()


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


def default_config() -> ml_collections.ConfigDict:
    """``config.loss.diversity``: a weight per regularizer (0 = off; several > 0 combine), options, and where."""
    c = ml_collections.ConfigDict({name: {"weight": 0.0} for name in REGULARIZERS})
    c.map_cosine.tau = 0.5
    c.kinds = ",".join(KINDS)  # which attention kinds are regularized
    c.layers = ""  # comma-separated layer indices; empty: all
    return c


def check_config(dcfg: Any, kernels: dict[str, Any]) -> None:
    """One line naming the bad ``loss.diversity`` key; map-based regularizers need kernels that materialize maps."""
    for name in REGULARIZERS:
        if not dcfg[name].weight >= 0:
            raise ValueError(f"loss.diversity.{name}.weight must be >= 0, got {dcfg[name].weight}")
    if not -1.0 <= dcfg.map_cosine.tau <= 1.0:
        raise ValueError(f"loss.diversity.map_cosine.tau must be in [-1, 1], got {dcfg.map_cosine.tau}")
    kinds = selected_kinds(dcfg)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"loss.diversity.kinds={dcfg.kinds!r}: choose among {', '.join(KINDS)}")
    try:
        selected_layers(dcfg)
    except ValueError:
        raise ValueError(f"loss.diversity.layers={dcfg.layers!r}: give comma-separated layer indices") from None
    for name in NEEDS_MAPS:
        for kind in kinds:
            kernel = kernels.get(kind)
            if dcfg[name].weight > 0 and kernel is not None and not kernel.supports_weights:
                raise ValueError(f"loss.diversity.{name} needs attention maps, which attention "
                                 f"'{kernel.name}' ({kind}) does not materialize")


def active(dcfg: Any) -> bool:
    return any(dcfg[name].weight > 0 for name in REGULARIZERS)


def needs_capture(dcfg: Any) -> bool | str:
    """What the forward pass must capture: True (maps and heads), 'heads' (per-head values/outputs) or False."""
    active = [name for name in REGULARIZERS if dcfg[name].weight > 0]
    if any(name in NEEDS_MAPS for name in active):
        return True
    return "heads" if any(name in ("subspace", "output") for name in active) else False


def selected_kinds(dcfg: Any) -> list[str]:
    """``loss.diversity.kinds`` as a list (written comma-separated, so one ``--config`` flag overrides it)."""
    return [k.strip() for k in str(dcfg.kinds).split(",") if k.strip()]


def selected_layers(dcfg: Any) -> list[int]:
    """``loss.diversity.layers`` as a list of indices (empty: every layer); ValueError on a non-integer."""
    return [int(x) for x in str(dcfg.layers).split(",") if x.strip()]


def selected(dcfg: Any, kind: str, layer: int) -> bool:
    layers = selected_layers(dcfg)
    return kind in selected_kinds(dcfg) and (not layers or layer in layers)


def layer_terms(dcfg: Any, attn: nnx.Module, captured: dict) -> dict[str, jax.Array]:
    """Each active regularizer's value on one attention layer, plus the heads' output similarity (for logging)."""
    terms = {}
    maps = captured.get("attention_weights")
    for name in REGULARIZERS:
        if dcfg[name].weight <= 0:
            continue
        if name == "map_cosine":
            terms[name] = map_cosine(maps, dcfg.map_cosine.tau)
        elif name == "position":
            terms[name] = position(maps)
        elif name == "output":
            terms[name] = head_cosine(captured["head_outputs"])
        elif name == "subspace":
            terms[name] = head_cosine(captured["values"])
        else:
            terms[name] = qk_orthogonal(attn.query.kernel[...], attn.key.kernel[...])
    if "head_outputs" in captured:
        terms["similarity"] = head_cosine(captured["head_outputs"])
    return terms


def regularizer(model: nnx.Module, dcfg: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(weighted total, per-name mean over the chosen layers) after a forward pass with capture on.

    Pops the captured intermediates from every attention layer (so they never reach the model state).
    """
    per_name: dict[str, list[jax.Array]] = {}
    for kind, layer, attn in attention_layers(model):
        captured = {k: v[0] for k, v in nnx.to_pure_dict(nnx.pop(attn, nnx.Intermediate)).items()}
        if selected(dcfg, kind, layer):
            for name, value in layer_terms(dcfg, attn, captured).items():
                per_name.setdefault(name, []).append(value)
    means = {name: jnp.mean(jnp.stack(values)) for name, values in per_name.items()}
    total = sum((dcfg[name].weight * means[name] for name in REGULARIZERS if name in means), jnp.zeros(()))
    return total, means
