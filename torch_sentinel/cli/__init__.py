"""The ``torch-sentinel`` command line. Each subcommand lives in its own module here and
exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking
the parsed args and returning an exit code."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from typing import Optional

__all__ = ["main"]

#: Subcommand modules, in the order ``--help`` lists them. A module missing here is skipped.
SUBCOMMANDS = ("demo", "report", "diff", "replay", "precision")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torch-sentinel",
        description="Find training faults early in a PyTorch loop, and say where they start.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit, where a closed pipe could not be caught
    except BrokenPipeError:
        return _reader_went_away()
    return code


def _reader_went_away() -> int:
    """The reader of stdout closed it (``torch-sentinel report RUN | head``): stop quietly.

    stdout is pointed at /dev/null so that the interpreter's last flush at exit does not fail
    again (the recipe in Python's ``signal`` docs). The exit status is a shell's for a process
    ended by SIGPIPE, as ``cat`` or ``git log`` give.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + int(getattr(signal, "SIGPIPE", 13))
