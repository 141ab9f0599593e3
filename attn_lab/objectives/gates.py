"""The L0 head gates' sparsity term (Louizos et al. 2018; Voita et al. 2019), section ``heads.gates``.

The gates themselves live in the model (:mod:`attn_lab.models.gates`: sampled in training, binarized at test time);
this term adds their penalty -- ``l0 x E[open gates]``, or the dual-ascent constraint towards a ``target`` share
of heads kept -- to the loss, and owns the section's defaults and checks. The section also tells the model to build
gates and the optimizer to give their ``log_alpha`` plain Adam at ``lr`` (attn_lab/train/steps.py).
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
from ml_collections import config_dict

from attn_lab.checks import BOOL, NON_NEGATIVE, POSITIVE, Rule, check_values
from attn_lab.objectives.base import LossTerm, ModelFacts, TermInputs, register_term

RULES = {"enabled": BOOL, "l0": NON_NEGATIVE, "dual_lr": POSITIVE, "lr": POSITIVE, "init": Rule(float),
         "target": Rule(float, "in (0, 1] (the share of heads to keep)", lambda v: 0 < v <= 1, True),
         "anneal": Rule(float, "in [0, 1] (a share of train.num_steps)", lambda v: 0 <= v <= 1)}


@register_term
class Gates(LossTerm):
    """``l0``: penalty weight on the expected number of open gates; ``target``: keep this share of heads instead
    (Wang et al. 2020), reached over the first ``anneal`` of training with multipliers moved at ``dual_lr``;
    ``init``: the gates' initial ``log_alpha`` (3: open); ``lr``: their Adam learning rate."""

    name, path, order = "gates", "heads.gates", 20

    def default_config(self) -> ml_collections.ConfigDict:
        return ml_collections.ConfigDict({"enabled": False, "l0": 0.0, "target": config_dict.placeholder(float),
                                          "dual_lr": 0.3, "init": 3.0, "lr": 0.05, "anneal": 0.5})

    def check(self, cfg: Any, facts: ModelFacts) -> None:
        check_values(self.path, cfg, RULES)
        if (cfg.l0 > 0 or cfg.target is not None) and not cfg.enabled:
            raise ValueError("heads.gates.l0 / heads.gates.target need heads.gates.enabled=True")

    def active(self, cfg: Any) -> bool:
        return cfg.enabled

    def __call__(self, cfg: Any, inputs: TermInputs) -> tuple[jax.Array, dict[str, jax.Array]]:
        gates = getattr(inputs.model, "gates", None)  # a model built without the section has none
        return (0.0, {}) if gates is None else gates.penalty(cfg, inputs.progress)
