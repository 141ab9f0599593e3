"""The published numbers are declared once (attn_lab/published/) and docs/published.md shows each of them: every
decimal number a module declares -- in its constants and in the texts the findings quote -- is on that page, so
the page checked against the papers and the tables that print them cannot drift apart."""

import ast
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = sorted(p for p in glob.glob(os.path.join(ROOT, "attn_lab", "published", "*.py"))
                 if not p.endswith("__init__.py"))
PAGE = open(os.path.join(ROOT, "docs", "published.md")).read()
NOT_PUBLISHED = {0.6}  # a setting (vaswani.BEAM's length penalty), on the page as "length penalty 0.6"


def _numbers(path: str) -> list[str]:
    """The decimal numbers a module declares: float constants, and decimals inside its string constants (not the
    docstring, which names arXiv ids)."""
    tree = ast.parse(open(path).read())
    doc = ast.get_docstring(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, float):
            out.append(repr(abs(node.value)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value != doc:
            out += re.findall(r"(?<![\w.])\d+\.\d+", re.sub(r"arXiv \d+\.\d+", "", node.value))
    return out


@pytest.mark.parametrize("path", MODULES, ids=os.path.basename)
def test_every_declared_published_number_is_on_the_published_page(path):
    name = os.path.basename(path)[:-3]
    assert f"`{name}." in PAGE, f"docs/published.md names no constant of attn_lab/published/{name}.py"
    for number in _numbers(path):
        whole, _, frac = number.partition(".")
        pattern = rf"(?<![\d.]){whole}\.{frac.rstrip('0') or '0'}0*(?!\d)"  # 5.0 is written 5.00
        assert re.search(pattern, PAGE) or float(number) in NOT_PUBLISHED, f"{name}: {number} not on the page"
