"""The span check's comparison (tools/llamacpp/README-span.md): per layout and -npl, the geometric mean of t/s over the
complete rounds (every one of the four calls finished) at -c 10240 and -c 12288, and their ratio.

    python tools/llamacpp/span_ratio.py validate/results/h200-llamacpp/span [--all-rounds]

``--all-rounds`` (after the fact, not the rule): every finished call, complete round or not. Reads the files; prints a table.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.errors import InputError  # noqa: E402
from validate import batched_bench  # noqa: E402

NAME = re.compile(r"span-(split|unified)-c(\d+)-r(\d+)\.jsonl$")


def calls(folder: Path) -> dict[tuple[str, int, int], dict[int, float]]:
    """(layout, -c, round) -> {-npl: t/s} of every call whose file has a row for each -npl it ran. Reads files."""
    out: dict[tuple[str, int, int], dict[int, float]] = {}
    for path in sorted(folder.glob("span-*.jsonl")):
        m = NAME.search(path.name)
        if not m:
            continue
        try:
            rows = {r.sequences: r.decode_tps for r in batched_bench.load(path).rows}
        except InputError:
            continue  # killed before its first row: not a finished call
        if rows:
            out[(m.group(1), int(m.group(2)), int(m.group(3)))] = rows
    return out


def table(got: dict[tuple[str, int, int], dict[int, float]], all_rounds: bool) -> list[str]:
    """Markdown rows: layout, -npl, rounds used, gmean at -c 10240 and 12288, their ratio. Pure."""
    configs = {(lay, c) for lay, c, _ in got}
    rounds = sorted({k for _, _, k in got})
    complete = [k for k in rounds if all((lay, c, k) in got for lay, c in configs)]
    lines = ["| layout | -npl | rounds | t/s at -c 10240 | t/s at -c 12288 | ratio |", "|---|---:|---|---:|---:|---:|"]
    for lay in ("split", "unified"):
        for npl in sorted({p for (la, _, _), rows in got.items() if la == lay for p in rows}):
            gm, used = {}, []
            for c in (10240, 12288):
                ks = [k for k in (rounds if all_rounds else complete) if (lay, c, k) in got and npl in got[(lay, c, k)]]
                used.append(",".join(map(str, ks)))
                gm[c] = math.exp(sum(math.log(got[(lay, c, k)][npl]) for k in ks) / len(ks)) if ks else math.nan
            lines.append(f"| {lay} | {npl} | {' / '.join(used)} | {gm[10240]:.2f} | {gm[12288]:.2f} | {gm[10240] / gm[12288]:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--all-rounds", action="store_true")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"span_ratio: {folder} is not a folder; allowed: the span check's results folder", file=sys.stderr)
        return 2
    got = calls(folder)
    if not got:
        print(f"span_ratio: {folder} has no span-*.jsonl call with a row; allowed: the span check's results folder", file=sys.stderr)
        return 2
    print("\n".join(table(got, args.all_rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
