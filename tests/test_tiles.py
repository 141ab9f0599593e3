"""The fused kernels' tile rule (attn_lab/attention/tiles.py), as pure functions: the on-chip estimate written
out for one case, the configurations it refuses, and that nothing it picks exceeds the limit or its block."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from attn_lab.attention.tiles import (
    KERNELS,
    STAGES,
    TILES,
    choose_tile,
    forced_plan,
    fused_tile,
    kernel_bytes,
    padded_head_dim,
    smem_limit,
)

BLOCKS = (16, 32, 64, 128)


def test_the_limit_is_an_h200s_227_kib():
    assert smem_limit() == smem_limit("NVIDIA H200") == smem_limit("NVIDIA H100 80GB HBM3") == 232448


def test_the_estimate_written_out_for_dkdv_at_tile_128_head_dim_128_bf16():
    """dK/dV keeps k and v ([128, 128] bf16, 32 KiB each) and the float32 dk, dv accumulators (64 KiB each), and
    streams q and dO (32 KiB each) with the int8 token mask (16 KiB) per stage: 192 KiB + 80 KiB per stage, beyond
    227 KiB even at one stage, so the rule refuses 128 for dK/dV and takes 64."""
    assert kernel_bytes("dkdv", 128, 128, 128, jnp.bfloat16, 1) == 192 * 1024 + 80 * 1024 > smem_limit()
    assert kernel_bytes("dkdv", 128, 128, 128, jnp.bfloat16, 2) == 192 * 1024 + 2 * 80 * 1024
    assert choose_tile("dkdv", 128, jnp.bfloat16, 128)[:2] == (64, STAGES)
    assert kernel_bytes("dkdv", 64, 64, 128, jnp.bfloat16, STAGES) <= smem_limit()


def test_float32_doubles_the_operand_bytes():
    """The estimate is linear in the operand size: float32 (4 bytes) adds twice what bf16 (2) adds over int8 (1);
    the float32 accumulators and the int8 mask stay."""
    for kernel, tq, tk, hd, stages in itertools.product(KERNELS, TILES, TILES, (64, 128), (1, 2)):
        size = {e: kernel_bytes(kernel, tq, tk, hd, e, stages) for e in (np.int8, jnp.bfloat16, jnp.float32)}
        assert size[jnp.float32] - size[jnp.bfloat16] == 2 * (size[jnp.bfloat16] - size[np.int8]) > 0


def test_padded_head_dims():
    assert [padded_head_dim(h) for h in (1, 16, 17, 48, 64, 65, 128)] == [16, 16, 32, 64, 64, 128, 128]


def test_each_kernel_gets_its_own_tile_and_the_dispatch_reason_says_why():
    plan = fused_tile(128, 128, jnp.bfloat16)
    assert plan.tiles == (64, 64, 64) and plan.stages == (2, 2, 2)
    assert plan.why == ("block 128, head dim 128 bfloat16: forward 64x2 (128x2: 256 KiB), dq 64x2 (128x2: 288 KiB), "
                        "dkdv 64x2 (128x2: 352 KiB) within 227 KiB")
    plan = fused_tile(128, 64, jnp.float32)
    assert plan.tiles == (128, 64, 64) and plan.launch() == "forward 128x2, dq 64x2, dkdv 64x2"
    assert fused_tile(64, 64, jnp.bfloat16).why == ("block 64, head dim 64 bfloat16: forward 64x2, dq 64x2, dkdv "
                                                    "64x2 within 227 KiB")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("head_dim", [8, 48, 64, 100, 128, 256, 512])
def test_every_chosen_tile_fits_divides_its_block_and_is_the_largest_that_does(dtype, head_dim):
    for block, kernel in itertools.product(BLOCKS, KERNELS):
        tile, stages, _ = choose_tile(kernel, head_dim, dtype, block)
        assert tile <= block and block % tile == 0 and 1 <= stages <= STAGES
        assert kernel_bytes(kernel, tile, tile, head_dim, dtype, stages) <= smem_limit()
        larger = [t for t in TILES if tile < t <= block]
        assert all(kernel_bytes(kernel, t, t, head_dim, dtype, stages) > smem_limit() for t in larger)
        assert fused_tile(block, head_dim, dtype).of(kernel) == (tile, stages)


def test_a_head_dim_no_tile_fits_is_refused_in_one_line():
    assert choose_tile("forward", 1024, jnp.float32, 128) is None
    with pytest.raises(ValueError) as info:
        fused_tile(128, 1024, jnp.float32)
    assert str(info.value) == (
        "fused kernel: block 128 with head dim 1024 in float32 does not fit in 227 KiB of shared memory at any tile "
        "(forward: 256 KiB at tile 16, one stage); use an implementation that is not fused")


def test_a_forced_tile_is_checked_against_the_same_estimate():
    assert forced_plan(128, 32, 3, 128, jnp.float32).of("dkdv") == (32, 3)
    with pytest.raises(ValueError) as info:
        forced_plan(128, 128, 2, 128, jnp.bfloat16)
    assert str(info.value) == ("fused kernel: tile 128 with head dim 128 in bfloat16 at 2 stage(s) does not fit in "
                               "227 KiB of shared memory (dkdv: 352 KiB)")
    with pytest.raises(ValueError, match="tile 64 does not divide the block 32"):
        forced_plan(32, 64, 1, 64, jnp.bfloat16)


def test_an_explicit_fused_kernel_beyond_shared_memory_is_refused_at_validation(monkeypatch):
    """On a GPU (the backend check stubbed), implementation='fused' at a head dim no tile fits stops the run's
    validation in one line naming the kernel key, before any file is written."""
    from attn_lab.attention import dispatch
    from attn_lab.train.config import validate_config
    from tests.helpers import tiny_numbers

    monkeypatch.setattr(dispatch, "fused_refusal", lambda backend: None)
    c = tiny_numbers("/nonexistent/data")
    c.model.d_model, c.model.num_heads = 4096, 4  # head dim 1024, float32
    c.model.kinds.encoder_self.attention = "local"
    c.model.attention.local.update(implementation="fused", fused_block_size=128)
    with pytest.raises(ValueError) as info:
        validate_config(c)
    assert str(info.value).startswith("model.attention.local: fused kernel: block 128 with head dim 1024 in float32 "
                                      "does not fit in 227 KiB")
    assert str(info.value).endswith(" (used by encoder_self)") and "\n" not in str(info.value)
    c.model.d_model = 512  # head dim 128: every kernel finds a tile inside the 128 block
    validate_config(c)
