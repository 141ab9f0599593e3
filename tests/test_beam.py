"""Beam search (attn_lab/train/beam.py) against independent references, by value.

- beam 1 is greedy decoding, token for token, cached and uncached;
- the cached search (KV cache rows reordered by parent) equals the uncached one (prefix re-run) at beam 4;
- on a tiny model every output sequence is enumerated and scored from teacher-forced log-probs with the length
  penalty written out here in numpy: a beam wide enough to keep every prefix returns that argmax, for several alphas;
- a larger alpha moves the choice to longer outputs in a constructed case;
- the trainer's seed axis (``compile_decode(num_seeds=2)``) equals decoding each seed alone;
- bad ``eval.beam_size`` / ``eval.length_penalty`` stop ``validate_config`` with one line.

Matmul precision: every test runs under ``jax.default_matmul_precision('highest')`` (tests/conftest.py), and the
module-scoped model fixture trains under it explicitly (conftest's setting does not reach broader fixtures), so
the exact-equality checks hold on CPU and GPU alike.
"""

import functools
import importlib.util
import itertools
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from attn_lab.models import build_model, supports_cached_decoding
from attn_lab.models.transformer import EOS, PAD
from attn_lab.train.beam import beam_search, beam_search_uncached
from attn_lab.train.config import base_config, validate_config
from attn_lab.train.decode import compile_decode, greedy_decode, greedy_decode_uncached
from attn_lab.train.metrics import translation_scores
from attn_lab.train.restore import load_finished_run
from attn_lab.train.seeds import stack
from attn_lab.train.steps import merge, model_state
from attn_lab.train.trainer import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V, T = 12, 8  # vocabulary incl. PAD/BOS/EOS, longest output


def _cfg(**model):
    cfg = base_config().model
    cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.mlp_dim, cfg.dropout = 2, 32, 4, 64, 0.0
    cfg.update(model)
    return cfg


def _state(m):
    graphdef, params, _ = nnx.split(m, nnx.Param, ...)
    return graphdef, {"params": nnx.to_pure_dict(params), "model_state": model_state(m)}


def _reversal_batch(seed, batch=32, vocab=V, lengths=(2, 6), max_len=T):
    """Source: ``lengths`` (inclusive range) random content tokens; target: them reversed, then EOS (a task beam
    and greedy can disagree on while half-trained)."""
    rng = np.random.default_rng(seed)
    inputs, targets = np.zeros((batch, lengths[1] + 1), np.int32), np.zeros((batch, max_len), np.int32)
    for row, n in enumerate(rng.integers(lengths[0], lengths[1] + 1, batch)):
        tokens = rng.integers(3, vocab, n)
        inputs[row, :n], targets[row, :n], targets[row, n] = tokens, tokens[::-1], EOS
    return jnp.asarray(inputs), jnp.asarray(targets)


def _train(m, steps, **task):
    """A few Adam steps of teacher-forced cross-entropy: outputs with varied tokens and EOS positions."""
    graphdef, state = _state(m)
    opt = optax.adam(3e-3)

    @jax.jit
    def update(params, opt_state, inputs, targets):
        def loss(p):
            logits = merge(graphdef, state, p)(inputs, targets)  # (B, T, V)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
            w = targets != PAD
            return (ce * w).sum() / w.sum()
        grads = jax.grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state

    params, opt_state = state["params"], opt.init(state["params"])
    for s in range(steps):
        params, opt_state = update(params, opt_state, *_reversal_batch(s, **task))
    return graphdef, {"params": params, "model_state": state["model_state"]}


@pytest.fixture(scope="module")
def trained():
    with jax.default_matmul_precision("highest"):
        return _train(build_model(_cfg(), kind="translation", vocab_size=V, max_len=16), steps=60)


def _inputs(seed=100, batch=8):
    return _reversal_batch(seed, batch)[0]


def _search(graphdef, state, inputs, *, beam_size, length_penalty=0.6, cached=True, max_len=T):
    fn = beam_search if cached else beam_search_uncached
    return np.asarray(jax.jit(functools.partial(fn, graphdef=graphdef, max_len=max_len, beam_size=beam_size,
                                                length_penalty=length_penalty))(state, inputs))


def test_beam_one_is_greedy(trained):
    graphdef, state = trained
    inputs = _inputs()
    for fn, greedy in ((True, greedy_decode), (False, greedy_decode_uncached)):
        want = np.asarray(jax.jit(functools.partial(greedy, graphdef=graphdef, max_len=T))(state, inputs))
        got = _search(graphdef, state, inputs, beam_size=1, cached=fn)
        np.testing.assert_array_equal(got, want)
    assert len({tuple(r) for r in want}) > 1 and (want == EOS).any()  # varied outputs, some end early


def test_cached_beam_equals_uncached(trained):
    graphdef, state = trained
    inputs = _inputs(101)
    cached = _search(graphdef, state, inputs, beam_size=4)
    np.testing.assert_array_equal(cached, _search(graphdef, state, inputs, beam_size=4, cached=False))
    assert cached.shape == (8, T) and ((cached == EOS).sum(1) <= 1).all()
    after_eos = np.cumsum(cached == EOS, axis=1) - (cached == EOS)  # 1 strictly after the EOS
    assert (cached[after_eos > 0] == 0).all()


def test_adaptive_span_cached_decoding_equals_uncached():
    """Adaptive span decodes from the KV cache (the cache slot is the query's position): greedy and beam 4 pick the
    tokens of the uncached search, which re-runs the prefix through the blockwise kernel. Spans are short enough
    (z + R = 4 of 8 positions) that the distance cut acts; a cached step that placed the query elsewhere differs."""
    cfg = _cfg()
    cfg.attention.name, cfg.kinds.cross.attention = "adaptive_span", "dense"
    cfg.attention.adaptive_span.update(max_span=8, ramp=2.0, init_span=0.25)
    with jax.default_matmul_precision("highest"):
        graphdef, state = _train(build_model(cfg, kind="translation", vocab_size=V, max_len=16), steps=60)
        assert supports_cached_decoding(merge(graphdef, state))
        inputs = _inputs(102)
        want = jax.jit(functools.partial(greedy_decode_uncached, graphdef=graphdef, max_len=T))(state, inputs)
        got = jax.jit(functools.partial(greedy_decode, graphdef=graphdef, max_len=T))(state, inputs)
        np.testing.assert_array_equal(got, want)
        assert len({tuple(r) for r in np.asarray(want)}) > 1
        beam = _search(graphdef, state, inputs, beam_size=4)
        np.testing.assert_array_equal(beam, _search(graphdef, state, inputs, beam_size=4, cached=False))


# --- exhaustive reference on a tiny model ------------------------------------------------------------------------

TINY_V = 5  # PAD, BOS, EOS and two content tokens


def _all_outputs(max_len):
    """Every output the search can produce: tokens then EOS (no EOS before), or ``max_len`` tokens without EOS;
    as ``(ids [max_len] 0-padded, length incl. EOS)``."""
    out = []
    for n in range(1, max_len + 1):
        for seq in itertools.product(range(TINY_V), repeat=n):
            if EOS in seq[:-1] or (n < max_len and seq[-1] != EOS):
                continue
            out.append((np.pad(seq, (0, max_len - n)), n))
    return out


def _exhaustive_best(graphdef, state, source, max_len, alpha):
    """Argmax over every output of ``sum log P(y_t | y_<t, x) / ((5 + |Y|) / 6)^alpha`` (GNMT), log-probs from
    the teacher-forced model (one forward over all candidates), the rest in float64 numpy."""
    outputs = _all_outputs(max_len)
    targets = jnp.asarray(np.stack([ids for ids, _ in outputs]))  # (C, T)
    logits = merge(graphdef, state)(jnp.broadcast_to(source, (len(outputs), source.shape[0])), targets)
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)), np.float64)  # (C, T, V)
    picked = np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]  # (C, T)
    lengths = np.array([n for _, n in outputs])
    scores = np.where(np.arange(max_len) < lengths[:, None], picked, 0.0).sum(1) / ((5 + lengths) / 6) ** alpha
    order = np.argsort(-scores)
    assert scores[order[0]] - scores[order[1]] > 1e-4, "near tie: the reference cannot decide"
    return outputs[order[0]][0], lengths[order[0]]


def _tiny_model():
    return build_model(_cfg(d_model=16, num_heads=2, mlp_dim=32, tie_embeddings=False), kind="translation",
                       vocab_size=TINY_V, max_len=8, seed=3)


@pytest.fixture(scope="module")
def tiny():
    """Random init: for the source below, EOS alone is its most probable output."""
    return _state(_tiny_model())


@pytest.fixture(scope="module")
def tiny_trained():
    """10 steps of reversing 1-3 tokens: varied best outputs, which greedy decoding misses for some sources."""
    with jax.default_matmul_precision("highest"):
        return _train(_tiny_model(), 10, vocab=TINY_V, lengths=(1, 3), max_len=4)


@pytest.mark.parametrize("max_len,alpha", [(3, 0.0), (3, 0.6), (4, 0.6), (4, 2.0)])
def test_wide_beam_finds_exhaustive_argmax(tiny_trained, max_len, alpha):
    graphdef, state = tiny_trained
    sources = jnp.asarray([[3, 4, 4, 0], [4, 3, 3, 4], [3, 3, 0, 0], [4, 0, 0, 0]], jnp.int32)  # (B, S)
    want = np.stack([_exhaustive_best(graphdef, state, source, max_len, alpha)[0] for source in sources])
    width = TINY_V ** max_len  # >= every step's live prefixes x vocab + finished ones: nothing is pruned
    for cached in (True, False):
        got = _search(graphdef, state, sources, beam_size=width, length_penalty=alpha, cached=cached,
                      max_len=max_len)
        np.testing.assert_array_equal(got, want)
    greedy = _search(graphdef, state, sources, beam_size=1, max_len=max_len)
    assert (greedy != want).any(axis=1).any()  # the search matters here: greedy misses some argmax


def test_length_penalty_moves_choice_to_longer_outputs(tiny):
    """A constructed case: for this source the tiny model's most probable output is EOS alone, so alpha 0 picks it;
    alpha 3 divides longer outputs' (more negative) log-probs by more and picks a longest one. Both choices equal
    the exhaustive argmax."""
    graphdef, state = tiny
    source, max_len = jnp.asarray([[3, 4, 4, 3]], jnp.int32), 4
    lengths = {}
    for alpha in (0.0, 3.0):
        want, lengths[alpha] = _exhaustive_best(graphdef, state, source[0], max_len, alpha)
        got = _search(graphdef, state, source, beam_size=TINY_V ** max_len, length_penalty=alpha, max_len=max_len)
        np.testing.assert_array_equal(got[0], want)
    assert lengths[0.0] == 1 and lengths[3.0] == max_len


def test_seed_axis_equals_each_seed_alone():
    """The trainer decodes a state with a leading seed axis (vmapped); each seed's rows equal its own search."""
    models = [build_model(_cfg(), kind="translation", vocab_size=V, max_len=16, seed=s) for s in (0, 1)]
    graphdef, states = _state(models[0])[0], [_state(m)[1] for m in models]
    inputs = _inputs(102, batch=4)
    both = np.asarray(compile_decode(graphdef, T, num_seeds=2, beam_size=3, length_penalty=0.6)(stack(states),
                                                                                              inputs))
    single = compile_decode(graphdef, T, beam_size=3, length_penalty=0.6)
    assert both.shape == (2, 4, T)
    for i, state in enumerate(states):
        np.testing.assert_array_equal(both[i], np.asarray(single(state, inputs)))


def test_compile_decode_beam_one_is_greedy_program(trained):
    graphdef, state = trained
    inputs = _inputs(103)
    np.testing.assert_array_equal(compile_decode(graphdef, T, beam_size=1, length_penalty=2.0)(state, inputs),
                                  compile_decode(graphdef, T)(state, inputs))


@pytest.mark.parametrize("key,value,message", [
    ("beam_size", 0, "eval.beam_size must be >= 1 (1: greedy decoding), got 0"),
    ("beam_size", 1.5, "eval.beam_size must be an integer, got 1.5"),
    ("length_penalty", -1, "eval.length_penalty must be >= 0, got -1"),
    ("validation_beam_size", 0,
     "eval.validation_beam_size must be >= 1 (1: greedy decoding), or unset (eval.beam_size), got 0"),
])
def test_bad_eval_values_give_one_line_error(key, value, message):
    """Built from a plain dict, as a config.json or a Python caller gives it (ConfigDict's typed overrides would
    refuse 1.5 for an int field before validation)."""
    config = base_config().to_dict()
    config["eval"][key] = value
    with pytest.raises(ValueError) as err:
        validate_config(ml_collections.ConfigDict(config))
    assert str(err.value) == message


def _tiny_numbers(data_dir):
    """configs/numbers.py:quick shrunk to a few steps of a one-layer model."""
    spec = importlib.util.spec_from_file_location("numbers_config", os.path.join(ROOT, "configs", "numbers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config("quick")
    c.task.data_dir, c.task.max_value, c.wandb.mode = data_dir, 299, "disabled"
    c.model.num_layers, c.model.d_model, c.model.mlp_dim, c.model.num_heads = 1, 32, 64, 4
    c.train.update(dict(num_steps=4, batch_size=16, warmup_steps=2, log_every=2, eval_every=4, checkpoint_every=4,
                        max_eval_batches=2))
    return c


def test_run_config_reaches_the_trainer_and_the_analysis_decoder(tmp_path, data_dir):
    """``eval.beam_size=3`` in a run's config: the trainer's test BLEU (results.json) and the restored run's
    analysis scorer on the same batches both equal the BLEU of beam search called directly, which differs from
    greedy decoding's here."""
    config = _tiny_numbers(data_dir)
    config.eval.beam_size, config.eval.length_penalty = 3, 1.0
    results = train_and_evaluate(config, str(tmp_path / "run"))
    run = load_finished_run(str(tmp_path / "run"))
    batches, refs = run.batches("test", config.train.max_eval_batches), run.task.references("test")

    def bleu(**search):
        decode = compile_decode(run.graphdef, run.task.max_target_length, **search)
        hyps = [run.task.decode(row) for b in batches for row in np.asarray(decode(run.state, b["inputs"]))]
        return translation_scores(hyps[: len(refs)], refs[: len(hyps)], config.eval.bleu_tokenize)["bleu"]

    want = bleu(beam_size=3, length_penalty=1.0)
    assert want != bleu()  # greedy decodes differently: the check below can tell which one ran
    assert results["final"]["test"]["bleu"] == pytest.approx(want)
    assert run.decode_scorer(batches, "test", "bleu")(run.state, {})[1] == pytest.approx(want)


def test_validation_beam_size_decodes_validation_only(tmp_path, data_dir):
    """``eval.validation_beam_size=1`` beside ``eval.beam_size=3``: the periodic validation's BLEU (metrics.jsonl,
    results' final validation) is greedy decoding's, the test BLEU is still the beam's, and the restored run's
    scorer decodes each split the same way."""
    config = _tiny_numbers(data_dir)
    config.eval.beam_size, config.eval.length_penalty, config.eval.validation_beam_size = 3, 1.0, 1
    results = train_and_evaluate(config, str(tmp_path / "run"))
    run = load_finished_run(str(tmp_path / "run"))
    assert results["compilations"]["decode_validation"] == 1  # its own program (counted before the final test)

    def bleu(split, **search):
        batches, refs = run.batches(split, config.train.max_eval_batches), run.task.references(split)
        decode = compile_decode(run.graphdef, run.task.max_target_length, **search)
        hyps = [run.task.decode(row) for b in batches for row in np.asarray(decode(run.state, b["inputs"]))]
        return translation_scores(hyps[: len(refs)], refs[: len(hyps)], config.eval.bleu_tokenize)["bleu"]

    beam = dict(beam_size=3, length_penalty=1.0)
    assert bleu("validation") != bleu("validation", **beam)  # the check below can tell which one ran
    assert results["final"]["validation"]["bleu"] == pytest.approx(bleu("validation"))
    assert results["final"]["test"]["bleu"] == pytest.approx(bleu("test", **beam))
    for split, search in (("validation", {}), ("test", beam)):
        scorer = run.decode_scorer(run.batches(split, config.train.max_eval_batches), split, "bleu")
        assert scorer(run.state, {})[1] == pytest.approx(bleu(split, **search))
