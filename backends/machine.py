"""The concrete base of every machine: the rules a machine does not get to choose, and the hooks it implements.

In the manner of SimPy's ``BaseResource`` (whose subclasses override
``_do_put`` and ``_do_get`` while the queueing stays in the base) and
tinygrad's ``Allocator`` (``alloc`` checks, ``_alloc`` allocates), a
:class:`Machine` keeps the invariants and a machine implements the hooks:

* ``copy`` checks and shapes the copy once (``backends.base.plan_copy``:
  direction, every source row and destination in bounds, the one 2D rule),
  raising BackendError at the call, then hands the plan to ``_copy``, which
  enqueues the plan's calls in order and returns the host operation; it may
  trust the plan, so the SimPy machine and CuPy cannot disagree on what a
  range means, which ranges are refused, or which go as one 2D copy.
* ``alloc`` checks the device and the size, then calls ``_alloc``.
* Streams and events: ``create_stream`` and ``create_event`` check the device,
  then call ``_create_stream`` and ``_create_event``; ``record`` marks the
  event recorded and hands over to ``_record``; ``wait_event``,
  ``synchronize`` and ``wait_host`` are ``_wait_event``, ``_synchronize`` and
  ``_wait_host``.
* ``free`` drops the buffer's array and handle, then calls ``_free``, which
  returns the memory.
* ``run`` drives a host program on the calling thread
  (``backends.base.drive``); the SimPy machine overrides it to run the
  program as a process.

A host operation's hook returns the generator the caller runs with ``yield
from`` (the base adds no generator layer). A machine that wraps another, as the
race checker (``backends.checked``) does, is a Machine too: its hooks do their
bookkeeping and call the inner machine's hooks, so the invariants are kept once.
A subclass provides the rest of the ``backends.base.Backend`` Protocol
(``launch``, ``run_host``, ``alloc_host``, ``free_bytes``, ``now_s``,
``timeline``, ``clear_timeline``: declared here, no invariant of the base's
in them), ``name``, ``xp`` and ``describe``.
Units: seconds and bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.base import BackendError, Buffer, CopyPlan, CopyRange, Event, HostOp, KeptRanges, Span, Stream, Work, drive, plan_copy


class Machine:
    """What every machine shares: the checks, the copy's shape and the hooks' doors. A machine implements the hooks."""

    name = "machine"
    xp: Any = None

    def device_count(self) -> int:
        """Number of devices. Does not block."""
        raise NotImplementedError

    _plans: dict[int, tuple[Buffer, Buffer, Sequence[CopyRange], CopyPlan]] | None = None

    def copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], tag: str = "") -> HostOp:
        """See ``Backend.copy``. Raises BackendError at the call for a bad direction or range.

        A copy of the same ``KeptRanges`` between the same buffers (the scheduler keeps a window's ranges per layout)
        is planned once: the plan is kept with the tuple, which it keeps alive, so the tuple's id names it.
        """
        if type(ranges) is not KeptRanges:
            return self._copy(stream, dst, src, ranges, plan_copy(dst, src, ranges, tag), tag)
        plans = self._plans
        if plans is None:
            plans = self._plans = {}
        kept = plans.get(id(ranges))
        if kept is None or kept[0] is not dst or kept[1] is not src:
            if len(plans) >= 4096:
                plans.clear()
            kept = plans[id(ranges)] = (dst, src, ranges, plan_copy(dst, src, ranges, tag))
        return self._copy(stream, dst, src, ranges, kept[3], tag)

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        """See ``Backend.alloc``. Raises BackendError for a bad device or a negative size. Does not block."""
        self._check_device(device)
        if nbytes < 0:
            raise BackendError(f"{name}: cannot allocate {nbytes} B")
        return self._alloc(device, int(nbytes), name)

    def free(self, buffer: Buffer) -> None:
        """See ``Backend.free``: the buffer's array and handle are dropped, then its memory returned. Does not block."""
        buffer.array = None
        buffer.handle = None
        self._free(buffer)

    def create_stream(self, device: int, name: str) -> Stream:
        """See ``Backend.create_stream``. Raises BackendError for a bad device. Does not block."""
        self._check_device(device)
        return self._create_stream(device, name)

    def create_event(self, device: int, name: str) -> Event:
        """See ``Backend.create_event``. Raises BackendError for a bad device (or one without events). Does not block."""
        self._check_device(device)
        return self._create_event(device, name)

    def record(self, event: Event, stream: Stream) -> HostOp:
        """See ``Backend.record``: the event is recorded from the call on (a wait on it is a wait). One event call."""
        event.recorded = True
        return self._record(event, stream)

    def wait_event(self, stream: Stream, event: Event) -> HostOp:
        """See ``Backend.wait_event``. One event call of host time; the host does not block."""
        return self._wait_event(stream, event)

    def synchronize(self, stream: Stream) -> HostOp:
        """See ``Backend.synchronize``. Blocks the host until ``stream``'s work is done."""
        return self._synchronize(stream)

    def wait_host(self, event: Event) -> HostOp:
        """See ``Backend.wait_host``. Blocks the host until ``event`` (if recorded) is done."""
        return self._wait_host(event)

    def run(self, program: HostOp) -> Any:
        """Run a host program to completion on the calling thread; returns its value. Blocks as its operations do."""
        return drive(program)

    def describe(self) -> dict[str, Any]:
        """See ``Backend.describe`` (each machine says what it is). Does not block."""
        raise NotImplementedError

    # ------------------------------------------------- a machine's own (no invariant of the base's to keep)

    def now_s(self) -> float:
        """See ``Backend.now_s``: the host clock, seconds. Does not block."""
        raise NotImplementedError

    def launch(self, stream: Stream, work: Work) -> HostOp:
        """See ``Backend.launch``: ``work.n_launches`` launches of host time."""
        raise NotImplementedError

    def run_host(self, work: Work) -> HostOp:
        """See ``Backend.run_host``: blocks the host for the CPU split."""
        raise NotImplementedError

    def alloc_host(self, nbytes: int, name: str, pinned: bool = True) -> Buffer:
        """See ``Backend.alloc_host``. Does not block."""
        raise NotImplementedError

    def free_bytes(self, device: int) -> int:
        """See ``Backend.free_bytes``: bytes. Does not block."""
        raise NotImplementedError

    def timeline(self) -> list[Span]:
        """See ``Backend.timeline``. Does not block."""
        raise NotImplementedError

    def clear_timeline(self) -> None:
        """See ``Backend.clear_timeline``. Blocks only on a GPU."""
        raise NotImplementedError

    # ------------------------------------------------------------ hooks

    def _copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: Sequence[CopyRange], plan: CopyPlan, tag: str) -> HostOp:
        """Enqueue the plan's calls on ``stream`` (hook; ``ranges`` are what the plan was made from, for a wrapper).
        ``tag`` is the caller's, maybe empty."""
        raise NotImplementedError

    def _alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        """Allocate ``nbytes`` (>= 0) on ``device`` (in range) or raise OutOfDeviceMemory (hook)."""
        raise NotImplementedError

    def _free(self, buffer: Buffer) -> None:
        """Return ``buffer``'s memory (hook; its array and handle are already dropped)."""
        raise NotImplementedError

    def _create_stream(self, device: int, name: str) -> Stream:
        """A new stream on ``device`` (in range) (hook)."""
        raise NotImplementedError

    def _create_event(self, device: int, name: str) -> Event:
        """A new event on ``device`` (in range), or BackendError if it has none (hook)."""
        raise NotImplementedError

    def _record(self, event: Event, stream: Stream) -> HostOp:
        """Record ``event`` (already marked recorded) at the tail of ``stream`` (hook)."""
        raise NotImplementedError

    def _wait_event(self, stream: Stream, event: Event) -> HostOp:
        """Make ``stream`` wait for ``event`` (hook)."""
        raise NotImplementedError

    def _synchronize(self, stream: Stream) -> HostOp:
        """Block the host until ``stream``'s work is done (hook)."""
        raise NotImplementedError

    def _wait_host(self, event: Event) -> HostOp:
        """Block the host until ``event`` is done; nothing for an event never recorded (hook)."""
        raise NotImplementedError

    def _check_device(self, device: int) -> None:
        n = self.device_count()
        if not 0 <= device < n:
            raise BackendError(f"device {device} out of range; this machine has {n}")
