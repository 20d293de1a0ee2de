"""Issue 28: which llama-batched-bench call-rows the outlier rule leaves out, run by run.

``validate.batch_fit.outlying`` (what ``kvpipe calibrate --drop-outliers`` and ``predict_batched.py compare
--drop-outliers`` apply) holds each call's t/s at one -npl to the median of its configuration's calls (same run, layout
and -npp) at that -npl. This counts, over every call of the runs given (complete rounds or not), the call-rows it
leaves out at a spread: how often the rule fires on calls nobody suspects (tools/llamacpp/README-run13.md).

    python tools/llamacpp/outlier_count.py --runs 9,10,11,12 --spread 0.25

Reads the runs' files; prints a table. Exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.llamacpp.batched_scatter import load_calls  # noqa: E402
from validate.batch_fit import outlying  # noqa: E402


def left_out(root: Path, run: int, spread: float) -> tuple[int, list[tuple[str, int, int, int, float]]]:
    """(call-rows read, the ones left out as (layout, -npp, -npl, round, t/s)) of one run. Reads files."""
    by_row: dict[tuple[str, int, int], list[tuple[int, float]]] = {}
    for c in load_calls(root, [run]):
        for npl, tps in c.tps:
            by_row.setdefault((c.layout, c.pp, npl), []).append((c.repeat, tps))
    out = []
    for (layout, pp, npl), calls in sorted(by_row.items()):
        flags = outlying([t for _, t in calls], spread)
        out += [(layout, pp, npl, k, t) for (k, t), f in zip(calls, flags, strict=True) if f]
    return sum(len(v) for v in by_row.values()), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/llamacpp/outlier_count.py", description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(ROOT / "validate/results/h200-llamacpp"), help="folder holding run*/ (default: ours)")
    ap.add_argument("--runs", default="9,10,11,12", help="runs to read (default 9,10,11,12)")
    ap.add_argument("--spread", type=float, default=0.25, help="the rule's spread (default 0.25)")
    args = ap.parse_args(argv)
    try:
        runs = [int(x) for x in args.runs.split(",")]
    except ValueError:
        return _bad(f"--runs {args.runs!r}; allowed: run numbers, comma separated")
    if not 0.0 < args.spread < 1.0:
        return _bad(f"--spread {args.spread!r}; allowed: a fraction between 0 and 1")
    got = {run: left_out(Path(args.root), run, args.spread) for run in runs}
    empty = [run for run, (n, _) in got.items() if not n]
    if empty:
        return _bad(f"--runs: run {empty[0]} has no batched calls under {args.root}; allowed: runs with run<N>/*/r<N>-batched-*.jsonl")
    print(f"| run | call-rows | left out at spread {args.spread:g} | which (layout, -npp, -npl, round: t/s) |")
    print("|---:|---:|---:|---|")
    for run, (n, out) in got.items():
        which = "; ".join(f"{lay} {pp} x{npl} r{k}: {t:.1f}" for lay, pp, npl, k, t in out)
        print(f"| {run} | {n} | {len(out)} | {which} |")
    return 0


def _bad(message: str) -> int:
    print(f"outlier_count: {message}", file=sys.stderr)
    return 2

if __name__ == "__main__":
    sys.exit(main())
