"""Where a sweep's work runs: this process, local worker processes, or a Dask cluster.

:func:`executor_for` hands out a ``concurrent.futures.Executor``: ``_Serial`` (this process, one task after another:
``--jobs 1``, easy to debug and profile), a ``ProcessPoolExecutor`` of local workers, or ``dask.distributed``'s
executor, which has the same interface. Local workers leave Ctrl-C to the parent, which keeps the rows that finished
and ends the pool, and they die with the parent even when it is killed by SIGKILL (:func:`_worker_init`).
:func:`without_cycle_collection` runs a large plan without Python's cycle collector (and its workers with it).

Units: seconds.
"""

from __future__ import annotations

import gc
import operator
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from sim.errors import InputError


class _Serial(Executor):
    """This process, one task after another (``--jobs 1``: no pool, easy to debug and profile)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        f: Future[Any] = Future()
        f.set_result(fn(*args, **kwargs))
        return f


@contextmanager
def executor_for(jobs: int | None = None, dask_address: str | None = None) -> Iterator[Executor]:
    """An executor: Dask at ``dask_address``, else ``jobs`` local processes (default: all cores; 1 = this process).

    Raises InputError if dask.distributed is missing or the scheduler cannot be reached.
    """
    if dask_address:
        try:
            from dask.distributed import Client
        except ImportError:
            raise InputError("--dask needs dask.distributed: pip install 'kvpipe[cluster]'") from None
        try:
            client = Client(dask_address, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(f"cannot reach the Dask scheduler at {dask_address!r}: {exc}") from None
        try:
            yield client.get_executor(pure=False)
        finally:
            client.close()
        return
    n = jobs or os.cpu_count() or 1
    if not 1 <= n <= max_jobs():
        raise InputError(f"--jobs {jobs} out of range; allowed: 0 (every core) or 1..{max_jobs()} workers")
    if n == 1:
        yield _Serial()
        return
    pool = ProcessPoolExecutor(max_workers=n, initializer=_worker_init, initargs=(os.getpid(),))
    try:
        yield pool
    except BaseException:  # interrupted (Ctrl-C, SIGTERM) or failed: the workers end now, not after their chunks
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        # wait for the pool's manager thread, which sees the workers gone and ends at once: one left running races the
        # interpreter's exit hook for the pool's wake-up pipe (CPython 3.11 prints "Bad file descriptor" tracebacks)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True, cancel_futures=True)


def max_jobs() -> int:
    """The most local worker processes a sweep may start: 4 per core, at least 32 (each is a whole Python process)."""
    return max(32, 4 * (os.cpu_count() or 1))


def _worker_init(parent: int) -> None:
    """A worker leaves Ctrl-C to the parent, which keeps finished rows and ends the pool; SIGTERM ends it; and it dies
    with its parent, even one killed by SIGKILL (which runs no cleanup): Linux sends it SIGTERM when the parent
    thread ends (``prctl(PR_SET_PDEATHSIG)``), and a watcher thread checks ``os.getppid()`` where that is missing."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="kvpipe-parent-watch").start()


def _die_with_parent() -> None:
    """Ask Linux for SIGTERM when the parent ends (PR_SET_PDEATHSIG); a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watch_parent(parent: int, every_s: float = 1.0) -> None:
    """End this worker once its parent is gone (reparented: ``os.getppid()`` changed). Runs in a daemon thread."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


class PackedPoints:
    """Points as a worker is sent them: their distinct workload, machine and config objects and, per point, the index
    of each (pickling a quarter of a million ``Point`` objects takes about a second on this page's VM; these, a few
    ms). :meth:`points` gives the same points back, sharing their objects as the originals did."""

    def __init__(self, pts: Any) -> None:
        self.parts: list[tuple[list[Any], np.ndarray]] = []
        if hasattr(pts, "parts"):  # a ``sim.points.PointGrid``: its objects and indices as they are
            self.parts = [(objs, np.asarray(idx).astype(np.int32)) for objs, idx in pts.parts]
            return
        for name in ("workload", "hardware", "transport"):
            ids = np.fromiter(map(id, map(operator.attrgetter(name), pts)), dtype=np.int64, count=len(pts))
            _, first, inv = np.unique(ids, return_index=True, return_inverse=True)
            self.parts.append(([getattr(pts[i], name) for i in first.tolist()], inv.reshape(-1).astype(np.int32)))

    def take(self, lo: int, hi: int) -> PackedPoints:
        """The points ``lo:hi`` with only the objects they use, in their order (what a worker is sent: a piece of a plan's
        memory plan used to carry every one of its ~7,000 workloads and configs, ~1 s of pickling a plan; the same list
        where the piece uses every object)."""
        out = object.__new__(PackedPoints)
        out.parts = [_used(objs, idx[lo:hi]) for objs, idx in self.parts]
        return out

    def points(self) -> list[Any]:
        """The points, in order. Does not block."""
        from sim.points import new_point

        (ws, w), (hs, h), (cs, c) = self.parts
        return [new_point(ws[a], hs[b], cs[k]) for a, b, k in zip(w.tolist(), h.tolist(), c.tolist(), strict=True)]


def _used(objs: list[Any], idx: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """The objects that ``idx`` (an index into ``objs`` per point) uses, in their order in ``objs``, and each point's
    index among them. Pure."""
    used, inv = np.unique(idx, return_inverse=True)
    if len(used) == len(objs):
        return objs, idx
    return [objs[i] for i in used.tolist()], inv.reshape(-1).astype(np.int32)


def summarize_packed(packed: PackedPoints) -> Any:
    """``sim.evaluator.summarize`` of the packed points (what a worker runs), as a ``sim.points.PointGrid``: a point is
    made only where the evaluator reads one (a line's first). Blocks (CPU)."""
    from sim.evaluator import summarize
    from sim.points import PointGrid

    return summarize(PointGrid(packed.parts))


@contextmanager
def without_cycle_collection() -> Iterator[None]:
    """Run a plan with Python's cycle collector off (as it was, after): a plan holds hundreds of thousands of points
    and their numbers, and each full collection walks them all (a fifth of the issue's plan's time, measured in Round
    11 of docs/performance.md) while the plan makes no cyclic garbage that matters (its peak RSS is the same). Memory
    freed by reference counting is freed as before; workers forked meanwhile inherit the setting. Does not block."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
