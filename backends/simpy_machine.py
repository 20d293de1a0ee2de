"""The SimPy machine: a simulated host, GPU streams, copy engines and memory.

A host thread, streams and copy engines are SimPy actors:

* The *host thread* is the process that runs the scheduler's generator. Each
  backend call costs it the profile's issue time (a timeout) and blocks it
  where the real call blocks (synchronize, host event wait, a copy from
  pageable memory, a CPU split).
* A *stream* is a process that takes items from its queue in order and runs
  each to completion before the next: a copy, a kernel, an event record, an
  event wait. An idle stream sleeps on a SimPy event the next enqueue fires;
  ``synchronize`` waits on an event fired when the stream's last item so far
  completes.
* A *copy engine* per direction is a ``simpy.Resource`` shared by every
  stream: copies in one direction run one at a time in the order their streams
  reached them (FIFO across streams, as measured on the H200), so a small
  blocking copy waits behind queued deliveries. Host->device and
  device->host run at once (full duplex, with the profile's slowdown when both
  are busy). Engines, lanes and a copy's engine time live in
  ``backends.simpy_copy``; a copy is checked and shaped into calls by the
  base class (``backends.machine.Machine``), the same way as on a GPU, and
  costs one link time per call.
* *Kernels* run on their stream for their duration. Only the consumer stream
  of a device runs kernels in this design (the transfer stream only copies),
  so kernels of one device never compete and need no shared compute resource.
* *Events* are generations of SimPy events: ``record`` makes a new one that
  fires when the stream reaches it; ``wait_event`` captures the generation
  current at enqueue time, as CUDA does.
* *Memory* is a ledger per device, so budget, headroom and reservation
  failures happen as they would.

In *functional* mode buffers hold NumPy arrays: a copy reads its source and
lands in its destination when it completes (so a write to its source while it
is in flight shows in the bytes, as it may on a real DMA engine); a kernel
runs its ``Work.run`` with NumPy when it completes. Same scheduler, real bytes.

``run`` runs a host program as a SimPy process; ``describe`` is the profile's
device as plain data; the array module ``xp`` is NumPy.

Speed: on its ``FastEnvironment`` (``backends.simpy_env``) a fixed wait, a free engine's grant, a release no one
waits for and a record no one waits on yet are taken in place where SimPy would process them next (same times, same
order); per-copy constants are looked up once per device and direction (a ``_Lane``), link times are memoized per
size, and span names and byte counts are built only when the timeline is recorded.

Units: seconds and bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy

from backends.base import Buffer, CopyPlan, CopyRange, Event, HostOp, OutOfDeviceMemory, Span, SpanKind, Stream, Work, WorkKind
from backends.machine import Machine
from backends.profile import HardwareProfile
from backends.simpy_copy import _Engine, _Lane, calls_seconds, copy_seconds, dram_stretch, next_copy_on
from backends.simpy_env import FastEnvironment

__all__ = ["SimMachine", "copy_seconds"]

#: One entry of a stream's queue: (kind, name, payload); kind is "copy" | "kernel" | "record" | "wait".
_Item = tuple[str, str, Any]


@dataclass(eq=False, slots=True)
class _StreamState:
    """A stream's queue and progress: items run in order; waiters wake when item k has completed."""

    queue: deque[_Item] = field(default_factory=deque)
    enqueued: int = 0
    completed: int = 0
    wake: simpy.Event | None = None
    # (k, event) in ascending k: every waiter is added for the stream's current tail, which only grows.
    waiters: deque[tuple[int, simpy.Event]] = field(default_factory=deque)
    held: Any = None  # (engine, request) kept for this stream's next copy (copy_engine_drains_stream)


def _numpy() -> Any:
    """NumPy, imported on first use: only functional mode moves real bytes (a timing run never imports it)."""
    import numpy

    return numpy


def _nothing() -> HostOp:
    """A host operation that does nothing."""
    return
    yield  # pragma: no cover - makes this a generator


class SimMachine(Machine):
    """A simulated machine behind the backend Protocol. Construct, then run a host program with :meth:`run`."""

    name = "simpy"

    @property
    def xp(self) -> Any:
        """NumPy: the arrays behind functional buffers."""
        return _numpy()

    def __init__(
        self, profile: HardwareProfile, functional: bool = False, trace: bool = True, env: simpy.Environment | None = None
    ) -> None:
        self.profile = profile
        self.functional = functional
        self.tracing = trace
        self.env = env if env is not None else FastEnvironment()
        # a fixed wait taken in place where nothing else could run first (``backends.simpy_env``); not when tracing
        self._advance = self.env.advance if isinstance(self.env, FastEnvironment) and not trace else None
        self.spans: list[Span] = []
        self._used = [d.memory_used_bytes for d in profile.devices]
        self._h2d = [_Engine(self.env, d.h2d_engines) for d in profile.devices]
        self._d2h = [_Engine(self.env, d.d2h_engines) for d in profile.devices]
        self._lanes = {
            (d, to_device, pinned): _Lane(d, to_device, pinned, self._h2d[d], self._d2h[d], profile)
            for d in range(len(profile.devices)) for to_device in (True, False) for pinned in (True, False)
        }
        self._streams: list[Stream] = []
        host = profile.host  # frozen: its costs are read once
        self._event_s, self._issue_s, self._launch_s, self._wait_s = host.event_s, host.copy_issue_s, host.launch_s, host.host_wait_s
        self._split_launch_s = host.split_launch_s
        self._timeout = self.env.timeout
        self._event = self.env.event
        # DRAM shared by copies and kernels: per device, the copies (start, end, bytes) a running kernel may overlap
        self._dram = [d.dram_bytes_per_s for d in profile.devices]
        self._copies: list[deque[tuple[float, float, int]]] = [deque() for _ in profile.devices]

    # ----------------------------------------------------------- driving

    def run(self, program: HostOp) -> Any:
        """Run a host program (a generator of backend ops) as a SimPy process to completion; returns its value.

        Blocks until the simulation reaches the program's end (simulated time, not the host's).
        """
        proc = self.env.process(program)
        if isinstance(self.env, FastEnvironment):
            return self.env.run_until(proc)
        self.env.run(until=proc)
        return proc.value

    def describe(self) -> dict[str, Any]:
        """The profile's machine as plain data (device 0's memory; no driver, runtime or CuPy). Does not block."""
        dev = self.profile.devices[0]
        return {"device": f"SimPy machine ({self.profile.name})", "device_count": len(self.profile.devices),
                "memory_total_bytes": dev.memory_total_bytes, "memory_free_bytes": self.free_bytes(0),
                "driver_version": None, "runtime_version": None, "cupy_version": None,
                "numpy_version": _numpy().__version__, "profile": self.profile.name, "estimate": self.profile.estimate}

    def _span(self, track: str, name: str, start: float, kind: SpanKind, **args: Any) -> None:
        if self.tracing:
            self.spans.append(Span(track, name, start, self.env.now, args, kind))

    def _busy(self, seconds: float, kind: SpanKind, what: str, name: str = "", **args: Any) -> simpy.Timeout:
        """The host thread busy for ``seconds`` (> 0): the timeout to yield (callers first try ``self._advance``:
        the same time, in place); its span ``what + name`` (of ``kind``) is recorded when it fires, just before the
        host resumes (where a span recorded after the yield would go)."""
        ev = self._timeout(seconds)
        if self.tracing:
            t = self.env._now
            ev.callbacks.append(lambda _: self.spans.append(Span("host", what + name, t, self.env.now, args, kind)))
        return ev

    # --------------------------------------------------------- Protocol

    def now_s(self) -> float:
        return float(self.env._now)  # (the clock itself: ``now`` is a property, read at every host call)

    def device_count(self) -> int:
        return len(self.profile.devices)

    def _create_stream(self, device: int, name: str) -> Stream:
        st = Stream(name, device, handle=_StreamState())
        self._streams.append(st)
        self.env.process(self._stream_loop(st))
        return st

    def _create_event(self, device: int, name: str) -> Event:
        return Event(name, device, handle=None)

    def _record(self, event: Event, stream: Stream) -> HostOp:
        if self._event_s > 0:
            if self._advance is None or not self._advance(self._event_s):  # (in place: no timeout)
                yield self._busy(self._event_s, SpanKind.RECORD, "record ", event.name)
        gen = self._event()
        event.handle = gen
        self._enqueue(stream, ("record", event.name, gen))

    def _wait_event(self, stream: Stream, event: Event) -> HostOp:
        if self._event_s > 0:
            if self._advance is None or not self._advance(self._event_s):
                yield self._busy(self._event_s, SpanKind.WAIT, "wait ", event.name)
        if event.handle is not None:
            self._enqueue(stream, ("wait", event.name, event.handle))

    def _copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], plan: CopyPlan, tag: str) -> HostOp:
        """The copy hook: one copy issue of host time, then the plan on ``stream``; blocks the host from pageable memory."""
        if self._issue_s > 0:
            if self._advance is None or not self._advance(self._issue_s):
                yield self._busy(self._issue_s, SpanKind.ISSUE, "issue ", tag)
        to_device = plan.to_device
        host_side, dev_side = (src, dst) if to_device else (dst, src)
        lane = self._lanes[dev_side.device, to_device, host_side.pinned]
        name = tag or f"{src.name}->{dst.name}"
        if not host_side.pinned and to_device:
            yield from self._pageable_h2d(stream, name, dst, src, plan, lane)
            return
        k = self._enqueue(stream, ("copy", name, (dst, src, plan, lane, None)))  # (dst, src, plan, lane, pageable chunk)
        if not host_side.pinned:  # pageable D2H: the call returns once the bytes are in the pageable buffer
            yield from self._wait_done(self._completion(stream, k), SpanKind.SYNC, "pageable copy")

    def _pageable_h2d(self, stream: Stream, name: str, dst: Buffer, src: Buffer, plan: CopyPlan, lane: _Lane) -> HostOp:
        """A pageable H2D copy as the driver runs it: sync the stream, stage chunk by chunk on this (host) thread into
        two staging buffers, each staged chunk DMA'd on the stream at the pinned rate; return once the last is staged.

        The bytes move with the last chunk's DMA, as they were when the call returned (the staging buffers hold them:
        the host may write its pageable buffer again at once).
        """
        st: _StreamState = stream.handle
        if st.completed < st.enqueued:  # "a stream sync is performed before the copy is initiated" (idle: nothing to wait)
            yield from self._synchronize(stream)
        chunks = lane.staging(plan.nbytes)
        staged = src
        if self.functional and src.array is not None:
            staged = Buffer(f"{src.name}@staging", src.nbytes, src.device, True, src.array.copy())
        done: list[int] = []
        for i, (stage_s, nbytes, dma_s) in enumerate(chunks):
            busy = self._completion(stream, done[i - 2]) if i >= 2 else None
            if busy is not None:  # two staging buffers: chunk i reuses chunk i - 2's once its DMA is done
                yield from self._wait_done(busy, SpanKind.WAIT, "staging buffer")
            if stage_s > 0:
                if self._advance is None or not self._advance(stage_s):
                    yield self._busy(stage_s, SpanKind.STAGE, "stage ", name)
            last = i == len(chunks) - 1
            chunk = (dma_s, nbytes)
            done.append(self._enqueue(stream, ("copy", name if last else f"{name}[{i}]",
                                               (dst, staged, plan if last else None, lane, chunk))))

    def launch(self, stream: Stream, work: Work) -> HostOp:
        seconds = self._launch_s * work.n_launches
        if seconds > 0:
            if self._advance is None or not self._advance(seconds):
                yield self._busy(seconds, SpanKind.LAUNCH, "launch ", work.name, work=work.kind.value)
        self._enqueue(stream, ("kernel", work.name, work))
        if self._split_launch_s > 0 and work.kind is WorkKind.GPU_SPLIT:  # the split's other kernels, launched while the first runs
            if self._advance is None or not self._advance(self._split_launch_s):
                yield self._busy(self._split_launch_s, SpanKind.LAUNCHING, "launching ", work.name)

    def run_host(self, work: Work) -> HostOp:
        t = self.env._now
        if work.duration_s > 0 and not (self._advance is not None and self._advance(work.duration_s)):
            yield self._timeout(work.duration_s)
        if self.functional and work.run is not None:
            work.run(_numpy())
        self._span("host", work.name, t, SpanKind.HOST_WORK)

    # _synchronize and _wait_host hand back the waiting generator itself (one generator less per wait);
    # the caller runs it with ``yield from`` at once, as every host operation is run.

    def _synchronize(self, stream: Stream) -> HostOp:
        st: _StreamState = stream.handle
        return self._wait_done(self._completion(stream, st.enqueued), SpanKind.SYNC, "sync")

    def _wait_host(self, event: Event) -> HostOp:
        return self._wait_done(event.handle, SpanKind.WAIT, "wait ", event.name) if event.handle is not None else _nothing()

    def _alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        if nbytes > self.free_bytes(device):
            raise OutOfDeviceMemory(f"{name}: {nbytes} B > {self.free_bytes(device)} B free on device {device}")
        self._used[device] += nbytes
        return Buffer(name, nbytes, device, True, self._array(nbytes))

    def alloc_host(self, nbytes: int, name: str, pinned: bool = True) -> Buffer:
        return Buffer(name, nbytes, -1, pinned, self._array(nbytes))

    def _free(self, buffer: Buffer) -> None:
        if buffer.device >= 0:
            self._used[buffer.device] -= buffer.nbytes

    def free_bytes(self, device: int) -> int:
        return self.profile.devices[device].memory_total_bytes - self._used[device]

    def timeline(self) -> list[Span]:
        return list(self.spans)

    def clear_timeline(self) -> None:
        """Forget the spans recorded so far. Does not block."""
        self.spans.clear()

    # ------------------------------------------------------------ inside

    def _array(self, nbytes: int) -> Any:
        return _numpy().zeros(nbytes, dtype=_numpy().uint8) if self.functional else None

    def _wait_done(self, ev: simpy.Event | None, kind: SpanKind, what: str, name: str = "") -> HostOp:
        """Block the host until ``ev`` has been processed (None: done already), then pay the wake-up."""
        t = self.env._now
        if ev is not None and ev.callbacks is not None:  # not processed yet
            yield ev
        if self._wait_s > 0:
            if self._advance is None or not self._advance(self._wait_s):
                yield self._busy(self._wait_s, SpanKind.WAKE, "wake")
        if self.tracing:
            self._span("host", what + name, t, kind)

    def _completion(self, stream: Stream, k: int) -> simpy.Event | None:
        """An event that fires when item ``k`` (1-based) of ``stream`` has completed; None if it has."""
        st: _StreamState = stream.handle
        if st.completed >= k:
            return None
        ev = self._event()
        st.waiters.append((k, ev))
        return ev

    def _enqueue(self, stream: Stream, item: _Item) -> int:
        st: _StreamState = stream.handle
        st.queue.append(item)
        st.enqueued += 1
        if st.wake is not None:
            wake, st.wake = st.wake, None
            wake.succeed()
        return st.enqueued

    def _stream_loop(self, stream: Stream) -> Any:
        st: _StreamState = stream.handle
        queue, waiters, env, advance = st.queue, st.waiters, self.env, self._advance
        while True:
            if not queue:
                st.wake = wake = self._event()
                yield wake
                continue
            kind, name, payload = queue.popleft()
            if kind == "copy":
                # One copy on its lane's engine: its plan's link time, or a pageable copy's DMA chunk (seconds,
                # bytes; a chunk with no plan moves no bytes: its copy's last chunk moves them all). Inline, not a
                # generator of its own: the stream resumes through it at every step of every copy.
                dst, src, plan, lane, chunk = payload
                engine = lane.engine
                held, st.held = st.held, None
                if held is not None and held[0] is not engine:
                    held[0].release(held[1])
                    held = None
                if held is not None:
                    req = held[1]
                elif advance is None or (req := engine.take()) is None:  # (take: granted in place)
                    req = engine.request()
                    yield req
                try:
                    t = env._now
                    if chunk is None:
                        seconds, nbytes = calls_seconds(lane, plan.calls), plan.nbytes
                    else:
                        seconds, nbytes = chunk
                    if lane.other.users:
                        seconds *= lane.slowdown
                    if self._dram[lane.device]:
                        self._copies[lane.device].append((t, t + seconds, nbytes))
                    if advance is None or not advance(seconds):
                        yield self._timeout(seconds)
                    # The bytes move at completion: a write to the source while the copy is in flight shows.
                    if self.functional and dst.array is not None and plan is not None:
                        s_arr, d_arr = src.array, dst.array
                        for so, do, n in plan.pieces():
                            d_arr[do : do + n] = s_arr[so : so + n]
                    if self.tracing:
                        self._span(lane.track, name, t, SpanKind.COPY, bytes=nbytes, stream=stream.name)
                        self._span(stream.name, name, t, SpanKind.COPY, bytes=nbytes)
                finally:
                    if lane.drains and next_copy_on(stream.handle.queue, lane.to_device, lane.device):
                        st.held = (engine, req)
                    else:
                        engine.release(req)
            elif kind == "kernel":
                t = env._now
                if advance is None or not advance(payload.duration_s):
                    yield self._timeout(payload.duration_s)
                if self._dram[stream.device]:
                    yield from dram_stretch(env, self._copies[stream.device], self._dram[stream.device], t)
                if self.functional and payload.run is not None:
                    payload.run(_numpy())
                if self.tracing:
                    self._span(stream.name, name, t, SpanKind.KERNEL)
            elif kind == "record":  # no one waits yet and nothing else could run first: processed in place
                if payload.callbacks or advance is None or not advance(0.0):
                    payload.succeed()
                else:
                    payload._ok, payload._value, payload.callbacks = True, None, None
            elif payload.callbacks is not None:  # a wait on an event not processed yet
                t = env._now
                yield payload
                if self.tracing and env.now > t:
                    self._span(stream.name, "wait " + name, t, SpanKind.STREAM_WAIT)
            st.completed += 1
            while waiters and waiters[0][0] <= st.completed:
                waiters.popleft()[1].succeed()
