"""Device memory as ring planning sees it, over points: which buffers are held, and whether an allocation fits.

``sim.transport.planning`` writes its rules against the :class:`Memory` protocol. A :class:`Ledger` keeps each
point's device memory as the SimPy machine keeps it -- an allocation that fits is granted, nothing else is modelled
-- for thousands of points at once (the point planner, the evaluator); :class:`BackendMemory` is one point's memory on
a real backend, the scheduler's own buffers where the scheduler keeps them (:func:`memory_of`). A buffer is named by
what it is (``ring``, ``graph``, ``io``, ``resident``) and its device.

Units: bytes. None of these calls blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from backends.base import Backend, Buffer, OutOfDeviceMemory

Arr = np.ndarray
I64 = np.int64


class Memory(Protocol):
    """Device memory as planning sees it, over points: which buffers are held and whether an allocation fits.
    ``what`` names a buffer of the device (``ring``, ``graph``, ``io``, ``resident``). None of these calls blocks."""

    def free_bytes(self, device: int) -> Arr:
        """Bytes free on ``device`` at each point."""
        ...

    def held(self, device: int, what: str) -> Arr:
        """Bytes of buffer ``what`` at each point; -1 where it is not held."""
        ...

    def alloc(self, device: int, what: str, nbytes: Arr | int, where: Arr, must: bool = False) -> Arr:
        """Allocate ``what`` where asked; True where granted. ``must``: a refusal means the point does not fit (the
        scheduler raises OutOfDeviceMemory, the ledger marks the point)."""
        ...

    def free(self, device: int, what: str, where: Arr) -> None:
        """Give back ``what`` where asked and held."""
        ...

    def refuse(self, device: int, need: Arr, where: Arr) -> None:
        """The graph does not fit ``device`` where asked, even on the ordered path."""
        ...


class Ledger:
    """Each point's device memory as the SimPy machine keeps it: an allocation that fits is granted, nothing else is
    modelled. ``total``/``used``: bytes, one row per point, one column per device. A point refused a buffer it must
    have stops fitting (``fits``, ``reasons``); later calls leave it alone."""

    def __init__(self, total: Arr, used: Arr) -> None:
        self.total = np.asarray(total, dtype=I64)
        self.used = np.array(used, dtype=I64)
        self.buffers: dict[tuple[str, int], Arr] = {}
        self.fits = np.ones(len(self.total), dtype=bool)
        self.reasons: dict[int, str] = {}

    def free_bytes(self, device: int) -> Arr:
        return self.total[:, device] - self.used[:, device]  # type: ignore[no-any-return]

    def held(self, device: int, what: str) -> Arr:
        got = self.buffers.get((what, device))
        if got is None:
            got = self.buffers[(what, device)] = np.full(len(self.total), -1, dtype=I64)
        return got

    def alloc(self, device: int, what: str, nbytes: Arr | int, where: Arr, must: bool = False) -> Arr:
        where = where & self.fits
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=I64), where.shape)
        free = self.free_bytes(device)
        ok = where & (nbytes <= free)
        self.used[ok, device] += nbytes[ok]
        self.held(device, what)[ok] = nbytes[ok]
        if must:
            for i in np.flatnonzero(where & ~ok):
                self._unfit(int(i), f"{what}{device}: {int(nbytes[i])} B > {int(free[i])} B free on device {device}")
        return ok

    def free(self, device: int, what: str, where: Arr) -> None:
        held = self.held(device, what)
        gone = where & (held >= 0)
        self.used[gone, device] -= held[gone]
        held[gone] = -1

    def refuse(self, device: int, need: Arr, where: Arr) -> None:
        for i in np.flatnonzero(where & self.fits):
            self._unfit(int(i), f"the graph does not fit device {device}")

    def _unfit(self, i: int, reason: str) -> None:
        self.fits[i] = False
        self.reasons[i] = reason


class BackendMemory:
    """One point's memory on a backend, for the scheduler: its buffers where the scheduler keeps them (each ring's
    ``buffer``, and per device the graph memory, io buffer and resident cache). ``does_not_fit(device, need)``: the
    error to raise when the graph does not fit. None of these calls blocks."""

    def __init__(self, be: Backend, rings: Mapping[int, Any], buffers: Mapping[str, dict[int, Buffer]],
                 does_not_fit: Callable[[int, int], Exception]) -> None:
        self.be, self.rings, self.buffers, self.does_not_fit = be, rings, buffers, does_not_fit

    def _get(self, device: int, what: str) -> Buffer | None:
        if what == "ring":
            ring = self.rings.get(device)
            return ring.buffer if ring is not None else None
        return self.buffers[what].get(device)

    def _put(self, device: int, what: str, buf: Buffer | None) -> None:
        if what == "ring":
            self.rings[device].buffer = buf
        elif buf is None:
            del self.buffers[what][device]
        else:
            self.buffers[what][device] = buf

    def free_bytes(self, device: int) -> Arr:
        return np.array([self.be.free_bytes(device)], dtype=I64)

    def held(self, device: int, what: str) -> Arr:
        buf = self._get(device, what)
        return np.array([buf.nbytes if buf is not None else -1], dtype=I64)

    def alloc(self, device: int, what: str, nbytes: Arr | int, where: Arr, must: bool = False) -> Arr:
        if not where[0]:
            return np.zeros(1, dtype=bool)
        try:
            buf = self.be.alloc(device, int(np.asarray(nbytes).reshape(-1)[0]), f"{what}{device}")
        except OutOfDeviceMemory:
            if must:
                raise
            return np.zeros(1, dtype=bool)
        self._put(device, what, buf)
        return np.ones(1, dtype=bool)

    def free(self, device: int, what: str, where: Arr) -> None:
        buf = self._get(device, what) if where[0] else None
        if buf is not None:
            self.be.free(buf)
            self._put(device, what, None)

    def refuse(self, device: int, need: Arr, where: Arr) -> None:
        if where[0]:
            raise self.does_not_fit(device, int(need[0]))


def memory_of(sched: Any) -> BackendMemory:
    """A ``TransportScheduler``'s memory: its backend, rings, graph memory, io buffers and resident caches."""
    return BackendMemory(sched.be, sched.rings, {"graph": sched.graph_mem, "io": sched.io_dev, "resident": sched.resident},
                         sched._does_not_fit)
