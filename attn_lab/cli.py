"""The one command-line convention of the scripts and entry points: absl flags (ml_collections config flags where a
config is taken), parsed by :func:`parse_flags` so that any bad flag is one ``error: ...`` line, never a traceback.

Lists are absl list flags written comma-separated (``--seeds 0,1,2``), parsed once by absl
(:func:`DEFINE_integer_list` for integers).
"""

from __future__ import annotations

import ast
import os
import re
import sys
from typing import Callable

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from attn_lab import plugins, signals
from attn_lab.checks import call_user_function, load_user_module
from attn_lab.diskfull import disk_full, disk_full_line, quiet_full_disk, stop_for_full_disk

flags.disclaim_key_flags()  # a flag defined through this module belongs to its caller (shown by its --help)
flags.DEFINE_string("plugins", None, "Comma-separated modules or .py files imported first: your own kernels, model "
                    "kinds, objectives, tasks and analyses (also ATTN_LAB_PLUGINS and the 'attn_lab.plugins' "
                    "entry-point group; see attn_lab/plugins.py).")

# absl's and ml_collections' reasons for a value that does not parse -> what the key takes
_REASONS = (("invalid literal for int()", "expected an integer"),
            ("could not convert string to float", "expected a number"),
            ("Non-boolean argument", "expected true or false"))


def _override_path(argv: list[str], missing: str) -> str:
    """The ``--config.a.b=`` override whose path contains the missing key (for the error line)."""
    for arg in argv:
        match = re.match(r"--(config\.[\w.]+)", arg)
        if match and missing in match.group(1).split("."):
            return match.group(1)
    return missing


def _unknown_key(argv: list[str], error: Exception) -> str:
    """ml_collections' KeyError (``'x'`` then ``Did you mean "y" instead of "x"?``, possibly quoted again as a repr)
    or AttributeError (a sub-key of a value) -> one line with the override's path and the suggestion as a path."""
    text = str(error.args[0]) if error.args else str(error)
    while len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":  # repr()s of the message, nested
        try:
            text = str(ast.literal_eval(text))
        except (ValueError, SyntaxError):
            break
    lookup = re.search(r"Attempting to lookup: ([\w.]+)", text)
    if lookup:  # --config.model.num_heads.x: num_heads is a value, not a group of keys
        parent = lookup.group(1).rsplit(".", 1)[0]
        return f"unknown config key 'config.{lookup.group(1)}' (config.{parent} is a value, it has no keys)"
    missing = text.splitlines()[0].strip().strip("\"'") if text.strip() else ""
    path = _override_path(argv, missing)
    message = f"unknown config key '{path}'"
    from attn_lab.plugins import unregistered  # a plugin's key: say which plugin is not loaded

    hint = unregistered(path)
    if hint:
        return f"{message}: {hint}"
    suggestion = re.search(r'Did you mean "([^"]+)"', text)
    if suggestion and missing in path.split("."):
        parts = path.split(".")
        parts[parts.index(missing)] = suggestion.group(1)
        message += f"; did you mean '{'.'.join(parts)}'?"
    return message


def _flag_error(error: flags.Error) -> str:
    """absl's flag error as one line: a config file's own exception (e.g. an unknown preset) by its message, a value
    that does not parse as ``--key=value: expected <type>``."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if "Error whilst parsing config file" in str(error):
        flag = re.match(r"flag (--\S+?): ", lines[0])
        cause = re.sub(r"^\w+(Error|Exception): ", "", lines[-1])
        return f"{flag.group(1) if flag else '--config'}: {cause}"
    first = re.sub(r"^flag ", "", lines[0]) if lines else str(error)
    required = re.match(r"(--[\w-]+)=None: Flag", first)
    if required:  # absl's message for a required flag left out
        return f"{required.group(1)} is required"
    unknown = re.match(r"Unknown command line flag '([^']+)'", first)
    if unknown:
        return f"unknown flag --{unknown.group(1)}; see --help for the flags this command takes"
    for reason, allowed in _REASONS:
        if reason in first:
            return f"{first.split(': ', 1)[0]}: {allowed}"
    return first


def _check_config_file(argv: list[str]) -> None:
    """``--config FILE[:preset]`` given once, naming an existing file (ml_collections defers a missing file's error
    to the first use of the config, as a 50-line traceback)."""
    values = [a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
              for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")]
    if len(values) > 1:
        sys.exit(f"error: --config given {len(values)} times: {', '.join(values)}")
    path, _, preset = values[0].partition(":") if values else (None, "", "")
    if path is None:
        return
    if not os.path.exists(path):
        sys.exit(f"error: --config={values[0]}: no such config file '{path}'")
    try:  # loaded once here too, so a syntax error or a NameError in it is its file and line, not a traceback
        module = load_user_module(path, "_attn_lab_config_check")
        call_user_function(path, module, "get_config", *([preset] if preset else []))
    except ValueError as e:
        sys.exit(f"error: --config={values[0]}: {e}")


HELP = {"--help": True, "-h": True, "-?": True, "--helpshort": True, "--helpfull": False}


def _help(argv: list[str]) -> None:
    """``--help`` (``-h``, ``--helpshort``; ``--helpfull`` for every library's flags too): the command's usage and
    its flags on stdout, exit status 0 (absl's own help flag exits 1), before any config file is loaded."""
    asked = [HELP[a] for a in argv if a in HELP]
    if asked:
        app.usage(shorthelp=all(asked), writeto_stdout=True)
        sys.exit(0)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flags parser for ``app.run(..., flags_parser=parse_flags)``.

    ml_collections reports an unknown ``--config.x.y`` key with a three-exception traceback, a missing config file
    only when the config is first used, and a config file's own error (an unknown preset) with its traceback; this
    turns those, and any other flag error, into ``error: ...`` on one line and a nonzero exit, before anything is built
    or compiled. Plugins (:func:`attn_lab.plugins.load_all`) are imported first: a config's defaults come from the
    registries they add to.
    """
    try:
        plugins.load_all(argv[1:])
    except ValueError as e:
        sys.exit(f"error: {e}")
    _help(argv[1:])
    _check_config_file(argv[1:])
    try:
        return flags.FLAGS(argv)
    except (KeyError, AttributeError) as e:
        sys.exit(f"error: {_unknown_key(argv, e)}")
    except flags.Error as e:
        sys.exit(f"error: {_flag_error(e)}")


def main_args(argv: list[str]) -> None:
    """Stops with one line when positional arguments are left after the flags (every command takes flags only)."""
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {argv[1:]}; every argument is a --flag")


class _IntListParser(flags.ListParser):
    """``'0,1,2'`` -> ``[0, 1, 2]``; anything else is a flag error (one line through :func:`parse_flags`)."""

    def parse(self, argument):
        items = super().parse(argument)
        if isinstance(argument, str) and not items:
            raise ValueError("give at least one integer, e.g. 0,1,2")
        try:
            return [int(item) for item in items]
        except (TypeError, ValueError):
            raise ValueError("give comma-separated integers, e.g. 0,1,2") from None

    def flag_type(self) -> str:
        return "comma separated list of integers"


def DEFINE_integer_list(name: str, default: list[int] | None, help: str) -> flags.FlagHolder:  # noqa: N802 (absl)
    """An absl list flag of integers, written ``--name 0,1,2`` (absl has list flags of strings only)."""
    return flags.DEFINE(_IntListParser(), name, default, help, serializer=flags.CsvListSerializer(","))


def split_config_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without its ``--config.key=value`` flags, those flags): for a command that passes them on to a config
    it does not load itself (the sweep's trials), checked later against that config by
    :func:`check_config_overrides`."""
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    for flag in overrides:
        if "=" not in flag:
            sys.exit(f"error: {flag}: give the override as --config.key=value (with '=')")
    return [a for a in argv if a not in overrides], overrides


def check_config_overrides(config, overrides: list[str]) -> None:
    """Applies ``--config.key=value`` flags to ``config`` (a ConfigDict, changed in place) exactly as a config flag
    would: an unknown key or a value of the wrong type stops with one line, before anything runs."""
    argv = ["overrides", *overrides]
    try:
        holder = flags.FlagValues()  # ml_collections reads the overrides from sys_argv as the flag is defined
        config_flags.DEFINE_config_dict("config", config, flag_values=holder, sys_argv=argv)
        holder(argv)
    except (KeyError, AttributeError) as e:
        sys.exit(f"error: {_unknown_key(argv, e)}")
    except flags.Error as e:
        sys.exit(f"error: {_flag_error(e)}")


def run_entry_point(main: Callable[[list[str]], int | None], module: str,
                    flags_parser: Callable[[list[str]], list[str]] = parse_flags) -> None:
    """``app.run(main)`` for an entry point whose flags ``module`` defines: absl's ``--help`` lists the flags of
    ``sys.argv[0]``, which is another file when a console script (``attn-train``) imports the module."""
    for flag in flags.FLAGS.get_key_flags_for_module(module):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    signals.install()
    quiet_full_disk()

    def quiet_main(argv: list[str]) -> int | None:
        quiet_libraries()
        return main(argv)
    try:
        app.run(quiet_main, flags_parser=flags_parser)
    except signals.Interrupted as e:
        print(f"stopped by {e}; what was written before is intact, and the same command resumes", file=sys.stderr)
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 (only a full disk, wrapped by whichever library hit it, is handled)
        full = disk_full(e)
        if full is None:
            raise
        stop_for_full_disk(disk_full_line(full))


def quiet_libraries() -> None:
    """A command shows its own lines only: the libraries' logging (orbax's checkpoint INFO, TFDS and absl warnings,
    jax's backend probing, matplotlib's font cache) goes through absl's handler on the root logger, set to ERROR
    here unless ``-v N`` / ``--verbosity=N`` was given (absl's own flag: ``-v 0`` shows INFO, ``-v -1`` warnings)."""
    if not flags.FLAGS["verbosity"].present:
        absl_logging.set_verbosity(absl_logging.ERROR)
