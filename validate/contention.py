"""Two copy-engine behaviours the SimPy machine can model, measured through the backend Protocol.

* **The drain rule** (``copy_engine_drains_stream``): copies ``a1`` and ``a2``
  on stream A and ``b1`` on stream B, issued a1, b1, a2 while a1 runs. A
  strictly FIFO engine serves a1, b1, a2; an engine that drains a stream
  serves a2 before b1. The rule is on when b1 ends after a2 in at least two of
  three trials.
* **DRAM contention** (``dram_bytes_per_s``): a memory-bound kernel (a device
  copy of ``kernel_bytes``) timed alone and while a large H2D copy runs on
  another stream. The SimPy machine charges every byte a copy engine moves
  during a kernel ``1 / dram_bytes_per_s`` seconds of that kernel, so
  ``dram_bytes_per_s = bytes the copy moved during the kernel / extra kernel
  time``. Where the kernel is not measurably slower (less than
  ``MIN_SLOWDOWN``), contention cannot be measured and stays off (0).

Each is a host program of backend operations (``validate.micro.run_on``), timed
by the backend's timeline. Units: seconds and bytes.
"""

from __future__ import annotations

import statistics
from typing import Any

from backends.base import Backend, CopyRange, HostOp, Work

MIN_SLOWDOWN = 0.02


def drain_rule(be: Backend, nbytes: int = 64 << 20, trials: int = 3) -> HostOp:
    """Whether the H2D engine finishes a stream's queued copy before another stream's earlier one. Blocks."""
    a, b = be.create_stream(0, "drain_a"), be.create_stream(0, "drain_b")
    dev = be.alloc(0, 3 * nbytes, "drain_dev")
    host = be.alloc_host(3 * nbytes, "drain_host", pinned=True)
    votes = []
    for t in range(trials):
        yield from be.copy(a, dev, host, [CopyRange(0, 0, nbytes)], tag=f"drain{t}_a1")
        yield from be.copy(b, dev, host, [CopyRange(nbytes, nbytes, nbytes)], tag=f"drain{t}_b1")
        yield from be.copy(a, dev, host, [CopyRange(2 * nbytes, 2 * nbytes, nbytes)], tag=f"drain{t}_a2")
        yield from be.synchronize(a)
        yield from be.synchronize(b)
        spans = {s.name: s for s in be.timeline() if s.track in (a.name, b.name) and s.name.startswith(f"drain{t}_")}
        votes.append(spans[f"drain{t}_b1"].end_s > spans[f"drain{t}_a2"].end_s)
    be.free(dev)
    be.free(host)
    return {"drains": sum(votes) >= 2, "votes": votes}


def dram_contention(be: Backend, kernel_bytes: int = 1 << 30, copy_bytes: int = 4 << 30, kernels: int = 12) -> HostOp:
    """``dram_bytes_per_s`` (0 when not measurable) and the kernel times it came from. Blocks the host for it."""
    k, c = be.create_stream(0, "dram_kernel"), be.create_stream(0, "dram_copy")
    src, dst = be.alloc(0, kernel_bytes, "dram_src"), be.alloc(0, kernel_bytes, "dram_dst")
    cdev = be.alloc(0, copy_bytes, "dram_copy_dev")
    host = be.alloc_host(copy_bytes, "dram_copy_host", pinned=True)

    def work(name: str) -> Work:
        def run(xp: Any) -> None:
            dst.array[...] = src.array

        return Work(name, 2 * kernel_bytes / 2e12, 1, run if src.array is not None else None)

    for i in range(kernels):
        yield from be.launch(k, work(f"alone{i}"))
    yield from be.synchronize(k)
    yield from be.copy(c, cdev, host, [CopyRange(0, 0, copy_bytes)], tag="dram_h2d")
    for i in range(kernels):
        yield from be.launch(k, work(f"during{i}"))
    yield from be.synchronize(k)
    yield from be.synchronize(c)
    spans = be.timeline()
    copy = next(s for s in spans if s.track == c.name and s.name == "dram_h2d")
    rate = copy_bytes / (copy.end_s - copy.start_s)
    alone = [s.end_s - s.start_s for s in spans if s.track == k.name and s.name.startswith("alone")][1:]
    during = [s.end_s - s.start_s for s in spans if s.track == k.name and s.name.startswith("during")
              and s.start_s >= copy.start_s and s.end_s <= copy.end_s]
    for buf in (src, dst, cdev, host):
        be.free(buf)
    t_alone = statistics.median(alone) if alone else 0.0
    t_during = statistics.median(during) if during else 0.0
    slower = (t_during - t_alone) / t_alone if t_alone > 0 and during else 0.0
    dram = rate * t_during / (t_during - t_alone) if slower >= MIN_SLOWDOWN else 0.0
    return {"dram_bytes_per_s": dram, "kernel_alone_s": t_alone, "kernel_during_copy_s": t_during,
            "kernels_inside_copy": len(during), "copy_bytes_per_s": rate, "slowdown": slower}
