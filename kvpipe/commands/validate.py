"""``kvpipe validate``: run the grid on the GPU through the same scheduler and hold the simulation to it.

For every (model, cache type, context) of the grid flags it runs the decode
program at every (depth, budget) -- A/B/A/B order, ``--reps`` repetitions,
``--warmup`` graphs excluded -- on the CuPy backend, simulates the same
points on the calibrated profile (``--hardware FILE`` from ``kvpipe
calibrate``), and writes the report folder ``--out`` (report.json,
report.md, plots). ``--trace FILE`` writes the GPU timelines as a Chrome
trace. Exit codes: 0 when the exactness gate holds, 1 when any depth's
per-step logits hashes differ from depth 0's (the gate fails loudly), 2 on bad
input or without a GPU (``--machine simpy`` runs the same code on the
simulated machine).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from kvpipe.commands.args import UsageError, add_grid_args, points_from_args


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="GPU vs simulation over a grid, with the exactness gate")
    add_grid_args(p, exact=False)
    p.set_defaults(model="llama-3.1-8b,qwen3.8-27b", context="4096,16384,65536", depth="0,1,2,4", budget="0",
                   tokens=4, hardware="calibrated.json")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every arm (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="graphs run before the timed ones in every run (default 1)")
    p.add_argument("--scale", type=float, default=1.0, help="hidden/FFN/vocab of the program as a fraction of the model's")
    p.add_argument("--out", default="validate-report", help="report folder (default validate-report)")
    p.add_argument("--trace", metavar="FILE", help="write the measured timelines as a Chrome trace")
    p.add_argument("--machine", default="cupy", help="cupy (the GPU) or simpy (the simulated --hardware, for checks)")
    p.add_argument("--no-reference-arms", dest="reference_arms", action="store_false",
                   help="skip each group's resident and copy-only arms (no measured ceiling)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from backends.base import BackendUnavailable
    from sim.safe_write import check_folder
    from validate import driver

    points = points_from_args(args)
    if args.reps < 1 or args.warmup < 0 or not 0 < args.scale <= 1:
        raise UsageError("--reps must be >= 1, --warmup >= 0, --scale in (0, 1]")
    check_folder(args.out)  # before the measurements: a report that cannot be written is known now
    if any(p.workload.gpu_layer_start for p in points):
        raise UsageError("--n-gpu-layers below the layer count: validate runs every layer on the GPU (the decode program "
                         "models GPU kernels); allowed: -ngl >= the model's layers")
    if len({p.hardware.name for p in points}) != 1:
        raise UsageError("--hardware: give one calibrated profile")
    profile = points[0].hardware
    try:
        be, xp, info = driver.machine(args.machine, profile)
    except BackendUnavailable as exc:
        raise UsageError(driver.unavailable_message(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    command = "kvpipe " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "kvpipe validate"
    doc = driver.run_validate(be, xp, info, points, profile, args.out, args.reps, args.warmup, args.scale, command, args.trace,
                              reference_arms=args.reference_arms)
    s = doc["summary"]
    print(f"wrote {args.out}/report.md: {s['points']} points, median |error| {s['median_abs_error']:.1%}, "
          f"max {s['max_abs_error']:.1%}, deliveries at {s['delivery_share_of_peak_median']:.1%} of peak H2D")
    if not s["exactness_gate"]:
        bad = [f"{g['model']}@{g['context']}" + (f" x{g['parallel']}" if g.get("parallel", 1) > 1 else "")
               for g in doc["exactness"]["groups"] if g["mismatches"]]
        print(f"kvpipe validate: EXACTNESS GATE FAILED: output differs across depths at {', '.join(bad)}", file=sys.stderr)
        return 1
    print("exactness gate: identical per-step logits hashes at every depth")
    return 0
