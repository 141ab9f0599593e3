"""Recall per listed key-value pair of finished MQAR runs, on each run's prepared test split: where a recall plateau
comes from (docs/recall.md, "Why dense plateaus").

  python scripts/mqar_by_pair.py --workdir runs/probe/recall/seed=301 [--workdir ...]

Prints one line per run: its recall, then the recall of the pair listed first, second, ... A run whose first layer
did not learn to tell two pairs' positions apart shows ~0.5 on each of the two and ~1.0 on the rest.
"""

from __future__ import annotations

import jax
import numpy as np
from absl import app, flags

from attn_lab.analysis.context import merge
from attn_lab.checks import RunError
from attn_lab.cli import parse_flags, quiet_libraries
from attn_lab.data.tasks import mqar
from attn_lab.data.tokenizers import PAD_ID
from attn_lab.train.restore import load_finished_run

_WORKDIR = flags.DEFINE_multi_string("workdir", None, "A finished MQAR run's folder (repeat for several).",
                                     required=True)
BATCH = 250  # sequences per forward pass


def by_pair(workdir: str) -> str:
    """One line: the run's recall on its test split and per listed pair (greedy: the top logit at each query)."""
    run = load_finished_run(workdir)
    if run.config.task.name != "mqar":
        raise ValueError(f"--workdir {workdir} is a '{run.config.task.name}' run; this reads MQAR runs only")
    test = run.task.sources["test"]  # the prepared test split the run was scored on
    inputs = np.stack([np.asarray(test[i]["inputs"]) for i in range(len(test))])  # (num_test, L)
    targets = np.stack([np.asarray(test[i]["targets"]) for i in range(len(test))])
    forward = jax.jit(merge(run.graphdef, run.state).__call__)
    predicted = np.concatenate([np.asarray(forward(inputs[i : i + BATCH])).argmax(-1)
                                for i in range(0, len(inputs), BATCH)])  # (num_test, L)
    scored = targets != PAD_ID
    pairs = mqar.recall_by_pair(inputs, targets, predicted, run.config.task.num_kv_pairs)
    return (f"{workdir}: recall {np.mean(predicted[scored] == targets[scored]):.3f}; by pair listed "
            f"1..{len(pairs)}: {' '.join(f'{p:.3f}' for p in pairs)}")


def main(argv):
    del argv
    quiet_libraries()
    for workdir in _WORKDIR.value:
        try:
            print(by_pair(workdir))
        except (ValueError, RunError) as e:  # no such folder, not MQAR, no readable checkpoint: one line
            raise SystemExit(str(e)) from None


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
