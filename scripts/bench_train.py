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

``--loop`` measures the training loop and decoding instead, on a tiny model (numbers quick: d_model 64, 2+2 layers):

  python scripts/bench_train.py --loop --out bench/loop

- ``trainer_over_bare``: steady-state steps/s of the real trainer loop (``loop.train_loop`` on a ``Run`` of the
  numbers task: prefetch, metric syncs at log steps, logging) over the same compiled train step called in a tight
  loop on the same batches, already on the device, with one ``block_until_ready`` at the end. Every shape bucket is
  compiled before either is timed, and the trainer's steady speed is its steps after the first log window, as in
  results.json, so both sides time the same programs on the same batches. Goal: >= 0.9.
- ``decode``: greedy decoding of a batch through the KV cache (``compile_decode(cached=True)``) against re-running
  the causal decoder over the whole target buffer for every token (``cached=False``), at each target length (64 and
  256). The model's logits never pick EOS (its bias is -1e9), so both decode every position. Goal: >= 5x at 256.
- ``lm``: the same two measurements on the decoder-only language model (``models/lm.py``): its trainer loop over
  its bare step on MQAR batches (configs/mqar.py:quick, the --loop width, an MLP of 4 x d_model; goal >= 0.9), and
  greedy generation (``train/generate.py``) through the KV cache against re-running the causal model over the
  buffer for every new token, from an 8-token prompt to each length (goal >= 5x at 256).
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import time
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from attn_lab.cli import DEFINE_integer_list, main_args, parse_flags
from attn_lab.io import write_json_atomic, write_text_atomic
from attn_lab.markdown import markdown_table
from attn_lab.models import LanguageModel, Seq2Seq, build_model, count_params, supports_cached_decoding
from attn_lab.models.transformer import EOS
from attn_lab.sweep.spec import load_config_file
from attn_lab.train.config import base_config
from attn_lab.train.decode import compile_decode
from attn_lab.train.generate import compile_generate
from attn_lab.train.loop import train_loop  # the trainer's own loop, timed as a run uses it
from attn_lab.train.seeds import stack, stack_batches
from attn_lab.train.steps import compile_steps, init_state, make_optimizer, model_state
from attn_lab.train.trainer import Run

ROOT = pathlib.Path(__file__).resolve().parent.parent

MFU_MODEL = {"d_model": 512, "layers": 2, "heads": 8, "batch": 32}
LOOP_MODEL = {"d_model": 64, "layers": 2, "heads": 4, "batch": 32}  # configs/numbers.py:quick, half its batch


_D_MODEL = flags.DEFINE_integer("d-model", None, "Model width; default 512 (64 with --loop).", lower_bound=1)
_LAYERS = flags.DEFINE_integer("layers", None, "Encoder and decoder layers each; default 2.", lower_bound=1)
_HEADS = flags.DEFINE_integer("heads", None, "Attention heads; default 8 (4 with --loop).", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch", None, "Batch size; default 32.", lower_bound=1)
_LENGTH = flags.DEFINE_integer("length", 64, "Source and target tokens per example.", lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab", 8000, "Vocabulary size of the random tokens.", lower_bound=4)
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Model and matmul-peak dtype.")
_STEPS = flags.DEFINE_integer("steps", 8, "Timed steps after 2 warm-up steps.", lower_bound=1)
_PEAK_SIZES = DEFINE_integer_list("peak-sizes", [1024, 2048, 4096], "Comma-separated square matmul sizes timed for "
                                  "the peak.")
_OUT = flags.DEFINE_string("out", "bench/train", "Output path without suffix: writes <out>.json and <out>.md.")
_LOOP = flags.DEFINE_bool("loop", False, "Trainer loop vs bare step, and cached vs uncached decoding.")
_LOOP_STEPS = flags.DEFINE_integer("loop-steps", 80, "Trainer steps per round (--loop).", lower_bound=2)
_LOG_EVERY = flags.DEFINE_integer("log-every", 20, "Trainer log window (--loop); a round's first is warm-up.",
                                  lower_bound=1)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Trainer and bare loop alternations (--loop).", lower_bound=1)
_DECODE_LENGTHS = DEFINE_integer_list("decode-lengths", [64, 256], "Comma-separated greedy decoding target lengths "
                                      "(--loop).")
_DECODE_BATCH = flags.DEFINE_integer("decode-batch", 8, "Sentences decoded at once (--loop).", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 2, "Least timed calls per decoder and length, median; fast ones repeat "
                                "for 1 s (--loop).", lower_bound=1)


FLAG_NAMES = ("d-model", "layers", "heads", "batch", "length", "vocab", "dtype", "steps", "peak-sizes", "out", "loop",
              "loop-steps", "log-every", "rounds", "decode-lengths", "decode-batch", "repeats")


def parsed_args() -> types.SimpleNamespace:
    """The flags as ``args.<name>`` (dashes as underscores), with the model defaults of ``--loop`` or the MFU run
    filled in; what the benchmarks read and what ``<out>.json`` records under ``args``. Stops with one line on
    values absl's types do not catch."""
    args = types.SimpleNamespace(**{name.replace("-", "_"): flags.FLAGS[name].value for name in FLAG_NAMES})
    for name in ("peak-sizes", "decode-lengths"):
        sizes = flags.FLAGS[name].value
        if not all(n > 0 for n in sizes):
            sys.exit(f"error: --{name}={','.join(map(str, sizes))}: give positive integers, e.g. 64,256")
    if args.loop and not args.log_every < args.loop_steps:
        sys.exit(f"error: --log-every={args.log_every}: must be below --loop-steps ({args.loop_steps}): the first "
                 "log window is warm-up")
    for key, value in (LOOP_MODEL if args.loop else MFU_MODEL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


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


def model_config(args: types.SimpleNamespace):
    c = base_config()
    c.model.update(num_layers=args.layers, d_model=args.d_model, mlp_dim=4 * args.d_model, num_heads=args.heads,
                   dtype=args.dtype)
    c.train.update(batch_size=args.batch, warmup_steps=10)
    return c


def model_flops(params: int, args: types.SimpleNamespace, tokens: int) -> float:
    """6 N D for the dense weights, plus 3 x 4 x (T x S x d) per attention layer for scores and values (forward
    2 T S d each, backward twice that); one attention layer per encoder layer, two (self, cross) per decoder layer."""
    t = args.length
    attention = 12 * args.batch * t * t * args.d_model * (args.layers + 2 * args.layers)
    return 6.0 * params * tokens + attention


def random_batch(args: types.SimpleNamespace, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.integers(3, args.vocab, (1, args.batch, args.length)).astype(np.int32)
            for k in ("inputs", "targets")}  # (S=1, B, T)


def bench_model(args: types.SimpleNamespace) -> dict:
    c = model_config(args)
    model = build_model(c.model, kind=Seq2Seq.TASK_KINDS[0], vocab_size=args.vocab, max_len=args.length + 1)
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(c.train)
    state = stack([init_state(nnx.to_pure_dict(params), model_state(model), tx, 0)])
    train_step, _ = compile_steps(graphdef, tx, c.train.label_smoothing)
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


def report(args: types.SimpleNamespace, peak: dict, model: dict) -> dict:
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
            + markdown_table(["matmul peak", "step", "tokens/s", "MFU", "HFU (XLA flops)"],
                             [[f"{r['peak_flops_per_sec'] / 1e9:.1f} GFLOP/s (n={r['peak_matmul_size']})",
                               f"{r['seconds_per_step'] * 1e3:.0f} ms", f"{r['tokens_per_sec']:,.0f}",
                               f"{100 * r['mfu']:.1f}%", f"{100 * r['hfu']:.1f}%"]]) + "\n")


def _loop_model(c, args: types.SimpleNamespace):
    """``c`` with the --loop model (an MLP of 4 x d_model, dropout 0.1: the trainer's usual work) and the loop's
    steps: ``num_steps`` is one more than the rounds train, so no evaluation runs (it would only cost untimed
    compilation); each round ends with a checkpoint, outside the timed windows. No W&B."""
    c.wandb.mode = "disabled"
    c.model.update(num_layers=args.layers, d_model=args.d_model, mlp_dim=4 * args.d_model, num_heads=args.heads,
                   dtype=args.dtype, dropout=0.1)
    steps = args.loop_steps * args.rounds + 1
    c.train.update(num_steps=steps, batch_size=args.batch, log_every=args.log_every, eval_every=steps,
                   checkpoint_every=steps, max_eval_batches=1)
    return c


def loop_config(args: types.SimpleNamespace, data_dir: str):
    """configs/numbers.py:quick (the encoder-decoder) with the --loop model."""
    c = load_config_file(f"{ROOT / 'configs' / 'numbers.py'}:quick")
    c.task.data_dir, c.task.max_value = data_dir, 999
    return _loop_model(c, args)


def lm_loop_config(args: types.SimpleNamespace, data_dir: str):
    """configs/mqar.py:quick (64 tokens, 4 pairs, vocabulary 64) with the --loop model as a decoder-only LM."""
    c = load_config_file(f"{ROOT / 'configs' / 'mqar.py'}:quick")
    c.task.update(data_dir=data_dir, vocab_size=64, seq_len=64, num_kv_pairs=4, num_train=2000, num_validation=16,
                  num_test=16)
    return _loop_model(c, args)


def compile_every_bucket(run: Run, batches: list[dict]) -> None:
    """Compiles the train step for each distinct batch shape on a copy of the state (the step donates its input),
    so neither the trainer's nor the bare loop's timed steps include a compilation."""
    shapes = {}
    for b in batches:
        shapes.setdefault(tuple((k, v.shape) for k, v in sorted(b.items())), b)
    copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))  # one program, not one per leaf
    for b in shapes.values():
        jax.block_until_ready(run.train_step(copy(run.state), jax.device_put(b)))


def bare_steps_per_sec(run: Run, batches: list[dict]) -> float:
    """The same compiled step over batches already on the device, in a tight loop, blocking once at the end."""
    placed = [jax.device_put(b) for b in batches]
    state = run.state
    jax.block_until_ready((state, placed))
    start = time.perf_counter()
    for b in placed:
        state, _ = run.train_step(state, b)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - start
    run.state = state  # the old buffers were donated
    return len(placed) / seconds


def bench_trainer(args: types.SimpleNamespace, make_config=loop_config) -> dict:
    """Steady steps/s of the trainer loop and of the bare step on the same batches, alternated for ``--rounds``.

    Round r trains steps ``[r n + 1, (r + 1) n]`` with the trainer loop (one ``train_loop`` call that stops there,
    as an interrupted run would; its first log window is warm-up, as in results.json), then runs the bare step over
    the batches of that round's steady steps. Alternating keeps a machine whose load drifts (a shared CPU) from
    favouring one side; ``trainer_over_bare`` is the median of the rounds' ratios (each round's is ``ratio``).
    """
    n, rounds = args.loop_steps, []
    with tempfile.TemporaryDirectory() as tmp:
        config = make_config(args, str(pathlib.Path(tmp) / "data"))
        run = Run(config, str(pathlib.Path(tmp) / "run"))
        try:
            datasets = [run.task.dataset("train", args.batch, train=True, seed=s) for s in run.seeds]
            batches = [stack_batches([d[i] for d in datasets]) for i in range(n * args.rounds)]  # step s: [s - 1]
            compile_every_bucket(run, batches)
            for r in range(args.rounds):
                stats = train_loop(run, stop_after=(r + 1) * n)
                run.start_step = stats.step  # the next round continues from here, as a resumed run would
                bare = bare_steps_per_sec(run, batches[r * n + args.log_every:(r + 1) * n])
                trainer = stats.steady_steps / stats.steady_seconds
                rounds.append({"trainer_steps_per_sec": trainer, "bare_steps_per_sec": bare, "ratio": trainer / bare})
            num_params = run.num_params
        finally:
            run.close()
    mean = lambda key: float(np.mean([x[key] for x in rounds]))
    return {"params": num_params, "steady_steps": stats.steady_steps, "rounds": rounds,
            "trainer_steps_per_sec": mean("trainer_steps_per_sec"), "bare_steps_per_sec": mean("bare_steps_per_sec"),
            "trainer_over_bare": float(np.median([x["ratio"] for x in rounds]))}


def decode_model(args: types.SimpleNamespace, vocab: int, max_len: int) -> tuple[Any, dict]:
    """(graphdef, state) of a randomly initialized --loop model whose logits never pick EOS (untied output layer,
    EOS bias -1e9), so greedy decoding runs to the full target length on both paths."""
    c = base_config()
    c.model.update(num_layers=args.layers, d_model=args.d_model, mlp_dim=4 * args.d_model, num_heads=args.heads,
                   dtype=args.dtype, dropout=0.0, tie_embeddings=False)
    model = build_model(c.model, kind=Seq2Seq.TASK_KINDS[0], vocab_size=vocab, max_len=max_len + 1)
    assert supports_cached_decoding(model)
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    params["logits_proj"]["bias"] = params["logits_proj"]["bias"].at[EOS].set(-1e9)
    return graphdef, {"params": params, "model_state": model_state(model)}


def median_seconds(fn: Any, args: tuple, repeats: int, budget: float = 1.0) -> tuple[float, Any]:
    """(median wall time of blocked calls of jitted ``fn`` on ``args``; the last call's output).

    Compiled ahead of time, so no call compiles and no untimed warm-up run is needed (for the uncached decoder at
    length 256 that run would be the longest part of the benchmark). At least ``repeats`` calls, more while they
    add up to under ``budget`` seconds, so a fast function's first, cold call is one sample among many.
    """
    compiled = fn.lower(*args).compile()
    times, out = [], None
    while len(times) < repeats or (sum(times) < budget and len(times) < 50):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times)), out


DECODE_VOCAB, DECODE_SOURCE_LENGTH = 1000, 32


def cached_vs_uncached(cached: Any, uncached: Any, args: tuple, repeats: int) -> dict:
    """Median seconds of the KV-cache and the re-running decoder on the same inputs, their ratio, and whether they
    produced the same tokens (``(B, length)`` each)."""
    t_cached, ids = median_seconds(cached, args, repeats)
    t_uncached, ids_uncached = median_seconds(uncached, args, repeats)
    return {"cached_seconds": t_cached, "uncached_seconds": t_uncached, "cached_speedup": t_uncached / t_cached,
            "same_tokens": bool((np.asarray(ids) == np.asarray(ids_uncached)).all())}


def bench_decode(args: types.SimpleNamespace, vocab: int = DECODE_VOCAB,
                 source_length: int = DECODE_SOURCE_LENGTH) -> list[dict]:
    """Per target length: seconds to greedy-decode one batch with the KV cache and by re-running the decoder."""
    lengths = list(args.decode_lengths)
    graphdef, state = decode_model(args, vocab, max(*lengths, source_length))
    inputs = jnp.asarray(np.random.default_rng(0).integers(3, vocab, (args.decode_batch, source_length)),
                         jnp.int32)  # (B, S)
    rows = []
    for length in lengths:
        cached, uncached = (compile_decode(graphdef, length, cached=c) for c in (True, False))
        rows.append({"length": length, **cached_vs_uncached(cached, uncached, (state, inputs), args.repeats)})
    return rows


PROMPT_LENGTH = 8


def bench_generate(args: types.SimpleNamespace, vocab: int = DECODE_VOCAB) -> list[dict]:
    """Per total length: seconds to greedy-generate from an 8-token prompt (shorter for a length <= 8) with the KV
    cache and by re-running the causal model over the buffer (a randomly initialized --loop LM: no EOS stops
    either)."""
    lengths = list(args.decode_lengths)
    prompt_length = min(PROMPT_LENGTH, min(lengths) - 1)
    c = base_config()
    c.model.update(num_layers=args.layers, d_model=args.d_model, mlp_dim=4 * args.d_model, num_heads=args.heads,
                   dtype=args.dtype, dropout=0.0)
    model = build_model(c.model, kind=LanguageModel.TASK_KINDS[0], vocab_size=vocab, max_len=max(lengths))
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    state = {"params": nnx.to_pure_dict(params), "model_state": model_state(model)}
    prompt = jnp.asarray(np.random.default_rng(0).integers(3, vocab, (args.decode_batch, prompt_length)), jnp.int32)
    key, rows = jax.random.key(0), []
    for length in lengths:
        cached, uncached = (compile_generate(graphdef, length - prompt_length, cached=c) for c in (True, False))
        rows.append({"length": length, "prompt_length": prompt_length,
                     **cached_vs_uncached(cached, uncached, (state, prompt, key), args.repeats)})
    return rows


def bench_loop(args: types.SimpleNamespace) -> dict:
    """The --loop report: trainer loop against the bare step, then cached against uncached greedy decoding, for
    the encoder-decoder and for the decoder-only LM."""
    device = jax.devices()[0]
    return {"device": f"{device.platform} {device.device_kind} x{jax.device_count()}", "args": vars(args),
            **bench_trainer(args), "decode": bench_decode(args), "decode_vocab": DECODE_VOCAB,
            "decode_source_length": DECODE_SOURCE_LENGTH,
            "lm": {**bench_trainer(args, lm_loop_config), "generate": bench_generate(args)}}


def _loop_table(r: dict) -> str:
    per_round = ", ".join(f"{x['ratio']:.2f}" for x in r["rounds"])
    return markdown_table(
        ["trainer loop", "bare jitted step", "trainer / bare (goal >= 0.9)", "per round"],
        [[f"{r['trainer_steps_per_sec']:.1f} steps/s", f"{r['bare_steps_per_sec']:.1f} steps/s",
          f"{r['trainer_over_bare']:.3f}", per_round]])


def _decode_table(rows: list[dict], what: str) -> str:
    return markdown_table(
        [what, "KV cache", "re-run the model", "speedup (goal >= 5x at 256)", "same tokens"],
        [[str(d["length"]), f"{d['cached_seconds'] * 1e3:.1f} ms", f"{d['uncached_seconds'] * 1e3:.1f} ms",
          f"{d['cached_speedup']:.1f}x", "yes" if d["same_tokens"] else "no"] for d in rows])


def loop_markdown(r: dict) -> str:
    a, lm = r["args"], r["lm"]
    timing = (f"{a['rounds']} rounds of {a['loop_steps']} trainer steps (the {r['steady_steps']} after the first log "
              f"window of {a['log_every']} timed), each followed by the bare step on the same batches; every shape "
              "bucket compiled beforehand. Mean steps/s, median ratio.")
    return (f"# Training loop and decoding\n\n`python scripts/bench_train.py --loop` on {r['device']}, {a['dtype']}, "
            f"d_model {a['d_model']}, {a['heads']} heads.\n\n"
            f"## Seq2Seq ({a['layers']}+{a['layers']} layers, {r['params']:,} parameters)\n\n"
            f"Numbers task, batch {a['batch']}; {timing}\n\n{_loop_table(r)}\n\n"
            f"Greedy decoding of {a['decode_batch']} sentences of {r['decode_source_length']} random tokens "
            f"(vocabulary {r['decode_vocab']:,}), median of at least {a['repeats']} calls:\n\n"
            f"{_decode_table(r['decode'], 'target length')}\n\n"
            f"## Decoder-only LM ({a['layers']} layers, {lm['params']:,} parameters)\n\n"
            f"MQAR batches (64 tokens), batch {a['batch']}; {timing}\n\n{_loop_table(lm)}\n\n"
            f"Greedy generation for {a['decode_batch']} prompts of {lm['generate'][0]['prompt_length']} random "
            f"tokens (vocabulary {r['decode_vocab']:,}) up to each total length, median of at least {a['repeats']} "
            "calls:\n\n"
            f"{_decode_table(lm['generate'], 'total length')}\n")


def main(argv: list[str]) -> int:
    """Runs the MFU benchmark (or ``--loop``'s) and writes ``<out>.json`` and ``<out>.md`` (flags checked by absl)."""
    main_args(argv)
    args = parsed_args()
    if args.loop:
        r = bench_loop(args)
        text = loop_markdown(r)
    else:
        peak = matmul_peak(args.dtype, tuple(args.peak_sizes))
        r = report(args, peak, bench_model(args))
        text = markdown(r)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(str(out.with_suffix(".json")), r)
    write_text_atomic(out.with_suffix(".md"), text)
    print(text)
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
