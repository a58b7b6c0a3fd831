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

COMMANDS = ("run", "sweep", "validate", "list", "nccl_tests", "synth", "search")
"""Sub-command modules, ``scenarios.cmd_<name>``."""


class UserError(Exception):
    """An error caused by the user's input, printed as one line."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainsim",
        description="Simulate one training iteration of a PyTorch model with a parallel strategy on a "
                    "GPU cluster, on a contended hardware model (GPUs, NVLink/NVSwitch, PCIe, NICs, "
                    "InfiniBand).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
    return parser


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
        return int(args.func(args) or 0)
    except (UserError, ValueError, KeyError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"trainsim {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `trainsim list | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
