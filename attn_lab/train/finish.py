"""What a run writes when it ends: the training record (speed, compilations; kept for a process that only finishes
the final test), results.json per seed, the test line in metrics.jsonl and W&B, and curves.png."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from attn_lab import results
from attn_lab.checks import describe
from attn_lab.models.gates import binary_gates
from attn_lab.train import identity, summary
from attn_lab.train.loop import LoopStats, speed
from attn_lab.train.seeds import unstack

if TYPE_CHECKING:
    from attn_lab.train.trainer import Run


def training_records(run: Run, stats: LoopStats, start: float) -> list[dict]:
    """Per seed, what training measured: written to training.json (before the final test) by a process that trained
    up to the last step; read back by one that only finishes the final test, because the process that trained was
    stopped during it -- so results.json gets the original run's speed, not this process's (which trained nothing)."""
    if run.start_step < stats.step:
        record = results.training_record(run.num_params, stats.step, run.compilations(), time.time() - start,
                                         speed(stats, stats.step - run.start_step), len(run.seeds))
        if run.main:
            for w in run.workdirs:
                results.write_training(w, record)
        return [record] * len(run.seeds)
    return [results.recorded_training(w, run.num_params, stats.step, len(run.seeds)) for w in run.workdirs]


def finish(run: Run, i: int, step: int, test: dict[str, float], training: dict, tested_from: float) -> dict:
    """Seed i's results: logged to its W&B run and written atomically to its results.json. A test line already in
    metrics.jsonl (the process that trained was stopped after logging it) is not logged twice."""
    workdir = run.workdirs[i]
    gates = binary_gates(run.parallel.fetch(unstack(run.state, i)["params"]), run.config.heads.gates.target)
    learned = run.learned_heads(i)  # per-head spans / alphas of kernels that learn their shape
    extra = ({} if gates is None else results.gates_record(gates)) | ({"learned": learned} if learned else {})
    extra["config_fingerprint"] = identity.fingerprint(run.configs[i].to_dict())  # see attn_lab.train.identity
    if run.example:
        extra["example"] = run.example[i]
    record = results.results_record(workdir, test, training, time.time() - tested_from, run.configs[i].to_dict(),
                                    extra)
    if not results.test_logged(workdir, step):
        run.loggers[i].log(step, {f"test/{k}": v for k, v in test.items()})
    run.loggers[i].summary({"final/" + k: v for k, v in test.items()})
    if run.main:
        results.write_results(workdir, record)
        write_curves(workdir)
    return record


def write_curves(workdir: str) -> None:
    """curves.png beside results.json; a plot that fails is a note (the results are already written)."""
    try:
        summary.write_curves(workdir)
    except Exception as e:  # noqa: BLE001 (matplotlib fails in many ways; the run's numbers are safe either way)
        print(f"note: {workdir}/{summary.CURVES_FILE} not written ({describe(e)})", flush=True)
