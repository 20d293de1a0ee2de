"""kvpipe's own decode schedule on a real GPU, kernels replaced by spin kernels of the model's durations.

Evidence for docs/reproduction.md ("the copy engine drains a stream"): the scheduler
(sim.transport.scheduler via sim.run.decode.run_decode) drives the CuPy backend exactly as it drives the
SimPy machine; a GPU split with no program is a one-thread spin kernel of the split's
``compute_s`` (no DRAM traffic, so copies and kernels do not contend), a CPU split a host busy
wait. The link and host are the GPU's own; the split durations are the reference card's
(rtx4070-gen4x16 compute). Run on a machine with a CUDA GPU and CuPy, from the repository root:

    PYTHONPATH=. OUT=out python3 docs/figures/reproduction-gpu-schedule.py 16384,65536,131072

It writes $OUT/gpu_schedule.json (per point: mean ms per token over tokens 3..7 and the
breakdown) and $OUT/gpu_trace.json (a Chrome trace of the largest context at depth 1).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import replace

from backends.base import drive
from backends.cupy_gpu import CupyGPU
from backends.profile import load_profile
from sim.run.decode import run_decode
from sim.run.point import Point
from sim.telemetry import chrome_trace
from sim.transport.scheduler import TransportConfig
from sim.workload import Workload, cache_type, load_model


def main() -> None:
    out = os.environ.get("OUT", "/tmp")
    contexts = [int(c) for c in sys.argv[1].split(",")]
    h200 = load_profile("h200-gen5x16-kvpipe")
    rtx = load_profile("rtx4070-gen4x16")
    hw = replace(h200, devices=(replace(h200.devices[0], compute=rtx.devices[0].compute),), name="h200-link-rtx4070-compute")
    q8 = cache_type("q8_0")
    be = CupyGPU(trace=True)
    rows, traces = [], []
    for ctx in contexts:
        for depth in (0, 1, 2):
            point = Point(Workload(load_model("qwen3.8-27b"), q8, q8, (ctx,), tokens=7), hw, TransportConfig(depth=depth, budget_mib=0))
            n0 = len(be.timeline())
            t = time.perf_counter()
            _, stats = drive(run_decode(be, point))
            wall = time.perf_counter() - t
            g = stats[2:]
            spans = be.timeline()[n0:]
            r = {"context": ctx, "depth": depth, "ms": 1e3 * statistics.mean(s.total_s for s in g),
                 "blocked_ms": 1e3 * statistics.mean(s.blocked_ordered_s for s in g),
                 "consumer_ms": 1e3 * statistics.mean(s.consumer_wait_s for s in g),
                 "issue_ms": 1e3 * statistics.mean(s.issue_s for s in g),
                 "early_mib": statistics.mean(s.early_bytes for s in g) / 2**20, "wall_s": wall,
                 "h2d_busy_ms_total": 1e3 * sum(s.end_s - s.start_s for s in spans if s.track.startswith("h2d")),
                 "tokens": len(stats)}
            rows.append(r)
            print(json.dumps(r), flush=True)
            if depth == 1 and ctx == max(contexts):
                traces.append((f"gpu ctx={ctx} depth={depth}", spans))
    with open(f"{out}/gpu_schedule.json", "w") as f:
        json.dump({"hardware": hw.name, "rows": rows, "device": be.describe()}, f, indent=1)
    with open(f"{out}/gpu_trace.json", "w") as f:
        json.dump(chrome_trace(traces), f)


if __name__ == "__main__":
    main()
