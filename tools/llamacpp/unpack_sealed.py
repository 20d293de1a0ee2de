"""Unpack one device call's tarballs into the repository, the held-out calls' files sealed outside it, unread.

The blind protocol of issue 28's runs (tools/llamacpp/README-run10.md, README-run11.md): a held-out call's files
(``*-pp{PP}-*`` for each held-out -npp) must not be read until the fit and the predictions are committed. This moves
them, by name only, to a folder outside the repository as the tarball is unpacked; the rest (calibration calls,
logs, commands, machine facts) goes to the run's call folder. Later, ``cp SEAL/* DEST/`` adds them.

    python tools/llamacpp/unpack_sealed.py --held 576,1120 --seal /work/sealed11/call1 \
        --dest validate/results/h200-llamacpp/run11/call1 /path/to/files_at/*.tar.gz

Reads the tarballs, writes the two folders; never opens a member's content beyond copying it. Exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def held_out(name: str, held: set[int]) -> bool:
    """Whether a file of this base name belongs to a held-out call (``...-pp{PP}-...``, PP in ``held``). Pure."""
    m = re.search(r"-pp(\d+)-", name)
    return m is not None and int(m.group(1)) in held


def unpack(tarballs: list[Path], held: set[int], dest: Path, seal: Path) -> tuple[int, int]:
    """Every regular member of ``tarballs`` by its base name into ``dest``, or ``seal`` where :func:`held_out`;
    (files to dest, files sealed). Raises ValueError where ``seal`` is inside the repository or two members share a
    base name. Blocks (disk)."""
    if seal.resolve().is_relative_to(ROOT):
        raise ValueError(f"--seal {seal}: inside the repository; allowed: a folder outside {ROOT}")
    dest.mkdir(parents=True, exist_ok=True)
    seal.mkdir(parents=True, exist_ok=True)
    counts, seen = [0, 0], set()
    for path in tarballs:
        with tarfile.open(path) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                name = Path(member.name).name
                if name in seen:
                    raise ValueError(f"{path}: two members named {name!r}; allowed: one file per base name")
                seen.add(name)
                hidden = held_out(name, held)
                src = tar.extractfile(member)
                assert src is not None  # a regular file
                (seal if hidden else dest).joinpath(name).write_bytes(src.read())
                counts[hidden] += 1
    return counts[0], counts[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/llamacpp/unpack_sealed.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--held", required=True, help="held-out -npp values, comma-separated (e.g. 576,1120)")
    p.add_argument("--dest", required=True, type=Path, help="the run's call folder in the repository")
    p.add_argument("--seal", required=True, type=Path, help="a folder outside the repository for the held-out files")
    p.add_argument("tarballs", nargs="+", type=Path, help="the device call's .tar.gz files")
    a = p.parse_args(argv)
    try:
        held = {int(x) for x in a.held.split(",")}
        if not held or min(held) <= 0:
            raise ValueError
    except ValueError:
        print(f"unpack_sealed: --held {a.held!r}; allowed: positive -npp values, comma-separated", file=sys.stderr)
        return 2
    for t in a.tarballs:
        if not tarfile.is_tarfile(t):
            print(f"unpack_sealed: {t}: not a tarball; allowed: the device call's .tar.gz files", file=sys.stderr)
            return 2
    try:
        kept, sealed = unpack(a.tarballs, held, a.dest, a.seal)
    except ValueError as exc:
        print(f"unpack_sealed: {exc}", file=sys.stderr)
        return 2
    print(f"{kept} files to {a.dest}; {sealed} held-out files sealed unread in {a.seal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
