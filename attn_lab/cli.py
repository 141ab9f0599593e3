"""Command-line helpers shared by the scripts: one clear line for a bad flag instead of a traceback."""

from __future__ import annotations

import re
import sys

from absl import flags


def _override_path(argv: list[str], missing: str) -> str:
    """The ``--config.a.b=`` override whose path contains the missing key (for the error line)."""
    for arg in argv:
        match = re.match(r"--(config\.[\w.]+)", arg)
        if match and missing in match.group(1).split("."):
            return match.group(1)
    return missing


def parse_flags(argv: list[str]) -> list[str]:
    """absl flags parser for ``app.run(..., flags_parser=parse_flags)``.

    ml_collections reports an unknown ``--config.x.y`` key with a three-exception traceback; this turns it, and any
    other flag error, into ``error: ...`` on one line and exit code 2, before anything is built or compiled.
    """
    try:
        return flags.FLAGS(argv)
    except (KeyError, AttributeError) as e:
        missing = str(e).strip("\"'")
        sys.exit(f"error: unknown config key '{_override_path(argv, missing)}'")
    except flags.Error as e:
        sys.exit(f"error: {e}")
