"""Which H2D copy does a CUDA copy engine serve next? (evidence for docs/reproduction.md)

Stream s1 gets copy A (256 MiB), stream s2 then copy C, stream s1 then copy B (256 MiB), all
from pinned memory without host waits; CUDA events after each give completion times from a
start event. In arrival order C would finish before B. Cases: as is; with A already running
when C is issued (2 ms host sleep); with an event record + wait on s1 between A and B; with C
large (64 MiB). Run on a CUDA machine with CuPy:

    OUT=out python3 docs/figures/reproduction-engine-order.py      # writes $OUT/engine_order.json
"""

from __future__ import annotations

import json
import os
import time

import cupy as cp

BIG, SMALL, H2D = 256 << 20, 256 << 10, 1


def main() -> None:
    rt = cp.cuda.runtime
    host = cp.cuda.alloc_pinned_memory(BIG)
    d1, d2, d3 = cp.cuda.alloc(BIG), cp.cuda.alloc(BIG), cp.cuda.alloc(SMALL)
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)

    def mark(stream: cp.cuda.Stream) -> cp.cuda.Event:
        e = cp.cuda.Event()
        e.record(stream)
        return e

    out = {}
    for case in ("A,C,B", "A,sleep,C,B", "A,C,rec+wait,B", "A,sleep,C,B big C"):
        res = []
        for _ in range(5):
            cp.cuda.Device().synchronize()
            t0 = mark(s1)
            s2.wait_event(t0)
            rt.memcpyAsync(d1.ptr, host.ptr, BIG, H2D, s1.ptr)
            a = mark(s1)
            if "sleep" in case:
                time.sleep(0.002)
            n_c = BIG // 4 if "big C" in case else SMALL
            rt.memcpyAsync(d3.ptr if n_c == SMALL else d2.ptr, host.ptr, n_c, H2D, s2.ptr)
            c = mark(s2)
            if "rec+wait" in case:
                s1.wait_event(mark(s1))
            rt.memcpyAsync(d2.ptr if n_c == SMALL else d1.ptr, host.ptr, BIG, H2D, s1.ptr)
            b = mark(s1)
            cp.cuda.Device().synchronize()
            res.append({k: cp.cuda.get_elapsed_time(t0, e) for k, e in (("A", a), ("C", c), ("B", b))})
        out[case] = res
        print(case, [(round(r["A"], 2), round(r["C"], 2), round(r["B"], 2)) for r in res], flush=True)
    with open(os.environ.get("OUT", "/tmp") + "/engine_order.json", "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
