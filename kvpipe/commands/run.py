"""``kvpipe run STUDY.toml``: run the commands a study file stands for.

``kvpipe/study.py`` turns the study into ``kvpipe`` command lines; each is
parsed by the command's own parser (``kvpipe.cli.build_parser``) and, for the
grid commands, expanded by the same ``points_from_args`` they call, all before
anything runs, so a bad value is the flag's own one-line message (prefixed with
the study file and table) and nothing is written. Then each command's ``run``
runs in turn; a table's ``out`` file receives that command's standard output
through ``sim.safe_write.write_output`` once the command has finished (a
command that fails writes nothing there). The first command that returns
non-zero stops the study with its exit code, and its line names the files the
tables before it wrote ("kept from the tables before it: ..."): a study is
not all-or-nothing, since a table may read what an earlier one wrote. ``--dry-run`` prints the
equivalent command lines instead; ``--print-example`` prints a commented study.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Iterator
from typing import Any

from backends.files import plain
from kvpipe import study
from kvpipe.cli import build_parser
from kvpipe.commands.args import UsageError, points_from_args
from kvpipe.commands.paths import check_paths
from sim.safe_write import check_output, distinct_outputs, write_output

GRID_COMMANDS = ("simulate", "sweep", "plot")  # the commands whose grid flags points_from_args expands


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run a study file (TOML): a grid and the outputs to make from it")
    p.add_argument("study", nargs="?", metavar="STUDY.toml", help="the study file (relative paths in it are from its folder)")
    p.add_argument("--dry-run", action="store_true", help="print the equivalent kvpipe command lines, check every value, run nothing")
    p.add_argument("--print-example", action="store_true", help="write a commented example study to standard output")
    p.set_defaults(func=run)


@contextlib.contextmanager
def _about(where: str, task: study.Task) -> Iterator[None]:
    """A command's bad-input line, said of the study file and table it came from."""
    try:
        yield
    except UsageError as exc:
        raise UsageError(f"{plain(where)} [{task.section}]: {exc}") from None


def checked(task: study.Task, where: str, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The task's arguments through its command's parser (and grid), its outputs checked against every input (the
    study file included). Raises UsageError. Does not block."""
    with _about(where, task):
        args = parser.parse_args(list(task.argv))
        check_paths(args)
        check_output(task.out)
        if task.section in GRID_COMMANDS:
            points_from_args(args)
    return args


@contextlib.contextmanager
def _about_study(where: str) -> Iterator[None]:
    try:
        yield
    except UsageError as exc:
        raise UsageError(f"{plain(where)}: {exc}") from None


def outputs_of(task: study.Task, args: argparse.Namespace) -> list[str]:
    """The files and folders a task writes: its standard output's file, and its --out / --csv / --trace."""
    named = [getattr(args, flag, None) for flag in ("out", "csv", "trace")]
    return [p for p in [task.out, *named] if isinstance(p, str) and p and p != "-"]


def execute(task: study.Task, args: argparse.Namespace) -> int:
    """Run the command; its standard output goes to ``task.out``. Returns its exit code. Blocks while it runs."""
    if task.out == "-":
        return int(args.func(args) or 0)
    raw = io.BytesIO()
    text = io.TextIOWrapper(raw, encoding="utf-8")  # with a .buffer, as sys.stdout has (write_output("-") uses it)
    with contextlib.redirect_stdout(text):
        code = int(args.func(args) or 0)
    text.flush()
    write_output(task.out, raw.getvalue())
    print(f"kvpipe run: {task.section} -> {task.out}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    if args.print_example:
        sys.stdout.write(study.EXAMPLE)
        return 0
    if not args.study:
        raise UsageError("run needs a study file: kvpipe run STUDY.toml (kvpipe run --print-example > study.toml writes one)")
    parser = build_parser()
    tasks = [(t, checked(t, args.study, parser)) for t in study.load(args.study)]
    named = [(f"[{t.section}]", p) for t, a in tasks for p in outputs_of(t, a)]
    with _about_study(args.study):
        distinct_outputs([p for _, p in named], [n for n, _ in named])  # a later table would replace an earlier one's file
    if args.dry_run:
        print("\n".join(t.command_line() for t, _ in tasks))
        return 0
    kept: list[str] = []  # what finished tables wrote: a later table that fails cannot take it back, so it is named
    for task, targs in tasks:
        try:
            with _about(args.study, task):
                code = execute(task, targs)
        except UsageError as exc:
            raise UsageError(f"{exc}{_kept(kept)}") from None
        if code:
            print(f"kvpipe run: [{task.section}] exited {code}{_kept(kept)}", file=sys.stderr)
            return code
        kept += outputs_of(task, targs)
    return 0


def _kept(paths: list[str]) -> str:
    """The tail of a failed study's line: the outputs of the tables that finished before it."""
    if not paths:
        return ""
    return "; kept from the tables before it: " + ", ".join(repr(p) for p in dict.fromkeys(paths))
