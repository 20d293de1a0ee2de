"""Issue 26's speed targets, measured the way docs/performance.md reports them, from a checkout: the plan of 4,096
contexts x 15 depths x 8 budgets (wall, CPU, peak RSS) and the 1,020-point sweep's default path against its
``--exact`` path (wall of each, their ratio, and the largest disagreement of any row field between the two).

Each command runs as its own process (``python -m kvpipe.cli`` from this checkout), one after another, the sides of a
pair in alternating order; the machine's load is logged before each. Bytecode caches are written by a warm-up run
first and used by every measured run (the environment variable ``PYTHONDONTWRITEBYTECODE`` is removed for the
children: with it, every run recompiles ~85 modules, ~0.2 s a run). Blocks the host for minutes.

    python tools/perf_targets.py                    # both, 3 repeats
    python tools/perf_targets.py --only plan --repeats 5
    python tools/perf_targets.py --only sweep --in-process   # the ratio without the interpreters' start
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--context", "128..524288/128", "--max-depth", "14", "--budget", "0,16,32,64,128,256,512,1024"]
SWEEP = ["sweep", "--context", "1024..52224/1024", "--depth", "0..4", "--budget", "0,64,128,256", "--quiet"]
#: Row fields that name how a row was answered, not what it answers.
HOW = ("engine", "hazards", "tokens_simulated", "simulated_as", "shared_with_n")


def measure(args: list[str]) -> dict[str, float]:
    """Run ``python -m kvpipe.cli ARGS`` from this checkout, its output discarded: wall seconds, CPU seconds (user +
    system of the process and the workers it waited for) and peak RSS MB read from its ``wait4`` as GNU time does,
    and the 1-minute load before it. Blocks the host; a failed command raises ``RuntimeError`` with its last error
    line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile("w+") as errf:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "kvpipe.cli", *args], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=errf)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            errf.seek(0)
            last = (errf.read().strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(f"kvpipe {' '.join(args)} exited {proc.returncode}: {last}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024, "load": load}


def disagreement(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> float:
    """The largest relative difference of any numeric row field between two sweeps' rows (same points, same order),
    fields of :data:`HOW` left out; ``math.inf`` where the points, a flag or a text field differ. Pure."""
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for ra, rb in zip(a, b, strict=True):
        if set(ra) - set(HOW) != set(rb) - set(HOW):
            return math.inf
        for k in ra:
            if k not in HOW:
                worst = max(worst, _field(ra[k], rb[k]))
    return worst


def _field(x: Any, y: Any) -> float:
    if isinstance(x, dict) and isinstance(y, dict):
        return math.inf if x.keys() != y.keys() else max((_field(x[k], y[k]) for k in x), default=0.0)
    if isinstance(x, list) and isinstance(y, list):
        return math.inf if len(x) != len(y) else max((_field(p, q) for p, q in zip(x, y, strict=True)), default=0.0)
    if isinstance(x, bool) or isinstance(y, bool) or not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
        return 0.0 if x == y else math.inf
    if x == y:
        return 0.0
    return abs(x - y) / max(abs(x), abs(y))


def _summary(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f}"


def plan_table(repeats: int) -> str:
    """The plan's runs as a markdown table, min / median last. Blocks the host."""
    runs = [measure(PLAN) for _ in range(repeats)]
    lines = ["| run | load | wall s | CPU s | peak RSS MB |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {i + 1} | {r['load']:.2f} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['rss_mb']:.0f} |"
              for i, r in enumerate(runs)]
    lines.append(f"| min / median | | {_summary([r['wall_s'] for r in runs])} | {_summary([r['cpu_s'] for r in runs])}"
                 f" | {max(r['rss_mb'] for r in runs):.0f} (max) |")
    return "\n".join(lines)


def sweep_table(repeats: int) -> str:
    """The sweep's pairs as two processes each (``kvpipe sweep ...`` and ``... --exact``) as a markdown table. Blocks
    the host."""

    def side(exact: bool, out: Path) -> tuple[float, list[dict[str, Any]]]:
        wall = measure([*SWEEP, *(["--exact"] if exact else []), "--out", str(out)])["wall_s"]
        return wall, json.loads((out / "rows.json").read_text())

    return _pair_table(repeats, side)


def sweep_in_process(repeats: int) -> str:
    """The sweep's pairs in this one process, as Rounds 8-23 measured them: ``kvpipe.sweep.run_sweep`` on the grid's
    points, default and ``exact=True``, the evaluator's and the planner's caches cleared before each side, no
    interpreter start in either; a markdown table. Blocks the host."""
    sys.path.insert(0, str(ROOT))
    from kvpipe.sweep import run_sweep
    from sim.evaluator import clear_caches
    from sim.points import GridSpec, points

    grid = GridSpec(contexts=tuple((c,) for c in range(1024, 52225, 1024)), depths=(0, 1, 2, 3, 4),
                    budgets_mib=(0, 64, 128, 256))
    pts = points(grid)

    def side(exact: bool, out: Path) -> tuple[float, list[dict[str, Any]]]:
        clear_caches()
        start = time.perf_counter()
        res = run_sweep(pts, out_dir=out, progress=False, exact=exact)
        return time.perf_counter() - start, [dict(r) for r in res.rows]

    return _pair_table(repeats, side)


def _pair_table(repeats: int, side: Callable[[bool, Path], tuple[float, list[dict[str, Any]]]]) -> str:
    """``repeats`` pairs of ``side(exact, out folder) -> (wall s, rows)``, the default path first in odd pairs and
    ``--exact`` first in even ones, with each pair's ratio and the rows' largest disagreement; a markdown table."""
    lines = ["| pair | load | default s | exact s | ratio | largest row disagreement |", "|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            load = os.getloadavg()[0]
            got = {exact: side(exact, Path(tmp) / f"{'exact' if exact else 'default'}{i}")
                   for exact in ((False, True) if i % 2 == 0 else (True, False))}
            ratio = got[True][0] / got[False][0]
            ratios.append(ratio)
            lines.append(f"| {i + 1} | {load:.2f} | {got[False][0]:.3f} | {got[True][0]:.3f} | {ratio:.1f}x | "
                         f"{disagreement(got[False][1], got[True][1]):.1e} |")
    lines.append(f"| min / median ratio | | | | {min(ratios):.1f}x / {statistics.median(ratios):.1f}x | |")
    return "\n".join(lines)


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """An argument parser for a measuring tool (``doc``: its module docstring, whose first paragraph describes it) whose
    every error is one line, ``PROG: message`` on stderr, exit 2."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)

    def one_line(message: str) -> NoReturn:
        print(f"{prog}: {message}", file=sys.stderr)
        sys.exit(2)

    ap.error = one_line  # type: ignore[method-assign]
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser("perf_targets", __doc__)
    ap.add_argument("--repeats", type=int, default=3, help="runs of the plan, pairs of the sweep (default 3)")
    ap.add_argument("--only", choices=("plan", "sweep"), help="one of the two (default both)")
    ap.add_argument("--in-process", action="store_true",
                    help="the sweep's two paths in this process (run_sweep), as Rounds 8-23 measured the ratio")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print(f"perf_targets: --repeats {args.repeats}; allowed: 1 or more", file=sys.stderr)
        return 2
    measure(["plan", "--context", "4096"])  # the warm-up: bytecode caches written
    if args.only in (None, "plan"):
        print(f"kvpipe {' '.join(PLAN)}\n\n{plan_table(args.repeats)}\n", flush=True)
    if args.only in (None, "sweep"):
        if args.in_process:
            print(f"run_sweep, the grid of kvpipe {' '.join(SWEEP[1:-1])} [exact=True], in one process\n\n"
                  f"{sweep_in_process(args.repeats)}", flush=True)
        else:
            print(f"kvpipe {' '.join(SWEEP)} [--exact]\n\n{sweep_table(args.repeats)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
