"""The decoder-only language model: KV-cache decoding equals the causal forward for every causal kernel, sampling,
structural pruning equals masking, the loss against a reference written out here, and the bad LM configs that
stop in one line. Exactness at 'highest' matmul precision (tests/conftest.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.analysis.structural import prune_model
from attn_lab.attention import KERNELS
from attn_lab.models import build_model, mask_shapes, supports_cached_decoding
from attn_lab.train import losses
from attn_lab.train.config import base_config, validate_config
from attn_lab.train.generate import compile_generate, pick
from attn_lab.train.steps import model_state
from tests.helpers import load_config

V, T, B = 23, 12, 3
SMALL = {"local": {"window": 4}, "strided": {"stride": 4}, "longformer": {"window": 4}, "bigbird": {"block_size": 4},
         "lsh": {"bucket_size": 4, "n_buckets": 2}, "performer": {"num_features": 32}, "adaptive_span":
         {"max_span": 8, "ramp": 2.0, "init_span": 0.5}}
CAUSAL = sorted(k for k, cls in KERNELS.items() if cls.supports_causal)


def _config(kernel="dense", **model):
    c = base_config()
    c.model.update(**{"num_layers": 2, "d_model": 32, "mlp_dim": 48, "num_heads": 4, "num_kv_heads": 2,
                      "dropout": 0.0, **model})
    c.model.attention.name = kernel
    for key, value in SMALL.get(kernel, {}).items():
        c.model.attention[kernel][key] = value
    return c


def _lm(kernel="dense", **model):
    return build_model(_config(kernel, **model).model, kind="lm", vocab_size=V, max_len=T + 4, seed=0)


def _tokens(seed=0, shape=(B, T)):
    return jnp.asarray(np.random.default_rng(seed).integers(1, V, shape), jnp.int32)


@pytest.mark.parametrize("kernel", CAUSAL)
def test_cached_decoding_equals_the_causal_forward_for_every_causal_kernel(kernel):
    """Feeding the tokens one by one through the KV cache gives the causal forward's logits at every position;
    kernels without a cached mode say so, and their generation re-runs the prefix."""
    model, tokens = _lm(kernel), _tokens()
    full = model(tokens)  # (B, T, V)
    if not KERNELS[kernel].supports_decode:
        assert not supports_cached_decoding(model)
        return
    assert supports_cached_decoding(model)
    model.init_cache(B, T)
    from attn_lab.models.transformer import Ctx

    steps = [model(tokens[:, i:i + 1], Ctx(decode=True), start=i) for i in range(T)]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, rtol=1e-4, atol=1e-4)


def _state(model):
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    return graphdef, {"params": nnx.to_pure_dict(params), "model_state": model_state(model)}


@pytest.mark.parametrize("kernel", ["dense", "local", "performer"])
def test_greedy_generation_cached_and_uncached_equal_a_rollout_of_the_full_forward(kernel):
    """Greedy generation: each new token is the argmax of the full causal forward over the tokens so far."""
    model = _lm(kernel)
    graphdef, state = _state(model)
    prompt = _tokens(1, (B, 4))
    key = jax.random.key(0)
    ways = [False] + ([True] if supports_cached_decoding(model) else [])
    outs = [compile_generate(graphdef, 6, cached=c)(state, prompt, key) for c in ways]
    rollout = prompt
    for _ in range(6):
        nxt = model(rollout)[:, -1].argmax(-1).astype(jnp.int32)
        rollout = jnp.concatenate([rollout, nxt[:, None]], axis=1)
    for out in outs:
        np.testing.assert_array_equal(out, rollout)
    ahead = compile_generate(graphdef, 6, cached=ways[-1]).lower(state, prompt, key).compile()  # as benchmarks do
    np.testing.assert_array_equal(ahead(state, prompt, key), rollout)


def test_sampling_with_temperature_and_top_k_cached_equals_uncached_and_follows_the_softmax():
    model = _lm()
    graphdef, state = _state(model)
    prompt, key = _tokens(2, (B, 3)), jax.random.key(5)
    for temperature, top_k in [(1.0, None), (0.7, 5)]:
        a = compile_generate(graphdef, 5, cached=True, temperature=temperature, top_k=top_k)(state, prompt, key)
        b = compile_generate(graphdef, 5, cached=False, temperature=temperature, top_k=top_k)(state, prompt, key)
        np.testing.assert_array_equal(a, b)
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))  # (1, 4)
    draws = jax.vmap(lambda k: pick(logits, k, 1.0, None))(jax.random.split(jax.random.key(1), 20000))[:, 0]
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / 20000, [0.5, 0.3, 0.15, 0.05], atol=0.015)
    top2 = jax.vmap(lambda k: pick(logits, k, 1.0, 2))(jax.random.split(jax.random.key(2), 20000))[:, 0]
    np.testing.assert_allclose(np.bincount(top2, minlength=4) / 20000, [0.625, 0.375, 0, 0], atol=0.015)
    assert int(pick(logits, jax.random.key(0), 0.0, None)[0]) == 0  # temperature 0: argmax
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        compile_generate(graphdef, 2, top_k=0)


@pytest.mark.parametrize("kwargs,line", [
    ({"new_tokens": -3}, "new_tokens must be a positive integer, got -3"),
    ({"new_tokens": 0}, "new_tokens must be a positive integer, got 0"),
    ({"new_tokens": 2.5}, "new_tokens must be a positive integer, got 2.5"),
    ({"new_tokens": 2, "temperature": float("nan")}, "temperature must be a finite number >= 0 (0: greedy), got nan"),
    ({"new_tokens": 2, "temperature": float("inf")}, "temperature must be a finite number >= 0 (0: greedy), got inf"),
    ({"new_tokens": 2, "temperature": -1.0}, "temperature must be a finite number >= 0 (0: greedy), got -1.0"),
])
def test_generation_arguments_that_cannot_work_are_one_line_naming_them(kwargs, line):
    graphdef, _ = _state(_lm())
    with pytest.raises(ValueError) as info:
        compile_generate(graphdef, **kwargs)
    assert str(info.value) == line


def test_an_empty_prompt_or_one_past_the_model_s_positions_is_refused_before_compiling():
    """An empty prompt would feed the pad id as its first token; a continuation past the position table would
    repeat positions (and tokens). Both are one line; a prompt that fits exactly still generates."""
    model = _lm()
    graphdef, state = _state(model)
    limit, key = model.max_positions, jax.random.key(0)
    with pytest.raises(ValueError, match=r"^prompt is empty: give at least one token"):
        compile_generate(graphdef, 2)(state, jnp.zeros((B, 0), jnp.int32), key)
    with pytest.raises(ValueError) as info:
        compile_generate(graphdef, 3)(state, _tokens(1, (B, limit - 2)), key)
    assert str(info.value) == (f"prompt ({limit - 2} tokens) + new_tokens (3) = {limit + 1} passes the model's "
                               f"{limit} positions; generate at most 2 tokens after this prompt")
    assert compile_generate(graphdef, 2)(state, _tokens(1, (B, limit - 2)), key).shape == (B, limit)


@pytest.mark.parametrize("prompt, line", [
    (np.full((B, 3), V + 24, np.int32), f"prompt token id {V + 24} is outside the model's vocabulary: ids must be "
                                        f"0..{V - 1}"),
    (np.array([[1, V, 2]], np.int32), f"prompt token id {V} is outside the model's vocabulary: ids must be 0..{V - 1}"),
    (np.array([[1, -3, 2]], np.int32), f"prompt token id -3 is outside the model's vocabulary: ids must be 0..{V - 1}"),
    (np.array([1, 2, 3], np.int32), "prompt must be token ids of shape [batch, tokens], got shape (3,): use "
                                    "prompt[None] for one sequence"),
    (np.ones((1, 2, 3), np.int32), "prompt must be token ids of shape [batch, tokens], got shape (1, 2, 3)"),
    ([[1, 2]], "prompt must be token ids of shape [batch, tokens], got shape None"),
    (np.ones((B, 3), np.float32), "prompt must hold integer token ids, got dtype float32"),
])
def test_a_prompt_of_ids_outside_the_vocabulary_or_not_batch_by_tokens_is_one_line(prompt, line):
    """The embedding gather clamps an id past the table and wraps a negative one, so such a prompt would continue
    garbage without a word; a 1-D prompt would fail on unpacking its shape. Each is one line naming the prompt, and
    the largest valid id still generates (cached and uncached)."""
    graphdef, state = _state(_lm())
    key = jax.random.key(0)
    for cached in (True, False):
        with pytest.raises(ValueError) as info:
            compile_generate(graphdef, 2, cached=cached)(state, prompt, key)
        assert str(info.value) == line
        edge = jnp.asarray([[0, V - 1]] * B, jnp.int32)
        assert compile_generate(graphdef, 2, cached=cached)(state, edge, key).shape == (B, 4)


def test_structural_pruning_of_an_lm_equals_masking():
    model, tokens = _lm(num_kv_heads=None), _tokens(3)  # keep_heads needs a key/value head per query head
    masks = {"decoder_self": np.array([[1, 0, 1, 1], [0, 0, 1, 0]], np.float32)}
    assert mask_shapes(model) == {"decoder_self": (2, 4)}
    pruned = prune_model(model, masks)
    assert [pruned.decoder.blocks[i].self_attn.num_heads for i in (0, 1)] == [3, 1]
    np.testing.assert_allclose(pruned(tokens), model(tokens, head_masks={"decoder_self": jnp.asarray(masks[
        "decoder_self"])}), rtol=1e-5, atol=1e-5)


def _reference_lm_logits(p: dict, tokens: np.ndarray, num_heads: int, num_kv: int) -> np.ndarray:
    """The pre-LN decoder-only Transformer written out in numpy (float64) from its parameters: sinusoidal positions,
    causal multi-head attention with grouped key/value heads, GELU MLP, final LayerNorm, tied read-out / sqrt(d)."""
    f = lambda a: np.asarray(a, np.float64)
    emb = f(p["decoder"]["embed"]["embedding"])
    t, d = tokens.shape[1], emb.shape[1]
    pos = np.arange(t)[:, None] * np.exp(-np.log(10000.0) * np.arange(0, d, 2) / d)[None]
    table = np.zeros((t, d))
    table[:, 0::2], table[:, 1::2] = np.sin(pos), np.cos(pos)
    x = emb[tokens] + table[None]  # (B, T, d)

    def norm(x, q):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-6) * f(q["scale"]) + f(q["bias"])

    for blk in p["decoder"]["blocks"].values():
        a, h = blk["self_attn"], norm(x, blk["norms"][0])
        q = np.einsum("btd,dnh->btnh", h, f(a["query"]["kernel"])) + f(a["query"]["bias"])
        k = np.einsum("btd,dnh->btnh", h, f(a["key"]["kernel"])) + f(a["key"]["bias"])
        v = np.einsum("btd,dnh->btnh", h, f(a["value"]["kernel"])) + f(a["value"]["bias"])
        k, v = np.repeat(k, num_heads // num_kv, 2), np.repeat(v, num_heads // num_kv, 2)  # grouped heads
        s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        o = np.einsum("bnts,bsnh->btnh", w, v)
        x = x + np.einsum("btnh,nhd->btd", o, f(a["out"]["kernel"])) + f(a["out"]["bias"])
        h = norm(x, blk["norms"][1])
        up = h @ f(blk["mlp"]["up"]["kernel"]) + f(blk["mlp"]["up"]["bias"])
        gelu = 0.5 * up * (1 + np.tanh(np.sqrt(2 / np.pi) * (up + 0.044715 * up ** 3)))  # jax.nn.gelu's default
        x = x + gelu @ f(blk["mlp"]["down"]["kernel"]) + f(blk["mlp"]["down"]["bias"])
    x = norm(x, p["decoder"]["final_norm"])
    return x @ emb.T / np.sqrt(d)  # (B, T, V)


def test_loss_on_a_tiny_corpus_matches_the_reference_written_out_by_value_and_gradient():
    """Mean next-token cross-entropy over the scored positions (padding at the end), from the model and from the
    numpy reference; the gradient of the model's loss against central finite differences of the reference."""
    model = _lm()
    tokens = np.array(_tokens(4, (B, T + 1)))
    tokens[1, 9:] = 0  # a shorter row: padded at the end
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def model_loss(params):
        logits, labels, weights = nnx.merge(graphdef, params, rest).forward_batch(batch)
        total, count = losses.cross_entropy(logits, labels, weights)
        return total / count

    def reference_loss(p):
        logits = _reference_lm_logits(p, batch["inputs"], 4, 2)
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
            -1, keepdims=True)
        picked = np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
        w = batch["targets"] != 0
        return float(-(picked * w).sum() / w.sum())

    pure = jax.tree.map(np.asarray, nnx.to_pure_dict(params))
    value, grads = jax.value_and_grad(model_loss)(params)
    np.testing.assert_allclose(float(value), reference_loss(pure), rtol=1e-5)
    flat = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(grads))[0]
    rng = np.random.default_rng(0)
    for path, g in [flat[i] for i in rng.choice(len(flat), 6, replace=False)]:  # six parameters, one entry each
        index = tuple(rng.integers(0, n) for n in np.shape(g))
        plus, minus = jax.tree.map(np.copy, pure), jax.tree.map(np.copy, pure)
        _at(plus, path)[index] += 1e-3
        _at(minus, path)[index] -= 1e-3
        numeric = (reference_loss(plus) - reference_loss(minus)) / 2e-3
        np.testing.assert_allclose(np.asarray(g)[index], numeric, rtol=2e-3, atol=2e-5, err_msg=str(path))


def _at(tree, path):
    for part in path:
        tree = tree[getattr(part, "key", getattr(part, "idx", None))]
    return tree


@pytest.mark.parametrize("override, message", [
    ({"model.attention.name": "linformer"}, "attention 'linformer' does not support causal attention (used by "
                                            "decoder_self)"),
    ({"model.kinds.encoder_self.attention": "local"}, "model.kinds.encoder_self.attention='local': model 'lm' has "
                                                      "no encoder_self attention (its kinds: decoder_self)"),
    ({"model.kinds.cross.num_kv_heads": 1}, "model 'lm' has no cross attention"),
    ({"model.num_decoder_layers": 2}, "model.num_decoder_layers=2: model 'lm' does not use it"),
    ({"model.pooling": "cls"}, "model.pooling='cls': model 'lm' does not use it"),
    ({"model.name": "seq2seq"}, "model.name='seq2seq' trains on translation tasks; this task is 'lm'"),
    ({"model.name": "gpt"}, "model.name='gpt' is not a registered model"),
    ({"loss.diversity.kinds": "cross", "loss.diversity.output.weight": 0.1},
     "loss.diversity.kinds='cross': the model has none of these attention kinds (its kinds: decoder_self)"),
])
def test_bad_lm_configs_are_one_line(override, message, tmp_path):
    c = load_config("mqar", "quick")
    c.task.data_dir = str(tmp_path)
    for key, value in override.items():
        *parents, last = key.split(".")
        node = c
        for part in parents:
            node = node[part]
        node[last] = value
    with pytest.raises(ValueError) as e:
        validate_config(c)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_an_lm_trains_with_gates_diversity_and_grouped_heads_and_the_head_analysis_runs_on_it(tmp_path):
    """The whole lab on the decoder-only model, as a user runs it: MQAR with grouped key/value heads, L0 head gates
    and an output-diversity term in the loss, then ``python -m attn_lab.analysis`` (importance, ablations, pruning
    curve, diagnostics, structural pruning, gates) on the finished run -- every report is about the LM's one
    attention kind, ``decoder_self``, with its layers x heads shape."""
    import json
    import os
    import subprocess
    import sys

    from attn_lab.train.trainer import train_and_evaluate

    c = load_config("mqar", "quick")
    c.task.update(data_dir=str(tmp_path / "d"), vocab_size=24, seq_len=16, num_kv_pairs=2, num_train=64,
                  num_validation=16, num_test=16)
    c.model.update(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=32)
    c.heads.gates.update(enabled=True, l0=0.01)
    c.loss.diversity.output.weight = 0.1
    c.train.update(num_steps=2, batch_size=8, log_every=1, eval_every=2, checkpoint_every=2)
    c.wandb.mode = "disabled"
    results = train_and_evaluate(c, str(tmp_path / "run"))
    assert np.isfinite(results["final"]["test"]["loss"])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "attn_lab.analysis", "--workdir", str(tmp_path / "run"),
                           "--what", "importance,ablate,prune,structural,gates,diagnose", "--max-batches", "1",
                           "--prune-fraction", "0.5", "--gate-targets", "0.5", "--gate-steps",
                           "2", "--speed-batch", "4"], capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "run" / "analysis"
    assert np.asarray(json.loads((out / "importance.json").read_text())["decoder_self"]).shape == (2, 4)
    assert len(json.loads((out / "ablate.json").read_text())["all_but_one"]["decoder_self"]) == 2
    assert set(json.loads((out / "diagnose.json").read_text())) == {"decoder_self/0", "decoder_self/1"}
    structural = json.loads((out / "structural.json").read_text())  # grouped heads: masked pruning only, said so
    assert "decoder_self has grouped key/value heads" in structural["skipped"] and "structural: skipped" in proc.stdout
    assert {"importance", "random"} <= set(json.loads((out / "prune.json").read_text()))
    assert [g["target"] for g in json.loads((out / "gates.json").read_text())] == [1.0, 0.5]
