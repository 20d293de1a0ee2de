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

A copy is checked and shaped here, once, for every machine: :func:`plan_copy`
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
from typing import Any, NamedTuple, Protocol, runtime_checkable

#: A host-thread operation: call it with ``yield from``.
HostOp = Generator[Any, Any, Any]


class BackendError(RuntimeError):
    """A backend refused an operation (bad arguments, no device, ...)."""


class OutOfDeviceMemory(BackendError):
    """A device allocation did not fit the device's free memory."""


class BackendUnavailable(BackendError):
    """The backend cannot run here (no CUDA device, CuPy missing, ...)."""


class _CopyRangeFields(NamedTuple):
    src_offset: int
    dst_offset: int
    nbytes: int
    rows: int = 1
    src_pitch: int = 0


class CopyRange(_CopyRangeFields):
    """One piece of a copy: ``nbytes`` from ``src_offset`` to ``dst_offset``.

    With ``rows`` > 1 the piece is 2D: ``rows`` rows of ``nbytes // rows``
    bytes, ``src_pitch`` apart in the source, packed in the destination (a
    head slice of a window, one ``cudaMemcpy2DAsync``). Immutable (a tuple: the
    scheduler builds thousands a token, and a frozen dataclass costs 1.5 us each
    to construct). Raises ValueError for a negative offset or size, or rows that do not split it.
    """

    __slots__ = ()

    def __new__(cls, src_offset: int, dst_offset: int, nbytes: int, rows: int = 1, src_pitch: int = 0) -> CopyRange:
        if src_offset < 0 or dst_offset < 0 or nbytes < 0:
            raise ValueError(f"CopyRange offsets and nbytes must be >= 0, got {(src_offset, dst_offset, nbytes)}")
        if rows != 1 and (rows < 1 or nbytes % rows or src_pitch < nbytes // rows):
            raise ValueError(f"CopyRange rows must split nbytes evenly with src_pitch >= row width, got "
                             f"{nbytes} B in {rows} rows {src_pitch} apart")
        return tuple.__new__(cls, (src_offset, dst_offset, nbytes, rows, src_pitch))

    def __repr__(self) -> str:
        return (f"CopyRange(src_offset={self[0]}, dst_offset={self[1]}, nbytes={self[2]}, rows={self[3]}, "
                f"src_pitch={self[4]})")

    @property
    def width(self) -> int:
        return self.nbytes // self.rows

    @property
    def src_span(self) -> int:
        """Bytes of the source the piece reaches over (from ``src_offset``)."""
        return self.nbytes if self.rows == 1 else (self.rows - 1) * self.src_pitch + self.width

    def src_rows(self) -> list[tuple[int, int]]:
        """(offset, bytes) of each source row."""
        if self.rows == 1:
            return [(self.src_offset, self.nbytes)]
        return [(self.src_offset + i * self.src_pitch, self.width) for i in range(self.rows)]


class CopyCall(NamedTuple):
    """One copy a machine issues: ``height`` rows of ``width`` bytes, ``src_pitch`` / ``dst_pitch`` apart.

    ``height`` 1 is a 1D copy (``cudaMemcpyAsync``), more a 2D one (``cudaMemcpy2DAsync``).
    """

    src_offset: int
    dst_offset: int
    width: int
    height: int = 1
    src_pitch: int = 0
    dst_pitch: int = 0

    @property
    def nbytes(self) -> int:
        return self.width * self.height

    def pieces(self) -> list[tuple[int, int, int]]:
        """(source offset, destination offset, bytes) of each row."""
        return [(self.src_offset + i * self.src_pitch, self.dst_offset + i * self.dst_pitch, self.width) for i in range(self.height)]


class KeptRanges(tuple):  # type: ignore[type-arg]
    """A tuple of ``CopyRange``s its maker keeps and copies again and again (the scheduler's ordered window of one
    window size, ``sim.transport.deliveries.ordered_copy``): a machine may plan a copy of it once per pair of buffers."""

    __slots__ = ()


class CopyPlan(NamedTuple):
    """A copy checked and shaped once (:func:`plan_copy`): its direction, the calls to issue, its bytes."""

    to_device: bool
    calls: tuple[CopyCall, ...]
    nbytes: int

    def pieces(self) -> list[tuple[int, int, int]]:
        """(source offset, destination offset, bytes) of every row of every call, in order."""
        return [p for c in self.calls for p in c.pieces()]


def ranges_2d(ranges: Sequence[CopyRange]) -> tuple[int, int, int, int] | None:
    """``(width, height, src_pitch, dst_pitch)`` when several ranges form one 2D copy, else None.

    Two or more contiguous ranges (``rows`` 1) of one length > 0 whose source
    and destination offsets each advance by a constant stride no smaller than
    that length (the pitches a ``cudaMemcpy2DAsync`` accepts).
    """
    if len(ranges) < 2:
        return None
    first = ranges[0]
    width = first.nbytes
    sp = ranges[1].src_offset - first.src_offset
    dp = ranges[1].dst_offset - first.dst_offset
    if width <= 0 or sp < width or dp < width or first.rows != 1:
        return None
    a = first
    for b in ranges[1:]:
        if b.nbytes != width or b.rows != 1 or b.src_offset - a.src_offset != sp or b.dst_offset - a.dst_offset != dp:
            return None
        a = b
    return width, len(ranges), sp, dp


def copy_calls(ranges: Sequence[CopyRange]) -> tuple[CopyCall, ...]:
    """The calls a copy of ``ranges`` is made of: the one rule every machine shapes its copies by.

    Ranges that form one 2D copy (:func:`ranges_2d`) are one call; otherwise
    each non-empty range is one call: 1D, or 2D for a strided range (its rows
    packed in the destination).
    """
    if len(ranges) == 1:  # the common case: one range, no 2D rule to test
        r = ranges[0]
        if not r.nbytes:
            return ()
        return (CopyCall(r.src_offset, r.dst_offset, r.nbytes) if r.rows == 1
                else CopyCall(r.src_offset, r.dst_offset, r.width, r.rows, r.src_pitch, r.width),)
    shape = ranges_2d(ranges)
    if shape is not None:
        return (CopyCall(ranges[0].src_offset, ranges[0].dst_offset, *shape),)
    return tuple(
        CopyCall(r.src_offset, r.dst_offset, r.nbytes) if r.rows == 1
        else CopyCall(r.src_offset, r.dst_offset, r.width, r.rows, r.src_pitch, r.width)
        for r in ranges
        if r.nbytes
    )


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
    tag: str = ""


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


@dataclass(frozen=True)
class Span:
    """One interval of a timeline: ``track`` did ``name`` from ``start_s`` to ``end_s``."""

    track: str
    name: str
    start_s: float
    end_s: float
    args: dict[str, Any] = field(default_factory=dict, compare=False)


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
