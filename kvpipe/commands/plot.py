"""``kvpipe plot KIND``: draw a sweep (or simulate one) as PNG and SVG.

Rows come from ``--rows FILE`` (a sweep's rows.json or rows.csv) or are
simulated from the grid flags (ranges ``START..STOP/STEP`` allowed; depth 0 is
added where a gain needs its baseline). ``timeline`` simulates the first
point of the grid ordered and at each depth >= 1 given, with tracing on. ``all`` draws every kind (every
row kind with ``--rows``).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

from backends.files import LARGE_LIMIT, parse_json, read_bytes, shown
from kvpipe.commands.args import UsageError, add_grid_args, parse_list

ROW_KINDS = ("gain-vs-depth", "gain-vs-context", "gain-per-mib", "ring-vs-context", "tps-vs-context")
ROW_FIELDS = ("model", "hardware", "cache_type", "context", "depth", "budget_mib", "tokens", "tokens_per_s", "window_rows",
              "ring_mib", "declined", "decline_reason")


def register(sub: Any) -> None:
    from kvpipe.plots import KINDS

    p = sub.add_parser("plot", help="plot gain/ring against depth and context, or a token's timeline (PNG, SVG)")
    p.add_argument("kind", help=f"one of: {', '.join(KINDS)}, all")
    add_grid_args(p)
    p.add_argument("--rows", metavar="FILE", help="plot these rows (a sweep's rows.json / rows.csv) instead of simulating")
    p.add_argument("--out", metavar="PREFIX", help="write PREFIX.png and PREFIX.svg (default out/plots/KIND)")
    p.add_argument("--format", default="png,svg", help="png, svg or both (comma list)")
    p.add_argument("--x", help="xy: column on the x axis")
    p.add_argument("--y", help="xy: column on the y axis")
    p.add_argument("--group", help="xy: one line per value of this column")
    p.add_argument("--peak", action="store_true",
                   help="gain-vs-context: mark the closed-form peak rows* = compute x BW / (n_attn x b) at depth 1")
    p.add_argument("--budget-lines", default="", help="ring-vs-context: extra budget lines, MiB (comma list)")
    p.add_argument("--jobs", type=int, default=0, help="local worker processes when simulating (default: all cores)")
    p.set_defaults(func=run)


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows from a JSON list or a CSV file (numbers and booleans converted). Raises UsageError if unreadable."""
    p = Path(path)
    raw = read_bytes(p, "rows", LARGE_LIMIT, gz=True)
    if p.suffix == ".csv":
        text = raw.decode(errors="replace")
        return _checked([{k: _value(v) for k, v in r.items()} for r in csv.DictReader(text.splitlines())], path)
    rows = parse_json(raw, f"rows {shown(path)}", allow_nan=True)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise UsageError(f"rows {path!r} must hold a JSON list of row objects")
    return _checked(rows, path)


def _checked(rows: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    if not rows:
        raise UsageError(f"rows {path!r} hold no row")
    for i, r in enumerate(rows):
        missing = [k for k in ROW_FIELDS if k not in r]
        if missing:
            raise UsageError(f"row {i} of {path!r} lacks {', '.join(missing)}; rows come from kvpipe sweep or simulate --json")
    from kvpipe.plots import check_rows

    check_rows(rows, f"rows {shown(path)}")
    return rows


def _value(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _simulated_rows(args: argparse.Namespace, need_baseline: bool) -> list[dict[str, Any]]:
    from kvpipe.commands.args import points_from_args as grid_points

    if need_baseline:
        from kvpipe.commands.args import expand_ranges

        depths = expand_ranges(args.depth).split(",")
        args.depth = ",".join(["0", *[d for d in depths if d.strip() != "0"]])
    from kvpipe.sweep import run_sweep

    res = run_sweep(grid_points(args), None, jobs=args.jobs or None, progress=False, exact=args.exact)
    if res.failed:
        raise UsageError(f"point {res.failed[0][0]} failed: {res.failed[0][1]}")
    return res.rows


def _timeline_figure(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    from kvpipe.commands.args import points_from_args as grid_points
    from kvpipe.plots import timeline, token_window
    from sim.run.run import run_point

    points = grid_points(args)
    first = points[0]
    same = [p for p in points if (p.workload.model, p.hardware.name, p.workload.cache_k, p.context, p.transport.budget_mib)
            == (first.workload.model, first.hardware.name, first.workload.cache_k, first.context, first.transport.budget_mib)]
    depths = sorted({p.transport.depth for p in same} - {0})
    if not depths:
        raise UsageError("timeline compares ordered with pipelined: give a --depth >= 1")
    piped = next(p for p in same if p.transport.depth == depths[0])
    panels = []
    for depth in [0, *depths]:
        p = replace(piped, transport=replace(piped.transport, depth=depth))
        res = run_point(p, trace=True)
        totals = [g.total_s for g in res.graphs]
        declined = depth and all(g.declined for g in res.graphs)
        label = "ordered (depth 0)" if not depth else f"pipelined (depth {depth})"
        panels.append((label + (" - ring declined, ran ordered" if declined else ""), res.spans, token_window(totals, -1)))
    wl, tc = piped.workload, piped.transport
    budget = "no budget cap" if not tc.budget_mib else f"budget {tc.budget_mib:g} MiB"
    title = (f"{wl.model.name} ({wl.cache_k.name} KV) on {piped.hardware.name}, context {piped.context:,}: "
             f"one decode token (the last of {wl.tokens}), {budget}")
    return timeline(panels, title)


def _peak_marks(rows: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """The closed-form peak of the rows' one model/hardware/cache type, as a context to mark."""
    from kvpipe.plan import PlanRequest, closed_form, points

    combos = {(r["model"], r["hardware"], r["cache_type"]) for r in rows}
    if len(combos) != 1:
        raise UsageError("--peak needs rows of one model, one hardware and one cache type")
    model, hardware, cache = combos.pop()
    cf = closed_form(points(PlanRequest(model=model, hardware=hardware, cache_type=cache), [4096], [1], 0, tokens=1)[0])
    return [(f"closed-form peak: {cf.rows:,.0f} rows (copy = compute)", cf.rows - 1)]


def run(args: argparse.Namespace) -> int:
    from kvpipe import plots

    kinds = [*ROW_KINDS, *([] if args.rows else ["timeline"])] if args.kind == "all" else [args.kind]
    if args.kind not in plots.KINDS and args.kind != "all":
        raise UsageError(f"unknown plot kind {args.kind!r}; allowed: {', '.join(plots.KINDS)}, all")
    if args.kind == "xy" and not (args.x and args.y):
        raise UsageError("plot xy needs --x COLUMN and --y COLUMN")
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    if not formats or any(f not in plots.FORMATS for f in formats):
        raise UsageError(f"--format {args.format!r}; allowed: {', '.join(plots.FORMATS)} (comma list)")
    budget_lines = parse_list(args.budget_lines, float, "--budget-lines", "MiB, comma list") if args.budget_lines else []
    rows: list[dict[str, Any]] | None = None
    files: list[tuple[Path, bytes]] = []  # every kind's files: written together at the end, all or none
    for kind in kinds:
        if kind == "timeline":
            if args.rows:
                raise UsageError("a timeline is simulated, not read from rows: drop --rows")
            fig = _timeline_figure(args)
        else:
            if rows is None:
                rows = read_rows(args.rows) if args.rows else _simulated_rows(args, need_baseline=kind != "xy")
                from kvpipe.sweep import gain_rows

                rows = gain_rows(rows)
            if kind == "xy":
                fig = plots.xy(rows, args.x, args.y, args.group)
            elif kind == "gain-vs-context":
                fig = plots.gain_vs_context(rows, _peak_marks(rows) if args.peak else ())
            elif kind == "ring-vs-context":
                fig = plots.ring_vs_context(rows, budget_lines)
            else:
                fig = plots.KINDS[kind](rows)
        prefix = args.out or f"out/plots/{kind}"
        if args.out and len(kinds) > 1:
            prefix = f"{args.out}-{kind}"
        files += plots.rendered(fig, prefix, formats)
    from sim.safe_write import write_outputs

    write_outputs(list(files))
    for path, _ in files:
        print(path)
    return 0
