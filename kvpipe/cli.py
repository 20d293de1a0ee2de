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

COMMANDS = ("simulate", "bench", "sweep", "plan", "plot", "calibrate", "validate", "run", "report")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvpipe", description="Predict and prove pipelined host->device KV-cache delivery.")
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
