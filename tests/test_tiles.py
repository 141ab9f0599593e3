"""The fused kernel's tile rule (attn_lab/attention/tiles.py), as pure functions: the shared-memory estimate
written out for one case, the configurations it refuses, and that nothing it allows exceeds the limit."""

import itertools

import jax.numpy as jnp
import pytest

from attn_lab.attention.tiles import (
    KERNELS,
    SMEM_LIMIT,
    STAGES,
    TILES,
    fused_plan,
    kernel_bytes,
    largest_tile,
    padded_head_dim,
)


def test_the_estimate_written_out_for_dkdv_at_tile_128_head_dim_128_bf16():
    """dK/dV streams q and dO ([128, 128] bf16, 32 KiB each) and the int8 token mask (16 KiB) per stage, and keeps
    k, v (32 KiB each), p and ds ([128, 128] bf16, 32 KiB each): 80 KiB per stage + 128 KiB."""
    assert kernel_bytes("dkdv", 128, 128, jnp.bfloat16, 1) == 80 * 1024 + 128 * 1024
    assert kernel_bytes("dkdv", 128, 128, jnp.bfloat16, 2) == 2 * 80 * 1024 + 128 * 1024  # 288 KiB: over 227
    for kernel, tile, hd in itertools.product(KERNELS, TILES, (64, 128)):
        one = kernel_bytes(kernel, tile, hd, jnp.float32, 1) - tile * tile  # the int8 mask does not double
        assert one == 2 * (kernel_bytes(kernel, tile, hd, jnp.bfloat16, 1) - tile * tile)  # float32 doubles


def test_padded_head_dims():
    assert [padded_head_dim(h) for h in (1, 16, 17, 48, 64, 65, 128)] == [16, 16, 32, 64, 64, 128, 128]


def test_a_tile_beyond_shared_memory_is_refused_in_one_line_with_the_largest_that_fits():
    with pytest.raises(ValueError) as info:
        fused_plan(128, 128, jnp.float32)
    assert str(info.value) == ("fused kernel: tile 128 with head dim 128 in float32 does not fit in 227 KiB of "
                               "shared memory (dkdv: 400 KiB at one stage); use fused_block_size=64 or less")
    assert largest_tile(128, jnp.float32) == 64 and largest_tile(128, jnp.bfloat16) == 128


def test_bf16_head_dim_128_at_tile_128_pipelines_dkdv_less_and_says_why():
    plan = fused_plan(128, 128, jnp.bfloat16)
    assert plan.of("forward") == STAGES and plan.of("dkdv") == 1
    assert plan.why == "tile 128, head dim 128 bfloat16: dq, dkdv at 1 stage(s) to fit 227 KiB"
    assert fused_plan(64, 64, jnp.bfloat16).why == "tile 64, head dim 64 bfloat16: 2 stages each, within 227 KiB"


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("head_dim", [8, 48, 64, 100, 128, 256])
def test_every_allowed_plan_fits_and_every_refusal_is_a_real_overflow(dtype, head_dim):
    for tile in TILES:
        try:
            plan = fused_plan(tile, head_dim, dtype)
        except ValueError:
            assert any(kernel_bytes(k, tile, head_dim, dtype, 1) > SMEM_LIMIT for k in KERNELS)
            continue
        assert plan.tile == tile
        for kernel in KERNELS:
            stages = plan.of(kernel)
            assert 1 <= stages <= STAGES and kernel_bytes(kernel, tile, head_dim, dtype, stages) <= SMEM_LIMIT
            assert stages == STAGES or kernel_bytes(kernel, tile, head_dim, dtype, stages + 1) > SMEM_LIMIT


def test_an_explicit_fused_tile_beyond_shared_memory_is_refused_at_validation(monkeypatch):
    """On a GPU (the backend check stubbed), implementation='fused' with a tile the rule refuses stops the run's
    validation in one line naming the kernel key, before any file is written."""
    from attn_lab.attention import dispatch
    from attn_lab.train.config import validate_config
    from tests.helpers import tiny_numbers

    monkeypatch.setattr(dispatch, "fused_refusal", lambda backend: None)
    c = tiny_numbers("/nonexistent/data")
    c.model.d_model, c.model.num_heads = 512, 4  # head dim 128, float32
    c.model.kinds.encoder_self.attention = "local"
    c.model.attention.local.update(implementation="fused", fused_block_size=128)
    with pytest.raises(ValueError) as info:
        validate_config(c)
    assert str(info.value) == (
        "model.attention.local: fused kernel: tile 128 with head dim 128 in float32 does not fit in 227 KiB of shared "
        "memory (dkdv: 400 KiB at one stage); use fused_block_size=64 or less (used by encoder_self)")
    c.model.attention.local.fused_block_size = 64
    validate_config(c)
