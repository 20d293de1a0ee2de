"""The host programs of a decode run: every token (``run_decode``), or the tokens that decide it (``run_steady``).

``run_decode`` is the loop shared by the simulation and the GPU (``validate.gpu_run``): it sets up the transport
scheduler (:func:`new_scheduler`), builds each token's graph and hands it to the scheduler; the backend decides
whether time is simulated or real.

**The fast path.** A decode run of N tokens is mostly the same token again. The first one is not (the rings and buffers are
allocated, nothing was delivered before it, so no boundary wait); after it, a token's events depend on its own
graph and on the plan the scheduler makes for it, and every stream is idle at a token's end. Within one 256-row
window block, with the same plan, consecutive graphs differ only in where the new rows land: the stable prefix
grows by the same rows every token, the late part shrinks by them, and the token's time moves by the same small
step (at most a few 1e-5 of it on the reference grid) or not at all.

So the fast path cuts the run into *segments* from the plan alone (``sim.replay.plan_point``): token 0; then
runs of tokens with the same window rows, the same per-token plan and the same previous plan (the boundary wait
follows from it). A token where a ring holds slots but delivers nothing is its own segment, since the scheduler
counts such graphs to release the ring. In each segment it simulates tokens one after another until two
consecutive ones *match*, judged from the simulation itself: every count, flag and ring field equal, and every
time field within ``STEADY_RTOL`` of the token's time. The rest of the segment is extrapolated from that pair:
each one is a copy of the steady token, advanced by the pair's per-token change in time and in early and late
bytes, and marked (``GraphStats.extrapolated_from``). The step is not assumed to hold for a whole block: past
``UNCHECKED_TOKENS`` extrapolated tokens the last one is simulated too, and where it is not where the pair points
(the token's bottleneck moved within the block), the stretch is halved and its second half is a segment of its
own. A segment whose tokens never match is simulated whole. The stats list has one entry per token either way.

``exact`` (``--exact``) simulates every token. Traces, functional runs and mutations always run exact
(:func:`applies`): their output is per token, not a mean.

Units: seconds and bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import fields, replace
from typing import Any

from backends.base import Backend, Buffer, HostOp
from sim.graph import DecodeGraph
from sim.replay import PointPlan
from sim.run.point import GRAPH_BASE_BYTES, Point, graph_at, graphs_for, io_bytes_for
from sim.transport.config import GraphStats
from sim.transport.scheduler import Program, TransportScheduler

#: Two consecutive tokens match when each time field differs by at most this fraction of the token's time.
STEADY_RTOL = 1e-4
#: A time step smaller than this fraction of the token's time is float noise, not a step (the same token's time
#: differs by ~1e-14 of itself at another absolute time; where one cache row moves it, it moves it by ~1e-5).
NOISE_RTOL = 1e-9
#: Past this many extrapolated tokens in a row, the last of them is simulated to check the extrapolation.
UNCHECKED_TOKENS = 8
TIME_FIELDS = ("total_s", "blocked_ordered_s", "consumer_wait_s", "issue_s", "boundary_wait_s")
#: Fields that move by a fixed step per token in a steady segment (the stable prefix grows, the late part shrinks).
DRIFT_FIELDS = (*TIME_FIELDS, "early_bytes", "late_bytes")
SAME_FIELDS = tuple(f.name for f in fields(GraphStats) if f.name not in (*DRIFT_FIELDS, "token", "extrapolated_from"))



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


# ------------------------------------------------------------------ the fast path


def applies(point: Point, trace: bool = False, functional: bool = False) -> bool:
    """Whether the fast path may run ``point``: not for a trace, a functional run or a mutation. Pure."""
    return not trace and not functional and not point.transport.mutations


def segments(plan: PointPlan) -> list[range]:
    """The token ranges whose tokens may stand in for each other (see the module docstring). Pure."""
    out: list[range] = []
    last: Any = None
    for k, t in enumerate(plan.tokens):
        key = None if k == 0 or t.counts_idle else (t.rows, t.stats, t.rings, plan.tokens[k - 1].active)
        if key is not None and key == last:
            out[-1] = range(out[-1].start, k + 1)
        else:
            out.append(range(k, k + 1))
        last = key
    return out


def matches(a: GraphStats, b: GraphStats) -> bool:
    """Consecutive tokens ``a``, ``b`` ran the same events: counts and ring fields equal, times within STEADY_RTOL."""
    if any(getattr(a, f) != getattr(b, f) for f in SAME_FIELDS):
        return False
    tol = STEADY_RTOL * max(a.total_s, b.total_s)
    return all(abs(getattr(b, f) - getattr(a, f)) <= tol for f in TIME_FIELDS)


def step(a: GraphStats, b: GraphStats, f: str) -> Any:
    """The per-token change of field ``f`` from ``a`` to ``b``; a time step within float noise (NOISE_RTOL of the
    token's time, what simulated clocks at different absolute times give the same token) is none."""
    d = getattr(b, f) - getattr(a, f)
    return 0.0 if f in TIME_FIELDS and abs(d) <= NOISE_RTOL * b.total_s else d


def extrapolate(a: GraphStats, b: GraphStats, token: int) -> GraphStats:
    """Token ``token``'s stats from the steady pair ``a``, ``b`` (consecutive): ``b`` advanced by their step."""
    n = token - b.token
    return replace(b, token=token, extrapolated_from=b.token, **{f: getattr(b, f) + n * step(a, b, f) for f in DRIFT_FIELDS})


def predicted(guess: GraphStats, got: GraphStats) -> bool:
    """A simulated token is where its steady pair pointed: it matches the extrapolation, bytes exactly."""
    return matches(guess, got) and (guess.early_bytes, guess.late_bytes) == (got.early_bytes, got.late_bytes)


class _Run:
    """One fast-path run: the scheduler, the stats so far (token -> stats) and the graphs it reads."""

    def __init__(self, backend: Backend, point: Point) -> None:
        self.point = point
        self.sched = new_scheduler(backend, point, graph_at(point, 0))
        self.stats: dict[int, GraphStats] = {}

    def segment(self, start: int, stop: int) -> HostOp:
        """Tokens ``start..stop-1`` of one segment: simulated until two consecutive ones match, then filled."""
        prev: GraphStats | None = None
        for k in range(start, stop):
            s = self.stats[k] = yield from self.sched.run_graph(graph_at(self.point, k))  # (no generator layer of its own)
            if prev is not None and k + 1 < stop and matches(prev, s):
                yield from self.fill(prev, s, stop)
                return
            prev = s

    def fill(self, a: GraphStats, b: GraphStats, stop: int) -> HostOp:
        """Tokens after ``b`` up to ``stop-1`` from the steady pair ``a``, ``b``. More than UNCHECKED_TOKENS of them:
        the last is simulated first, and where it is not where the pair points (the token's bottleneck moved within
        the block), the first half is filled from the pair and the second half is a segment of its own."""
        first, last = b.token + 1, stop - 1
        if last - first + 1 > UNCHECKED_TOKENS and last not in self.stats:
            end = self.stats[last] = yield from self.sched.run_graph(graph_at(self.point, last))
            if not predicted(extrapolate(a, b, last), end):
                mid = (first + last) // 2
                yield from self.fill(a, b, mid)
                yield from self.segment(mid, last)
                return
        for k in range(first, last + 1):
            if k not in self.stats:
                self.stats[k] = extrapolate(a, b, k)


def run_steady(backend: Backend, point: Point, plan: PointPlan) -> HostOp:
    """The host program of the fast path: the scheduler runs the tokens each segment needs, the rest are
    extrapolated. Returns (scheduler, stats list of ``tokens`` entries). Blocks the host as ``run_decode`` does."""
    run = _Run(backend, point)
    for seg in segments(plan):
        yield from run.segment(seg.start, seg.stop)
    return run.sched, [run.stats[k] for k in range(point.workload.tokens)]
