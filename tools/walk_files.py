"""Which of the project's files one command enters: parse a kvpipe command line, then run the command in this process
under a profile hook and list every module of the four floors whose code ran (imports alone do not count: a module
whose only code run was its top level is counted apart; the parsing, which builds every command's parser, is not
part of the call).

Usage: ``python tools/walk_files.py plan --context 1024..65536/1024`` (the arguments of ``kvpipe``). Prints the
count and the files, bottom floor first. Blocks for the command's run; slower than the command (a hook per call).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("backends", "sim", "validate", "kvpipe")


def main(argv: list[str]) -> int:
    entered: set[str] = set()
    top_only: set[str] = set()

    def hook(frame, event, arg):  # type: ignore[no-untyped-def]
        if event != "call":
            return
        f = frame.f_code.co_filename
        if not f.startswith(str(ROOT)):
            return
        rel = Path(f).relative_to(ROOT).as_posix()
        if rel.split("/")[0] not in FLOORS:
            return
        (top_only if frame.f_code.co_name == "<module>" else entered).add(rel)

    from kvpipe.cli import build_parser

    args = build_parser().parse_args(argv)  # the command line's parsing is not the call: every command builds a parser
    sys.setprofile(hook)
    try:
        rc = int(args.func(args) or 0)
    finally:
        sys.setprofile(None)
    files = sorted(entered, key=lambda p: (FLOORS.index(p.split("/")[0]), p))
    print(f"\n{len(files)} files entered (functions run), {len(top_only - entered)} more imported only; exit {rc}",
          file=sys.stderr)
    for p in files:
        print(p, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
