"""``kvpipe schedules``: rank the delivery schedules (``kvpipe.schedules``) over a grid, with the traces that explain it.

Prints the ranking and the per-point ceiling shares as Markdown tables; with ``--out DIR`` writes
``schedules.csv`` (one row per point, schedule and depth), ``ranking.md`` and a one-token timeline per schedule
(ordered, reference, the best) at one copy ≈ compute point of the grid (``timeline-<name>.png``).
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

from kvpipe.commands.args import UsageError, parse_list

GRIDS = ("h200", "h200-calibrated", "reference", "all")


def register(sub: Any) -> None:
    p = sub.add_parser("schedules", help="rank delivery schedules by simulated ceiling share (docs/schedules.md)")
    p.add_argument("--grid", default="all", help=f"which grid: {', '.join(GRIDS)} (default all; h200-calibrated reads "
                   "validate/results/h200/run11/calibrated.json from the repository)")
    p.add_argument("--hardware", default="", help="the H200 grid on this profile instead (a preset or calibrated .json)")
    p.add_argument("--depth", default="1,2", help="look-ahead depths tried per schedule (comma list, 1..14)")
    p.add_argument("--tokens", type=int, default=4, help="decode tokens simulated per run (default 4)")
    p.add_argument("--out", default="", help="folder for schedules.csv, ranking.md and the timelines (PNG)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from kvpipe import schedules as S
    from sim.safe_write import write_outputs

    if args.grid not in GRIDS:
        raise UsageError(f"--grid {args.grid!r} unknown; allowed: {', '.join(GRIDS)}")
    if not 1 <= args.tokens <= 64:
        raise UsageError(f"--tokens {args.tokens} out of range; allowed: 1..64")
    depths = tuple(parse_list(args.depth, int, "--depth", "integers 1..14"))
    if any(not 1 <= d <= 14 for d in depths):
        raise UsageError(f"--depth {args.depth}: out of range; allowed: integers 1..14")
    h200 = tuple(replace(g, hardware=args.hardware) for g in S.H200_GRID) if args.hardware else S.H200_GRID
    calibrated = S.H200_CALIBRATED_GRID
    if args.grid in ("h200-calibrated", "all") and not Path(S.H200_CALIBRATION).is_file():
        raise UsageError(f"--grid {args.grid}: {S.H200_CALIBRATION} not found; run from the repository root, or --grid h200,reference")
    grid = {"h200": h200, "h200-calibrated": calibrated, "reference": S.REFERENCE_GRID,
            "all": h200 + calibrated + S.REFERENCE_GRID}[args.grid]
    rows = [r for gp in grid for r in S.evaluate(gp, depths=depths, tokens=args.tokens)]
    rank = S.ranking(rows)
    best = rank[0]["schedule"] if rank[0]["schedule"] != "reference" else rank[1]["schedule"]
    text = "\n\n".join(["## Ranking\n\n" + S.ranking_table(rank),
                        "## Ceiling share per point (best depth)\n\n" + S.points_table(rows, list(S.CANDIDATES))])
    print(text)
    if not args.out:
        return 0
    out = Path(args.out)
    files: list[tuple[str | Path, bytes | str]] = [(out / "schedules.csv", _csv(rows)), (out / "ranking.md", text + "\n")]
    files += _timelines(S, grid, rows, best, depths, out)
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(files)
    print(f"wrote {out}: schedules.csv, ranking.md, " + ", ".join(Path(p).name for p, _ in files[2:]))
    return 0


def _csv(rows: list[dict[str, Any]]) -> str:
    import csv

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _timelines(S: Any, grid: Any, rows: list[dict[str, Any]], best: str, depths: tuple[int, ...],
               out: Path) -> list[tuple[str | Path, bytes | str]]:
    """Per hardware of the grid, one PNG per schedule (ordered, reference, ``best``) at its point whose copy/compute
    is closest to 1, each at ``best``'s fastest depth there."""
    from kvpipe.plots import png_bytes, timeline

    files: list[tuple[str | Path, bytes | str]] = []
    for hw in dict.fromkeys(g.hardware for g in grid):
        ref = [r for r in rows if r["schedule"] == "reference" and r["hardware"] == hw]
        at = min(ref, key=lambda r: abs(r["copy_over_compute"] - 1.0))
        key = (at["hardware"], at["model"], at["cache_type"], at["context"])
        gp = next(g for g in grid if (g.hardware, g.model, g.cache_type, g.context) == key)
        mine = [r for r in rows if r["schedule"] == best and (r["hardware"], r["model"], r["cache_type"], r["context"]) == key]
        depth = max(mine, key=lambda r: r["tokens_per_s"])["depth"]
        panels = S.timeline_panels(gp, ["reference", best], depth if depth in depths else depths[0])
        title = (f"{gp.model} ({gp.cache_type} KV) on {Path(hw).stem}, context {gp.context:,} "
                 f"(copy/compute {at['copy_over_compute']:.2f}, ceiling {at['ceiling_tps']:.2f} t/s): one token")
        for name, panel in zip(["ordered", "reference", "best"], panels, strict=True):
            files.append((out / f"timeline-{Path(hw).stem}-{name}.png", png_bytes(timeline([panel], title))))
    return files
