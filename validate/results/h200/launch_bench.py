"""Host microseconds to launch a captured graph of 8 kernels: raw, and through the CuPy backend's launch (device only).

Prints one JSON object: ``raw_us`` (graph.launch alone), ``backend_traced_us`` (CupyGPU.launch with its timing
events, as validate runs it; the median of its host spans), ``backend_untraced_us`` (tracing off), medians of
2,000 launches each. Usage on the device: ``python3 validate/results/h200/launch_bench.py``.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from backends.base import Work, drive
from backends.cupy_gpu import CupyGPU

N = 2000
SRC = 'extern "C" __global__ void nop(float* x) { if (threadIdx.x == 0) x[0] += 1.f; }'


def main() -> None:
    out = {}
    for traced in (True, False):
        be = CupyGPU(trace=traced)
        cp = be.cp
        st = be.create_stream(0, "consumer0")
        k, x, cap = cp.RawKernel(SRC, "nop"), cp.zeros(1, cp.float32), cp.cuda.Stream(non_blocking=True)
        k((1,), (32,), (x,), stream=cap)
        cap.synchronize()
        cap.begin_capture()
        for _ in range(8):
            k((1,), (32,), (x,), stream=cap)
        g = cap.end_capture()
        if traced:
            ts = []
            for _ in range(N):
                t = time.perf_counter()
                g.launch(st.handle)
                ts.append(time.perf_counter() - t)
            st.handle.synchronize()
            out["raw_us"] = statistics.median(ts) * 1e6
        def replay(xp: Any, graph: Any = g) -> None:
            graph.launch(xp.cuda.get_current_stream())

        work = Work("gpu_bench", 0.0, 1, replay)
        ts = []
        for _ in range(N):
            t = time.perf_counter()
            drive(be.launch(st, work))
            ts.append(time.perf_counter() - t)
        st.handle.synchronize()
        key = "backend_traced_us" if traced else "backend_untraced_us"
        out[key] = statistics.median(ts) * 1e6
        if traced:
            spans = [s.end_s - s.start_s for s in be.timeline() if s.track == "host" and s.name == "launch gpu_bench"]
            out["backend_traced_span_us"] = statistics.median(spans) * 1e6
    print(json.dumps(out))


if __name__ == "__main__":
    main()
