"""Micro-measurements of a machine through the backend Protocol.

``kvpipe calibrate`` learns a device the way the scheduler uses it: every
number here comes from the backend's own operations (``copy``, ``launch``,
``record``, ``synchronize``) timed by the backend's own clocks -- CUDA event
timestamps for what a stream did (``timeline()``), the host clock
(``now_s()``) for what the host thread paid. Each measurement is a host
program (a generator of backend operations), so the same code measures a real
GPU (driven by ``backends.base.drive``) and the SimPy machine (run as a SimPy
process); on the SimPy machine it recovers the profile the machine was built
from, which is how ``tests/validate/test_micro.py`` checks it without a GPU.

* Host costs: issuing a copy, launching one kernel, recording/waiting an event,
  and the wake-up of a host wait (a blocking round trip minus its parts).
* Link curves: time of one copy by size, pinned and pageable, both directions;
  latency from a tiny copy, then bandwidth(size) = size / (time - latency),
  which :class:`backends.profile.LinkCurve` turns back into each measured time,
  up to two approximations: the latency includes the tiny copy's own bytes,
  and a bandwidth is capped at 1.02 x the best plain rate (on the H200 preset
  the 1 MiB copy comes back 5.7% slower than measured).
* Copy engines: whether a small copy on a second stream waits behind a big one
  (FIFO, one engine per direction) and how much H2D and D2H slow each other.

Units: seconds and bytes; the file format's units appear only in
:func:`curve_points`.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from backends.base import Backend, CopyRange, HostOp, Work

MIB = 1 << 20
LATENCY_PROBE_BYTES = 256
LINK_SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30)


def run_on(backend: Backend, program: HostOp) -> Any:
    """Run a host program on ``backend`` (``Backend.run``: a SimPy process there, driven on a real machine). Blocks."""
    return backend.run(program)


def _median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else 0.0


# ------------------------------------------------------------ host costs


def host_costs(be: Backend, reps: int = 200) -> HostOp:
    """Host seconds per event call, copy issue, kernel launch and host wake-up, as this backend pays them.

    Returns a dict with ``event_s``, ``copy_issue_s``, ``launch_s``,
    ``host_wait_s``. Blocks the host for the measurement.
    """
    s = be.create_stream(0, "calib_host")
    ev = be.create_event(0, "calib_ev")
    dev = be.alloc(0, 1 << 16, "calib_dev")
    host = be.alloc_host(1 << 16, "calib_host_buf", pinned=True)

    def tiny(xp: Any) -> None:
        if dev.array is not None:
            dev.array[:256] += 1

    # Warm: first launch compiles the kernel, first copy maps the buffer.
    yield from be.launch(s, Work("calib_warm", 0.0, 1, tiny))
    yield from be.copy(s, dev, host, [CopyRange(0, 0, 4096)], tag="calib_warm")
    yield from be.synchronize(s)

    t = be.now_s()
    for _ in range(reps):
        yield from be.record(ev, s)
        yield from be.wait_event(s, ev)
    event_s = (be.now_s() - t) / (2 * reps)
    yield from be.synchronize(s)

    t = be.now_s()
    for _ in range(reps):
        yield from be.copy(s, dev, host, [CopyRange(0, 0, 64)], tag="calib_issue")
    copy_issue_s = (be.now_s() - t) / reps
    yield from be.synchronize(s)

    t = be.now_s()
    for _ in range(reps):
        yield from be.launch(s, Work("calib_launch", 0.0, 1, tiny))
    launch_s = (be.now_s() - t) / reps
    yield from be.synchronize(s)

    waits = []
    for i in range(max(10, reps // 10)):
        t = be.now_s()
        yield from be.copy(s, dev, host, [CopyRange(0, 0, 64)], tag=f"calib_rt{i}")
        yield from be.synchronize(s)
        waits.append((f"calib_rt{i}", be.now_s() - t))
    spans = {sp.name: sp for sp in be.timeline() if sp.name.startswith("calib_rt") and sp.track == s.name}
    residual = [dt - copy_issue_s - (spans[n].end_s - spans[n].start_s) for n, dt in waits if n in spans]
    host_wait_s = max(0.0, _median(residual))
    be.free(dev)
    be.free(host)
    return {"event_s": event_s, "copy_issue_s": copy_issue_s, "launch_s": launch_s, "host_wait_s": host_wait_s}


# ------------------------------------------------------------ link curves


def copy_times(be: Backend, sizes: Iterable[int], reps: int, host_wait_s: float, copy_issue_s: float) -> HostOp:
    """Seconds one copy of each size occupies the link, and the host's wake-up after a blocking pinned copy.

    Returns ``({(direction, pinned): {size: seconds}}, {(direction, size):
    wake seconds})``. Pinned copies are timed by the stream's own events (the
    wake-up is the host's round trip minus issue and event time); pageable
    copies block the host, so they are timed by the host clock minus the issue
    and wake-up costs (a pageable H2D call stages its bytes and returns with
    the last chunk's DMA in flight, which the synchronize then waits for).
    Blocks the host for the measurement.
    """
    sizes = sorted(set(int(n) for n in sizes) | {LATENCY_PROBE_BYTES})
    top = max(sizes)
    s = be.create_stream(0, "calib_link")
    dev = be.alloc(0, top, "calib_link_dev")
    bufs = {True: be.alloc_host(top, "calib_pinned", pinned=True), False: be.alloc_host(top, "calib_pageable", pinned=False)}
    for b in bufs.values():
        if b.array is not None:
            b.array[:] = 1  # touch every page before timing
    out: dict[tuple[str, bool], dict[int, float]] = {}
    waits: dict[tuple[str, int], float] = {}
    for direction in ("h2d", "d2h"):
        for pinned, hb in bufs.items():
            times: dict[int, float] = {}
            for n in sizes:
                src, dst = (hb, dev) if direction == "h2d" else (dev, hb)
                host_dt = []
                for r in range(reps + 1):
                    t = be.now_s()
                    yield from be.copy(s, dst, src, [CopyRange(0, 0, n)], tag=f"link_{direction}_{pinned}_{n}_{r}")
                    yield from be.synchronize(s)
                    if r:  # the first of each size warms up
                        # wake-ups: the synchronize's and the copy's own (a pinned or pageable D2H copy returns after a wait);
                        # a pageable H2D call returns once its last chunk is staged, without a wait
                        wakes = 1 if not pinned and direction == "h2d" else 2
                        host_dt.append(be.now_s() - t - copy_issue_s - wakes * host_wait_s)
                if pinned:
                    prefix = f"link_{direction}_{pinned}_{n}_"
                    spans = [sp for sp in be.timeline() if sp.track == s.name and sp.name.startswith(prefix) and not sp.name.endswith("_0")]
                    times[n] = _median(sp.end_s - sp.start_s for sp in spans)
                    waits[(direction, n)] = _median(host_dt) + host_wait_s - times[n]
                else:
                    times[n] = max(_median(host_dt), 1e-9)
            out[(direction, pinned)] = times
    be.free(dev)
    for b in bufs.values():
        be.free(b)
    return out, waits


def curve_points(times: dict[int, float]) -> dict[str, Any]:
    """A link curve in the profile file format from copy times by size.

    ``latency_us`` is the time of the tiny probe copy; each larger size gets
    the bandwidth that makes ``latency + size / bandwidth`` its measured time.
    """
    small = [t for n, t in times.items() if n <= 64 << 10]
    latency = min(small) if small else 0.0
    peak = max(n / t for n, t in times.items() if t > 0)
    points = []
    for n in sorted(times):
        if n == LATENCY_PROBE_BYTES:
            continue
        transfer = max(times[n] - latency, 1e-9)
        points.append([n / MIB, min(n / transfer, peak * 1.02) / 1e9])
    return {"latency_us": latency * 1e6, "points": points}


def peak_bytes_per_s(times: dict[int, float], min_bytes: int = 16 << 20) -> float:
    """The best plain rate (size / time, latency included) of copies of at least ``min_bytes``."""
    big = [n / t for n, t in times.items() if n >= min_bytes and t > 0]
    return max(big) if big else max(n / t for n, t in times.items() if t > 0)


# ------------------------------------------------------------ copy engines


def engines(be: Backend, big_bytes: int = 256 << 20, small_bytes: int = 256 << 10) -> HostOp:
    """FIFO and duplex behaviour of the copy engines. Blocks the host for the measurement.

    Returns ``h2d_fifo``/``d2h_fifo`` (a small copy issued on a second stream
    right after a big one finished after it), the times in seconds, and
    ``duplex_slowdown`` (a big H2D and a big D2H at once against each alone).
    """
    a, b = be.create_stream(0, "calib_a"), be.create_stream(0, "calib_b")
    dev = be.alloc(0, 2 * big_bytes, "calib_eng_dev")
    host = be.alloc_host(2 * big_bytes, "calib_eng_host", pinned=True)
    if host.array is not None:
        host.array[:] = 1
    out: dict[str, Any] = {}
    for direction in ("h2d", "d2h"):
        src, dst = (host, dev) if direction == "h2d" else (dev, host)
        for warm in (True, False):
            tag = "warm" if warm else "fifo"
            yield from be.copy(a, dst, src, [CopyRange(0, 0, big_bytes)], tag=f"{tag}_{direction}_big")
            yield from be.copy(b, dst, src, [CopyRange(big_bytes, big_bytes, small_bytes)], tag=f"{tag}_{direction}_small")
            yield from be.synchronize(a)
            yield from be.synchronize(b)
        spans = {sp.name: sp for sp in be.timeline() if sp.track in (a.name, b.name) and sp.name.startswith("fifo_")}
        big, small = spans[f"fifo_{direction}_big"], spans[f"fifo_{direction}_small"]
        out[f"{direction}_fifo"] = small.end_s >= big.end_s - 0.5 * (small.end_s - small.start_s)
        out[f"{direction}_big_done_s"] = big.end_s - big.start_s
        out[f"{direction}_small_done_s"] = small.end_s - big.start_s
    alone: dict[str, float] = {}
    for direction in ("h2d", "d2h"):
        src, dst = (host, dev) if direction == "h2d" else (dev, host)
        yield from be.copy(a, dst, src, [CopyRange(0, 0, big_bytes)], tag=f"alone_{direction}")
        yield from be.synchronize(a)
    yield from be.copy(a, dev, host, [CopyRange(0, 0, big_bytes)], tag="duplex_h2d")
    yield from be.copy(b, host, dev, [CopyRange(big_bytes, big_bytes, big_bytes)], tag="duplex_d2h")
    yield from be.synchronize(a)
    yield from be.synchronize(b)
    spans = {sp.name: sp for sp in be.timeline() if sp.track in (a.name, b.name)}
    for direction in ("h2d", "d2h"):
        alone[direction] = spans[f"alone_{direction}"].end_s - spans[f"alone_{direction}"].start_s
    together = {d: spans[f"duplex_{d}"].end_s - spans[f"duplex_{d}"].start_s for d in ("h2d", "d2h")}
    out["duplex_s"] = together
    out["alone_s"] = alone
    out["duplex_slowdown"] = max(1.0, max(together[d] / alone[d] for d in alone if alone[d] > 0))
    be.free(dev)
    be.free(host)
    return out


def two_d_ratio(be: Backend, width: int = 32 << 20, height: int = 2) -> HostOp:
    """Time of one strided 2D copy over the time of one 1D copy of the same bytes (H2D, pinned). Blocks."""
    s = be.create_stream(0, "calib_2d")
    stride = width + (1 << 20)
    dev = be.alloc(0, stride * height, "calib_2d_dev")
    host = be.alloc_host(stride * height, "calib_2d_host", pinned=True)
    ranges = [CopyRange(i * stride, i * width, width) for i in range(height)]
    for r in range(4):
        yield from be.copy(s, dev, host, ranges, tag=f"twod_{r}")
        yield from be.copy(s, dev, host, [CopyRange(0, 0, width * height)], tag=f"oned_{r}")
    yield from be.synchronize(s)
    spans = [sp for sp in be.timeline() if sp.track == s.name]
    t2 = _median(sp.end_s - sp.start_s for sp in spans if sp.name.startswith("twod_") and sp.name != "twod_0")
    t1 = _median(sp.end_s - sp.start_s for sp in spans if sp.name.startswith("oned_") and sp.name != "oned_0")
    be.free(dev)
    be.free(host)
    return t2 / t1 if t1 > 0 else 1.0
