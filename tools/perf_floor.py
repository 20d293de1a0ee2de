"""Where issue 26's two speed targets' CPU goes, and the wall time that CPU allows on this machine's cores.

Runs, in this one process (``--jobs 1``: every piece of work here, so each is timed with ``time.process_time``), the
plan of ``tools/perf_targets.py`` (4,096 contexts x 15 depths x 8 budgets) and the 1,020-point sweep's default path,
and splits their CPU into what the issue asks for: the evaluator's figures and rows, the sample check's simulations on
the SimPy machine (item 3: at least 32 points and every change of best depth or decline), the sweep's row store, and
the rest. With the sweep's ``--exact`` path too (``--exact``), the ratio that CPU allows. The floor printed is the CPU
divided by the cores: the wall time of perfectly parallel work, which no schedule of the same work beats. Prints
markdown tables; blocks the host for about half a minute (with ``--exact``, a minute more).

    python tools/perf_floor.py              # the plan and the sweep's default path
    python tools/perf_floor.py --exact      # and the sweep's exact path, for the ratio's ceiling
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "tools"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from perf_targets import parser  # noqa: E402 - the tools' folder is on the path only now

CONTEXTS = tuple(range(128, 524289, 128))
BUDGETS = (16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
SWEEP = {"contexts": tuple((c,) for c in range(1024, 52225, 1024)), "depths": (0, 1, 2, 3, 4),
         "budgets_mib": (0.0, 64.0, 128.0, 256.0)}
CHECK_SIMS = "the sample check's simulations (SimPy)"


@contextmanager
def timed(parts: dict[tuple[Any, str], str]) -> Iterator[collections.Counter[str]]:
    """While entered, each ``(module or class, function name)`` of ``parts`` is wrapped to add its CPU seconds
    (``process_time``) to the yielded counter under its label; restored on exit. A call inside another timed one
    counts in both (the labels here do not nest)."""
    spent: collections.Counter[str] = collections.Counter()
    saved = []
    for (owner, name), label in parts.items():
        fn = getattr(owner, name)

        def wrapped(*a: Any, _fn: Callable[..., Any] = fn, _label: str = label, **k: Any) -> Any:
            start = time.process_time()
            try:
                return _fn(*a, **k)
            finally:
                spent[_label] += time.process_time() - start

        saved.append((owner, name, fn))
        setattr(owner, name, functools.wraps(fn)(wrapped))
    try:
        yield spent
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def plan_breakdown(contexts: tuple[int, ...] = CONTEXTS, max_depth: int = 14,
                   budgets: tuple[float, ...] = BUDGETS) -> tuple[dict[str, float], str]:
    """The plan of ``contexts`` in this process: CPU seconds by part (``total`` the whole, its output included) and its
    printed text. Blocks the host."""
    import kvpipe.plan_run as plan_run
    import kvpipe.sweep_work as sweep_work
    import sim.evaluator as evaluator
    from kvpipe.capacity import plan_fit
    from kvpipe.capacity_report import render_fit
    from kvpipe.plan import PlanRequest, render

    parts = {(evaluator, "summarize"): "the evaluator's figures (grid, memory plan)",
             (plan_run, "_evaluated_rows"): "the evaluator's rows (the check's sample, the peak scan)",
             (sweep_work, "_sample_rows"): CHECK_SIMS}
    req = PlanRequest(contexts=contexts, max_depth=max_depth, budgets_mib=budgets, jobs=1)
    start = time.process_time()
    with timed(parts) as spent:
        fp = plan_fit(req)
        text = f"{render_fit(fp, req.cache_type)}\n\n{render(fp.plans)}"
    return {**spent, "total": time.process_time() - start}, text


def sweep_breakdown(exact: bool = False, grid: dict[str, Any] | None = None) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The sweep of ``grid`` (default: the 1,020 points of ``tools/perf_targets.py``) in this process, rows written to
    a temporary folder: CPU seconds by part (``total`` the whole) and its rows. Blocks the host."""
    import kvpipe.row_store as row_store
    import kvpipe.sweep as sweep
    import kvpipe.sweep_work as sweep_work
    from sim.evaluator import clear_caches
    from sim.points import GridSpec, points

    pts = points(GridSpec(**(grid or SWEEP)))
    parts = {(sweep_work, "_evaluated"): "the evaluator's rows", (sweep_work, "_sample_rows"): CHECK_SIMS,
             (row_store.RowStore, "add"): "the row store: journal, snapshots",
             (row_store.RowStore, "close"): "the row store: the last snapshot"}
    clear_caches()
    with tempfile.TemporaryDirectory() as tmp, timed(parts) as spent:
        start = time.process_time()
        res = sweep.run_sweep(pts, out_dir=Path(tmp) / "out", jobs=1, progress=False, exact=exact)
        total = time.process_time() - start
    return {**spent, "total": total}, res.rows


def table(title: str, spent: dict[str, float], cores: int) -> str:
    """``spent`` as a markdown table: each part's CPU and share, the rest, the total and its floor on ``cores``."""
    total = spent["total"]
    named = {k: v for k, v in spent.items() if k != "total"}
    lines = [f"{title}\n", "| part | CPU s | share |", "|---|---:|---:|"]
    lines += [f"| {k} | {v:.3f} | {v / total:.0%} |" for k, v in named.items()]
    rest = total - sum(named.values())
    lines += [f"| the rest (planning, the memory plan, analysis, output) | {rest:.3f} | {rest / total:.0%} |",
              f"| **total** | **{total:.3f}** | |",
              f"| the floor on {cores} cores (total / cores) | {total / cores:.3f} | |"]
    if CHECK_SIMS in named:
        lines.append(f"| the check's simulations alone on {cores} cores | {named[CHECK_SIMS] / cores:.3f} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser("perf_floor", __doc__)
    ap.add_argument("--exact", action="store_true", help="also the sweep's --exact path (a minute more)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="the cores the floor divides by (default: this "
                    "machine's)")
    args = ap.parse_args(argv)
    if args.cores < 1:
        ap.error(f"--cores {args.cores}; allowed: 1 or more")
    print(f"load {os.getloadavg()[0]:.2f}, {args.cores} cores\n", flush=True)
    spent, _ = plan_breakdown()
    print(table("kvpipe plan --context 128..524288/128 --max-depth 14 --budget 0,16,32,64,128,256,512,1024 (--jobs 1)",
                spent, args.cores) + "\n", flush=True)
    default, _ = sweep_breakdown()
    print(table("the 1,020-point sweep, default path (--jobs 1)", default, args.cores) + "\n", flush=True)
    if args.exact:
        exact, _ = sweep_breakdown(exact=True)
        print(f"the same, --exact: {exact['total']:.3f} s of CPU; the ratio that CPU allows, exact / default: "
              f"{exact['total'] / default['total']:.1f}x (the same parallel efficiency on both paths)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
