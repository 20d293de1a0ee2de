"""The host program of a decode run: set up the transport scheduler, hand it each token's graph.

``run_decode`` is the loop shared by the simulation and the GPU (``validate.gpu_run``): it builds each token's
graph and hands it to the scheduler; the backend decides whether time is simulated or real. ``sim.run.steady``
is the fast path's version of it, over the same :func:`new_scheduler`.

Units: seconds and bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from backends.base import Backend, Buffer, HostOp
from sim.graph import DecodeGraph
from sim.run.graphs import graphs_for
from sim.run.point import Point
from sim.transport.scheduler import MIB, Program, TransportScheduler
from sim.workload import Workload

GRAPH_BASE_BYTES = 16 * MIB


def io_bytes_for(wl: Workload) -> int:
    """Bytes of the small-input staging buffers: graph inputs, the KQ mask at full context, new rows, activations."""
    mask = wl.cells * 2 * wl.n_parallel
    rows = 2 * wl.n_parallel * wl.row_bytes
    return (1 << 20) + sum(wl.model.small_inputs_bytes) + mask + rows + 4 * wl.model.hidden * wl.n_parallel


def new_scheduler(backend: Backend, point: Point, first: DecodeGraph, program: Program | None = None,
                  host_cache: Buffer | None = None) -> TransportScheduler:
    """The transport scheduler of ``point`` on ``backend``, with the host cache ``first`` (the first graph) needs. Does not block."""
    wl = point.workload
    if host_cache is None:
        host_cache = backend.alloc_host(first.host_cache_bytes, "host_kv_cache", pinned=wl.pinned)
    n_dev = backend.device_count()
    return TransportScheduler(
        backend,
        point.transport,
        host_cache,
        alignment_bytes=[point.hardware.devices[d].alignment_bytes for d in range(n_dev)],
        graph_base_bytes=[GRAPH_BASE_BYTES] * n_dev,
        program=program,
        io_bytes=io_bytes_for(wl),
    )


def run_decode(
    backend: Backend,
    point: Point,
    program: Program | None = None,
    graphs: Callable[[Point], Iterator[DecodeGraph]] = graphs_for,
    host_cache: Buffer | None = None,
) -> HostOp:
    """The host program: set up the scheduler, run every graph, return (scheduler, stats list)."""
    sched = new_scheduler(backend, point, next(iter(graphs(point))), program, host_cache)
    stats = []
    it = iter(graphs(point))
    g = next(it, None)
    peek = point.transport.schedule.across_tokens  # only then is the next graph taken before this one runs
    while g is not None:
        sched.upcoming = nxt = next(it, None) if peek else None
        stats.append((yield from sched.run_graph(g)))
        g = nxt if peek else next(it, None)
    return sched, stats
