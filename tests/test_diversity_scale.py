"""The Li et al. (2018) regularizers against the paper's formulas written out naively -- Eq. 5-7 for one sentence
and one layer, ``(1/N^2) sum_i sum_j`` over all ordered head pairs, i = j included, on the real rows only -- so
``weight = 1`` is the paper's ``lambda = 1`` (attn_lab/train/diversity.py's docstring states the reading).

The second test runs a real encoder-decoder on a padded batch and checks the regularizer the train step adds
against the same formulas, with the masks written here from the batch (not the model's own ``attention_rows``).
Float64 references; the model runs at 'highest' matmul precision (tests/conftest.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_lab.models import Ctx, attention_layers, build_model
from attn_lab.objectives import diversity
from attn_lab.train.config import base_config


def _cos(a, b):
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def paper_subspace_or_output(x, valid):
    """``x [L, N, H]`` one sentence's per-head values or outputs, ``valid [L]``: (1/N^2) sum_ij cos(X^i, X^j) of the
    heads' matrices on the valid positions (the negative of D_subspace / D_output)."""
    x = np.asarray(x, np.float64)[np.asarray(valid)]
    n = x.shape[1]
    return sum(_cos(x[:, i], x[:, j]) for i in range(n) for j in range(n)) / n**2


def paper_position(maps, rows):
    """``maps [N, T, S]`` one sentence, ``rows [T]`` the counted query rows: (1/N^2) sum_ij sum |A^i (.) A^j|."""
    a = np.asarray(maps, np.float64)[:, np.asarray(rows, bool)]
    n = a.shape[0]
    return sum(np.abs(a[i] * a[j]).sum() for i in range(n) for j in range(n)) / n**2


def test_each_term_is_the_papers_formula_per_sentence_averaged_over_the_batch():
    rng = np.random.default_rng(0)
    b, t, n, h = 3, 5, 4, 6
    x = rng.normal(size=(b, t, n, h)).astype(np.float32)
    valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], bool)
    ours = float(diversity.matrix_cosine(jnp.asarray(x), jnp.asarray(valid)))
    np.testing.assert_allclose(ours, np.mean([paper_subspace_or_output(x[e], valid[e]) for e in range(b)]),
                               rtol=1e-5)
    logits = rng.normal(size=(b, n, t, t))
    maps = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    rows = valid & (np.arange(t) > 0)  # as a causal decoder: row 0 sees one key and is left out
    ours = float(diversity.position(jnp.asarray(maps, jnp.float32), jnp.asarray(rows, jnp.float32)))
    np.testing.assert_allclose(ours, np.mean([paper_position(maps[e], rows[e]) for e in range(b)]), rtol=1e-5)


def test_the_regularizer_of_a_real_model_on_a_padded_batch_is_the_papers_mean_over_sentences_and_layers():
    c = base_config()
    c.model.update(num_layers=2, d_model=32, mlp_dim=64, num_heads=4, num_kv_heads=2, dropout=0.0)
    for name in ("subspace", "position", "output"):
        c.loss.diversity[name].weight = 1.0
    model = build_model(c.model, kind="translation", vocab_size=20, max_len=12, seed=0)
    inputs = np.array([[5, 6, 7, 8, 9, 4, 3], [5, 6, 7, 0, 0, 0, 0], [9, 8, 0, 0, 0, 0, 0]])  # (B, S), 0 = pad
    targets = np.array([[4, 5, 6, 7, 8, 2], [4, 5, 2, 0, 0, 0], [3, 2, 0, 0, 0, 0]])  # (B, T)
    batch = {"inputs": inputs, "targets": targets}
    model.forward_batch(batch, Ctx(capture=True))
    captured = {(kind, layer): {k: np.asarray(v[0]) for k, v in
                                nnx.to_pure_dict(nnx.state(attn, nnx.Intermediate)).items()}
                for kind, layer, attn in attention_layers(model)}
    total, means = diversity.regularizer(model, c.loss.diversity, model.attention_rows(batch))

    src, tgt = inputs != 0, targets != 0  # the masks, written from the batch
    dec_in = np.pad(targets, ((0, 0), (1, 0)), constant_values=1)[:, :-1] != 0  # BOS-shifted decoder inputs
    t = targets.shape[1]
    expect = {"subspace": [], "position": [], "output": []}
    for (kind, _), cap in captured.items():
        queries = src if kind == "encoder_self" else tgt
        value_pos = dec_in if kind == "decoder_self" else src
        if kind == "decoder_self":
            keys = dec_in[:, None, :] & np.tril(np.ones((t, t), bool))
        else:
            keys = np.broadcast_to((src)[:, None, :], (*queries.shape, src.shape[1]))
        rows = queries & (keys.sum(-1) >= 2)
        values = np.repeat(cap["values"], 2, axis=2)  # (B, S, N, H): 2 query heads per value head
        for e in range(len(inputs)):
            expect["subspace"].append(paper_subspace_or_output(values[e], value_pos[e]))
            expect["output"].append(paper_subspace_or_output(cap["head_outputs"][e], queries[e]))
            expect["position"].append(paper_position(cap["attention_weights"][e], rows[e]))
    layers = len(captured)
    for name, values in expect.items():  # mean over sentences per layer, then over layers = mean of all
        assert len(values) == layers * len(inputs)
        np.testing.assert_allclose(float(means[name]), np.mean(values), rtol=2e-5, err_msg=name)
    np.testing.assert_allclose(float(total), sum(np.mean(v) for v in expect.values()), rtol=2e-5)
    assert jax.tree.leaves(nnx.state(model, nnx.Intermediate)) == []  # popped: never in the model state
