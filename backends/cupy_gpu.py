"""The CuPy machine: the backend Protocol on a real CUDA GPU.

Every operation does the CUDA call and yields nothing, so ``backends.base.drive``
runs the scheduler's host program here exactly as SimPy runs it there:

* *Streams* are non-blocking ``cupy.cuda.Stream`` objects (one consumer and
  one transfer stream per device, as the scheduler asks).
* *Events* are ``cupy.cuda.Event`` objects without timing (ready/release per
  ring slot); every copy and kernel is also bracketed by a pair of *timing*
  events, from which :meth:`CupyGPU.timeline` builds spans in seconds relative
  to a base event recorded at construction -- the same tracks the SimPy
  machine writes (``consumer0``, ``transfer0``, ``host``, and the copy engines
  ``h2d0``/``d2h0``), so the two Chrome traces read alike.
* *Copies* arrive checked and shaped by the base class
  (``backends.machine.Machine``, the same rule as the SimPy machine's): each
  call of the plan is one raw ``cudaMemcpyAsync`` (height 1) or
  ``cudaMemcpy2DAsync`` (a strided range, or several ranges sharing a length
  and a stride) on the given stream. From pageable host memory the host
  blocks until the copy is done, as the SimPy machine models it (and as CUDA
  roughly does).
* *Device memory* is ``cupy.cuda.memory.Memory``: one ``cudaMalloc`` per
  request, outside the memory pool, held by the Buffer until :meth:`free`, so
  nothing can hand a ring slot to someone else while a copy is in flight.
  Host memory is pinned (``cupyx.empty_pinned``) or a plain NumPy array.
* *Kernels*: ``launch`` runs ``work.run(cupy)`` inside ``with stream:`` so
  every CuPy kernel it issues lands on that stream; a Work without ``run``
  (timing-only) becomes one spin kernel of ``work.duration_s``.

CuPy is imported when the backend is built, never at module import of
``sim``; without CuPy or a CUDA device construction raises
BackendUnavailable. The array module is ``xp`` (``cp``, its older name, is
kept); ``run`` drives a host program (``backends.base.drive``). Units:
seconds and bytes; CUDA's milliseconds are converted once, in
:meth:`timeline`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends.base import (
    BackendError,
    BackendUnavailable,
    Buffer,
    CopyPlan,
    CopyRange,
    Event,
    HostOp,
    OutOfDeviceMemory,
    Span,
    SpanKind,
    Stream,
    Work,
)
from backends.machine import Machine

H2D, D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost

_SPIN_SRC = r"""
extern "C" __global__ void kvpipe_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def import_cupy() -> Any:
    """CuPy, or BackendUnavailable with a one-line reason. Does not block."""
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailable(f"CuPy is not installed ({exc.name or exc}); install kvpipe[gpu]") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver or device
        raise BackendUnavailable(f"no CUDA device: {exc}") from None
    if n < 1:
        raise BackendUnavailable("no CUDA device")
    return cupy


class CupyGPU(Machine):
    """The backend Protocol on CUDA devices through CuPy. Construct once per process; raises BackendUnavailable."""

    name = "cupy"

    def __init__(self, trace: bool = True) -> None:
        cp = import_cupy()
        self.xp = self.cp = cp  # ``cp``: the name callers used before ``xp``
        self.rt = cp.cuda.runtime
        self.tracing = trace
        self._n = self.rt.getDeviceCount()
        self._pending: list[tuple[tuple[str, ...], str, SpanKind, Any, Any, dict[str, Any]]] = []
        self._free_events: list[Any] = []
        self._host_spans: list[Span] = []
        self._resolved: list[Span] = []
        self._spin: Any = None
        self._base: list[Any] = []
        for d in range(self._n):
            with cp.cuda.Device(d):
                ev = cp.cuda.Event()
                ev.record(cp.cuda.Stream.null)
                ev.synchronize()
                self._base.append(ev)
        self._t0 = time.perf_counter()

    # --------------------------------------------------------- describe

    def describe(self) -> dict[str, Any]:
        """Device name, memory, driver, runtime and CuPy versions (plain data). Does not block."""
        props = self.rt.getDeviceProperties(0)
        name = props["name"]
        free, total = self.rt.memGetInfo()
        return {
            "device": name.decode() if isinstance(name, bytes) else str(name),
            "device_count": self._n,
            "memory_total_bytes": int(total),
            "memory_free_bytes": int(free),
            "driver_version": int(self.rt.driverGetVersion()),
            "runtime_version": int(self.rt.runtimeGetVersion()),
            "cupy_version": str(self.cp.__version__),
            "numpy_version": str(np.__version__),
        }

    # --------------------------------------------------------- Protocol

    def now_s(self) -> float:
        """Host clock in seconds since construction. Does not block."""
        return time.perf_counter() - self._t0

    def device_count(self) -> int:
        """Number of CUDA devices. Does not block."""
        return self._n

    def _create_stream(self, device: int, name: str) -> Stream:
        """A new non-blocking CUDA stream on ``device``. Does not block."""
        with self.cp.cuda.Device(device):
            return Stream(name, device, self.cp.cuda.Stream(non_blocking=True))

    def _create_event(self, device: int, name: str) -> Event:
        """A new CUDA event (timing disabled) on ``device``. Does not block."""
        with self.cp.cuda.Device(device):
            return Event(name, device, self.cp.cuda.Event(disable_timing=True))

    def _record(self, event: Event, stream: Stream) -> HostOp:
        """cudaEventRecord at the tail of ``stream``. The host does not block."""
        event.handle.record(stream.handle)
        return
        yield  # pragma: no cover - a host op is a generator

    def _wait_event(self, stream: Stream, event: Event) -> HostOp:
        """cudaStreamWaitEvent (a never-recorded event is no wait, as in CUDA). The host does not block."""
        if event.recorded:
            stream.handle.wait_event(event.handle)
        return
        yield  # pragma: no cover

    def _copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], plan: CopyPlan, tag: str) -> HostOp:
        """The copy hook: one raw async copy per call of the plan, on ``stream``, between a pair of timing events.

        The host does not block, except from pageable host memory, where it
        waits until the stream has finished the copy.
        """
        to_device = plan.to_device
        dev = dst.device if to_device else src.device
        kind = H2D if to_device else D2H
        sp, dp, sptr = stream.handle.ptr, _ptr(dst), _ptr(src)
        start = self._mark(stream)
        for c in plan.calls:
            if c.height > 1:
                self.rt.memcpy2DAsync(dp + c.dst_offset, c.dst_pitch, sptr + c.src_offset, c.src_pitch, c.width, c.height, kind, sp)
            else:
                self.rt.memcpyAsync(dp + c.dst_offset, sptr + c.src_offset, c.width, kind, sp)
        engine = f"{'h2d' if to_device else 'd2h'}{dev}"
        self._done(stream, start, (stream.name, engine), tag or f"{src.name}->{dst.name}", SpanKind.COPY, bytes=plan.nbytes,
                   stream=stream.name)
        host_side = src if to_device else dst
        if not host_side.pinned:
            yield from self._synchronize(stream)

    def launch(self, stream: Stream, work: Work) -> HostOp:
        """Enqueue ``work.run(cupy)`` on ``stream`` (a spin kernel of ``duration_s`` if it has none). The host does not block."""
        t = self.now_s()
        start = self._mark(stream)
        with stream.handle:
            if work.run is not None:
                work.run(self.cp)
            elif work.duration_s > 0:
                self._spin_kernel()((1,), (1,), (np.uint64(int(work.duration_s * 1e9)),))
        self._done(stream, start, (stream.name,), work.name, SpanKind.KERNEL)
        self._host_span(f"launch {work.name}", t, SpanKind.LAUNCH, work=work.kind.value)
        return
        yield  # pragma: no cover

    def run_host(self, work: Work) -> HostOp:
        """Run ``work.run(numpy)`` on the host thread (a sleep of ``duration_s`` if it has none). Blocks the host."""
        t = self.now_s()
        if work.run is not None:
            work.run(np)
        elif work.duration_s > 0:
            _busy_wait(work.duration_s)
        self._host_span(work.name, t, SpanKind.HOST_WORK)
        return
        yield  # pragma: no cover

    def _synchronize(self, stream: Stream) -> HostOp:
        """cudaStreamSynchronize: blocks the host until ``stream`` is idle."""
        t = self.now_s()
        stream.handle.synchronize()
        self._host_span(f"sync {stream.name}", t, SpanKind.SYNC)
        return
        yield  # pragma: no cover

    def _wait_host(self, event: Event) -> HostOp:
        """cudaEventSynchronize: blocks the host until ``event`` (if recorded) has completed."""
        if event.recorded:
            t = self.now_s()
            event.handle.synchronize()
            self._host_span(f"wait {event.name}", t, SpanKind.WAIT)
        return
        yield  # pragma: no cover

    def _alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        """The alloc hook: one cudaMalloc of ``nbytes`` outside the memory pool, kept until :meth:`free`. Raises OutOfDeviceMemory."""
        cp = self.cp
        with cp.cuda.Device(device):
            try:
                mem = cp.cuda.memory.Memory(max(int(nbytes), 1))
            except (cp.cuda.memory.OutOfMemoryError, cp.cuda.runtime.CUDARuntimeError) as exc:
                raise OutOfDeviceMemory(f"{name}: {nbytes} B on device {device}: {exc}") from None
            array = cp.ndarray((int(nbytes),), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))
        return Buffer(name, int(nbytes), device, True, array, mem)

    def alloc_host(self, nbytes: int, name: str, pinned: bool = True) -> Buffer:
        """Host memory: pinned (``cupyx.empty_pinned``) or pageable (NumPy). Does not block."""
        if pinned:
            import cupyx

            array = cupyx.empty_pinned((int(nbytes),), dtype=np.uint8)
        else:
            array = np.empty(int(nbytes), dtype=np.uint8)
        return Buffer(name, int(nbytes), -1, pinned, array)

    def _free(self, buffer: Buffer) -> None:
        """Return the buffer's memory (its array dropped: cudaFree, or back to the pinned pool)."""
        if buffer.on_host and buffer.pinned:
            self.cp.get_default_pinned_memory_pool().free_all_blocks()

    def free_bytes(self, device: int) -> int:
        """Free device memory in bytes (cudaMemGetInfo). Does not block."""
        self._check_device(device)
        with self.cp.cuda.Device(device):
            return int(self.rt.memGetInfo()[0])

    def timeline(self) -> list[Span]:
        """Spans of every timed copy and kernel so far, in seconds from construction.

        Blocks the host until the timed work has finished (it reads CUDA event
        timestamps). Copy-engine tracks are serialised in completion order: a
        copy starts no earlier than the previous copy of its direction ended.
        """
        spans = list(self._host_spans)
        engine: dict[str, list[Span]] = {}
        for tracks, name, kind, ev0, ev1, args in self._pending:
            ev1.synchronize()
            dev = args.pop("_device", 0)
            base = self._base[dev]
            t0 = self.cp.cuda.get_elapsed_time(base, ev0) * 1e-3
            t1 = self.cp.cuda.get_elapsed_time(base, ev1) * 1e-3
            for track in tracks:
                span = Span(track, name, t0, t1, dict(args), kind)
                if track[:3] in ("h2d", "d2h"):
                    engine.setdefault(track, []).append(span)
                else:
                    spans.append(span)
            self._free_events += [ev0, ev1]
        self._pending = []
        self._host_spans = []
        self._resolved += spans
        for track, lst in engine.items():
            lst.sort(key=lambda s: s.end_s)
            prev = -1.0
            for s in lst:
                start = max(s.start_s, prev)
                self._resolved.append(Span(track, s.name, start, s.end_s, s.args, s.kind))
                prev = s.end_s
        return sorted(self._resolved, key=lambda s: (s.start_s, s.track))

    def clear_timeline(self) -> None:
        """Forget the spans recorded so far (after reading them). Blocks until timed work has finished."""
        self.timeline()
        self._resolved = []

    # ------------------------------------------------------------ inside

    def _event(self) -> Any:
        return self._free_events.pop() if self._free_events else self.cp.cuda.Event()

    def _mark(self, stream: Stream) -> Any:
        if not self.tracing:
            return None
        ev = self._event()
        ev.record(stream.handle)
        return ev

    def _done(self, on: Stream, start: Any, tracks: tuple[str, ...], name: str, kind: SpanKind, **args: Any) -> None:
        if start is None:
            return
        ev = self._event()
        ev.record(on.handle)
        args["_device"] = on.device
        self._pending.append((tracks, name, kind, start, ev, args))

    def _host_span(self, name: str, start_s: float, kind: SpanKind, **args: Any) -> None:
        if self.tracing:
            self._host_spans.append(Span("host", name, start_s, self.now_s(), args, kind))

    def _spin_kernel(self) -> Any:
        if self._spin is None:
            self._spin = self.cp.RawKernel(_SPIN_SRC, "kvpipe_spin")
        return self._spin


def _ptr(buffer: Buffer) -> int:
    """Raw address of a buffer's first byte (device or host)."""
    a = buffer.array
    if a is None:
        raise BackendError(f"buffer {buffer.name} has no memory (freed?)")
    if isinstance(a, np.ndarray):
        return int(a.ctypes.data)
    return int(a.data.ptr)


def _busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
