"""Train one model from a config file (``python -m attn_lab.train``; ``scripts/train.py`` and ``attn-train`` run this).

  python -m attn_lab.train --config configs/numbers.py:quick --workdir runs/x --config.model.num_heads=8
  python -m attn_lab.train --config configs/numbers.py:quick --workdir 'runs/x/seed={seed}' --seeds 0,1,2

Running the same command again on the same workdir resumes from its last checkpoint; on a finished run (it has
results.json) it says so and exits 0, writing nothing. ``--reevaluate`` evaluates the newest checkpoint again into
``results.reeval-<time>.json`` (results.json and metrics.jsonl stay as the run wrote them). ``--seeds`` trains
several seeds in one vmapped program, each written to its own folder exactly as a separate run would be.
"""

import json
import sys

from absl import flags
from ml_collections import config_flags

from attn_lab import results
from attn_lab.checks import RunError, check_seed
from attn_lab.cli import DEFINE_integer_list, main_args, run_entry_point
from attn_lab.diskfull import disk_full, disk_full_line, stop_for_full_disk
from attn_lab.signals import Interrupted
from attn_lab.train.identity import checkpoint_steps
from attn_lab.train.summary import example_line, summary_line
from attn_lab.train.workdir import BUSY_EXIT, WorkdirBusy, seed_workdirs

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, optionally with ':preset'.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder (metrics, checkpoints, W&B, results.json).")
_SEEDS = DEFINE_integer_list("seeds", None, "Comma-separated seeds trained together (jax.vmap); the workdir "
                              "must then contain {seed}. Default: config.seed alone.")
_REEVALUATE = flags.DEFINE_bool("reevaluate", False, "Evaluate the newest checkpoint again (validation and test) into "
                                "<workdir>/results.reeval-<time>.json; results.json and metrics.jsonl are not touched.")
_PRINT_JSON = flags.DEFINE_bool("print-json", False, "Print each finished run's record (results.json's metrics and "
                                 "speed) as JSON instead of its one summary line.")
_ALLOW_UNFINISHED = flags.DEFINE_bool("allow-unfinished", False, "Let train.init_from name a run that has not "
                                      "finished (its newest checkpoint is used, and named).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> int:
    """Checks every input, then trains (or reevaluates). jax and the model code are imported here, after the flags
    parsed, so that ``--help`` and a bad flag answer at once."""
    main_args(argv)
    from attn_lab.train.config import check_parallel, check_workdirs
    from attn_lab.train.parallel import initialize_distributed
    from attn_lab.train.spec import resolve_run
    from attn_lab.train.trainer import reevaluate_seeds, train_seeds

    config = _CONFIG.value
    try:  # every check below writes nothing: a bad input stops here, in one line, before any file exists
        check_parallel(config)  # pure Python, so it can run before jax.distributed starts
        initialize_distributed(config.parallel)  # multi-host: before any other JAX work
        for seed in _SEEDS.value or ():  # config.seed is checked with the config
            check_seed(seed, "--seeds")
        # validated once (every key, path and late option, before any data or compilation) and resolved: nothing
        # below reads the raw config
        spec = resolve_run(config, _SEEDS.value)
        workdirs = seed_workdirs(_WORKDIR.value, spec.seeds)
        check_workdirs(workdirs)
    except ValueError as e:
        sys.exit(f"error: {e}")
    for note in spec.notes:
        print(note, flush=True)
    try:
        if _REEVALUATE.value:
            for path in reevaluate_seeds(spec, workdirs):
                print(f"wrote {path}")
            return 0
        finished = [results.finished_results(w) is not None for w in workdirs]  # said by the trainer, not printed again
        all_results = train_seeds(spec, workdirs, allow_unfinished=_ALLOW_UNFINISHED.value)
    except WorkdirBusy as e:  # another process trains there: a sweep tells this apart from a failure by the code
        print(f"error: {e}", file=sys.stderr)
        sys.exit(BUSY_EXIT)
    except (FloatingPointError, RunError) as e:  # non-finite loss: the last good checkpoint is kept
        sys.exit(f"error: {e}")
    except Interrupted as e:
        print(f"stopped by {e} {_where(e, workdirs)}; rerun the same command to resume", file=sys.stderr)
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 (a full disk, wrapped by whichever library hit it; anything else raises)
        full = disk_full(e)
        if full is None:
            raise
        steps = checkpoint_steps(workdirs[0])
        saved = f"the newest checkpoint, step {steps[-1]}, is intact" if steps else "no checkpoint was written yet"
        stop_for_full_disk(disk_full_line(full, saved))
    for workdir, record, done in zip(workdirs, all_results, finished):
        if not done:
            if _PRINT_JSON.value:
                print(json.dumps(results.printed(workdir, record), indent=2))
                continue
            example = example_line(record)
            print(*([example] if example else []), summary_line(workdir, record), sep="\n")
    return 0


def _where(e: Interrupted, workdirs: list[str]) -> str:
    """Where the interrupted run stands: the step it checkpointed, or its newest checkpoint."""
    folder = workdirs[0] if len(workdirs) == 1 else f"{workdirs[0]} (and {len(workdirs) - 1} more)"
    if e.step is not None:
        return f"at step {e.step}, checkpointed in {folder}"
    steps = checkpoint_steps(workdirs[0])
    return (f"before training (nothing trained in {folder})" if not steps
            else f"after step {steps[-1]}, its newest checkpoint in {folder}")


def run() -> None:
    """The ``attn-train`` console script."""
    run_entry_point(main, __name__)


if __name__ == "__main__":
    run()
