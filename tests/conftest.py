"""Matmul precision for the whole suite.

On accelerators JAX runs float32 matmuls at reduced precision by default (TF32 on an Ampere-or-later GPU, bf16
passes on a TPU): on an H200, exactness tests saw |diff| ~1e-3 where they expect 1e-5. A CPU is always exact, so a
suite written on one silently depends on exact float32 matmuls. Every test therefore runs under
``jax.default_matmul_precision('highest')`` and compares float32-exact matmuls on any backend. Tests marked
``@pytest.mark.default_precision`` run at the backend default instead, with tolerances derived from the dtype
(tests/test_precision.py): they check that nothing in the library needs highest precision to be correct. Library
code never sets a precision.

The setting is a trace-time config that jit caches are keyed on, so it reaches functions jitted inside or outside
the test (checked in tests/test_precision.py). It does not reach fixtures broader than a function's scope, nor
subprocesses.

``ATTN_LAB_EMULATE_MATMUL=tf32`` (GPU) or ``bf16`` (TPU) emulates reduced precision on a CPU: float32 operands of
every default-precision matmul are rounded to 10 (7) mantissa bits before the product. The unmarked tests must
still pass, and the ``default_precision`` ones show whether their tolerances hold there. It patches a private JAX
lowering rule, so it is for this check only.
"""

import os

import jax
import pytest

_EMULATE = os.environ.get("ATTN_LAB_EMULATE_MATMUL")


def _emulate_reduced_precision(mantissa_bits: int) -> None:
    import numpy as np
    from jax._src.interpreters import mlir
    from jax._src.lax import lax as lax_internal
    from jax._src.lib.mlir.dialects import hlo

    default = (lax_internal.Precision.DEFAULT,) * 2

    def lower(ctx, lhs, rhs, *, precision, **kw):
        if precision in (None, default):
            lhs, rhs = [hlo.reduce_precision(x, 8, mantissa_bits) if aval.dtype == np.float32 else x
                        for x, aval in zip((lhs, rhs), ctx.avals_in)]
        return lax_internal._dot_general_lower(ctx, lhs, rhs, precision=precision, platform="cpu", **kw)

    mlir.register_lowering(lax_internal.dot_general_p, lower, platform="cpu")


if _EMULATE:
    _emulate_reduced_precision({"tf32": 10, "bf16": 7}[_EMULATE])


def pytest_report_header(config):
    return f"matmul precision: highest unless marked default_precision; emulated default: {_EMULATE or 'no'}"


@pytest.fixture(autouse=True)
def matmul_precision(request):
    """'highest' for every test, the backend default (None) for tests marked default_precision."""
    precision = None if request.node.get_closest_marker("default_precision") else "highest"
    with jax.default_matmul_precision(precision):
        yield precision


@pytest.fixture
def tiny_step():
    """``make(config, max_len=9, length=8, **compile_kwargs) -> (step, stacked state, batch, graphdef)``: a one-seed
    translation train step of ``config.model`` on random tokens (vocab 20, batch 4), for loss-term tests."""
    import numpy as np
    from flax import nnx

    from attn_lab.models import build_model
    from attn_lab.train.seeds import stack
    from attn_lab.train.steps import compile_steps, init_state, make_optimizer, model_state

    def make(config, max_len: int = 9, length: int = 8, **compile_kwargs):
        tx = make_optimizer(config.train)
        model = build_model(config.model, kind="translation", vocab_size=20, max_len=max_len, seed=0)
        graphdef, params, _ = nnx.split(model, nnx.Param, ...)
        state = init_state(nnx.to_pure_dict(params), model_state(model), tx, 0)
        batch = {k: np.asarray(jax.random.randint(jax.random.key(i), (1, 4, length), 1, 20))
                 for i, k in enumerate(("inputs", "targets"))}
        step, _ = compile_steps(graphdef, tx, 0.0, **compile_kwargs)
        return step, stack([state]), batch, graphdef

    return make


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """One temporary ``data_dir`` for the session's prepared datasets: each task config gets its own folder under it
    (attn_lab/data/tasks/), so modules share a prepared task instead of preparing it again. A test that counts
    files across the whole folder needs its own (a module's fixture of the same name overrides this one)."""
    return str(tmp_path_factory.mktemp("data"))
