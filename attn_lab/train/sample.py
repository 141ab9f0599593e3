"""A language model's example for its summary: the test split's first text cut to a prompt, and the model's greedy
continuation (one compile of the generation loop, shared by the seeds; a translation run's example is the decoded
test sentence, :meth:`attn_lab.train.trainer.Run.evaluate`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from attn_lab.models.sites import decoding_attentions
from attn_lab.train.generate import compile_generate
from attn_lab.train.seeds import unstack
from attn_lab.train.state import merge

if TYPE_CHECKING:
    from attn_lab.train.trainer import Run

PROMPT_TOKENS, NEW_TOKENS = 12, 24


def continuations(run: Run) -> list[dict] | None:
    """Per seed ``{'prompt': text, 'ours': greedy continuation}``; None for a model that does not generate text."""
    prompt = run.task.prompt_ids("test", PROMPT_TOKENS)
    if not prompt:
        return None
    model = merge(run.graphdef, unstack(run.state, 0))
    new = min(NEW_TOKENS, (getattr(model, "max_positions", None) or NEW_TOKENS + len(prompt)) - len(prompt))
    if new < 1:
        return None
    cached = all(a.kernel.supports_decode for a in decoding_attentions(model))
    generate = compile_generate(run.graphdef, new, cached=cached)
    ids = jnp.asarray([prompt], jnp.int32)  # (1, P)
    out = []
    for i in range(len(run.seeds)):
        tokens = jax.device_get(generate(unstack(run.state, i), ids, jax.random.key(0)))[0]  # (P + new,)
        out.append({"prompt": run.task.decode(tokens[: len(prompt)]), "ours": run.task.decode(tokens[len(prompt):])})
    return out
