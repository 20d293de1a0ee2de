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
  are busy).
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

Units: seconds and bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from backends.base import (
    BackendError,
    Buffer,
    CopyRange,
    Event,
    HostOp,
    OutOfDeviceMemory,
    Span,
    Stream,
    Work,
)
from backends.profile import HardwareProfile, LinkCurve


@dataclass(eq=False)
class _Item:
    """One entry of a stream's queue."""

    kind: str  # "copy" | "kernel" | "record" | "wait"
    name: str
    payload: Any = None


@dataclass(eq=False)
class _StreamState:
    """A stream's queue and progress: items run in order; waiters wake when item k has completed."""

    queue: deque[_Item] = field(default_factory=deque)
    enqueued: int = 0
    completed: int = 0
    wake: simpy.Event | None = None
    waiters: list[tuple[int, simpy.Event]] = field(default_factory=list)
    held: Any = None  # (engine, request) kept for this stream's next copy (copy_engine_drains_stream)


def copy_seconds(link: LinkCurve, ranges: Sequence[CopyRange]) -> float:
    """Engine time of one copy call: one 2D copy when the ranges share a length and strides, else one per range."""
    if len(ranges) > 1:
        n = ranges[0].nbytes
        ds = ranges[1].src_offset - ranges[0].src_offset
        dd = ranges[1].dst_offset - ranges[0].dst_offset
        if all(
            r.nbytes == n and r.rows == 1 and r.src_offset - p.src_offset == ds and r.dst_offset - p.dst_offset == dd
            for p, r in zip(ranges, ranges[1:], strict=False)
        ):
            total = n * len(ranges)
            return link.seconds(total)
    return sum(link.seconds(r.nbytes) for r in ranges)


class SimMachine:
    """A simulated machine behind the backend Protocol. Construct, then run a host program with :meth:`run`."""

    name = "simpy"

    def __init__(
        self, profile: HardwareProfile, functional: bool = False, trace: bool = True, env: simpy.Environment | None = None
    ) -> None:
        self.profile = profile
        self.functional = functional
        self.tracing = trace
        self.env = env if env is not None else simpy.Environment()
        self.spans: list[Span] = []
        self._used = [d.memory_used_bytes for d in profile.devices]
        self._h2d = [simpy.Resource(self.env, d.h2d_engines) for d in profile.devices]
        self._d2h = [simpy.Resource(self.env, d.d2h_engines) for d in profile.devices]
        self._streams: list[Stream] = []
        self.host_busy_s = 0.0

    # ----------------------------------------------------------- driving

    def run(self, program: HostOp) -> Any:
        """Run a host program (a generator of backend ops) to completion; returns its value."""
        proc = self.env.process(program)
        self.env.run(until=proc)
        return proc.value

    def _span(self, track: str, name: str, start: float, **args: Any) -> None:
        if self.tracing:
            self.spans.append(Span(track, name, start, self.env.now, args))

    def _host(self, seconds: float, what: str) -> HostOp:
        if seconds > 0:
            t = self.env.now
            yield self.env.timeout(seconds)
            self.host_busy_s += seconds
            self._span("host", what, t)

    # --------------------------------------------------------- Protocol

    def now_s(self) -> float:
        return float(self.env.now)

    def device_count(self) -> int:
        return len(self.profile.devices)

    def create_stream(self, device: int, name: str) -> Stream:
        self._check_device(device)
        st = Stream(name, device, handle=_StreamState())
        self._streams.append(st)
        self.env.process(self._stream_loop(st))
        return st

    def create_event(self, device: int, name: str) -> Event:
        self._check_device(device)
        return Event(name, device, handle=None)

    def record(self, event: Event, stream: Stream) -> HostOp:
        yield from self._host(self.profile.host.event_s, f"record {event.name}")
        gen = self.env.event()
        event.handle = gen
        event.recorded = True
        self._enqueue(stream, _Item("record", event.name, gen))

    def wait_event(self, stream: Stream, event: Event) -> HostOp:
        yield from self._host(self.profile.host.event_s, f"wait {event.name}")
        if event.handle is not None:
            self._enqueue(stream, _Item("wait", event.name, event.handle))

    def copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], tag: str = "") -> HostOp:
        if src.on_host == dst.on_host:
            raise BackendError(f"copy {src.name}->{dst.name}: one side must be host memory, the other a device")
        for r in ranges:
            if r.src_offset + r.src_span > src.nbytes or r.dst_offset + r.nbytes > dst.nbytes:
                raise BackendError(f"copy {tag or src.name}: range {r} outside {src.name} ({src.nbytes} B) or {dst.name} ({dst.nbytes} B)")
        yield from self._host(self.profile.host.copy_issue_s, f"issue {tag}")
        item = _Item("copy", tag or f"{src.name}->{dst.name}", (dst, src, tuple(ranges)))
        k = self._enqueue(stream, item)
        host_side = src if src.on_host else dst
        if not host_side.pinned:
            yield from self._wait_done(self._completion(stream, k), "pageable copy")

    def launch(self, stream: Stream, work: Work) -> HostOp:
        yield from self._host(self.profile.host.launch_s * work.n_launches, f"launch {work.name}")
        self._enqueue(stream, _Item("kernel", work.name, work))

    def run_host(self, work: Work) -> HostOp:
        t = self.env.now
        if work.duration_s > 0:
            yield self.env.timeout(work.duration_s)
            self.host_busy_s += work.duration_s
        if self.functional and work.run is not None:
            work.run(np)
        self._span("host", work.name, t)

    def synchronize(self, stream: Stream) -> HostOp:
        st: _StreamState = stream.handle
        yield from self._wait_done(self._completion(stream, st.enqueued), "sync")

    def wait_host(self, event: Event) -> HostOp:
        if event.handle is not None:
            yield from self._wait_done(event.handle, f"wait {event.name}")

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        self._check_device(device)
        if nbytes > self.free_bytes(device):
            raise OutOfDeviceMemory(f"{name}: {nbytes} B > {self.free_bytes(device)} B free on device {device}")
        self._used[device] += nbytes
        return Buffer(name, nbytes, device, True, self._array(nbytes))

    def alloc_host(self, nbytes: int, name: str, pinned: bool = True) -> Buffer:
        return Buffer(name, nbytes, -1, pinned, self._array(nbytes))

    def free(self, buffer: Buffer) -> None:
        if buffer.device >= 0:
            self._used[buffer.device] -= buffer.nbytes
        buffer.array = None

    def free_bytes(self, device: int) -> int:
        return self.profile.devices[device].memory_total_bytes - self._used[device]

    def timeline(self) -> list[Span]:
        return list(self.spans)

    # ------------------------------------------------------------ inside

    def _check_device(self, device: int) -> None:
        if not 0 <= device < len(self.profile.devices):
            raise BackendError(f"device {device} out of range; this machine has {len(self.profile.devices)}")

    def _array(self, nbytes: int) -> Any:
        return np.zeros(nbytes, dtype=np.uint8) if self.functional else None

    def _wait_done(self, ev: simpy.Event | None, what: str) -> HostOp:
        t = self.env.now
        if ev is not None and not ev.processed:
            yield ev
        yield from self._host(self.profile.host.host_wait_s, "wake")
        if self.tracing:
            self._span("host", what, t)

    def _completion(self, stream: Stream, k: int) -> simpy.Event | None:
        """An event that fires when item ``k`` (1-based) of ``stream`` has completed; None if it has."""
        st: _StreamState = stream.handle
        if st.completed >= k:
            return None
        ev = self.env.event()
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
        run: dict[str, Callable[[Stream, _Item], Any]] = {
            "copy": self._run_copy,
            "kernel": self._run_kernel,
            "record": self._run_record,
            "wait": self._run_wait,
        }
        while True:
            if not st.queue:
                st.wake = self.env.event()
                yield st.wake
                continue
            item = st.queue.popleft()
            yield from run[item.kind](stream, item)
            st.completed += 1
            if st.waiters:
                ready = [w for w in st.waiters if w[0] <= st.completed]
                st.waiters = [w for w in st.waiters if w[0] > st.completed]
                for _, ev in ready:
                    ev.succeed()

    @staticmethod
    def _gather(src: Buffer, r: CopyRange) -> Any:
        if r.rows == 1:
            return src.array[r.src_offset : r.src_offset + r.nbytes].copy()
        return np.concatenate([src.array[o : o + n] for o, n in r.src_rows()])

    def _run_record(self, stream: Stream, item: _Item) -> Any:
        item.payload.succeed()
        return
        yield  # pragma: no cover - makes this a generator

    def _run_wait(self, stream: Stream, item: _Item) -> Any:
        t = self.env.now
        if not item.payload.processed:
            yield item.payload
        if self.env.now > t:
            self._span(stream.name, f"wait {item.name}", t)

    def _run_kernel(self, stream: Stream, item: _Item) -> Any:
        work: Work = item.payload
        t = self.env.now
        yield self.env.timeout(work.duration_s)
        if self.functional and work.run is not None:
            work.run(np)
        self._span(stream.name, work.name, t)

    def _run_copy(self, stream: Stream, item: _Item) -> Any:
        dst, src, ranges = item.payload
        to_device = src.on_host
        dev_buf = dst if to_device else src
        host_buf = src if to_device else dst
        dev = self.profile.devices[dev_buf.device]
        engines = self._h2d if to_device else self._d2h
        other = self._d2h if to_device else self._h2d
        link = dev.link(to_device, host_buf.pinned)
        engine = engines[dev_buf.device]
        st: _StreamState = stream.handle
        held, st.held = st.held, None
        if held is not None and held[0] is not engine:
            held[0].release(held[1])
            held = None
        req = held[1] if held is not None else engine.request()
        if held is None:
            yield req
        try:
            t = self.env.now
            seconds = copy_seconds(link, ranges)
            if other[dev_buf.device].count:
                seconds *= dev.duplex_slowdown
            yield self.env.timeout(seconds)
            # The bytes move at completion: a write to the source while the copy is in flight shows.
            data = [self._gather(src, r) for r in ranges] if self.functional else None
            if data is not None and dst.array is not None:
                for r, d in zip(ranges, data, strict=True):
                    dst.array[r.dst_offset : r.dst_offset + r.nbytes] = d
            track = f"{'h2d' if to_device else 'd2h'}{dev_buf.device}"
            nbytes = sum(r.nbytes for r in ranges)
            self._span(track, item.name, t, bytes=nbytes, stream=stream.name)
            self._span(stream.name, item.name, t, bytes=nbytes)
        finally:
            if dev.copy_engine_drains_stream and self._next_copy_on(stream, to_device, dev_buf.device):
                st.held = (engine, req)
            else:
                engine.release(req)

    @staticmethod
    def _next_copy_on(stream: Stream, to_device: bool, device: int) -> bool:
        """Whether the stream's next item past records and fired waits is a copy on the same engine."""
        for item in stream.handle.queue:
            if item.kind == "record" or (item.kind == "wait" and item.payload.triggered):
                continue
            if item.kind != "copy":
                return False
            dst, src, _ = item.payload
            return bool(src.on_host == to_device and (dst if to_device else src).device == device)
        return False
