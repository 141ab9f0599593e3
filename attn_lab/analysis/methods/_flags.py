"""absl list flags of the analysis written comma-separated, whose bad values are one-line flag errors (through
:func:`attn_lab.cli.parse_flags`): a list of names from a set (``--what``, ``--prune-orders``) and a list of shares
(``--gate-targets``). A helper, not a method (its name starts with ``_``)."""

from __future__ import annotations

from typing import Callable

from absl import flags

flags.disclaim_key_flags()  # a flag defined through list_flag belongs to its caller (shown by its --help)


class ChoicesListParser(flags.ListParser):
    """``'a,b'`` -> ``['a', 'b']``, each member one of ``choices()`` (absl's multi-enum, written comma-separated).

    ``choices`` is called at each parse, not at definition: ``--what`` accepts a method registered after its flag
    was defined (by a test, or a plugin imported later)."""

    def __init__(self, choices: Callable[[], tuple[str, ...]]):
        super().__init__()
        self.choices = choices

    def parse(self, argument):
        choices = self.choices()
        items = [item.strip() for item in super().parse(argument)]
        if not [item for item in items if item]:
            raise ValueError(f"give at least one of {', '.join(choices)}")
        bad = [item for item in items if item not in choices]
        if bad:
            verb = "is" if len(bad) == 1 else "are"
            raise ValueError(f"{', '.join(repr(b) for b in bad)} {verb} not one of {', '.join(choices)}")
        return list(dict.fromkeys(items))  # a name given twice counts once

    def flag_type(self) -> str:
        return f"comma separated list of {'|'.join(self.choices())}"


class ShareListParser(flags.ListParser):
    """``'0.5,0.25'`` -> ``[0.5, 0.25]``, each a share in (0, 1]; anything else is a flag error (one line)."""

    def parse(self, argument):
        items = super().parse(argument)
        try:
            shares = [float(item) for item in items]
        except (TypeError, ValueError):
            raise ValueError("give comma-separated numbers in (0, 1], e.g. 0.5,0.25") from None
        if not shares:
            raise ValueError("give at least one number in (0, 1], e.g. 0.5,0.25")
        bad = [s for s in shares if not 0 < s <= 1]
        if bad:
            raise ValueError(f"each must be in (0, 1] (a share of the heads to keep), got {bad[0]:g}")
        return shares

    def flag_type(self) -> str:
        return "comma separated list of numbers in (0, 1]"


def list_flag(parser: flags.ListParser, name: str, default: str, help: str) -> flags.FlagHolder:
    """An absl list flag with ``parser``, written and shown comma-separated."""
    return flags.DEFINE(parser, name, default, help, serializer=flags.CsvListSerializer(","))
