"""The first GPU check of the fused block-sparse flash kernels: a compile matrix, then 16K-token timings; one report.

  python scripts/fused_check.py --out fused.json            # on a CUDA GPU: about 3-5 minutes
  python scripts/fused_check.py --smoke --out fused.json    # anywhere: tiny sizes, interpret mode (~30 s on 2 cores)

Compile matrix: tile 32/64/128 x head dim 64/128 x bfloat16/float32 x pipeline stages 1/2/3, every kernel forced to
the case's tile and stages (``num_stages`` of Triton's compiler parameters). Per case: the tile rule's verdict
(attn_lab/attention/tiles.py: a case beyond its estimate is refused and not compiled; else what the rule itself
launches at that block), the compile time of forward+backward, the first line of a compile error, and the largest
forward / dQ / dK / dV error against softmax attention written out below (float32, 'highest' precision), on a
band pattern with key padding at four tiles' length.
Timings: fwd+bwd at 16,384 tokens (B 1, 8 heads, head dim 64, bfloat16; median of 5 after a warm-up) of cuDNN
dense attention (the reference), local w=256 fused and BigBird fused, with each one's speed-up over cuDNN (the
targets: local >= 5x, BigBird >= 3x; docs/gpu_h200.md). ``scripts/device_check.sh`` runs this as its 'fused' step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from attn_lab.attention import KERNELS
from attn_lab.attention.block_mask import create_block_mask
from attn_lab.attention.dense import NEG
from attn_lab.attention.flash import block_sparse_flash
from attn_lab.attention.tiles import forced_plan, fused_tile

FULL = dict(tiles=(32, 64, 128), head_dims=(64, 128), dtypes=("bfloat16", "float32"), stages=(1, 2, 3),
            length=16384, window=256, reps=5)
SMOKE = dict(tiles=(16, 32), head_dims=(64,), dtypes=("bfloat16", "float32"), stages=(1, 2), length=256,
             window=16, reps=1)


def naive(q, k, v, allowed, valid):
    """Softmax attention written out (float32): ``allowed [T, T]``; padded keys get the logit NEG."""
    s = jnp.einsum("bqnh,bknh->bnqk", q.astype(jnp.float32), k.astype(jnp.float32)) / np.sqrt(q.shape[-1])
    s = jnp.where(allowed, jnp.where(valid[:, None, None, :], s, NEG), -jnp.inf)
    return jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(s, axis=-1), v.astype(jnp.float32))


def _inputs(t, heads, head_dim, dtype, seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    q, k, v = (jax.random.normal(key, (1, t, heads, head_dim), jnp.float32).astype(dtype) for key in keys[:3])
    valid = jax.random.uniform(keys[3], (1, t)) > 0.1
    return q, k, v, valid


def _fwd_bwd(attend):
    """value and (dq, dk, dv) of ``sum(attend(q, k, v) * q)`` (a cotangent on every row)."""
    return jax.value_and_grad(lambda q, k, v: (attend(q, k, v).astype(jnp.float32) * q.astype(jnp.float32)).sum(),
                              argnums=(0, 1, 2))


def compile_case(tile, head_dim, dtype, stages, interpret):
    """One case of the matrix: every kernel forced to ``tile`` x ``stages`` inside ``tile``-wide blocks. A case the
    tile rule's estimate refuses is recorded, not compiled (nothing beyond the limit is ever compiled); otherwise
    the compile seconds of forward+backward, the first line of a compile error, and the errors against naive.
    ``rule`` also names what the rule itself would launch at this block."""
    case = dict(tile=tile, head_dim=head_dim, dtype=dtype, stages=stages)
    try:
        forced_plan(tile, tile, stages, head_dim, jnp.dtype(dtype))
    except ValueError as e:
        case["rule"] = f"refused: {e}"
        return case
    case["rule"] = f"fits (the rule's own at block {tile}: {fused_tile(tile, head_dim, jnp.dtype(dtype)).launch()})"
    t = 4 * tile
    mask = create_block_mask(lambda i, j: np.abs(i - j) <= tile, t, tile)
    q, k, v, valid = _inputs(t, 2, head_dim, jnp.dtype(dtype))
    fused = jax.jit(_fwd_bwd(lambda *x: block_sparse_flash(*x, mask, key_valid=valid, interpret=interpret,
                                                           tile=tile, stages=stages)))
    start = time.perf_counter()
    try:
        compiled = fused.lower(q, k, v).compile()
    except Exception as e:  # noqa: BLE001 (the compile error is the finding)
        case.update(compile_s=round(time.perf_counter() - start, 2), error=(str(e).strip().splitlines() or [""])[0])
        return case
    case["compile_s"] = round(time.perf_counter() - start, 2)
    out, grads = compiled(q, k, v)
    with jax.default_matmul_precision("highest"):
        want, want_grads = _fwd_bwd(lambda *x: naive(*x, jnp.asarray(mask.dense()), valid))(q, k, v)
    case["errors"] = {"loss": float(abs(out - want)), **{f"d{n}": float(jnp.max(jnp.abs(
        g.astype(jnp.float32) - w))) for n, g, w in zip("qkv", grads, want_grads)}}
    return case


def _time(fn, args, reps):
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timings(size, on_gpu):
    """fwd+bwd seconds of cuDNN dense (XLA dense off a GPU), local and BigBird fused, and their speed-ups."""
    t, heads, head_dim = size["length"], 8, 64
    q, k, v, _ = _inputs(t, heads, head_dim, jnp.bfloat16, seed=1)
    path = "fused" if on_gpu else "fused_interpret"
    shared = dict(num_heads=heads, num_kv_heads=heads, head_dim=head_dim, implementation=path)
    local = KERNELS["local"](window=size["window"], **shared)
    bigbird = KERNELS["bigbird"](**shared)

    def kernel_fn(kernel):
        return lambda *x: kernel(*x, mask=None, is_causal=False, dropout_rng=None, dropout_rate=0.0,
                                 broadcast_dropout=True, deterministic=True, precision=None, need_weights=False)[0]
    dense = lambda *x: jax.nn.dot_product_attention(*x, implementation="cudnn" if on_gpu else None)  # noqa: E731
    out = {"length": t, "heads": heads, "head_dim": head_dim, "dtype": "bfloat16"}
    for name, fn in (("cudnn_dense" if on_gpu else "xla_dense", dense), ("local_fused", kernel_fn(local)),
                     ("bigbird_fused", kernel_fn(bigbird))):
        try:
            out[f"{name}_s"] = _time(jax.jit(_fwd_bwd(fn)), (q, k, v), size["reps"])
        except Exception as e:  # noqa: BLE001 (recorded: the report says what failed)
            out[f"{name}_error"] = (str(e).strip().splitlines() or [""])[0]
    ref = out.get("cudnn_dense_s", out.get("xla_dense_s"))
    for name in ("local_fused", "bigbird_fused"):
        if ref and f"{name}_s" in out:
            out[f"{name}_speedup"] = round(ref / out[f"{name}_s"], 2)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON report to write")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes in interpret mode (any backend)")
    args = parser.parse_args()
    on_gpu = jax.default_backend() == "gpu" and not args.smoke
    size = SMOKE if args.smoke else FULL
    if not on_gpu and not args.smoke:
        sys.exit("error: the fused check compiles Triton kernels: it needs a CUDA GPU (use --smoke elsewhere)")
    report = {"backend": jax.default_backend(), "devices": [d.device_kind for d in jax.devices()],
              "jax": jax.__version__, "smoke": args.smoke, "matrix": []}
    for tile, hd, dtype, stages in itertools.product(size["tiles"], size["head_dims"], size["dtypes"],
                                                     size["stages"]):
        case = compile_case(tile, hd, dtype, stages, interpret=not on_gpu)
        report["matrix"].append(case)
        print(json.dumps(case), flush=True)
    report["timings"] = timings(size, on_gpu)
    print(json.dumps(report["timings"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    failed = [c for c in report["matrix"] if "error" in c and not c["rule"].startswith("refused")]
    print(f"wrote {args.out}: {len(report['matrix'])} cases, {len(failed)} failed to compile that the tile rule "
          "allows")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
