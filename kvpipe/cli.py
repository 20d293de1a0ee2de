"""The ``kvpipe`` command line: thin entry points over the library.

Each command lives in its own module under ``kvpipe/commands`` with
``register(subparsers)`` and ``run(args) -> int``; this file only dispatches.
Bad input anywhere becomes one line on stderr and exit code 2, never a
traceback; a bug is one line and exit code 1, its traceback behind
``--debug``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from backends.files import clear_inputs
from kvpipe.commands.paths import check_paths
from sim.errors import InputError as UsageError

COMMANDS = ("simulate", "bench", "sweep", "plan", "plot", "calibrate", "validate", "run", "report", "schedules")


class _Parser(argparse.ArgumentParser):
    """argparse with bad input as UsageError and no prefix matching: a flag is taken only as written (``--tok 2`` is
    not ``--tokens 2``, and ``-t 8`` -- llama.cpp's threads -- is not ``-ts 8``, the tensor split)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        # Python < 3.12 matches single-dash prefixes even with allow_abbrev=False; keep only a one-letter flag glued
        # to its value (``-c8`` is ``-c 8``).
        return [t for t in super()._get_option_tuples(option_string) if t[1] == option_string[:2]]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvpipe", description="Predict and prove pipelined host->device KV-cache delivery.")
    parser.add_argument("--version", action="version", version=f"kvpipe {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"kvpipe.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"kvpipe.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def version() -> str:
    """kvpipe's version: the installed distribution's, else the source tree's pyproject.toml. Does not block."""
    from importlib import metadata

    try:
        return metadata.version("kvpipe")
    except metadata.PackageNotFoundError:
        import re
        from pathlib import Path

        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
        found = re.search(r'^version = "([^"]+)"', text, re.M)
        return found[1] if found else "unknown"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so every cleanup path (worker pools, partial reports) runs."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated


def one_line(message: str) -> str:
    """A message as one line: any line break a value brought in (a file name, a library's text) written as ``\\n``."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        parser = build_parser()
        if not argv:
            argv = ["simulate"]
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        clear_inputs()
        check_paths(args)
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"kvpipe: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except Terminated:
        print("kvpipe: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("kvpipe: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (``kvpipe plan | head``): stop quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush of stdout must not raise again
        return 141
    except Exception as exc:  # a bug, not bad input: one line, the traceback behind --debug
        if debug:
            raise
        print(f"kvpipe: internal error: {type(exc).__name__}: {one_line(str(exc))} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
