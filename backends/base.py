"""The backend Protocol: the only thing the transport scheduler talks to.

A *backend* is a machine that can run one decode graph: a host thread, streams
that run their items in order, events, host<->device copies, kernels, CPU work
and device memory. kvpipe has two real ones -- the SimPy machine
(``backends.simpy_machine``) and a CUDA GPU through CuPy
(``backends.cupy_gpu``) -- and the scheduler in ``sim.transport.scheduler`` must not be
able to tell them apart.

The host thread is the only actor that blocks, so every operation that costs
host time or may block the host is a *generator* called with ``yield from``.
On the SimPy machine such an operation yields SimPy events (a timeout for the
issue cost, the completion event of a blocking wait); on the GPU it performs
the CUDA call, which blocks for real where it should, and yields nothing.
``Backend.run`` runs a whole host program: a real machine exhausts the
generator (:func:`drive`), the SimPy machine runs it as a process.

A copy is checked and shaped once, for every machine (``backends.copies``): :func:`plan_copy`
refuses a copy unless one side is host memory and every source row (``rows``
x ``src_pitch``) and destination range lies inside its buffer, and
:func:`copy_calls` is the one rule for which ranges go as one 2D copy. Both
machines derive from ``backends.machine.Machine``, whose public ``copy``
applies them and hands the :class:`CopyPlan` to the machine's hook.

Units: seconds and bytes everywhere. Offsets and sizes are byte counts.
Backends receive plain data (byte ranges, durations, callables), never
simulator objects: ``backends`` imports nothing from ``sim``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple, Protocol, runtime_checkable

from backends.copies import CopyCall, CopyPlan, CopyRange, KeptRanges, copy_calls, ranges_2d
from backends.errors import BackendError, BackendUnavailable, OutOfDeviceMemory

__all__ = ["Access", "Backend", "BackendError", "BackendUnavailable", "Buffer", "CopyCall", "CopyPlan", "CopyRange",
           "Event", "HostOp", "KeptRanges", "OutOfDeviceMemory", "Span", "SpanKind", "Stream", "Work", "WorkKind",
           "copy_calls", "drive", "is_split_launch", "plan_copy", "ranges_2d"]

#: A host-thread operation: call it with ``yield from``.
HostOp = Generator[Any, Any, Any]


class Access(NamedTuple):
    """A byte range of a buffer that an operation reads or writes (for the race checker). Immutable.

    With ``repeat`` > 1 it is ``repeat`` ranges of ``nbytes`` each, ``pitch`` bytes apart from ``offset`` (the rows
    one CPU split writes, one per sequence stream): the checker compares every one of them.
    """

    buffer: Buffer
    offset: int
    nbytes: int
    write: bool
    repeat: int = 1
    pitch: int = 0


class WorkKind(str, Enum):
    """What a :class:`Work` is, where a machine charges by it: a graph's GPU split (a simulated machine charges the
    launch of its other kernels while the first runs), a graph's CPU split, or anything else (a calibration kernel,
    the host cache's update)."""

    GPU_SPLIT = "gpu split"
    CPU_SPLIT = "cpu split"
    OTHER = "other"


class Work(NamedTuple):
    """A kernel (GPU split) or a CPU split, as plain data.

    ``duration_s`` is what the simulated machine charges for it (a real GPU
    ignores it and takes as long as it takes). ``n_launches`` is the number of
    kernel launches the host pays an issue cost for. ``run`` is the real work,
    or ``None`` in a timing-only run: it is called with the array module
    (``numpy`` or ``cupy``) and performs the computation on the buffers'
    arrays; on a GPU it is called inside the stream's context so its kernels
    are enqueued there. ``accesses`` name the byte ranges it reads and writes. Immutable.
    """

    name: str
    duration_s: float
    n_launches: int = 1
    run: Callable[[Any], None] | None = None
    accesses: tuple[Access, ...] = ()
    kind: WorkKind = WorkKind.OTHER


@dataclass(eq=False)
class Buffer:
    """A block of host or device memory owned by a backend.

    ``array`` is a flat ``uint8`` array (NumPy on the host and in the
    functional simulation, CuPy on a GPU) or ``None`` when the backend moves
    no real bytes. ``device`` is ``-1`` for host memory.
    """

    name: str
    nbytes: int
    device: int
    pinned: bool = True
    array: Any = None
    handle: Any = None

    @property
    def on_host(self) -> bool:
        return self.device < 0


@dataclass(eq=False)
class Stream:
    """An in-order queue of device work on one device."""

    name: str
    device: int
    handle: Any = None


@dataclass(eq=False)
class Event:
    """A marker recorded on a stream; other streams or the host can wait on it."""

    name: str
    device: int
    handle: Any = None
    recorded: bool = False


class SpanKind(str, Enum):
    """What a timeline span is, so readers select spans by kind, never by parsing names. Host-thread spans: a kernel
    ``LAUNCH`` (``args["work"]`` is the :class:`WorkKind` value), ``LAUNCHING`` (a split's other kernels), a copy's
    ``ISSUE``, a pageable chunk's ``STAGE``, an event ``RECORD`` or ``WAIT``, a stream ``SYNC``, the ``WAKE`` after a
    block, ``HOST_WORK`` (a CPU split). Stream and engine spans: ``COPY``, ``KERNEL``, ``STREAM_WAIT``."""

    LAUNCH = "launch"
    LAUNCHING = "launching"
    ISSUE = "issue"
    STAGE = "stage"
    RECORD = "record"
    WAIT = "wait"
    SYNC = "sync"
    WAKE = "wake"
    HOST_WORK = "host work"
    COPY = "copy"
    KERNEL = "kernel"
    STREAM_WAIT = "stream wait"
    OTHER = "other"


@dataclass(frozen=True)
class Span:
    """One interval of a timeline: ``track`` did ``name`` (a ``kind`` of thing) from ``start_s`` to ``end_s``."""

    track: str
    name: str
    start_s: float
    end_s: float
    args: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: SpanKind = SpanKind.OTHER


def plan_copy(dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], tag: str = "") -> CopyPlan:
    """Check a copy of ``ranges`` from ``src`` to ``dst`` and shape it. Raises BackendError; does not block.

    One side must be host memory and the other a device; every source row and
    every destination range must lie inside its buffer.
    """
    to_device = src.device < 0
    if to_device == (dst.device < 0):
        raise BackendError(f"copy {src.name}->{dst.name}: one side must be host memory, the other a device")
    nbytes = 0
    for r in ranges:
        n = r.nbytes
        if r.src_offset + (n if r.rows == 1 else r.src_span) > src.nbytes or r.dst_offset + n > dst.nbytes:
            raise BackendError(f"copy {tag or src.name}: range {r} outside {src.name} ({src.nbytes} B) or {dst.name} ({dst.nbytes} B)")
        nbytes += n
    return CopyPlan(to_device, copy_calls(ranges), nbytes)


def is_split_launch(kind: SpanKind | str, args: dict[str, Any]) -> bool:
    """Whether a span (its kind, or a Chrome trace event's ``cat``, and its args) is the host launching a graph's GPU
    split. Pure."""
    return kind == SpanKind.LAUNCH and args.get("work") == WorkKind.GPU_SPLIT.value


@runtime_checkable
class Backend(Protocol):
    """What a machine offers the scheduler. Generators are host-thread operations."""

    #: A short name for reports ("simpy", "cupy", ...).
    name: str

    @property
    def xp(self) -> Any:
        """The array module of the buffers' arrays and ``Work.run``: ``numpy``, or ``cupy`` on a GPU. Does not block."""
        ...

    def run(self, program: HostOp) -> Any:
        """Run a host program (a generator of this backend's operations) to completion; returns its value.

        Blocks the host until the program ends: a real machine exhausts it on
        the calling thread, the SimPy machine runs it as a process in simulated
        time.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """The machine as plain data (JSON-ready). Does not block.

        Keys: ``device`` (a name), ``device_count``, ``memory_total_bytes`` and
        ``memory_free_bytes`` (device 0), ``driver_version``,
        ``runtime_version``, ``cupy_version`` (None where there is none) and
        ``numpy_version``.
        """
        ...

    def now_s(self) -> float:
        """Host clock in seconds. Does not block."""
        ...

    def device_count(self) -> int:
        """Number of devices. Does not block."""
        ...

    def create_stream(self, device: int, name: str) -> Stream:
        """A new non-blocking stream on ``device``. Does not block."""
        ...

    def create_event(self, device: int, name: str) -> Event:
        """A new event on ``device``. Does not block. Raises BackendError if the device has none."""
        ...

    def record(self, event: Event, stream: Stream) -> HostOp:
        """Record ``event`` at the current tail of ``stream``. Costs one event call of host time."""
        ...

    def wait_event(self, stream: Stream, event: Event) -> HostOp:
        """Make ``stream`` wait for ``event`` before its next item. Costs one event call; the host does not block."""
        ...

    def copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], tag: str = "") -> HostOp:
        """Enqueue an async copy of ``ranges`` from ``src`` to ``dst`` on ``stream``.

        Direction follows the buffers (host->device or device->host). Ranges
        that share a length and a stride go as one 2D copy (:func:`copy_calls`).
        Costs one copy issue of host time; from pageable host memory the host
        blocks until the copy is done (as CUDA does). A copy from host to host,
        device to device, or with a range outside its buffers raises
        BackendError when called, before it costs anything.
        """
        ...

    def launch(self, stream: Stream, work: Work) -> HostOp:
        """Enqueue a GPU split's kernels on ``stream``. Costs ``work.n_launches`` launches of host time."""
        ...

    def run_host(self, work: Work) -> HostOp:
        """Run a CPU split on the host thread. Blocks the host for its duration."""
        ...

    def synchronize(self, stream: Stream) -> HostOp:
        """Block the host until everything enqueued on ``stream`` has finished."""
        ...

    def wait_host(self, event: Event) -> HostOp:
        """Block the host until ``event`` (already recorded) has completed."""
        ...

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        """Allocate ``nbytes`` of device memory outside any pool's reuse. Raises OutOfDeviceMemory. Does not block."""
        ...

    def alloc_host(self, nbytes: int, name: str, pinned: bool = True) -> Buffer:
        """Allocate host memory (pinned or pageable). Does not block."""
        ...

    def free(self, buffer: Buffer) -> None:
        """Return a buffer's memory. The caller orders it after its last use. Does not block."""
        ...

    def free_bytes(self, device: int) -> int:
        """Free device memory in bytes. Does not block."""
        ...

    def timeline(self) -> list[Span]:
        """Spans recorded so far on the device side (streams, copy engines). Does not block."""
        ...

    def clear_timeline(self) -> None:
        """Forget the spans recorded so far (a GPU first waits for its timed work). Blocks only on a GPU."""
        ...


def drive(op: HostOp) -> Any:
    """Run a host operation on a real machine: exhaust the generator, return its value.

    Blocks the host for as long as the operations inside block. A real
    backend's operations yield nothing; anything yielded is a programming
    error.
    """
    try:
        item = next(op)
    except StopIteration as stop:
        return stop.value
    raise BackendError(f"a real backend's operation yielded {item!r}; only simulated machines yield")
