"""Training objectives: the terms a train step adds to the task loss, one file each, registered by name.

``loss = task loss + sum of the active terms' values``. Each term (:class:`LossTerm`) owns its config section --
its defaults (``default_config``), its one-line checks (``check``), whether it is on (``active``), what the forward
pass must capture for it (``capture``: attention maps, per-head values / outputs, or nothing) -- and
``__call__(cfg, inputs) -> (value, logs)``, called inside the jitted train step with the model, the batch, every
attention layer with what it captured, the layers' real rows and the share of training done. Built in:

- ``diversity`` (``loss.diversity``): head-diversity regularizers (Li et al. 2018 and others; diversity.py);
- ``gates`` (``heads.gates``): the L0 head gates' sparsity penalty (Louizos et al.; Voita et al. 2019; gates.py);
- ``span`` (``loss.span``): the penalty of kernels that learn their span (Sukhbaatar et al. 2019; span.py).

A new term is one new file here::

    @register_term
    class Entropy(LossTerm):
        name = "entropy"                                   # section loss.entropy, weight 0 by default: off
        def capture(self, cfg): return True                # needs attention maps
        def __call__(self, cfg, inputs):
            h = sum(entropy(layer.captured["attention_weights"]) for layer in inputs.layers)
            return cfg.weight * h, {"entropy/value": h}

then ``--config.loss.entropy.weight=0.01``. Files here are imported when the package is (below ``train``, above
``models``: imports point down).
"""

import importlib
import pkgutil

from attn_lab.objectives.base import (  # noqa: F401
    TERMS,
    Layer,
    LossTerm,
    ModelFacts,
    TermInputs,
    add_sections,
    capture_mode,
    check_sections,
    configured,
    register_term,
    section,
    terms,
    total,
    unregister_term,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")
