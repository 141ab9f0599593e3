"""scripts/bench_attention.py's plan and targets for the fused kernels, on synthetic cases (no timing here).

Where the fused kernel compiles (a CUDA GPU), each pattern kernel gets a ``/fused`` and an ``/xla`` row; the
targets compare them with cuDNN and with each other as issue 31 states them; without a GPU they read "not yet
measured". The numbers below are made up to hit each branch; real ones come from a GPU run of the script.
"""

import functools
import importlib.util
import os
import sys
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def _bench():
    """The script as a module (registered first: its dataclasses resolve their annotations through sys.modules)."""
    spec = importlib.util.spec_from_file_location("bench_attention", os.path.join(ROOT, "scripts",
                                                                                  "bench_attention.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _args(lengths=(4096, 16384)):
    return SimpleNamespace(kernels=["all"], lengths=list(lengths), heads=8, head_dim=64)


def test_plan_has_fused_and_xla_rows_only_where_the_kernel_compiles():
    bench = _bench()
    gpu = {c.label: c.options for c in bench.plan(_args(), cudnn=True, fused=True)}
    for name, xla in bench.FUSED_KERNELS.items():
        assert gpu[f"{name}/fused"]["implementation"] == "fused"
        assert gpu[f"{name}/xla"]["implementation"] == xla
        assert name not in gpu
    assert gpu["local/fused"]["window"] == 256
    cpu = {c.label for c in bench.plan(_args(), cudnn=False, fused=False)}
    assert not any(label.endswith("/fused") for label in cpu) and {"local", "bigbird"} <= cpu


def _case(bench, label, length, seconds, temp):
    return bench.Case(label, label.split("/")[0], {}, length, seconds=seconds, memory={"temp": temp})


def test_fused_targets_pass_fail_and_skip():
    bench = _bench()
    cases = []
    for t, scale in ((4096, 1), (16384, 4)):
        cases += [_case(bench, bench.CUDNN, t, 10.0 * scale * scale, 100 * scale),
                  _case(bench, "bigbird/fused", t, 2.0 * scale, 10 * scale),  # 20x / 40x cuDNN: PASS
                  _case(bench, "bigbird/xla", t, 3.0 * scale, 30 * scale),
                  _case(bench, "longformer/fused", t, 20.0 * scale, 10 * scale * scale),  # 2x at 16K: FAIL
                  _case(bench, "longformer/xla", t, 10.0 * scale, 10 * scale)]  # fused slower: FAIL
    lines = bench.fused_targets(cases, "")
    assert any(x.startswith("PASS bigbird/fused >= 3x faster than cuDNN") for x in lines)
    assert any(x.startswith("FAIL longformer/fused >= 3x") and "2.00x" in x for x in lines)
    assert "PASS bigbird/fused not slower than its XLA path at any length: compared at [4096, 16384]" in lines
    assert any(x.startswith("FAIL longformer/fused not slower") and "slower at [4096, 16384]" in x for x in lines)
    assert "PASS bigbird/fused memory linear in T: worst growth 1.00x of T's" in lines
    assert "FAIL longformer/fused memory linear in T: worst growth 4.00x of T's" in lines
    none = bench.fused_targets([_case(bench, bench.CUDNN, 4096, 1.0, 1)], "backend cpu (...)")
    assert none == ["SKIP fused kernels' targets: not yet measured (backend cpu (...))"]


def test_local_target_reads_the_fused_row_on_a_gpu():
    bench = _bench()
    cases = [_case(bench, bench.CUDNN, 16384, 10.0, 100), _case(bench, "local/fused", 16384, 1.0, 10)]
    lines = bench.cudnn_targets(cases, "")
    assert any(x.startswith("PASS local/fused (w=256) >= 5x faster than cuDNN full attention at 16384: cuDNN "
                            "time / time 10.00x") for x in lines)
