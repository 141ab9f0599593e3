"""Per-head diagnostics average over valid query rows only: appending padding (queries and keys) leaves every
statistic unchanged, and each average equals a formula written here over the valid rows."""

import jax
import numpy as np
from flax import nnx

from attn_lab.models import build_model
from attn_lab.train import diagnostics
from attn_lab.train.capture import as_layers, capture_step
from attn_lab.train.config import base_config
from attn_lab.train.steps import init_state, make_optimizer, model_state


def _random_maps(rng, b, n, t, s, valid_keys):
    logits = rng.normal(size=(b, n, t, s)) * 2
    logits = np.where(valid_keys[:, None, None, :], logits, -np.inf)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _padded(maps, valid, extra, rng):
    """The same examples with ``extra`` padded positions appended; padded query rows get arbitrary distributions
    over the valid keys (what a kernel produces there), padded key columns get no mass."""
    b, n, t, _ = maps.shape
    big = np.zeros((b, n, t + extra, t + extra))
    big[:, :, :t, :t] = maps
    junk = rng.random((b, n, extra, t)) * valid[:, None, None, :]
    big[:, :, t:, :t] = junk / junk.sum(-1, keepdims=True)
    valid_big = np.concatenate([valid, np.zeros((b, extra), bool)], axis=1)
    return big, valid_big


def test_padding_leaves_statistics_unchanged_and_matches_formula():
    rng = np.random.default_rng(0)
    b, n, t = 3, 4, 6
    valid = np.ones((b, t), bool)
    valid[1, 4:] = False  # example 1 already has two padded positions
    valid[2, 5:] = False
    maps = _random_maps(rng, b, n, t, t, valid)
    # padded queries of the unpadded batch also get junk rows: they must be ignored as well
    for i in range(b):
        for q in np.flatnonzero(~valid[i]):
            junk = rng.random((n, t)) * valid[i]
            maps[i, :, q] = junk / junk.sum(-1, keepdims=True)
    outputs = rng.normal(size=(b, t, n, 3))
    big, valid_big = _padded(maps, valid, 5, rng)
    outputs_big = np.concatenate([outputs, rng.normal(size=(b, 5, n, 3)) * 100], axis=1)  # junk at padded rows

    small_report = diagnostics.layer_report(maps, valid, outputs)
    big_report = diagnostics.layer_report(big, valid_big, outputs_big)
    for key in ("entropy", "distance", "previous", "self", "next", "first", "output_norm", "mean_kl", "mean_js",
                "mean_similarity"):
        np.testing.assert_allclose(big_report[key], small_report[key], rtol=1e-9, atol=1e-12, err_msg=key)

    # naive formulas over the valid query rows, one head at a time
    rows = [(i, q) for i in range(b) for q in range(t) if valid[i, q]]
    for h in range(n):
        ent = dist = prev = first = norm = 0.0
        for i, q in rows:
            a = maps[i, h, q]
            nz = a[a > 0]
            ent += -(nz * np.log(nz)).sum() / np.log(valid[i].sum())
            dist += sum(a[k] * abs(q - k) for k in range(t))
            prev += a[q - 1] if q > 0 else 0.0
            first += a[0]
            norm += np.linalg.norm(outputs[i, q, h])
        m = len(rows)
        np.testing.assert_allclose(big_report["entropy"][h], ent / m, rtol=1e-6)
        np.testing.assert_allclose(big_report["distance"][h], dist / m, rtol=1e-9)
        np.testing.assert_allclose(big_report["previous"][h], prev / m, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(big_report["first"][h], first / m, rtol=1e-9)
        np.testing.assert_allclose(big_report["output_norm"][h], norm / m, rtol=1e-9)


def test_cross_attention_uses_given_query_mask():
    """Cross-attention (T != S): query validity comes from ``valid_queries``; padded query rows are ignored."""
    rng = np.random.default_rng(1)
    b, n, t, s = 2, 3, 4, 5
    valid_keys = np.ones((b, s), bool)
    valid_keys[0, 3:] = False
    valid_queries = np.ones((b, t), bool)
    valid_queries[1, 2:] = False
    maps = _random_maps(rng, b, n, t, s, valid_keys)
    got = diagnostics.normalized_entropy(maps, valid_keys, valid_queries)
    ent = -(maps * np.log(np.maximum(maps, 1e-300))).sum(-1) / np.log(valid_keys.sum(-1))[:, None, None]  # (B,N,T)
    want = np.array([ent[:, h][valid_queries].mean() for h in range(n)])
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert not np.allclose(diagnostics.normalized_entropy(maps, valid_keys), want)  # all rows counted otherwise


def _captured_decoder_self(attention: str):
    """A tiny translation model's captured ``decoder_self/0`` layer (maps, per-row keys, queries) and its batch."""
    c = base_config()
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.num_heads, c.model.dropout = 1, 16, 32, 2, 0.0
    c.model.attention.name = attention
    model = build_model(c.model, kind="translation", vocab_size=12, max_len=9, seed=0)
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    state = init_state(nnx.to_pure_dict(params), model_state(model), make_optimizer(c.train), 0)
    batch = {"inputs": np.array(jax.random.randint(jax.random.key(1), (3, 6), 4, 12)),
             "targets": np.array(jax.random.randint(jax.random.key(2), (3, 7), 4, 12))}
    batch["targets"][1, 4:] = 0  # padding
    captured = jax.jit(capture_step(graphdef))(state, batch)
    return as_layers(captured)["decoder_self/0"], batch


def test_causal_decoder_statistics_count_only_the_keys_each_row_may_see():
    """Decoder self-attention row t sees targets 0..t: softmax has no exact zeros there (the causal mask's zeros at
    keys > t are not the kernel's sparsity), and entropy normalizes by log(number of keys row t sees). Checked
    against formulas written here, row by row, for softmax (no zeros) and 1.5-entmax (true zeros)."""
    for attention in ("dense", "entmax"):
        layer, batch = _captured_decoder_self(attention)
        maps, queries = layer["maps"], layer["valid_queries"]  # (B, N, T, T), (B, T)
        report = diagnostics.layer_report(maps, layer["valid_keys"], layer["head_outputs"], queries)
        valid = batch["targets"] != 0
        rows = [(i, q) for i in range(maps.shape[0]) for q in range(maps.shape[2]) if valid[i, q]]
        for h in range(maps.shape[1]):
            zeros, ent = [], []
            for i, q in rows:
                seen = maps[i, h, q, : q + 1][valid[i, : q + 1]]  # keys 0..q that are not padding
                np.testing.assert_allclose(maps[i, h, q].sum(), 1, rtol=1e-5)
                zeros.append(np.mean(seen == 0))
                nz = seen[seen > 0]
                ent.append(-(nz * np.log(nz)).sum() / np.log(max(len(seen), 2)))
            np.testing.assert_allclose(report["zeros"][h], np.mean(zeros), atol=1e-9)
            np.testing.assert_allclose(report["entropy"][h], np.mean(ent), rtol=1e-4, atol=1e-6)
            if attention == "dense":
                assert report["zeros"][h] == 0.0
