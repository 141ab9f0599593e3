"""The methods of the head analysis (``python -m attn_lab.analysis --what ...``), one module each in this package.

A module registers its method with :func:`register_method` and defines, at import, the absl flags it alone reads
(so ``--help`` lists them); the flags several methods read (``--workdir``, ``--split``, ``--max-batches``,
``--metric``) are the command's, handed over in ``ctx.flags``. :func:`methods` imports every module of this package
(helpers are named ``_*``) the first time it is called, so a forker adds a method with one new file::

    # attn_lab/analysis/methods/top_heads.py
    from absl import flags

    from attn_lab.analysis.methods import register_method

    _COUNT = flags.DEFINE_integer("top-count", 3, "top_heads: how many heads to list per kind.", lower_bound=1)


    @register_method("top_heads")  # order=...: its place in --what (default: after the built-ins); trains=True: opt-in
    def top_heads(ctx):
        \"\"\"The most important heads of each kind (what ``--help`` and the registry show).\"\"\"
        imp = ctx.head_importance(normalize=True)  # {kind: [L, N]}
        top = {k: v.ravel().argsort()[::-1][: _COUNT.value].tolist() for k, v in imp.items()}
        ctx.output("top_heads", top, grids=imp, title="normalized importance")  # JSON, PNG, W&B summary

``--what`` accepts every registered name (a method registered later, e.g. by a test, included) and runs the ones
it names in the order given; its default is every method found here that trains nothing (``trains=False``), in
``order``: a method that trains derived runs (``gates``) takes longer than the run itself and runs only when named.
Each method ends with one labelled summary line (what it measured, in words and numbers), e.g.
``print(f"top_heads: {summary}")``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from attn_lab.analysis.context import AnalysisContext

Run = Callable[["AnalysisContext"], None]


@dataclasses.dataclass(frozen=True)
class Method:
    """A registered analysis method: ``run(ctx)`` writes ``<workdir>/analysis/<name>.json`` (and plots)."""

    name: str
    run: Run
    order: float  # where it runs in the default --what
    doc: str  # the function's docstring
    module: str  # where it is defined (its flags are that module's)
    trains: bool = False  # it trains derived runs: opt-in (never in the default --what)


_REGISTRY: dict[str, Method] = {}
_discovered = False


def register_method(name: str, *, order: float = 100.0, trains: bool = False) -> Callable[[Run], Run]:
    """Decorator: registers ``run(ctx)`` as the method ``--what=<name>``, placed by ``order`` in ``--what`` (the
    built-ins take 10 to 60, so the default order puts a new method after them); ``trains``: it trains derived runs,
    so it is left out of the default ``--what`` and runs only when named. A name taken twice is a ValueError."""
    def register(run: Run) -> Run:
        if name in _REGISTRY:
            raise ValueError(f"analysis method {name!r} is registered twice ({_REGISTRY[name].module} and "
                             f"{run.__module__})")
        _REGISTRY[name] = Method(name, run, order, inspect.getdoc(run) or "", run.__module__, trains)
        return run
    return register


def _discover() -> None:
    """Imports every module of this package once (each registers its method and defines its flags)."""
    global _discovered
    if _discovered:
        return
    _discovered = True  # before the imports: a module that asks for methods() while loading does not recurse
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def methods() -> tuple[Method, ...]:
    """Every registered method, in ``order`` (ties by name)."""
    _discover()
    return tuple(sorted(_REGISTRY.values(), key=lambda m: (m.order, m.name)))


def names() -> tuple[str, ...]:
    return tuple(m.name for m in methods())


def default_names() -> tuple[str, ...]:
    """The default ``--what``: every method that trains nothing, in ``order``."""
    return tuple(m.name for m in methods() if not m.trains)


def get(name: str) -> Method:
    _discover()
    return _REGISTRY[name]
