"""GQA uptraining (Ainslie et al. 2023, Section 2.1): a finished multi-head run's key/value heads mean-pooled into
groups by ``train.init_from`` + ``train.init_kv_heads='mean_pool'``; checked by value against the mean written out
here, against the multi-head module itself, and on a finished run."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attn_lab.attention import MultiHeadAttention
from attn_lab.checks import RunError
from attn_lab.train.config import validate_config
from attn_lab.train.restore import load_finished_run
from attn_lab.train.trainer import Run, train_and_evaluate
from attn_lab.train.uptrain import mean_pool_heads, poolable
from tests.helpers import tiny_numbers


def test_mean_pool_averages_consecutive_heads():
    x = np.random.default_rng(0).normal(size=(5, 8, 3))  # [in, heads, head_dim]
    pooled = mean_pool_heads(x, 2)
    want = np.stack([(x[:, 0] + x[:, 1] + x[:, 2] + x[:, 3]) / 4, (x[:, 4] + x[:, 5] + x[:, 6] + x[:, 7]) / 4], 1)
    np.testing.assert_allclose(pooled, want, rtol=1e-12)
    np.testing.assert_allclose(mean_pool_heads(x[0], 8), x[0])  # one head per group: unchanged
    np.testing.assert_allclose(mean_pool_heads(x, 1)[:, 0], x.mean(axis=1), rtol=1e-12)  # MQA: the mean of all
    with pytest.raises(ValueError, match="8 key/value heads cannot be mean-pooled into 3 groups"):
        mean_pool_heads(x, 3)
    assert poolable(("blocks", 0, "key", "kernel"), (32, 8, 4), (32, 2, 4))
    assert not poolable(("blocks", 0, "query", "kernel"), (32, 8, 4), (32, 2, 4))  # queries keep every head
    assert not poolable(("blocks", 0, "value", "kernel"), (32, 8, 4), (32, 3, 4))  # not a divisor
    assert not poolable(("blocks", 0, "value", "kernel"), (32, 8, 4), (16, 2, 4))  # another width


def test_pooled_heads_that_agree_within_groups_give_the_multi_head_output():
    """Where the heads of each group already share keys and values, pooling loses nothing: the grouped module
    computes the multi-head module's output exactly (float32, precision HIGHEST)."""
    d, n, groups = 32, 8, 2
    kw = dict(decode=False, precision=jax.lax.Precision.HIGHEST)
    mha = MultiHeadAttention(n, d, rngs=nnx.Rngs(0), **kw)
    for proj in (mha.key, mha.value):  # every head of a group gets its group's first head
        proj.kernel[...] = jnp.repeat(proj.kernel[...][:, :: n // groups], n // groups, axis=1)
        proj.bias[...] = jnp.repeat(jax.random.normal(jax.random.key(1), (groups, d // n)), n // groups, axis=0)
    gqa = MultiHeadAttention(n, d, num_kv_heads=groups, rngs=nnx.Rngs(2), **kw)
    gqa.query.kernel[...], gqa.query.bias[...] = mha.query.kernel[...], mha.query.bias[...]
    gqa.out.kernel[...], gqa.out.bias[...] = mha.out.kernel[...], mha.out.bias[...]
    for ours, theirs in ((gqa.key, mha.key), (gqa.value, mha.value)):
        ours.kernel[...] = mean_pool_heads(np.asarray(theirs.kernel[...]), groups)
        ours.bias[...] = mean_pool_heads(np.asarray(theirs.bias[...]), groups)
    x = jax.random.normal(jax.random.key(3), (2, 10, d))
    np.testing.assert_allclose(gqa(x, deterministic=True), mha(x, deterministic=True), atol=1e-5)
    assert gqa.key.kernel[...].shape == (d, groups, d // n)


@pytest.fixture(scope="module")
def source_run(tmp_path_factory, data_dir):
    """A finished 4-head run (the checkpoint GQA uptrains from)."""
    workdir = str(tmp_path_factory.mktemp("uptrain") / "mha")
    c = tiny_numbers(data_dir)
    c.wandb.mode = "disabled"
    train_and_evaluate(c, workdir)
    return workdir


def _grouped(data_dir, source, kv_heads, mode="mean_pool", **train):
    c = tiny_numbers(data_dir, init_from=source, init_kv_heads=mode, **train)
    c.wandb.mode, c.model.num_kv_heads = "disabled", kv_heads
    return c


def test_uptraining_starts_from_the_pooled_checkpoint_and_trains(source_run, data_dir, tmp_path):
    source = load_finished_run(source_run).state["params"]["encoder"]["blocks"][0]["self_attn"]
    c = _grouped(data_dir, source_run, 2)
    validate_config(c)
    run = Run(c, str(tmp_path / "gqa"))  # builds and warm-starts, compiles nothing
    ours = run.state["params"]["encoder"]["blocks"][0]["self_attn"]
    for proj in ("key", "value"):
        kernel, bias = np.asarray(source[proj]["kernel"]), np.asarray(source[proj]["bias"])  # [d, 4, h], [4, h]
        np.testing.assert_allclose(ours[proj]["kernel"][0], (kernel[:, 0::2] + kernel[:, 1::2]) / 2, rtol=1e-6)
        np.testing.assert_allclose(ours[proj]["bias"][0], (bias[0::2] + bias[1::2]) / 2, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(ours["query"]["kernel"][0], source["query"]["kernel"])  # queries as they were
    run.close()
    results = train_and_evaluate(c, str(tmp_path / "gqa"))  # and it trains
    assert results["steps"] == 12 and np.isfinite(results["final"]["test"]["loss"])


def test_uptraining_mistakes_are_one_line(source_run, data_dir, tmp_path):
    with pytest.raises(ValueError, match="train.init_kv_heads='mean_pool' needs train.init_from"):
        validate_config(_grouped(data_dir, None, 2))
    with pytest.raises(ValueError, match="has 4 key/value heads in encoder_self and this model 4; pooling needs fewer"):
        validate_config(_grouped(data_dir, source_run, 4))
    cross_only = _grouped(data_dir, source_run, None)  # one kind grouped is enough
    cross_only.model.kinds.cross.num_kv_heads = 2
    validate_config(cross_only)
    with pytest.raises(ValueError, match="train.init_kv_heads="):
        validate_config(_grouped(data_dir, source_run, 2, mode="first"))
    c = _grouped(data_dir, source_run, 2, mode="same")  # shapes differ and nothing says to pool them
    validate_config(c)
    with pytest.raises(RunError, match=r"parameter \S+/(key|value)/(kernel|bias) is \((32, )?4, 8\) in .*, "
                                       r"\((32, )?2, 8\) here; train.init_kv_heads='mean_pool' pools"):
        Run(c, str(tmp_path / "refused"))
    assert not os.path.exists(tmp_path / "refused")  # refused before the folder (lock, checkpoints) is made
    wider = tiny_numbers(data_dir, init_from=source_run)  # another width: every array differs, one line names one
    wider.wandb.mode, wider.model.d_model = "disabled", 48
    with pytest.raises(RunError, match=r"^train.init_from: parameter \S+ is \([\d, ]+\) in \S+, \([\d, ]+\) here$"):
        Run(wider, str(tmp_path / "wider"))
    assert not os.path.exists(tmp_path / "wider")


def test_vmapped_seeds_each_start_from_their_own_seed_s_run(source_run, data_dir, tmp_path):
    """``train.init_from`` with ``{seed}`` (a sweep's '{trial:...}'): seed i's state is pooled from seed i's run,
    not from the first one's."""
    (tmp_path / "src").mkdir()
    os.symlink(source_run, tmp_path / "src" / "seed=0")
    other = tiny_numbers(data_dir)
    other.wandb.mode, other.seed = "disabled", 1
    train_and_evaluate(other, str(tmp_path / "src" / "seed=1"))
    c = _grouped(data_dir, str(tmp_path / "src" / "seed={seed}"), 2)
    validate_config(c)
    run = Run(c, [str(tmp_path / "a"), str(tmp_path / "b")], seeds=[0, 1])
    ours = run.state["params"]["encoder"]["blocks"][0]["self_attn"]["key"]["kernel"]  # [S, d, 2, h]
    for i in (0, 1):
        source = load_finished_run(str(tmp_path / "src" / f"seed={i}")).state["params"]
        kernel = np.asarray(source["encoder"]["blocks"][0]["self_attn"]["key"]["kernel"])
        np.testing.assert_allclose(ours[i], (kernel[:, 0::2] + kernel[:, 1::2]) / 2, rtol=1e-6)
    assert not np.allclose(ours[0], ours[1])  # two different sources
    assert [cfg.train.init_from for cfg in run.configs] == [str(tmp_path / "src" / f"seed={i}") for i in (0, 1)]
    run.close()


def test_a_per_seed_source_with_nothing_to_pool_is_one_line_before_the_folder(source_run, data_dir, tmp_path):
    """A ``{seed}`` source cannot be read when the config is validated; with as many key/value heads as this model
    it trained with nothing pooled and said nothing. Now the run refuses in one line before its folder exists."""
    (tmp_path / "src").mkdir()
    os.symlink(source_run, tmp_path / "src" / "seed=0")
    c = _grouped(data_dir, str(tmp_path / "src" / "seed={seed}"), 4)  # the source has 4 key/value heads too
    validate_config(c)  # per seed: checked when the run reads its source
    with pytest.raises(RunError) as info:
        Run(c, [str(tmp_path / "same")], seeds=[0])
    assert str(info.value) == (f"train.init_kv_heads='mean_pool': {tmp_path / 'src' / 'seed=0'} has as many key/value "
                               "heads as this model in every attention; pooling needs fewer groups here (set "
                               "model.num_kv_heads below the source's)")
    assert not os.path.exists(tmp_path / "same")
