"""Imports only point down: every module under attn_lab, parsed (never imported, so nothing is skipped for being
slow or optional), imports nothing from a higher layer -- at module level or inside a function -- and the top-level
packages import each other without a cycle.

Layers, low to high: the top-level utility modules (attn_lab/*.py, among them the experiment declaration) ->
published (the papers' numbers) -> attention -> data -> models -> objectives -> train -> analysis -> reporting ->
sweep. A module may import its own layer and any lower one, so each layer can be read, tested and forked without
the ones above it. A package's ``__main__`` (its command: ``python -m attn_lab.reporting``)
sits above every layer: it may import any of them, and no module imports it.

The library launches commands as ``python -m attn_lab.<package>``, never a script by path: no string in its code
(docstrings aside) names ``scripts/train.py``, ``scripts/analyze_heads.py`` or ``scripts/make_tables.py``, so an
installed package or one on the path needs no scripts/ folder.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "attn_lab"
# above the utility modules
LAYERS = ("published", "attention", "data", "models", "objectives", "train", "analysis", "reporting", "sweep")


def module_name(path: pathlib.Path) -> str:
    """``attn_lab/train/steps.py`` -> ``attn_lab.train.steps``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def unit(module: str) -> str:
    """The top-level package or utility module a module belongs to: ``attn_lab.train.steps`` -> ``train``,
    ``attn_lab.io`` -> ``io``, ``attn_lab`` -> ``attn_lab`` (the package's own ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer(name: str) -> int:
    """0 for the utility modules (and the package ``__init__``), then the position in LAYERS."""
    return 1 + LAYERS.index(name) if name in LAYERS else 0


def imported(tree: ast.AST, module: str, is_package: bool) -> set[tuple[int, str]]:
    """(line, imported attn_lab module) for every import statement anywhere in ``tree`` (function-local ones too).

    ``from X import name`` counts as importing ``X.name`` when that is a module, else ``X``; relative imports are
    resolved against ``module`` (a package resolves them against itself).
    """
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # '.' is the package itself, '..' its parent
                base = ".".join(filter(None, (package.rsplit(".", node.level - 1)[0], base)))
            out += [(node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base) for a in node.names]
    return {(line, name) for line, name in out if name == "attn_lab" or name.startswith("attn_lab.")}


def is_entry_point(module: str) -> bool:
    """``attn_lab.reporting.__main__``: a command, above every layer."""
    return module.rpartition(".")[2] == "__main__"


def all_imports() -> list[tuple[str, str, str]]:
    """(importing module, ``file:line``, imported module) for every attn_lab import in the package."""
    out = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for line, target in sorted(imported(tree, module, path.name == "__init__.py")):
            out.append((module, f"{path.relative_to(PACKAGE.parent)}:{line}", target))
    return out


def edges() -> list[tuple[str, str, str]]:
    """(importing unit, ``file:line``, imported module) for every attn_lab import between different top-level
    units, entry points (``__main__``) left out: they may import any layer."""
    out = []
    for module, path in MODULES.items():
        if is_entry_point(module):
            continue
        tree = ast.parse(path.read_text(), str(path))
        for line, target in sorted(imported(tree, module, path.name == "__init__.py")):
            if unit(target) != unit(module):
                out.append((unit(module), f"{path.relative_to(PACKAGE.parent)}:{line}", target))
    return out


def test_the_parser_sees_function_local_and_relative_imports():
    source = "def f():\n    from attn_lab.analysis import run\n\nfrom . import steps\nimport attn_lab.io\n"
    got = sorted(imported(ast.parse(source), "attn_lab.train.trainer", False))
    assert got == [(2, "attn_lab.analysis.run"), (4, "attn_lab.train.steps"), (5, "attn_lab.io")]


def test_every_top_level_package_has_a_layer():
    packages = {unit(m) for m, p in MODULES.items() if len(p.relative_to(PACKAGE).parts) > 1}
    assert packages <= set(LAYERS), f"place {sorted(packages - set(LAYERS))} in LAYERS (tests/test_layers.py)"


def test_no_module_imports_a_higher_layer():
    """Also keeps the utility modules (attn_lab/*.py, layer 0) free of every package."""
    upward = [f"{where} imports {target} ({source} -> {unit(target)})" for source, where, target in edges()
              if layer(unit(target)) > layer(source)]
    assert not upward, "imports must only point down:\n" + "\n".join(upward)


def test_no_module_imports_an_entry_point():
    """A package's ``__main__`` defines absl flags when imported: only ``python -m`` (or a console script) loads it."""
    into = [f"{where} imports {target}" for module, where, target in all_imports()
            if is_entry_point(target) and target != module]
    assert not into, "\n".join(into)


def test_no_cycle_between_top_level_packages():
    graph: dict[str, set[str]] = {}
    for source, _, target in edges():
        graph.setdefault(source, set()).add(unit(target))
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a node path that returns to its start, or None (depth-first search)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return None

    return next((c for c in (visit(n, []) for n in sorted(graph)) if c), None)


@pytest.mark.parametrize("graph, cycle", [({"a": {"b"}, "b": {"c"}}, None),
                                          ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"])])
def test_find_cycle(graph, cycle):
    assert find_cycle(graph) == cycle


LAUNCHED_BY_MODULE = ("scripts/train.py", "scripts/analyze_heads.py", "scripts/make_tables.py")


def code_strings(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of ``tree`` but the docstrings (of the module, classes and functions); f-string parts
    included."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def script_paths(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, string) of the code strings naming a script that has a ``python -m`` entry point: as a path
    (``'scripts/train.py'``) or as its file name, as ``os.path.join(root, 'scripts', 'train.py')`` spells it."""
    names = {path.rpartition("/")[2] for path in LAUNCHED_BY_MODULE}
    return [(node.lineno, node.value) for node in code_strings(tree)
            if node.value in names or any(path in node.value for path in LAUNCHED_BY_MODULE)]


def test_the_script_path_check_sees_paths_and_joined_names_but_not_docstrings():
    source = ('"""Run scripts/train.py."""\n'
              'def f(root):\n    """scripts/analyze_heads.py"""\n'
              '    a = [sys.executable, "scripts/train.py"]  # a comment: scripts/make_tables.py\n'
              '    b = os.path.join(root, "scripts", "analyze_heads.py")\n'
              '    c = f"{root}/scripts/make_tables.py"\n'
              '    return [sys.executable, "-m", "attn_lab.analysis"]\n')
    assert script_paths(ast.parse(source)) == [(4, "scripts/train.py"), (5, "analyze_heads.py"),
                                               (6, "/scripts/make_tables.py")]


def test_no_module_launches_a_script_by_path():
    """Trials, the analysis and the tables run as ``python -m attn_lab.<package>`` (the same code wherever the
    package is installed), so the library never names the wrapper scripts outside its docstrings."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text!r}" for path in MODULES.values()
             for line, text in script_paths(ast.parse(path.read_text(), str(path)))]
    assert not found, "launch python -m attn_lab.<package> instead:\n" + "\n".join(found)
