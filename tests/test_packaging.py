"""Every package the project's code imports is declared in setup.py (a forgotten one fails for a new user only).

Dependencies that forget their own dependencies (tensorflow-datasets needing importlib_resources) are caught by
.ci/run, which installs into a brand-new environment and prepares a dataset; this test catches our own imports.
"""

import ast
import importlib.metadata
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = ("attn_lab", "scripts", "configs", "experiments")


def _imported_top_level_modules() -> set[str]:
    """Top-level module names imported anywhere in the project's code (tests excluded: pytest is a test extra)."""
    names = set()
    for folder in CODE:
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    tree = ast.parse(open(os.path.join(dirpath, name)).read())
                    for node in ast.walk(tree):
                        if isinstance(node, ast.Import):
                            names |= {a.name.split(".")[0] for a in node.names}
                        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                            names.add(node.module.split(".")[0])
    return names


def _declared_distributions() -> set[str]:
    """Distribution names in setup.py's install_requires and extras, normalized (PEP 503)."""
    text = open(os.path.join(ROOT, "setup.py")).read()
    requirements = re.findall(r"""["']([A-Za-z0-9_.\-]+)\s*(?:[<>=!~;\[]|["'])""", text)
    return {re.sub(r"[-_.]+", "-", r).lower() for r in requirements}


def test_every_imported_third_party_package_is_declared():
    local = {"attn_lab", "test_trainer"} | set(sys.stdlib_module_names)
    to_dist = importlib.metadata.packages_distributions()
    declared = _declared_distributions()
    missing = {}
    for module in sorted(_imported_top_level_modules() - local):
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in to_dist.get(module, [module])}
        if not dists & declared:
            missing[module] = sorted(dists)
    assert not missing, f"imported but not declared in setup.py: {missing}"


def test_setup_declares_what_tensorflow_datasets_forgets():
    assert "importlib-resources" in _declared_distributions()


def test_console_scripts_name_the_package_entry_points():
    """``attn-train`` / ``attn-sweep`` (setup.py) call the ``run`` of ``python -m attn_lab.train`` / ``attn_lab.sweep``
    (checked from the source: importing both would define their absl flags twice in this process)."""
    text = open(os.path.join(ROOT, "setup.py")).read()
    scripts = dict(re.findall(r'"(attn-\w+) = ([\w.]+:\w+)"', text))
    assert scripts == {"attn-train": "attn_lab.train.__main__:run", "attn-sweep": "attn_lab.sweep.__main__:run",
                       "attn-analyze": "attn_lab.analysis.__main__:run",
                       "attn-tables": "attn_lab.reporting.__main__:run"}
    for target in scripts.values():
        module, function = target.split(":")
        source = os.path.join(ROOT, *module.split(".")) + ".py"
        assert function in {n.name for n in ast.parse(open(source).read()).body if isinstance(n, ast.FunctionDef)}


def test_every_source_folder_is_a_package_find_packages_ships():
    """A folder of modules without ``__init__.py`` works in an editable install and vanishes from a wheel."""
    from setuptools import find_packages

    shipped = set(find_packages(ROOT, include=["attn_lab", "attn_lab.*"]))
    folders = {os.path.relpath(d, ROOT).replace(os.sep, ".") for d, _, files in os.walk(os.path.join(ROOT, "attn_lab"))
               if any(f.endswith(".py") for f in files)}
    assert folders <= shipped, sorted(folders - shipped)
