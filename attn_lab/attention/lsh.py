"""LSH attention (Kitaev, Kaiser & Levskaya 2020, "Reformer: The Efficient Transformer", arXiv:2001.04451).

Softmax is dominated by the largest logits, so each query only needs the keys closest to it. Reformer finds them
with angular locality-sensitive hashing (paper Section 2): a random rotation ``R [head_dim, n_buckets / 2]`` and
``h(x) = argmax([xR; -xR])`` put nearby vectors in the same bucket with high probability. Per hash round the
positions are sorted by ``(bucket, position)`` (a stable argsort), the sorted sequence is cut into chunks of
``bucket_size``, and each chunk attends to itself and the previous chunk, keeping only pairs in the same bucket.
Cost O(n_hashes * T * bucket_size) instead of O(T^2).

Details, each as the paper does unless said otherwise:

- Shared-QK (Section 2, "Shared-QK Transformer"): with ``shared_qk=True`` (default) the keys are the L2-normalized
  queries, ``k_j = q_j / ||q_j||``, so queries and keys hash and sort identically; the module's key projection is
  then unused (the values still come from the value projection). With ``shared_qk=False`` the provided keys are
  used and queries and keys are hashed with the same rotations and sorted separately; a query whose bucket holds
  no key in reach then has nothing to attend to and outputs zeros -- the reason the paper shares QK.
- No attention to self: a position does not attend to its own key unless no other key is available (e.g. the
  first position under causal masking); ``attend_self=True`` lifts this.
- Several rounds (Section 2, "Multi-round LSH attention", and Appendix A): each round r gives a softmax over its
  set P_i^r and its log-normalizer z_r(i); rounds are combined with weights ``exp(z_r(i) - logsumexp_r z_r(i))``.
  Each pair's logit is lowered by ``log N_ij``, the number of rounds in which i reaches j, so a pair found by
  several rounds is counted once: the result is exactly a softmax over the union of the rounds' sets.
- Key padding: masked keys are never attended unless a query has nothing else (then, as dense does, it averages
  the keys it reaches). Unlike the paper (which has no padding), padded positions sort after all real ones, so
  appending padding leaves the chunks of real positions, and hence their outputs, unchanged.
- Causal: pairs are masked by original position, so no output depends (in value or gradient) on later inputs.
  As in the paper, *which* earlier keys a query reaches still depends on how later positions hash (they shift
  chunk boundaries); the hash is not differentiable, so this is invisible to gradients.

Buckets come from fixed rotations drawn from ``jax.random.key(seed)``: outputs are deterministic and the matrix
returned with ``need_weights`` is the one applied. ``n_buckets=1`` turns hashing off (one bucket): with
``bucket_size >= T`` that is exact dense attention with the masks above, which the tests use as the reference.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from attn_lab.attention.dense import NEG, apply_weights
from attn_lab.attention.registry import AttentionKernel, key_padding, register

# Priority levels of a reachable key (see ``key_levels``): a query attends only to the keys of its highest level.
HIDDEN, SELF, OTHER = 0, 1, 2


def default_n_buckets(length: int, bucket_size: int) -> int:
    """The paper's choice ``2 * T / bucket_size`` (average bucket = half a chunk), even and at least 2."""
    n = max(2, 2 * length // bucket_size)
    return n + n % 2


def lsh_rotations(seed: int, num_heads: int, head_dim: int, n_hashes: int, n_buckets: int) -> jax.Array | None:
    """Random rotations ``[N, H, R, n_buckets // 2]`` (one per head and round); None when ``n_buckets == 1``."""
    if n_buckets == 1:
        return None
    return jax.random.normal(jax.random.key(seed), (num_heads, head_dim, n_hashes, n_buckets // 2))


def hash_buckets(x: jax.Array, rotations: jax.Array | None, n_hashes: int) -> jax.Array:
    """``x [B, N, T, H]`` -> buckets ``[B, N, R, T]`` = ``argmax([xR; -xR])`` per round (angular LSH).

    No gradient flows through the hash (argmax is piecewise constant).
    """
    b, n, t, _ = x.shape
    if rotations is None:
        return jnp.zeros((b, n, n_hashes, t), jnp.int32)
    proj = jnp.einsum("bnth,nhrk->bnrtk", jax.lax.stop_gradient(x).astype(jnp.float32), rotations)  # (B,N,R,T,nb/2)
    return jnp.argmax(jnp.concatenate([proj, -proj], axis=-1), axis=-1).astype(jnp.int32)  # (B, N, R, T)


def sort_order(buckets: jax.Array, valid: jax.Array, n_buckets: int) -> tuple[jax.Array, jax.Array]:
    """Per round, positions sorted by ``(padded last, bucket, position)`` and the inverse permutation.

    Args:
      buckets: ``[B, N, R, T]``; valid: ``[B, T]`` key-padding vector.

    Returns:
      ``(order, rank)``, both ``[B, N, R, T]``: ``order[s]`` is the position at sorted index s and ``rank[i]`` the
      sorted index of position i. Sorting padding last keeps real positions' chunks independent of padding.
    """
    sort_key = buckets + n_buckets * (~valid)[:, None, None, :].astype(buckets.dtype)  # (B, N, R, T)
    order = jnp.argsort(sort_key, axis=-1, stable=True)  # (B, N, R, T)
    rank = jnp.argsort(order, axis=-1)  # (B, N, R, T)
    return order, rank


def key_levels(visible: jax.Array, is_self: jax.Array, attend_self: bool) -> jax.Array:
    """Priority of each (query, key) pair: OTHER for a visible key, SELF for one's own visible key, HIDDEN else.

    A query attends only to reachable keys of its highest level: its own key only when no other visible key is
    reachable (the paper's rule), and masked keys (uniformly) only when nothing is visible -- as dense attention
    averages keys for a fully masked row. Levels replace large negative logits so that the ``log N_ij``
    de-duplication stays exact in float32.
    """
    if attend_self:
        return jnp.where(visible, OTHER, HIDDEN)
    return jnp.where(visible, jnp.where(is_self, SELF, OTHER), HIDDEN)


def _take(x: jax.Array, idx: jax.Array, batch_dims: int) -> jax.Array:
    """``x[b..., idx[b..., ...]]``: gathers along axis ``batch_dims`` of ``x`` with the leading axes batched."""
    gather = lambda a, i: a[i]
    for _ in range(batch_dims):  # static nesting of vmaps, not a traced loop
        gather = jax.vmap(gather)
    return gather(x, idx)


def _extend(x: jax.Array, axis: int, fill: Any) -> jax.Array:
    """Appends one ``fill`` entry along ``axis``: index T then stands for "no position" in gathers."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, 1)
    return jnp.pad(x, pad, constant_values=fill)


def _masked_softmax(logits: jax.Array, include: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Softmax over ``include`` on the last axis -> ``(probs, log-normalizer, row has any key)``.

    Excluded entries get exactly 0 and rows with nothing included get zeros and a finite normalizer, so
    gradients stay finite (the max is stopped: the softmax does not depend on it).
    """
    masked = jnp.where(include, logits, NEG)
    top = jax.lax.stop_gradient(masked.max(-1, keepdims=True))
    p = jnp.where(include, jnp.exp(masked - top), 0.0)
    total = p.sum(-1, keepdims=True)
    safe = jnp.where(total > 0.0, total, 1.0)
    return p / safe, (top + jnp.log(safe))[..., 0], total[..., 0] > 0.0


def _chunk_positions(order: jax.Array, chunk: int, look_back: bool) -> tuple[jax.Array, jax.Array]:
    """Sorted positions ``[B, N, R, T]`` -> query slots ``[B, N, R, nc, c]`` and key slots ``[.., nc, 2c or c]``.

    The sequence is padded to whole chunks with position T ("none"); each chunk's keys are the previous chunk's
    followed by its own (the first chunk has no previous one: those slots are "none" too).
    """
    b, n, r, t = order.shape
    nc = -(-t // chunk)
    slots = jnp.pad(order, [(0, 0)] * 3 + [(0, nc * chunk - t)], constant_values=t).reshape(b, n, r, nc, chunk)
    if not look_back:
        return slots, slots
    prev = jnp.pad(slots, [(0, 0)] * 3 + [(1, 0), (0, 0)], constant_values=t)[:, :, :, :-1]  # (B, N, R, nc, c)
    return slots, jnp.concatenate([prev, slots], axis=-1)  # (B, N, R, nc, c), (B, N, R, nc, 2c)


def _reach(q_bucket: jax.Array, k_bucket: jax.Array, q_chunk: jax.Array, k_chunk: jax.Array) -> jax.Array:
    """Whether a round lets a query reach a key: same bucket, key in the query's chunk or the one before."""
    return (q_bucket == k_bucket) & ((k_chunk == q_chunk) | (k_chunk == q_chunk - 1))


def _duplicate_counts(q_pos: jax.Array, k_pos: jax.Array, q_buckets: jax.Array, k_buckets: jax.Array,
                      q_rank: jax.Array, k_rank: jax.Array, chunk: int) -> jax.Array:
    """``N_ij``: in how many rounds query ``q_pos`` reaches key ``k_pos``, for every slot pair of every round.

    Args:
      q_pos ``[B, N, R, nc, c]``, k_pos ``[B, N, R, nc, C]``: positions in each round's chunks (T = none).
      q_buckets, k_buckets, q_rank, k_rank: ``[B, N, R, T]``.

    Returns ``[B, N, R, nc, c, C]``, at least 1. Memory O(R^2 * T * C): paid only when ``n_hashes > 1``.
    """
    per_position = lambda x: _extend(jnp.moveaxis(x, 2, 3), 2, -3)  # (B, N, T + 1, R')
    qb, kb = _take(per_position(q_buckets), q_pos, 2), _take(per_position(k_buckets), k_pos, 2)  # (..., c|C, R')
    qc, kc = _take(per_position(q_rank // chunk), q_pos, 2), _take(per_position(k_rank // chunk), k_pos, 2)
    reach = _reach(qb[..., :, None, :], kb[..., None, :, :], qc[..., :, None, :], kc[..., None, :, :])
    return jnp.maximum(reach.sum(-1), 1)  # (B, N, R, nc, c, C)


def lsh_attention(query: jax.Array, keys: jax.Array, values: jax.Array, *, q_buckets: jax.Array,
                  k_buckets: jax.Array, valid: jax.Array, n_buckets: int, bucket_size: int, is_causal: bool,
                  attend_self: bool, precision: Any = None) -> jax.Array:
    """Chunked multi-round LSH self-attention, ``[B, N, T, H]`` x3 -> ``[B, T, N, H]`` (see the module docstring).

    Args:
      query, keys, values: ``[B, N, T, H]`` (keys and values already expanded to the N query heads).
      q_buckets, k_buckets: ``[B, N, R, T]`` from :func:`hash_buckets` (the same array under shared-QK).
      valid: ``[B, T]`` key-padding vector.
    """
    b, n, t, h = query.shape
    r = q_buckets.shape[2]
    chunk = min(bucket_size, t)
    q_order, q_rank = sort_order(q_buckets, valid, n_buckets)  # (B, N, R, T)
    k_order, k_rank = sort_order(k_buckets, valid, n_buckets)  # (B, N, R, T)
    q_pos, _ = _chunk_positions(q_order, chunk, False)  # (B, N, R, nc, c)
    _, k_pos = _chunk_positions(k_order, chunk, t > chunk)  # (B, N, R, nc, C)
    scale = 1.0 / jnp.sqrt(h).astype(query.dtype)
    qs = _take(_extend(query * scale, 2, 0), q_pos, 2)  # (B, N, R, nc, c, H)
    ks, vs = (_take(_extend(x, 2, 0), k_pos, 2) for x in (keys, values))  # (B, N, R, nc, C, H)
    qb, kb = _take(_extend(q_buckets, 3, -1), q_pos, 3), _take(_extend(k_buckets, 3, -2), k_pos, 3)  # (.., c|C)
    visible = _take(_extend(jnp.broadcast_to(valid[:, None, :], (b, n, t)), 2, False), k_pos, 2)  # (.., C)

    counted = (q_pos < t)[..., :, None] & (k_pos < t)[..., None, :] & (qb[..., :, None] == kb[..., None, :])
    if is_causal:
        counted &= k_pos[..., None, :] <= q_pos[..., :, None]  # (B, N, R, nc, c, C)
    level = key_levels(visible[..., None, :], q_pos[..., :, None] == k_pos[..., None, :], attend_self)
    # The level a query attends at is the highest it reaches in any round, so the rounds agree on one key set.
    round_level = jnp.where(counted, level, -1).max(-1)  # (B, N, R, nc, c)
    best = _take(round_level.reshape(b, n, r, -1), q_rank, 3).max(2)  # (B, N, T)
    best = _take(_extend(best, 2, -1), q_pos, 2)  # (B, N, R, nc, c)
    include = counted & (level == best[..., None])  # (B, N, R, nc, c, C)

    logits = jnp.einsum("bnrcqh,bnrckh->bnrcqk", qs, ks, precision=precision,
                        preferred_element_type=jnp.float32)  # (B, N, R, nc, c, C)
    logits = jnp.where(level == OTHER, logits, 0.0)  # self / hidden: uniform among themselves
    if r > 1:
        logits -= jnp.log(_duplicate_counts(q_pos, k_pos, q_buckets, k_buckets, q_rank, k_rank, chunk))
    probs, lse, found = _masked_softmax(logits, include)  # (B, N, R, nc, c, C), (B, N, R, nc, c) x2
    out = jnp.einsum("bnrcqk,bnrckh->bnrcqh", probs.astype(values.dtype), vs,
                     precision=precision)  # (B, N, R, nc, c, H)

    unsort = lambda x: _take(x.reshape(b, n, r, -1, *x.shape[5:]), q_rank, 3)  # sorted slots -> positions
    out, lse, found = unsort(out), unsort(lse), unsort(found)  # (B, N, R, T, H), (B, N, R, T) x2
    round_weights = jax.nn.softmax(jnp.where(found, lse, NEG), axis=2)  # (B, N, R, T)
    out = jnp.einsum("bnrt,bnrth->btnh", round_weights.astype(out.dtype), out)  # (B, T, N, H)
    return out.astype(query.dtype)


def lsh_weights(query: jax.Array, keys: jax.Array, *, q_buckets: jax.Array, k_buckets: jax.Array,
                valid: jax.Array, n_buckets: int, bucket_size: int, is_causal: bool, attend_self: bool,
                precision: Any = None) -> jax.Array:
    """The dense ``[B, N, T, T]`` matrix :func:`lsh_attention` implies (O(R T^2): for analysis at small T).

    Built independently of the chunked path: a softmax over the union, over rounds, of the pairs each round
    reaches (same bucket, key chunk = query chunk or the one before), with the same levels and masks.
    """
    b, n, t, h = query.shape
    chunk = min(bucket_size, t)
    _, q_rank = sort_order(q_buckets, valid, n_buckets)  # (B, N, R, T)
    _, k_rank = sort_order(k_buckets, valid, n_buckets)  # (B, N, R, T)
    reach = _reach(q_buckets[..., :, None], k_buckets[..., None, :], (q_rank // chunk)[..., :, None],
                   (k_rank // chunk)[..., None, :]).any(2)  # (B, N, T, T)
    if is_causal:
        reach &= jnp.tril(jnp.ones((t, t), bool))
    level = key_levels(valid[:, None, None, :], jnp.eye(t, dtype=bool), attend_self)  # (B, 1, T, T)
    best = jnp.where(reach, level, -1).max(-1, keepdims=True)  # (B, N, T, 1)
    logits = jnp.einsum("bnqh,bnkh->bnqk", query / jnp.sqrt(h).astype(query.dtype), keys, precision=precision,
                        preferred_element_type=jnp.float32)  # (B, N, T, T)
    probs, _, _ = _masked_softmax(jnp.where(level == OTHER, logits, 0.0), reach & (level == best))
    return probs.astype(query.dtype)


def normalized(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``x / ||x||`` over the last axis: the shared-QK keys (eps keeps the gradient finite at 0)."""
    return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + eps)


@register("lsh")
class LSHAttention(AttentionKernel):
    """Reformer LSH self-attention (see the module docstring).

    Options:
      bucket_size: chunk length (default 64); capped at T. Each query sees keys of its bucket in its own chunk
        and the previous one of the sorted sequence.
      n_hashes: hash rounds (default 1); more rounds miss fewer neighbours at R times the cost.
      n_buckets: buckets per round, even; default ``2 * T // bucket_size`` (at least 2). ``1`` disables hashing.
      seed: the fixed hash rotations are drawn from ``jax.random.key(seed)``.
      attend_self: let a position attend to its own key (default False, as the paper).
      shared_qk: keys are the normalized queries (default True, as the paper); False uses the provided keys.

    Self-attention only, key-padding masks only, no KV-cache decoding and no attention dropout. ``need_weights``
    returns the implied dense matrix and the output computed from it, so ``out == apply_weights(weights, value)``.
    """

    supports_cross = False
    supports_decode = False
    supports_dropout = False

    def __init__(self, *, bucket_size: int = 64, n_hashes: int = 1, n_buckets: int | None = None, seed: int = 0,
                 attend_self: bool = False, shared_qk: bool = True, **shared: Any):
        super().__init__(**shared)
        for name, value in (("bucket_size", bucket_size), ("n_hashes", n_hashes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"attention.{name} must be a positive integer, got {value!r}")
        if n_buckets is not None and (isinstance(n_buckets, bool) or not isinstance(n_buckets, int)
                                      or n_buckets < 1 or (n_buckets > 1 and n_buckets % 2)):
            raise ValueError(f"attention.n_buckets must be 1 (no hashing) or an even integer >= 2, got {n_buckets!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"attention.seed must be an integer, got {seed!r}")
        self.bucket_size, self.n_hashes, self.n_buckets, self.seed = bucket_size, n_hashes, n_buckets, seed
        self.attend_self, self.shared_qk = bool(attend_self), bool(shared_qk)

    def buckets_for(self, length: int) -> int:
        """The number of buckets used at sequence length ``length``."""
        return self.n_buckets if self.n_buckets is not None else default_n_buckets(length, self.bucket_size)

    def hash(self, query: jax.Array, keys: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Buckets ``[B, N, R, T]`` of queries and keys (both ``[B, N, T, H]``) with this kernel's rotations."""
        n_buckets = self.buckets_for(query.shape[2])
        rotations = lsh_rotations(self.seed, query.shape[1], query.shape[3], self.n_hashes, n_buckets)
        q_buckets = hash_buckets(query, rotations, self.n_hashes)
        return q_buckets, q_buckets if self.shared_qk else hash_buckets(keys, rotations, self.n_hashes)

    def heads(self, query: jax.Array, key: jax.Array, value: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``[B, T, N|K, H]`` projections -> query, keys, values ``[B, N, T, H]`` as attended (GQA heads repeated)."""
        group = query.shape[2] // value.shape[2]
        q = jnp.swapaxes(query, 1, 2)  # (B, N, T, H)
        k = normalized(q) if self.shared_qk else jnp.swapaxes(jnp.repeat(key, group, axis=2), 1, 2)  # (B, N, T, H)
        return q, k, jnp.swapaxes(jnp.repeat(value, group, axis=2), 1, 2)

    def __call__(self, query, key, value, *, mask, is_causal, dropout_rng, dropout_rate, broadcast_dropout,
                 deterministic, precision, need_weights):
        b, t = query.shape[:2]
        self.check_call(query, key, dropout_rate, deterministic)
        valid = key_padding(mask, self.name)
        valid = jnp.ones((b, t), bool) if valid is None else valid  # (B, T)
        q, k, v = self.heads(query, key, value)  # (B, N, T, H)
        q_buckets, k_buckets = self.hash(q, k)  # (B, N, R, T)
        opts = dict(q_buckets=q_buckets, k_buckets=k_buckets, valid=valid, n_buckets=self.buckets_for(t),
                    bucket_size=self.bucket_size, is_causal=is_causal, attend_self=self.attend_self,
                    precision=precision)
        if need_weights:
            weights = lsh_weights(q, k, **opts)  # (B, N, T, T)
            return apply_weights(weights, value, precision), weights
        return lsh_attention(q, k, v, **opts), None
