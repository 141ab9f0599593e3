"""What a run says when it starts: its config written, the parameter count, the attention dispatch, and one note per
split whose examples the task's length limits cut."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attn_lab import results

if TYPE_CHECKING:
    from attn_lab.train.trainer import Run


def announce(run: Run) -> None:
    """The run's start: parameter count to W&B; config.json written; the model and dispatch lines printed."""
    for logger in run.loggers:
        logger.summary({"num_params": run.num_params})
    if not run.main:
        return
    for w, c in zip(run.workdirs, run.configs):
        if not run.start_step:  # a resumed run keeps the config.json it started with (the same identity)
            results.write_config(w, c.to_dict())
    for line in cut_notes(run.task, run.config.task.name) if not run.start_step else ():  # said at the start
        print(line, flush=True)
    resumed = f", resuming at step {run.start_step}" if run.start_step else ""
    vectorized = f", seeds {run.seeds} in one program" if len(run.seeds) > 1 else ""
    print(f"{run.config.task.name}: {run.task.kind} model, {run.num_params:,} parameters{vectorized}{resumed}",
          flush=True)
    print(run.dispatch, flush=True)
    if run.uncached:
        print(f"note: attention {', '.join(run.uncached)} has supports_decode=False: every decoding step re-runs the "
              "decoder over the whole prefix (no KV cache), so evaluation decodes several times slower", flush=True)


def cut_notes(task: Any, name: str) -> list[str]:
    """One line per split whose examples the task's length limits cut (the model trains on, and is scored on,
    the cut sequences; a translation's BLEU still compares with the full references)."""
    notes = []
    for split in ("train", "validation", "test"):
        cut = {key: c for key, c in task.overlong(split).items() if c[0]}
        if cut:
            said = "; ".join(f"task.{key}={getattr(task, key)} cuts {n} of the first {seen} examples (the longest: "
                             f"{longest} tokens)" for key, (n, seen, longest) in cut.items())
            notes.append(f"note: task '{name}', {split} split: {said}; raise it to keep them whole")
    return notes
