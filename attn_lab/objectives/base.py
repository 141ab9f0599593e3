"""The loss-term interface and its registry (see the package docstring for how to add one)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import jax
import ml_collections
from flax import nnx

from attn_lab import plugins
from attn_lab.models import attention_layers


@dataclasses.dataclass(frozen=True)
class Layer:
    """One attention layer as a loss term sees it after the forward pass.

    ``captured``: what the forward pass captured there (empty unless some active term asked, see
    :meth:`LossTerm.capture`): ``attention_weights [B, N, T, S]`` (capture True), ``head_outputs [B, T, N, H]`` and
    ``values [B, S, K, H]`` (capture True or 'heads').
    """

    kind: str
    index: int
    module: nnx.Module  # the MultiHeadAttention: its kernel, projections, num_heads
    captured: dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class TermInputs:
    """What every loss term is called with inside the jitted train step."""

    model: nnx.Module
    batch: dict[str, jax.Array]
    layers: tuple[Layer, ...]
    rows: dict[str, tuple[jax.Array, jax.Array]]  # per kind: real query rows [B, T], keys each row sees [B, T, S]
    progress: jax.Array  # the share of training done, step / train.num_steps (a traced scalar)


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What a term's config check may ask about the model, known before anything is built or compiled."""

    kernels: dict[str, Any]  # attention kind -> one tiny instance of the kernel it uses
    depth: int  # the deepest stack's number of layers


class LossTerm:
    """A term of the training loss: ``loss = task loss + sum of the active terms' values``.

    Subclass it in one file of ``attn_lab/objectives/`` and decorate the class with :func:`register_term`.
    ``path`` is its config section (default ``loss.<name>``); the section's defaults are :meth:`default_config`,
    overridable by flag at once (``--config.loss.<name>.weight=0.1``).
    """

    name: str = ""
    path: str = ""  # config section; '' -> 'loss.<name>'
    order: int = 100  # terms are summed in this order (then by name), so a run's loss is reproducible

    def default_config(self) -> ml_collections.ConfigDict:
        """The section's keys and defaults; a ``weight`` of 0 (the usual default) leaves the term off."""
        return ml_collections.ConfigDict({"weight": 0.0})

    def check(self, cfg: Any, facts: ModelFacts) -> None:
        """One-line ValueErrors naming the bad key of the section (run for every registered term, on or off)."""

    def active(self, cfg: Any) -> bool:
        """Whether the term is part of this run's loss."""
        return cfg.weight > 0

    def identity(self, section: dict[str, Any], model_kinds: tuple[str, ...] | None) -> dict[str, Any]:
        """The active section as a run's identity compares it (``section``: flat keys below the section's path;
        ``model_kinds``: the attention kinds of the run's model, None where unknown). A value derived from a
        registry returns here in a form that does not change when the registry grows; by default, as given."""
        return section

    def capture(self, cfg: Any) -> bool | str:
        """What the forward pass must capture for it: True (maps and per-head tensors), 'heads' (per-head values and
        outputs only) or False (nothing)."""
        return False

    def __call__(self, cfg: Any, inputs: TermInputs) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(weighted value added to the loss, {'<name>/<what>': logged scalar})``."""
        raise NotImplementedError


TERMS: dict[str, LossTerm] = {}
plugins.SECTIONS["loss"] = (lambda: [t.path.removeprefix("loss.") for t in TERMS.values()],
                            lambda rest: f"loss term section 'loss.{rest.rpartition('.')[0]}'")


def register_term(cls: type[LossTerm]) -> type[LossTerm]:
    """Class decorator: registers one instance under ``cls.name`` (ValueError on a taken name or section)."""
    term = cls()
    if not term.name or term.name in TERMS:
        raise ValueError(f"loss term {term.name!r}: give it a name no other term has")
    term.path = term.path or f"loss.{term.name}"
    if any(t.path == term.path for t in TERMS.values()):
        raise ValueError(f"loss term {term.name!r}: config section {term.path} belongs to another term")
    TERMS[term.name] = term
    return cls


def unregister_term(name: str) -> None:
    """Removes a term (a test's throwaway one)."""
    TERMS.pop(name, None)


def terms() -> list[LossTerm]:
    """Every registered term, in summation order."""
    return sorted(TERMS.values(), key=lambda t: (t.order, t.name))


def section(config: Any, path: str) -> Any:
    """``config`` at the dotted ``path``."""
    node = config
    for name in path.split("."):
        node = node[name]
    return node


def add_sections(config: ml_collections.ConfigDict) -> None:
    """Puts each registered term's default section at its path in ``config`` (parents created as needed)."""
    for term in terms():
        *parents, leaf = term.path.split(".")
        node = config
        for name in parents:
            if name not in node:
                node[name] = ml_collections.ConfigDict()
            node = node[name]
        node[leaf] = term.default_config()


def check_sections(config: Any, facts: ModelFacts) -> None:
    for term in terms():
        term.check(section(config, term.path), facts)


def configured(config: Any) -> tuple[tuple[LossTerm, Any], ...]:
    """The active terms of ``config`` with their sections, in summation order (what the train step sums)."""
    return tuple((t, section(config, t.path)) for t in terms() if t.active(section(config, t.path)))


def capture_mode(objectives: Iterable[tuple[LossTerm, Any]]) -> bool | str:
    """The most any active term needs captured: True over 'heads' over False."""
    modes = [term.capture(cfg) for term, cfg in objectives]
    return True if True in modes else ("heads" if "heads" in modes else False)


def captured_layers(model: nnx.Module, popped: bool) -> tuple[Layer, ...]:
    """Every attention layer with what it captured, popped from the model (so it never reaches the model state)."""
    out = []
    for kind, index, attn in attention_layers(model):
        captured = ({k: v[0] for k, v in nnx.to_pure_dict(nnx.pop(attn, nnx.Intermediate)).items()} if popped
                    else {})
        out.append(Layer(kind, index, attn, captured))
    return tuple(out)


def total(objectives: tuple[tuple[LossTerm, Any], ...], model: nnx.Module, batch: dict, progress: jax.Array,
          ) -> tuple[jax.Array | float, dict[str, jax.Array]]:
    """(sum of the active terms' values, their logs) after a forward pass with :func:`capture_mode` on."""
    if not objectives:
        return 0.0, {}
    inputs = TermInputs(model, batch, captured_layers(model, bool(capture_mode(objectives))),
                        model.attention_rows(batch), progress)
    value, logs = 0.0, {}
    for term, cfg in objectives:
        term_value, term_logs = term(cfg, inputs)
        value, logs = value + term_value, {**logs, **term_logs}
    return value, logs
