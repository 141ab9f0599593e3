"""The one Markdown table formatter: every table the project prints or writes (sweep summaries, paper tables,
benchmarks, device reports) goes through it, so they all look alike and escape cells the same way."""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def cell(value: Any) -> str:
    """A table cell: floats to 4 significant digits, None as an en dash, anything else as ``str``."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """``| a | b |`` / ``|---|---|`` / one line per row (no trailing newline); a ``|`` inside a cell is escaped."""
    fmt = lambda values: "| " + " | ".join(cell(v).replace("|", "\\|") for v in values) + " |"
    return "\n".join([fmt(header), "|" + "---|" * len(header), *map(fmt, rows)])
