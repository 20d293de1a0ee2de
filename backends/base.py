"""The backend Protocol: the only thing the transport scheduler talks to.

A *backend* is a machine that can run one decode graph: a host thread, streams
that run their items in order, events, host<->device copies, kernels, CPU work
and device memory. kvpipe has two real ones -- the SimPy machine
(``backends.simpy_machine``) and a CUDA GPU through CuPy
(``backends.cupy_gpu``) -- and the scheduler in ``sim.scheduler`` must not be
able to tell them apart.

The host thread is the only actor that blocks, so every operation that costs
host time or may block the host is a *generator* called with ``yield from``.
On the SimPy machine such an operation yields SimPy events (a timeout for the
issue cost, the completion event of a blocking wait); on the GPU it performs
the CUDA call, which blocks for real where it should, and yields nothing. A
trivial driver (:func:`drive`) exhausts a generator on a real machine; the
SimPy machine runs it as a process.

Units: seconds and bytes everywhere. Offsets and sizes are byte counts.
Backends receive plain data (byte ranges, durations, callables), never
simulator objects: ``backends`` imports nothing from ``sim``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

#: A host-thread operation: call it with ``yield from``.
HostOp = Generator[Any, Any, Any]


class BackendError(RuntimeError):
    """A backend refused an operation (bad arguments, no device, ...)."""


class OutOfDeviceMemory(BackendError):
    """A device allocation did not fit the device's free memory."""


class BackendUnavailable(BackendError):
    """The backend cannot run here (no CUDA device, CuPy missing, ...)."""


@dataclass(frozen=True)
class CopyRange:
    """One piece of a copy: ``nbytes`` from ``src_offset`` to ``dst_offset``.

    With ``rows`` > 1 the piece is 2D: ``rows`` rows of ``nbytes // rows``
    bytes, ``src_pitch`` apart in the source, packed in the destination (a
    head slice of a window, one ``cudaMemcpy2DAsync``).
    """

    src_offset: int
    dst_offset: int
    nbytes: int
    rows: int = 1
    src_pitch: int = 0

    def __post_init__(self) -> None:
        if self.src_offset < 0 or self.dst_offset < 0 or self.nbytes < 0:
            raise ValueError(f"CopyRange offsets and nbytes must be >= 0, got {self}")
        if self.rows < 1 or self.nbytes % self.rows or (self.rows > 1 and self.src_pitch < self.nbytes // self.rows):
            raise ValueError(f"CopyRange rows must split nbytes evenly with src_pitch >= row width, got {self}")

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


@dataclass(frozen=True)
class Access:
    """A byte range of a buffer that an operation reads or writes (for the race checker)."""

    buffer: Buffer
    offset: int
    nbytes: int
    write: bool


@dataclass(frozen=True)
class Work:
    """A kernel (GPU split) or a CPU split, as plain data.

    ``duration_s`` is what the simulated machine charges for it (a real GPU
    ignores it and takes as long as it takes). ``n_launches`` is the number of
    kernel launches the host pays an issue cost for. ``run`` is the real work,
    or ``None`` in a timing-only run: it is called with the array module
    (``numpy`` or ``cupy``) and performs the computation on the buffers'
    arrays; on a GPU it is called inside the stream's context so its kernels
    are enqueued there. ``accesses`` name the byte ranges it reads and writes.
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
        that share a length and a stride may go as one 2D copy. Costs one copy
        issue of host time; from pageable host memory the host blocks until the
        copy is done (as CUDA does).
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
