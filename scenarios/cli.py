"""The ``trainsim`` command line: one sub-command per module, argparse only.

Each sub-command lives in its own module exposing ``register(subparsers)``, which adds its parser and
sets ``func`` (called with the parsed arguments, returning an exit status). Errors a user can fix --
bad input, missing files, impossible configurations -- are reported as one line on stderr with exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

COMMANDS = ("run", "sweep", "validate", "list", "nccl_tests", "synth", "search", "calibrate", "compare")
"""Sub-command modules, ``scenarios.cmd_<name>``."""


class UserError(Exception):
    """An error caused by the user's input, printed as one line."""


def one_line(message: object) -> str:
    """``message`` as one line: newlines and other control characters (from a section name, a file
    name, a user's exception) are shown escaped, as Python writes them."""
    text = str(message)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def add_trust_code(parser: argparse.ArgumentParser) -> None:
    """``--trust-code``: let a scenario file's ``[model] factory`` run (:mod:`scenarios.user_code`)."""
    parser.add_argument("--trust-code", action="store_true",
                        help="let the scenario's [model] factory import a module or run a Python file (scenario "
                             "files are data otherwise; also TRAINSIM_TRUST_CODE=1; the shipped catalog is trusted)")


def output_file(option: str, value: str) -> Path:
    """An output file path, checked before any work: its folder must exist (a typo must not become a
    new tree of folders), and it must not name a folder.

    Raises:
        UserError: one line naming the option and the missing folder.
    """
    path = Path(value)
    if value.endswith(("/", "\\")) or path.is_dir():
        raise UserError(f"{option} {value}: is a directory; give a file name")
    if not path.parent.is_dir():
        raise UserError(f"{option} {value}: directory {path.parent} does not exist (create it first)")
    return path


def output_dir(option: str, value: str) -> Path:
    """An output folder: created when missing if its parent exists (as ``mkdir``); missing parents are
    created only when the path ends in ``/`` (as ``mkdir -p``).

    Raises:
        UserError: one line naming the option and the missing parent, or a file in the way.
    """
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {value}: is a file, not a directory")
    if not path.exists() and not value.endswith(("/", "\\")) and not path.parent.is_dir():
        raise UserError(f"{option} {value}: directory {path.parent} does not exist (create it, or end the "
                        f"path with / to create every missing folder)")
    return path


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse with the project's one-line errors: ``trainsim run: error: ...`` and exit 2, without the
    usage block argparse prints first (``--help`` shows it)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="trainsim",
        description="Simulate one training iteration of a PyTorch model with a parallel strategy on a "
                    "GPU cluster, on a contended hardware model (GPUs, NVLink/NVSwitch, PCIe, NICs, "
                    "InfiniBand).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"scenarios.cmd_{name}")
        except ModuleNotFoundError as exc:  # a command module not shipped in this build
            if exc.name != f"scenarios.cmd_{name}":
                raise
            continue
        mod.register(sub)
    for p in sub.choices.values():  # module docstrings double as help: drop their reST markup
        if p.description:
            p.description = plain_text(p.description)
        if not any("--calibration" in a.option_strings for a in p._actions):
            p.add_argument("--calibration", metavar="PROFILE", default=None,
                           help="apply a calibration profile (written by `trainsim calibrate`) on top of the "
                                "shipped calibration.toml; overrides a scenario's [simulation] calibration")
    return parser


def _profile(args: argparse.Namespace):
    """The ``--calibration`` profile of a command line, loaded (``None`` if not given)."""
    path = getattr(args, "calibration", None)
    if not path:
        return None
    from hwmodel.calibration_overlay import load_overlay

    try:
        return load_overlay(path)
    except ValueError as exc:
        raise UserError(f"--calibration: {exc}") from None


def plain_text(doc: str) -> str:
    """reST inline markup to plain text: ``x`` -> x, :func:`a.b` -> a.b, *x* -> x."""
    doc = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    doc = doc.replace("``", "")
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"\1", doc)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        from hwmodel.calibration_overlay import applied

        with applied(_profile(args)):
            return int(args.func(args) or 0)
    except (UserError, ValueError, KeyError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"trainsim {args.command}: error: {one_line(msg)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `trainsim list | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # python -m scenarios.cli: use the importable module, whose UserError commands raise
    from scenarios.cli import main as _main

    sys.exit(_main())
