"""The concrete base of every machine: the rules a machine does not get to choose, and two hooks.

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
* ``run`` drives a host program on the calling thread
  (``backends.base.drive``); the SimPy machine overrides it to run the
  program as a process.

A subclass provides the rest of the ``backends.base.Backend`` Protocol,
``name``, ``xp`` and ``describe``. Units: seconds and bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.base import BackendError, Buffer, CopyPlan, CopyRange, HostOp, KeptRanges, Stream, drive, plan_copy


class Machine:
    """What every machine shares: the checks and the copy's shape. A machine implements ``_copy`` and ``_alloc``."""

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
            return self._copy(stream, dst, src, plan_copy(dst, src, ranges, tag), tag)
        plans = self._plans
        if plans is None:
            plans = self._plans = {}
        kept = plans.get(id(ranges))
        if kept is None or kept[0] is not dst or kept[1] is not src:
            if len(plans) >= 4096:
                plans.clear()
            kept = plans[id(ranges)] = (dst, src, ranges, plan_copy(dst, src, ranges, tag))
        return self._copy(stream, dst, src, kept[3], tag)

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        """See ``Backend.alloc``. Raises BackendError for a bad device or a negative size. Does not block."""
        self._check_device(device)
        if nbytes < 0:
            raise BackendError(f"{name}: cannot allocate {nbytes} B")
        return self._alloc(device, int(nbytes), name)

    def run(self, program: HostOp) -> Any:
        """Run a host program to completion on the calling thread; returns its value. Blocks as its operations do."""
        return drive(program)

    def describe(self) -> dict[str, Any]:
        """See ``Backend.describe`` (each machine says what it is). Does not block."""
        raise NotImplementedError

    def _copy(self, stream: Stream, dst: Buffer, src: Buffer, plan: CopyPlan, tag: str) -> HostOp:
        """Enqueue the plan's calls on ``stream`` (hook). ``tag`` is the caller's, maybe empty."""
        raise NotImplementedError

    def _alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        """Allocate ``nbytes`` (>= 0) on ``device`` (in range) or raise OutOfDeviceMemory (hook)."""
        raise NotImplementedError

    def _check_device(self, device: int) -> None:
        n = self.device_count()
        if not 0 <= device < n:
            raise BackendError(f"device {device} out of range; this machine has {n}")
