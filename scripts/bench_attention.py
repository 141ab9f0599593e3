"""Times forward+backward and reads compiled memory of every registered attention kernel against its references.

    python scripts/bench_attention.py [--lengths 1024,2048,4096,8192,16384] [--batch 4 --heads 8 --head-dim 64]
                                      [--dtype float32] [--kernels all] [--max-gib 16] [--out bench/attention]
                                      [--quick]
    python scripts/bench_attention.py --dtype bfloat16 --lengths 1024,4096,16384,65536   # on a GPU: + cuDNN row

Each case is one jitted ``grad`` of ``sum(attention(q, k, v) * dout)`` on random inputs: the kernel alone (from
``attn_lab.attention.KERNELS`` as registered *at run time*, with the benchmark options below), beside
``jax.nn.dot_product_attention`` (XLA; "the reference"), cuDNN flash attention (the same call with
``implementation='cudnn'``; measured whenever a tiny call compiles, i.e. on an NVIDIA GPU at bfloat16/float16, and
omitted with one printed line otherwise) and a full ``flax.nnx.MultiHeadAttention`` layer (d_model = heads *
head_dim, so it adds the four projections). ``dense`` is benchmarked with its default options (what a user gets),
plus its 'xla' and 'chunked' implementations as separate rows. Where the fused block-sparse kernel compiles (a CUDA
GPU), ``local`` (w=256), ``longformer``, ``bigbird`` and ``strided`` get two rows each, ``<name>/fused``
(implementation='fused') and ``<name>/xla`` (their XLA path), beside cuDNN; elsewhere one row each (their 'auto',
the XLA path; interpret mode is a correctness check, not a benchmark). Inputs, and the kernels' compute, are
``--dtype``.
Each case is compiled ahead of time; ``compiled.memory_analysis()`` gives its memory
before anything is allocated, so cases over ``--max-gib`` are recorded as ``oom`` instead of run, and the T x T
cases whose score matrices obviously cannot fit (estimate ``3 * B*N*T*T*4`` bytes) are skipped before compiling.
Time is one warm-up run, then the median of a few more (fewer at long lengths, and none when the warm-up alone
exceeds ``--case-seconds``). To keep the full default run within ~15 minutes on 2 CPU cores, ``--time-budget``
bounds the whole run: the reference and the targets' rows run first at each length, and a case whose time,
extrapolated from its row at the previous length, would not fit in what is left is recorded as skipped.

Writes ``<out>.csv`` (one row per kernel and length, with its ratios against both references; the cuDNN columns are
empty without cuDNN), ``<out>.md`` (time and memory ratios vs XLA and vs cuDNN, one PASS/FAIL line per target; the
cuDNN targets read "not measured (no cuDNN)" where it is absent, the fused ones "not yet measured") and
``<out>.png`` (log-log time and memory vs length). A GPU user would run cuDNN, not XLA: ratios against XLA alone
flatter the efficient kernels there.
"""

from __future__ import annotations

import csv
import gc
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402

from attn_lab.attention import KERNELS, build_kernel  # noqa: E402
from attn_lab.attention.registry import default_options, kernel_options  # noqa: E402
from attn_lab.cli import DEFINE_integer_list, main_args, parse_flags  # noqa: E402
from attn_lab.markdown import markdown_table  # noqa: E402

REF = "jax.nn.dot_product_attention"  # XLA's implementation
CUDNN = "jax.nn.dot_product_attention/cudnn"  # cuDNN flash attention (GPU, half precision)
FLAX = "flax.nnx.MultiHeadAttention"
LINEAR_KERNELS = ("local", "linformer", "performer", "linear")  # the targets' linear-complexity kernels
# kernels with a fused block-sparse Pallas path, and the implementation name of their XLA path
FUSED_KERNELS = {"local": "blockwise", "longformer": "xla", "bigbird": "xla", "strided": "xla"}
FUSED_SPEEDUPS = {"local": 5.0, "bigbird": 3.0, "longformer": 3.0}  # x faster than cuDNN full attention at 16K
SPANS = (64, 256, 1024)  # adaptive_span rows: learned spans fixed at these (plus its ramp of 32)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MEMORY_NOTE = "compiled.memory_analysis(): temp_bytes=temp_size_in_bytes; total_bytes=temp+argument+output"


@dataclass
class Case:
    """One benchmark row at one length."""
    label: str  # e.g. 'dense/chunked', 'linformer', REF
    kernel: str  # registered name, or the reference's name
    options: dict[str, Any]
    length: int
    seconds: float | None = None
    repeats: int = 0
    memory: dict[str, int] = field(default_factory=dict)
    status: str = "ok"
    quadratic: bool = False  # forms the [B, N, T, T] score matrix: skipped up front when that cannot fit


def dense_default() -> str:
    """The ``dense`` kernel's default implementation ('xla' before the 'auto' dispatch exists, 'auto' after)."""
    return str(default_options("dense").get("implementation", "xla"))


def cudnn_status(dtype: Any) -> tuple[bool, str]:
    """Whether cuDNN flash attention runs here at ``dtype``, and why not: a tiny fwd+bwd is compiled to find out,
    since only that tells a GPU without a usable cuDNN apart from one with it."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return False, f"cuDNN flash attention takes bfloat16/float16 only, this run is {jnp.dtype(dtype).name}"
    q = jnp.zeros((1, 256, 2, 64), dtype)  # (B, T, N, H)
    try:
        loss = lambda q, k, v: jnp.sum(jax.nn.dot_product_attention(q, k, v, implementation="cudnn"))
        jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, q, q).compile()
    except Exception as err:  # noqa: BLE001 -- any failure means "no cuDNN row", with the reason printed
        return False, f"{type(err).__name__}: {err}".splitlines()[0][:160].rstrip(".")
    return True, f"cuDNN flash attention available on {jax.devices()[0].device_kind}"


def fused_status() -> tuple[bool, str]:
    """Whether the fused block-sparse kernel compiles here (a CUDA GPU, through Pallas' Triton backend)."""
    from attn_lab.attention.dispatch import current_backend, fused_refusal

    refusal = fused_refusal(current_backend())
    return refusal is None, refusal or f"fused kernel available on {jax.devices()[0].device_kind}"


def bench_options(name: str, length: int, fused: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """``(label, options)`` rows for one registered kernel at one length; options the kernel lacks are dropped.

    Kernels with a fused path get two rows where it compiles, ``<name>/fused`` and ``<name>/xla`` (their XLA path),
    and one row (what 'auto' gives: the XLA path) elsewhere."""
    if name == "dense":
        impls = getattr(KERNELS[name], "IMPLEMENTATIONS", ("xla",))
        rows = [("dense", {})] if dense_default() not in ("xla", "chunked") else []  # e.g. 'auto': what users get
        return rows + [(f"dense/{impl}", {"implementation": impl}) for impl in ("xla", "chunked") if impl in impls]
    if name == "adaptive_span":  # every head's span fixed at z = max_span (init_span 1): cost follows the span
        return [(f"adaptive_span/z{z}", {"max_span": z, "init_span": 1.0}) for z in SPANS if z < length]
    wanted = {"local": {"window": 256}, "linformer": {"k": 256, "max_len": max(4096, length)},
              "performer": {"num_features": 256}}.get(name, {})
    accepted = kernel_options(name)
    options = {key: val for key, val in wanted.items() if key in accepted}
    if fused and name in FUSED_KERNELS:
        return [(f"{name}/{impl}", {**options, "implementation": path})
                for impl, path in (("fused", "fused"), ("xla", FUSED_KERNELS[name]))]
    return [(name, options)]


def kernel_loss(name: str, options: dict[str, Any], heads: int, head_dim: int, dtype: Any = jnp.float32
                ) -> tuple[Callable[..., jax.Array], tuple[Any, ...]]:
    """``loss(q, k, v, dout, params)`` for one registered kernel, and its (non-differentiated) extra state."""
    kernel = build_kernel({"name": name, **options}, num_heads=heads, num_kv_heads=heads, head_dim=head_dim,
                          rngs=nnx.Rngs(0), dtype=dtype)
    graphdef, params, rest = nnx.split(kernel, nnx.Param, ...)

    def loss(q, k, v, dout, params):
        out, _ = nnx.merge(graphdef, params, rest)(
            q, k, v, mask=None, is_causal=False, dropout_rng=None, dropout_rate=0.0, broadcast_dropout=True,
            deterministic=True, precision=None, need_weights=False)  # (B, T, N, H)
        return jnp.sum(out * dout)

    return loss, (params,)


def make_case_fn(case: Case, batch: int, heads: int, head_dim: int, dtype: Any = jnp.float32
                 ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The jitted fwd+bwd function of a case and its arguments (random inputs of ``dtype``, fixed seeds)."""
    keys = jax.random.split(jax.random.key(0), 4)
    shape = (batch, case.length, heads, head_dim)  # (B, T, N, H)
    if case.kernel == FLAX:
        d_model = heads * head_dim
        layer = nnx.MultiHeadAttention(heads, d_model, decode=False, dtype=dtype, rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(layer, nnx.Param)
        x, dout = (jax.random.normal(k, (batch, case.length, d_model), dtype) for k in keys[:2])  # (B, T, D)

        def loss(x, dout, params):
            return jnp.sum(nnx.merge(graphdef, params)(x) * dout)

        return jax.jit(jax.grad(loss, argnums=(0, 2))), (x, dout, params)
    q, k, v, dout = (jax.random.normal(key, shape, dtype) for key in keys)
    if case.kernel in (REF, CUDNN):
        implementation = "cudnn" if case.kernel == CUDNN else None

        def ref_loss(q, k, v, dout):
            return jnp.sum(jax.nn.dot_product_attention(q, k, v, implementation=implementation) * dout)

        return jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2))), (q, k, v, dout)
    loss, extra = kernel_loss(case.kernel, case.options, heads, head_dim, dtype)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 4))), (q, k, v, dout, *extra)


def memory_of(compiled: Any) -> dict[str, int]:
    stats = compiled.memory_analysis()
    if stats is None:
        return {}
    temp, arg, out = (int(getattr(stats, f"{n}_size_in_bytes", 0)) for n in ("temp", "argument", "output"))
    return {"temp": temp, "argument": arg, "output": out, "total": temp + arg + out}


def short_error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".splitlines()[0][:160]
    oom = any(s in str(err) for s in ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "MemoryError"))
    return ("oom: " if oom or isinstance(err, MemoryError) else "error: ") + text.replace(",", ";")


def run_case(case: Case, args: SimpleNamespace, budget: float) -> None:
    """Compiles, checks memory against the budget, then times; fills ``case`` in place, never raises."""
    b, n, t = args.batch, args.heads, case.length
    score_bytes = 3 * b * n * t * t * 4  # softmax statistics are float32 at any input dtype
    if case.quadratic and score_bytes > budget:
        case.status = f"skipped: T x T estimate {score_bytes / 2**30:.1f} GiB > budget {budget / 2**30:.1f} GiB"
        return
    try:
        fn, inputs = make_case_fn(case, b, n, args.head_dim, DTYPES[args.dtype])
        compiled = fn.lower(*inputs).compile()
        case.memory = memory_of(compiled)
        if case.memory.get("total", 0) > budget:
            case.status = f"oom: memory analysis {case.memory['total'] / 2**30:.1f} GiB > budget"
            return
        start = time.perf_counter()
        jax.block_until_ready(compiled(*inputs))  # warm-up
        warm = time.perf_counter() - start
        repeats = repeat_count(args.repeats, t, warm)
        repeats = min(repeats, int(args.case_seconds // max(warm, 1e-9)))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(*inputs))
            times.append(time.perf_counter() - start)
        case.seconds, case.repeats = (statistics.median(times), repeats) if times else (warm, 0)
        if not times:
            case.status = "ok (warm-up time only)"
    except Exception as err:  # noqa: BLE001 -- a failing case is a row, not a crash
        case.status = short_error(err)
    finally:
        gc.collect()


def repeat_count(repeats: int, length: int, warm: float) -> int:
    """Timed runs after the warm-up: all of ``--repeats`` for fast cases (GPU timings of milliseconds need them to
    compare within 10%), fewer at long lengths when one run already takes seconds (2 CPU cores)."""
    if warm < 1.0:
        return repeats
    return repeats if length <= 2048 else max(1, repeats // 2) if length <= 4096 else 1


def available_bytes() -> float:
    """What one case may use: 90% of the accelerator's memory on a GPU/TPU, else MemAvailable from /proc/meminfo
    (inf where unknown), so the budget never exceeds what the device has."""
    stats = jax.local_devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return 0.9 * stats["bytes_limit"]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return 0.9 * int(line.split()[1]) * 1024
    except OSError:
        pass
    return math.inf


def priority(label: str) -> int:
    """Run order within a length: the reference and the targets' rows first, so a time budget cuts the rest."""
    order = [REF, CUDNN, "dense", *(f"{n}/fused" for n in FUSED_KERNELS), "dense/chunked", *LINEAR_KERNELS, FLAX,
             "dense/xla"]
    return order.index(label) if label in order else len(order)


def plan(args: SimpleNamespace, cudnn: bool = False, fused: bool = False) -> list[Case]:
    """Every (row, length) case: the references (cuDNN when available) and each registered kernel (optionally
    filtered; fused rows where the fused kernel compiles), by length."""
    wanted = None if args.kernels == ["all"] else set(args.kernels)
    cases = []
    for length in args.lengths:
        rows = [Case(REF, REF, {}, length, quadratic=True),
                Case(FLAX, FLAX, {"d_model": args.heads * args.head_dim}, length, quadratic=True)]
        rows += [Case(CUDNN, CUDNN, {}, length)] if cudnn else []
        for name in sorted(KERNELS):
            for label, options in bench_options(name, length, fused):
                if wanted is None or name in wanted or label in wanted:
                    rows.append(Case(label, name, options, length, quadratic=forms_scores(label, cudnn)))
        cases += sorted(rows, key=lambda c: priority(c.label))
    return cases


def forms_scores(label: str, cudnn: bool) -> bool:
    """Rows that form the T x T matrix: dense via XLA, and dense with its default options unless cuDNN serves it."""
    return label == "dense/xla" or (label == "dense" and not cudnn)


def predicted_seconds(case: Case, done: list[Case], args: SimpleNamespace) -> float:
    """Wall time this case will take, from the same row at the last shorter length (0 when unknown).

    Time is scaled by length for the targets' linear kernels and by length squared for everything else
    (conservative for kernels of unknown complexity); the case runs a warm-up plus repeats capped by --case-seconds.
    """
    prev = [c for c in done if c.label == case.label and ran(c) and c.length < case.length]
    if not prev:
        return 0.0
    last = max(prev, key=lambda c: c.length)
    linear = case.label in LINEAR_KERNELS or case.kernel in ("local", "longformer", "bigbird")
    one = last.seconds * (case.length / last.length) ** (1 if linear else 2)
    return one + min(args.case_seconds, one * args.repeats)


# --- reports -----------------------------------------------------------------------------------------------------

RATIO_COLUMNS = ("speedup_vs_xla", "memory_vs_xla", "speedup_vs_cudnn", "memory_vs_cudnn")


def write_csv(cases: list[Case], args: SimpleNamespace, path: Path) -> None:
    """One row per case; the ratio columns are reference / case (higher is better), empty where either is missing
    (the cuDNN ones on every row of a run without cuDNN), so a table reader needs no reference rows."""
    idx = index(cases)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kernel", "label", "options", "length", "batch", "heads", "head_dim", "dtype", "fwd_bwd_seconds",
                    "repeats", "temp_bytes", "argument_bytes", "output_bytes", "total_bytes", "memory_source",
                    "status", *RATIO_COLUMNS])
        for c in cases:
            m = c.memory
            both = [*ratios(c, idx.get((REF, c.length))), *ratios(c, idx.get((CUDNN, c.length)))]
            w.writerow([c.kernel, c.label, json.dumps(c.options, sort_keys=True), c.length, args.batch, args.heads,
                        args.head_dim, args.dtype, "" if c.seconds is None else f"{c.seconds:.6f}", c.repeats,
                        m.get("temp", ""), m.get("argument", ""), m.get("output", ""), m.get("total", ""),
                        MEMORY_NOTE, c.status, *("" if r is None else f"{r:.4g}" for r in both)])


def index(cases: list[Case]) -> dict[tuple[str, int], Case]:
    return {(c.label, c.length): c for c in cases}


def ran(c: Case | None) -> bool:
    return c is not None and c.seconds is not None


def ratios(c: Case | None, ref: Case | None) -> tuple[float | None, float | None]:
    """(speedup, memory reduction) of ``c`` vs the reference at the same length; None where either did not run."""
    if not (ran(c) and ran(ref)):
        return None, None
    speed = ref.seconds / c.seconds
    mem = ref.memory["temp"] / max(c.memory["temp"], 1) if c.memory and ref.memory else None
    return speed, mem


def cudnn_targets(cases: list[Case], cudnn_note: str) -> list[str]:
    """The GPU targets against cuDNN flash attention: exact dense (default options) within 1.1x of its time and
    memory at 4K and 16K; local (w=256) at least 5x faster than it at 16K. "not measured" without cuDNN."""
    idx, labels = index(cases), {c.label for c in cases}
    dense = "dense" if "dense" in labels else "dense/xla"
    wanted = [(dense, t, f"{dense} within 1.1x of cuDNN's time and memory at {t}") for t in (4096, 16384)]
    local = fused_label("local", labels)
    wanted.append((local, 16384, f"{local} (w=256) >= 5x faster than cuDNN full attention at 16384"))
    lines = []
    for label, length, what in wanted:
        c, ref = idx.get((label, length)), idx.get((CUDNN, length))
        if CUDNN not in labels:
            lines.append(f"SKIP {what}: not measured (no cuDNN: {cudnn_note})")
        elif label not in labels or c is None or ref is None:
            lines.append(f"SKIP {what}: not measured ({label} or {length} not in this run)")
        else:
            speed, mem = ratios(c, ref)
            ok = speed is not None and (speed >= 5 if label == local else
                                        speed >= 1 / 1.1 and mem is not None and mem >= 1 / 1.1)
            lines.append(f"{'PASS' if ok else 'FAIL'} {what}: cuDNN time / time {fmt(speed, 2)}x, "
                         f"cuDNN memory / memory {fmt(mem, 2)}x"
                         + ("" if ran(c) and ran(ref) else f" [{c.status} / cuDNN {ref.status}]"))
    return lines


def targets(cases: list[Case], cudnn_note: str = "", fused_note: str = "") -> list[str]:
    """One PASS/FAIL/SKIP line per target (ratios from this run)."""
    idx, lines = index(cases), []
    labels = {c.label for c in cases}

    def at(label, length):
        return idx.get((label, length))

    for name in (fused_label(n, labels) for n in LINEAR_KERNELS):
        what = f"{name} at 4096: >=10x faster and >=10x less memory than {REF} fwd+bwd"
        c, ref = at(name, 4096), at(REF, 4096)
        if name not in labels:
            lines.append(f"SKIP {what} (not registered / not selected)")
        elif c is None or ref is None:
            lines.append(f"SKIP {what} (4096 not in --lengths)")
        else:
            speed, mem = ratios(c, ref)
            ok = speed is not None and mem is not None and speed >= 10 and mem >= 10
            lines.append(f"{'PASS' if ok else 'FAIL'} {what}: speedup {fmt(speed)}x, memory {fmt(mem)}x"
                         + ("" if ran(c) and ran(ref) else f" [{c.status} / ref {ref.status}]"))
    what = f"dense/chunked at 2048 at least as fast as {REF}"
    c, ref = at("dense/chunked", 2048), at(REF, 2048)
    if "dense/chunked" not in labels:
        lines.append(f"SKIP {what} (dense implementation 'chunked' not registered / not selected)")
    elif c is None or ref is None:
        lines.append(f"SKIP {what} (2048 not in --lengths)")
    else:
        speed, _ = ratios(c, ref)
        lines.append(f"{'PASS' if speed is not None and speed >= 1 else 'FAIL'} {what}: speedup {fmt(speed)}x")
    for label in ("dense/chunked", *(fused_label(n, labels) for n in LINEAR_KERNELS)):
        what = f"{label} runs at 16384"
        c = at(label, 16384)
        if label not in labels:
            lines.append(f"SKIP {what} (not registered / not selected)")
        elif c is None:
            lines.append(f"SKIP {what} (16384 not in --lengths)")
        elif c.status.startswith("skipped: predicted"):
            lines.append(f"SKIP {what} ({c.status})")
        else:
            lines.append(f"{'PASS' if ran(c) else 'FAIL'} {what}: {c.status}"
                         + (f", {c.seconds:.3f} s" if ran(c) else ""))
    return lines + cudnn_targets(cases, cudnn_note) + fused_targets(cases, fused_note)


def fused_label(name: str, labels: set[str]) -> str:
    """``<name>/fused`` where this run has that row (a GPU), else the kernel's single row."""
    return f"{name}/fused" if f"{name}/fused" in labels else name


def fused_targets(cases: list[Case], fused_note: str) -> list[str]:
    """The fused kernels' GPU targets: bigbird and longformer >= 3x faster than cuDNN full attention at 16K (local's
    5x is in :func:`cudnn_targets`); no fused row slower than its XLA row at any length; fused memory linear in T
    (temp memory grows at most 1.25x as fast as T between measured lengths). "not yet measured" without them."""
    idx, labels = index(cases), {c.label for c in cases}
    fused = [f"{n}/fused" for n in FUSED_KERNELS if f"{n}/fused" in labels]
    if not fused:
        return [f"SKIP fused kernels' targets: not yet measured ({fused_note or 'no fused rows in this run'})"]
    lines = []
    for name in ("bigbird", "longformer"):
        c, ref = idx.get((f"{name}/fused", 16384)), idx.get((CUDNN, 16384))
        what = f"{name}/fused >= {FUSED_SPEEDUPS[name]:g}x faster than cuDNN full attention at 16384"
        speed = ratios(c, ref)[0]
        lines.append(f"SKIP {what}: not measured" if speed is None else
                     f"{'PASS' if speed >= FUSED_SPEEDUPS[name] else 'FAIL'} {what}: {speed:.2f}x")
    for label in fused:
        rows = sorted((c for c in cases if c.label == label and ran(c)), key=lambda c: c.length)
        slower = [c.length for c in rows if (ratios(c, idx.get((label.replace("/fused", "/xla"), c.length)))[0]
                                             or math.inf) < 1.0]
        measured = [c.length for c in rows if ran(idx.get((label.replace("/fused", "/xla"), c.length)))]
        lines.append(f"{'PASS' if measured and not slower else 'FAIL' if slower else 'SKIP'} {label} not slower "
                     f"than its XLA path at any length: compared at {measured or 'none'}"
                     + (f", slower at {slower}" if slower else ""))
        growth = [(b.memory["temp"] / max(a.memory["temp"], 1)) / (b.length / a.length)
                  for a, b in zip(rows, rows[1:]) if a.memory and b.memory]
        lines.append(f"{'SKIP' if not growth else 'PASS' if max(growth) <= 1.25 else 'FAIL'} {label} memory "
                     f"linear in T: worst growth {fmt(max(growth, default=None), 2)}x of T's")
    return lines


def fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def fmt_ratio(r: float | None) -> str:
    """Two decimals, or two significant digits below 0.1 (XLA's memory vs cuDNN's is ~0.002x at 16K)."""
    return "n/a" if r is None else f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"


def fmt_seconds(seconds: float) -> str:
    """Milliseconds below one second, so GPU times stay readable beside CPU ones."""
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def write_md(cases: list[Case], args: SimpleNamespace, path: Path, budget: float,
             cudnn_note: str = "", fused_note: str = "") -> list[str]:
    idx = index(cases)
    labels = list(dict.fromkeys(c.label for c in cases))
    head = ["kernel", "options", *(str(t) for t in args.lengths)]
    opts = {c.label: json.dumps(c.options, sort_keys=True) for c in cases}
    has_cudnn = CUDNN in labels

    def cell(label, t, kind):
        c = idx.get((label, t))
        if not ran(c):
            return c.status.split(":")[0] if c else ""
        pick = 0 if kind == "time" else 1
        rs = [ratios(c, idx.get((r, t)))[pick] for r in ((REF, CUDNN) if has_cudnn else (REF,))]
        shown = " / ".join(f"{fmt_ratio(r)}x" for r in rs)
        if kind == "time":
            return f"{fmt_seconds(c.seconds)} ({shown})"
        return f"{c.memory.get('temp', 0) / 2**20:.3g} MiB ({shown})"

    def table(kind):
        return markdown_table(head, [[lb, f"`{opts[lb]}`", *(cell(lb, t, kind) for t in args.lengths)]
                                     for lb in labels])

    vs = "vs XLA / vs cuDNN" if has_cudnn else "vs XLA"
    cudnn_line = (f"cuDNN row: `{CUDNN}` = `jax.nn.dot_product_attention(..., implementation='cudnn')`; each cell's "
                  f"ratios are vs XLA / vs cuDNN." if has_cudnn else f"No cuDNN row ({cudnn_note}).")
    has_fused = any(lb.endswith("/fused") for lb in labels)
    fused_line = ("`<kernel>/fused` rows: implementation='fused' (the block-sparse Pallas flash kernel); "
                  "`<kernel>/xla`: the same pattern through its XLA path." if has_fused
                  else f"No fused rows ({fused_note or 'not in this run'}).")
    lines = ["# Attention fwd+bwd benchmark", "",
             f"batch {args.batch}, heads {args.heads}, head_dim {args.head_dim}, {args.dtype}, "
             f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}; {os.cpu_count()} CPUs visible), "
             f"memory budget {budget / 2**30:.1f} GiB. Ratios are vs `{REF}` (XLA) at the same length (speedup = "
             f"ref time / time; memory = ref temp / temp); n/a where the reference did not run. {cudnn_line} "
             f"{fused_line} "
             f"Memory is XLA's `temp_size_in_bytes` (working set beyond arguments and outputs; see the CSV for the "
             f"others).", "",
             f"## Time (median, speedup {vs})", "", table("time"),
             "", f"## Memory (compiled temp MiB, reduction {vs})", "", table("mem")]
    notes = [f"- {c.label} @ {c.length}: {c.status}" for c in cases if c.status != "ok"]
    result = targets(cases, cudnn_note, fused_note)
    lines += ["", "## Targets", ""] + [f"- {t}" for t in result]
    lines += (["", "## Not run / notes", ""] + notes) if notes else []
    path.write_text("\n".join(lines) + "\n")
    return result


def write_png(cases: list[Case], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, label in enumerate(dict.fromkeys(c.label for c in cases)):
        rows = [c for c in cases if c.label == label and ran(c)]
        if not rows:
            continue
        style = dict(linestyle="--" if label in (REF, CUDNN, FLAX) else "-", marker="os^vD"[i % 5],
                     color=plt.cm.tab20(i % 20), label=label)  # 12+ lines: distinct colour and marker each
        xs = [c.length for c in rows]
        ax_t.plot(xs, [c.seconds for c in rows], **style)
        mem = [(c.length, c.memory["temp"] / 2**20) for c in rows if c.memory.get("temp")]
        if mem:
            ax_m.plot(*zip(*mem), **style)
    for ax, ylabel in ((ax_t, "fwd+bwd seconds (median)"), (ax_m, "compiled temp memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_csv(path: Path) -> tuple[list[Case], str | None]:
    """Cases back from a CSV this script wrote (to redraw the plot or table without rerunning), and its dtype
    (None for CSVs from before ``--dtype``)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    cases = [Case(label=r["label"], kernel=r["kernel"], options=json.loads(r["options"]), length=int(r["length"]),
                  seconds=float(r["fwd_bwd_seconds"]) if r["fwd_bwd_seconds"] else None,
                  repeats=int(r["repeats"] or 0), status=r["status"],
                  memory={k: int(r[f"{k}_bytes"]) for k in ("temp", "argument", "output", "total")
                          if r.get(f"{k}_bytes")}) for r in rows]
    return cases, next((r["dtype"] for r in rows if r.get("dtype")), None)


_LENGTHS = DEFINE_integer_list("lengths", [1024, 2048, 4096, 8192, 16384], "Sequence lengths, comma-separated.")
_BATCH = flags.DEFINE_integer("batch", 4, "Batch size.", lower_bound=1)
_HEADS = flags.DEFINE_integer("heads", 8, "Attention heads.", lower_bound=1)
_HEAD_DIM = flags.DEFINE_integer("head-dim", 64, "Head dimension.", lower_bound=1)
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(DTYPES),
                           "Inputs and kernel compute; cuDNN flash attention needs bfloat16 or float16.")
_KERNELS = flags.DEFINE_list("kernels", ["all"], "'all' or comma-separated names/labels (e.g. dense/chunked).")
_MAX_GIB = flags.DEFINE_float("max-gib", 16.0, "Memory budget per case (also capped by free RAM, or by the "
                              "accelerator's memory).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs after the warm-up (halved at 4096, 1 above).", lower_bound=1)
_CASE_SECONDS = flags.DEFINE_float("case-seconds", 45.0, "No more timed repeats than fit in this many seconds "
                                   "(warm-up time used if none fit).")
_TIME_BUDGET = flags.DEFINE_float("time-budget", 840.0, "Seconds for all cases; a case predicted (from its row at a "
                                  "shorter length) not to fit in what is left is recorded as skipped.")
_OUT = flags.DEFINE_string("out", "bench/attention", "Output prefix: <out>.csv, <out>.md, <out>.png.")
_REPLOT = flags.DEFINE_bool("replot", False, "Redraw <out>.md and <out>.png from <out>.csv, run nothing.")
_QUICK = flags.DEFINE_bool("quick", False, "Lengths 256,512 and batch 1 (smoke test, < 1 minute).")


def settings() -> SimpleNamespace:
    """The parsed flags as one object (``--quick`` applied): what the cases and the tables are made from."""
    args = SimpleNamespace(lengths=_LENGTHS.value, batch=_BATCH.value, heads=_HEADS.value, head_dim=_HEAD_DIM.value,
                           dtype=_DTYPE.value, kernels=_KERNELS.value, max_gib=_MAX_GIB.value, repeats=_REPEATS.value,
                           case_seconds=_CASE_SECONDS.value, time_budget=_TIME_BUDGET.value, out=_OUT.value,
                           replot=_REPLOT.value)
    if _QUICK.value:
        args.lengths, args.batch, args.repeats = [256, 512], 1, min(args.repeats, 2)
    return args


def main(argv: list[str]) -> None:
    main_args(argv)
    args = settings()
    budget = min(args.max_gib * 2**30, available_bytes())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.replot:
        cases, dtype = read_csv(out.with_suffix(".csv"))
        args.dtype = dtype or args.dtype
        note = "" if any(c.label == CUDNN for c in cases) else "not in this CSV"
        print("\n".join(write_md(cases, args, out.with_suffix(".md"), budget, note, "not in this CSV")))
        write_png(cases, out.with_suffix(".png"))
        return
    cudnn, cudnn_note = cudnn_status(DTYPES[args.dtype])
    print(f"cuDNN row: {'yes' if cudnn else 'omitted'} ({cudnn_note})", flush=True)
    fused, fused_note = fused_status()
    print(f"fused rows: {'yes' if fused else 'omitted'} ({fused_note})", flush=True)
    cases = plan(args, cudnn, fused)
    print(f"{len(cases)} cases; kernels registered: {', '.join(sorted(KERNELS))}; dense default implementation "
          f"'{dense_default()}'; {args.dtype}; budget {budget / 2**30:.1f} GiB", flush=True)
    start = time.perf_counter()
    for i, case in enumerate(cases):
        left = args.time_budget - (time.perf_counter() - start)
        guess = predicted_seconds(case, cases[:i], args)
        if guess > left:
            case.status = f"skipped: predicted {guess:.0f} s > {max(left, 0):.0f} s left of --time-budget"
        else:
            run_case(case, args, budget)
        mem = case.memory.get("temp")
        print(f"[{i + 1}/{len(cases)} {time.perf_counter() - start:6.0f}s] {case.label:30s} T={case.length:6d} "
              f"{fmt(case.seconds, 4):>9s} s  temp {fmt(mem and mem / 2**20, 1):>9s} MiB  {case.status}",
              flush=True)
    write_csv(cases, args, out.with_suffix(".csv"))
    result = write_md(cases, args, out.with_suffix(".md"), budget, cudnn_note, fused_note)
    write_png(cases, out.with_suffix(".png"))
    print("\n".join(result))
    print(f"wrote {out}.csv, {out}.md, {out}.png in {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
