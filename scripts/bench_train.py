"""Training throughput: tokens/s and model FLOP utilization against this machine's matmul peak, measured in one run.

  python scripts/bench_train.py                       # d_model 512 encoder-decoder, float32, on the default device
  python scripts/bench_train.py --dtype bfloat16 --out docs/bench_train_bf16

The peak is the best FLOP/s of a jitted square matmul (sizes 1024-4096) timed just before the model, in the same
process, so a shared or throttled machine moves both. The model is the project's Seq2Seq and its real jitted train
step (AdamW, label smoothing, dropout) on random token batches. Reported:

- tokens/s: target tokens (the loss's tokens) per second of training;
- MFU: model FLOPs (6 x parameters x tokens per step, plus the attention score and value products: Kaplan et al.'s
  and PaLM's accounting) per second / peak;
- HFU: the FLOPs XLA counts in the compiled step (``cost_analysis``) per second / peak.

Writes ``<out>.json`` and ``<out>.md``. Works the same on a GPU or TPU (the peak is then that device's matmul peak
at the chosen dtype).
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_lab.models import build_model, count_params
from attn_lab.train.config import base_config
from attn_lab.train.logging import write_json_atomic, write_text_atomic
from attn_lab.train.steps import compile_steps, init_state, make_optimizer, model_state
from attn_lab.train.seeds import stack


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=64, help="source and target tokens per example")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--steps", type=int, default=8, help="timed steps after 2 warm-up steps")
    p.add_argument("--peak-sizes", default="1024,2048,4096", help="square matmul sizes timed for the peak")
    p.add_argument("--out", default="bench/train")
    return p.parse_args(argv)


def matmul_peak(dtype: str, sizes=(1024, 2048, 4096), repeats: int = 3) -> dict:
    """Best FLOP/s of ``a @ b`` over square sizes (compiled first, median of ``repeats``)."""
    best = {"flops_per_sec": 0.0}
    for n in sizes:
        a = jnp.ones((n, n), dtype) / n
        f = jax.jit(lambda x, y: x @ y)
        f(a, a).block_until_ready()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            f(a, a).block_until_ready()
            times.append(time.perf_counter() - start)
        rate = 2 * n ** 3 / float(np.median(times))
        if rate > best["flops_per_sec"]:
            best = {"flops_per_sec": rate, "size": n}
    return best


def model_config(args: argparse.Namespace):
    c = base_config()
    c.model.update(num_layers=args.layers, d_model=args.d_model, mlp_dim=4 * args.d_model, num_heads=args.heads,
                   dtype=args.dtype)
    c.train.update(batch_size=args.batch, warmup_steps=10)
    return c


def model_flops(params: int, args: argparse.Namespace, tokens: int) -> float:
    """6 N D for the dense weights, plus 3 x 4 x (T x S x d) per attention layer for scores and values (forward
    2 T S d each, backward twice that); one attention layer per encoder layer, two (self, cross) per decoder layer."""
    t = args.length
    attention = 12 * args.batch * t * t * args.d_model * (args.layers + 2 * args.layers)
    return 6.0 * params * tokens + attention


def random_batch(args: argparse.Namespace, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.integers(3, args.vocab, (1, args.batch, args.length)).astype(np.int32)
            for k in ("inputs", "targets")}  # (S=1, B, T)


def bench_model(args: argparse.Namespace) -> dict:
    c = model_config(args)
    model = build_model(c.model, kind="translation", vocab_size=args.vocab, max_len=args.length + 1)
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(c.train)
    state = stack([init_state(nnx.to_pure_dict(params), model_state(model), tx, 0)])
    train_step, _ = compile_steps(graphdef, tx, "translation", c.train.label_smoothing)
    batch = random_batch(args, 0)
    hw_flops = train_step.lower(state, batch).compile().cost_analysis()
    hw_flops = float((hw_flops[0] if isinstance(hw_flops, list) else hw_flops).get("flops", float("nan")))
    for i in range(2):  # warm-up: compile, first donated step
        state, m = train_step(state, random_batch(args, i))
    jax.block_until_ready(m)
    batches = [random_batch(args, 10 + i) for i in range(args.steps)]  # made before the clock starts
    start = time.perf_counter()
    for b in batches:
        state, m = train_step(state, b)
    jax.block_until_ready(m)
    seconds = (time.perf_counter() - start) / args.steps
    tokens = args.batch * args.length
    n = count_params(model)
    return {"params": n, "seconds_per_step": seconds, "tokens_per_sec": tokens / seconds,
            "model_flops_per_step": model_flops(n, args, tokens), "xla_flops_per_step": hw_flops}


def report(args: argparse.Namespace, peak: dict, model: dict) -> dict:
    device = jax.devices()[0]
    mfu = model["model_flops_per_step"] / model["seconds_per_step"] / peak["flops_per_sec"]
    hfu = model["xla_flops_per_step"] / model["seconds_per_step"] / peak["flops_per_sec"]
    return {"device": f"{device.platform} {device.device_kind} x{jax.device_count()}", "args": vars(args),
            "peak_flops_per_sec": peak["flops_per_sec"], "peak_matmul_size": peak["size"], **model,
            "mfu": mfu, "hfu": hfu}


def markdown(r: dict) -> str:
    a = r["args"]
    return (f"# Training throughput\n\n`python scripts/bench_train.py --dtype {a['dtype']}` on {r['device']}: "
            f"Seq2Seq d_model {a['d_model']}, {a['layers']}+{a['layers']} layers, {a['heads']} heads, "
            f"{r['params']:,} parameters, batch {a['batch']} x {a['length']} tokens.\n\n"
            "| matmul peak | step | tokens/s | MFU | HFU (XLA flops) |\n|---|---|---|---|---|\n"
            f"| {r['peak_flops_per_sec'] / 1e9:.1f} GFLOP/s (n={r['peak_matmul_size']}) | "
            f"{r['seconds_per_step'] * 1e3:.0f} ms | {r['tokens_per_sec']:,.0f} | {100 * r['mfu']:.1f}% | "
            f"{100 * r['hfu']:.1f}% |\n")


def main(argv=None) -> int:
    args = parse(argv)
    peak = matmul_peak(args.dtype, tuple(int(n) for n in args.peak_sizes.split(",")))
    r = report(args, peak, bench_model(args))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(str(out.with_suffix(".json")), r)
    write_text_atomic(out.with_suffix(".md"), markdown(r))
    print(markdown(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
