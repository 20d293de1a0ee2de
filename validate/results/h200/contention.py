"""Does an H2D copy slow the GPU's kernels, and the kernels the copy? A CuPy micro-measurement (device only).

Kernels like the decode program's attention (f16 rows decoded to float32, a
grouped score product, softmax, the value product) run on one non-blocking
stream, alone and while a 4 GiB pinned H2D copy runs on another. Each is timed
with CUDA events, median of 5. Prints one JSON object. Usage on the device:

    python3 validate/results/h200/contention.py > contention.json
"""

from __future__ import annotations

import json
import statistics

import cupy as cp
import cupyx
import numpy as np

ROWS, HEADS, DIM, GROUP = 65536, 8, 128, 4  # llama-3.1-8b's K of one layer at 65,536 rows, f16


def attention(k16: cp.ndarray, v16: cp.ndarray, q: cp.ndarray) -> cp.ndarray:
    k = k16.astype(cp.float32).reshape(ROWS, HEADS, DIM).transpose(1, 2, 0)
    s = q @ cp.ascontiguousarray(k) / np.float32(np.sqrt(DIM))
    p = cp.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    v = cp.ascontiguousarray(v16.astype(cp.float32).reshape(ROWS, HEADS, DIM).transpose(1, 0, 2))
    return p @ v


def timed(fn, stream: cp.cuda.Stream) -> float:
    a, b = cp.cuda.Event(), cp.cuda.Event()
    with stream:
        a.record(stream)
        fn()
        b.record(stream)
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) * 1e-3


def main() -> None:
    ks, ts = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    rng = cp.random.RandomState(0)
    k16 = rng.standard_normal((ROWS, HEADS * DIM), dtype=cp.float32).astype(cp.float16)
    v16 = rng.standard_normal((ROWS, HEADS * DIM), dtype=cp.float32).astype(cp.float16)
    q = rng.standard_normal((HEADS, GROUP, DIM), dtype=cp.float32)
    copy_bytes = 4 << 30
    host = cupyx.empty_pinned((copy_bytes,), dtype=np.uint8)
    host[::4096] = 1
    dev = cp.empty((copy_bytes,), dtype=cp.uint8)
    big = cp.empty((1 << 30,), dtype=cp.float32)
    kernels = {
        "attention_f16_65536": lambda: attention(k16, v16, q),
        "elementwise_4GiB": lambda: big.__imul__(np.float32(1.0000001)),
    }
    out: dict[str, dict[str, float]] = {}
    for name, fn in kernels.items():
        for _ in range(2):
            timed(fn, ks)
        alone, under = [], []
        copy_alone = timed(lambda: dev.data.copy_from_host_async(host.ctypes.data, copy_bytes, ts), ts)
        for _ in range(5):
            alone.append(timed(fn, ks))
            ca, cb = cp.cuda.Event(), cp.cuda.Event()
            ca.record(ts)
            dev.data.copy_from_host_async(host.ctypes.data, copy_bytes, ts)
            cb.record(ts)
            t = timed(fn, ks)
            cb.synchronize()
            under.append(t)
        out[name] = {"alone_ms": statistics.median(alone) * 1e3, "under_copy_ms": statistics.median(under) * 1e3,
                     "slowdown": statistics.median(under) / statistics.median(alone),
                     "copy_alone_GBps": copy_bytes / copy_alone / 1e9}
    cp.cuda.runtime.deviceSynchronize()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
