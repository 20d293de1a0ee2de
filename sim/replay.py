"""The scheduler's planning replayed for many points at once: each token's ring decisions, with no simulation.

Which simulation decides a point, whether the evaluator's token is ordered or pipelined, which tokens of a run may
stand in for each other -- each follows from the plan the scheduler would make at every token. :func:`plan_points`
makes it for a whole batch of points: it reads each token's graph once per *line* (the points that differ only in
depth and budget; a window's graph once per workload at any context, ``context_free``; the lines of a *family*, alike
but for context, as arrays once its template is trusted: ``sim.replay_family``), then runs the scheduler's own
rules (``sim.transport.planning``: slot need, the ring's decline and sizing, the graph's memory beside it, the idle
release) over arrays with one element per point, against a ledger of each point's device memory. The result,
:class:`Plans`, keeps every token's decisions as arrays; :meth:`Plans.point_plan` gives one point's as the records
the point planner's grouping and the fast path read (:class:`PointPlan` of :class:`TokenPlan`).

Units: bytes.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.points import PointGrid, objects_of
from sim.replay_family import EachLines, OneLine, line_arrays
from sim.replay_groups import combined, first_appearance
from sim.replay_keys import (
    clear_numbers,
    compute_number,
    config_but_depth_budget,
    config_class,
    context_free,
    free_number,
    interned,
    number,
)
from sim.replay_shapes import _STEPS, placed_devices, steps_of
from sim.replay_shapes import TEMPLATES as _TEMPLATES
from sim.replay_shapes import learn as _learn
from sim.run.point import GRAPH_BASE_BYTES, Point, graph_at, io_bytes_for
from sim.transport import planning
from sim.transport.deliveries import span_fn
from sim.transport.planning import PLAN_FIELDS
from sim.workload import Workload

__all__ = ["PLAN_FIELDS", "Plans", "PointPlan", "TokenPlan", "config_but_depth_budget", "config_class", "context_free", "line_key",
           "object_groups", "plan_point", "plan_points", "point_parts", "window_rows_at"]


@dataclass(frozen=True)
class TokenPlan:
    """What the scheduler plans for one token: the ``PLAN_FIELDS`` of its stats, and each ring's state after it.

    ``rings``: (device, delivered this token, slot bytes allocated, frozen ordered) per ring, in the order the
    scheduler made them. ``counts_idle``: a ring holds slots but delivers nothing this token, so the scheduler's
    count of idle graphs (which releases the ring) depends on every such token being run.
    """

    rows: int
    stats: tuple[Any, ...]
    rings: tuple[tuple[int, bool, int, bool], ...]
    counts_idle: bool = False

    @property
    def active(self) -> tuple[int, ...]:
        return tuple(d for d, on, _, _ in self.rings if on)

    def fields(self) -> dict[str, Any]:
        return dict(zip(PLAN_FIELDS, self.stats, strict=True))


@dataclass(frozen=True)
class PointPlan:
    """The plan of every token of a point; ``fits`` False: the scheduler raises OutOfDeviceMemory (``reason``)."""

    tokens: tuple[TokenPlan, ...]
    fits: bool = True
    reason: str = ""

    @property
    def pipelined(self) -> bool:
        """Some ring delivers at some token."""
        return any(t.active for t in self.tokens)


@functools.lru_cache(maxsize=1 << 16)
def window_rows_at(wl: Workload, step: int) -> int:
    """Rows the attention of decode step ``step`` reads: the window of the highest row any sequence writes. Pure;
    kept (every depth and budget of a grid asks it of the same workload)."""
    return wl.window_rows(max(r for _, r in wl.writes(step)))


@dataclass(frozen=True)
class _Shape:
    """What planning reads of one token's graph: per device with staged splits (in graph order) the slot need, the
    full-context need and the staged split count; the devices that run GPU splits; the host cache's size."""

    staged: tuple[tuple[int, int, int, int], ...]
    gpu_devices: tuple[int, ...]
    host_cache_bytes: int  # the resident arm's device copy: the host cache past the -ngl CPU layers' blocks
    device_kv: tuple[int, ...] = ()  # the devices that keep the --kv-gpu-layers prefix
    device_kv_bytes: int = 0


_SHAPES: OrderedDict[Any, _Shape] = OrderedDict()  # the last shapes planned: the depths and budgets of a grid share them
SHAPES_KEPT = 1 << 14  # small records: every context of a workload, and the sample check's points, find theirs


def clear_shapes() -> None:
    """Forget the shapes and keys kept (a timing that must build them)."""
    _SHAPES.clear()
    _TEMPLATES.clear()
    _STEPS.clear()
    context_free.cache_clear()
    clear_numbers()
    window_rows_at.cache_clear()


def _family(point: Point) -> int:
    """What a step's shape depends on but its window and slot layout (``context_free`` with the cache's size), as a
    number."""
    return interned((free_number(point.workload, True), compute_number(point.hardware), point.transport.arm))


def _shape(point: Point, step: int, rows: int, spans: list[Any], slot_key: Any, family: int | None = None) -> _Shape:
    """The shape of step ``step``'s graph (its window: ``rows``); kept for the next points whose graphs share it
    (``slot_key``: what the slot spans depend on; ``family``: the point's :func:`_family`, if known)."""
    key = (_family(point) if family is None else family, rows, slot_key)
    shape = _SHAPES.get(key)
    if shape is None:
        tkey = (interned((free_number(point.workload, False), compute_number(point.hardware), point.transport.arm)), slot_key)
        kept = _TEMPLATES.get(tkey)
        if kept is not None and kept[1] and rows >= 1:  # a confirmed template: no graph
            shape = _Shape(*kept[0].fields(point.workload, rows, spans[kept[0].device]))
        else:
            graph = graph_at(point, step)
            got = graph_shape(graph, spans, slot_key)
            shape = _Shape(*got)
            _learn(tkey, kept, point.workload, graph, planning.slot_needs(graph, spans, slot_key), spans, got)
        _SHAPES[key] = shape
        while len(_SHAPES) > SHAPES_KEPT:
            _SHAPES.popitem(last=False)
    return shape


def graph_shape(graph: Any, spans: list[Any], slot_key: Any) -> tuple[Any, ...]:
    """The fields of ``graph``'s :class:`_Shape`, read off the graph (``slot_key`` names ``spans``). Pure."""
    needs = planning.slot_needs(graph, spans, slot_key)
    return (tuple((dev, need, full, len(splits)) for dev, splits, need, _, full in needs),
            tuple(sorted({s.device for s in graph.splits if s.kind == "gpu"})), graph.host_cache_bytes - graph.host_only_kv_bytes,
            tuple(sorted({s.device for s in graph.splits if s.resident})), graph.device_kv_bytes)


@dataclass(frozen=True)
class _Line:
    """What planning reads of the points that differ only in depth and budget: their devices' memory as the workload
    places it, the slot layout, the io buffer; and each token's graph shape (built as planning asks)."""

    point: Point
    total: tuple[int, ...]
    used: tuple[int, ...]
    align: tuple[int, ...]
    spans: list[Any]
    slot_key: Any
    io_bytes: int
    family: int  # _family(point)
    rows: tuple[int, ...]  # each token's window rows

    @staticmethod
    def of(point: Point) -> _Line:
        cfg, devices, wl = point.transport, placed_devices(point), point.workload
        align = tuple(max(d.alignment_bytes, cfg.min_alignment_bytes) for d in devices)
        return _Line(point, tuple(d.memory_total_bytes for d in devices), tuple(d.memory_used_bytes for d in devices), align,
                     [span_fn(cfg.pack_streams, a) for a in align], (cfg.pack_streams, align), io_bytes_for(wl),
                     _family(point), steps_of(wl)[0])

    def shape(self, step: int) -> _Shape:
        return _shape(self.point, step, self.rows[step], self.spans, self.slot_key, self.family)


def _one_line(point: Point) -> OneLine:
    """What planning reads of ``point``'s line, read alone (``sim.replay_family.line_arrays``' ``one_line``)."""
    x = _Line.of(point)
    return x.total, x.used, x.align, x.io_bytes, x.rows, [x.shape(k) for k in range(point.workload.tokens)]


def line_key(point: Point) -> Any:
    """Everything planning reads of a point but its depth and budget (the points of one line share their graphs)."""
    return point.workload, point.hardware, config_but_depth_budget(point.transport)


def point_parts(points: Sequence[Point]) -> list[tuple[list[Any], np.ndarray]]:
    """The points' workload, machine and config objects and each point's index of each (intp): a grid's
    (``sim.points.PointGrid``) own lists as they are (an object no point uses among them changes no key read through
    them), else ``sim.points.objects_of``. Pure."""
    if isinstance(points, PointGrid):
        return [(objs, np.asarray(at, dtype=np.intp).reshape(-1)) for objs, at in points.parts]
    return [objects_of(points, k) for k in range(3)]


def object_groups(points: Sequence[Point], parts: list[tuple[list[Any], np.ndarray]] | None = None
                  ) -> tuple[np.ndarray, list[int]]:
    """Each point's group, numbered in order of first appearance, and each group's first index: points in one group
    share their workload and profile objects and their :func:`config_class` (so differ at most in depth and budget),
    found from object ids as arrays, without hashing a workload (``points`` keeps the objects alive; ``parts``: their
    :func:`point_parts`, if known). Pure."""
    if not len(points):
        return np.zeros(0, dtype=np.intp), []
    (ws, w), (hs, h), (cs, c) = point_parts(points) if parts is None else parts
    classes, cls = np.unique(np.array([config_class(x) for x in cs], dtype=np.int64), return_inverse=True)
    return first_appearance(combined([(w, len(ws)), (h, len(hs)), (cls.reshape(-1)[c], len(classes))]))


def _lines(points: Sequence[Point], parts: list[tuple[list[Any], np.ndarray]] | None = None
           ) -> tuple[np.ndarray, list[Point]]:
    """Each point's line number, and each line's first point. Points that share their workload and profile objects
    (a grid's depths and budgets) are told apart without hashing them again (:func:`object_groups`; ``parts``: the
    points' :func:`point_parts`, if known)."""
    group, firsts_of = object_groups(points, parts)
    lines: dict[Any, int] = {}
    firsts: list[Point] = []
    line_of_group = np.empty(len(firsts_of), dtype=np.intp)
    for g, i in enumerate(firsts_of):
        p = points[i]
        wl = p.workload  # its number as its context-free one (``family_key`` reads it next) and what that leaves out
        key = (free_number(wl, False), wl.context, wl.tokens, wl.ctx_size, number(p.hardware), config_class(p.transport))
        li = line_of_group[g] = lines.setdefault(key, len(lines))
        if li == len(firsts):
            firsts.append(p)
    return line_of_group[group], firsts


@dataclass
class Plans:
    """Every token's plan of many points (``sim.transport.planning`` over arrays, one element per point).

    ``graphs[k]``: token k's :class:`planning.GraphPlan`; ``rings[k][d]``: device d's ring after token k (made,
    running, slot bytes, frozen); ``rows[k]``: each point's window rows at token k; ``fits``/``failed_at``/
    ``reasons``: a point the scheduler refuses (OutOfDeviceMemory) at token ``failed_at``, and why.
    """

    points: Sequence[Point]
    line_of: np.ndarray  # each point's line (the points that differ only in depth and budget), numbered from 0
    lines: list[Point]  # the first point of each line
    policy: planning.Policy  # each point's TransportConfig as planning reads it (depth, slots, budget, ...)
    tokens: np.ndarray  # each point's decode tokens
    graphs: list[planning.GraphPlan]
    rings: list[dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]]
    rows: list[np.ndarray]
    made_at: dict[int, np.ndarray]
    rank: dict[int, np.ndarray]
    fits: np.ndarray
    failed_at: np.ndarray
    reasons: dict[int, str]

    def active(self, k: int, device: int = 0) -> np.ndarray:
        """Where device ``device``'s ring delivers at token ``k``."""
        return self.graphs[k].active.get(device, np.zeros(len(self.points), dtype=bool))

    def point_plan(self, i: int) -> PointPlan:
        """Point ``i``'s plan as the point planner's records (what ``sim_key`` and the fast path read). Pure."""
        p = self.points[i]
        cfg = p.transport
        n = min(p.workload.tokens, int(self.failed_at[i]))
        order = sorted((int(self.made_at[d][i]), int(self.rank[d][i]), d) for d in self.made_at if self.made_at[d][i] < n)
        out = []
        for k in range(n):
            g, snap = self.graphs[k], self.rings[k]
            rings = tuple((d, bool(snap[d][1][i]), int(snap[d][2][i]), bool(snap[d][3][i])) for at, _, d in order if at <= k)
            out.append(TokenPlan(int(self.rows[k][i]), g.fields(i, cfg), rings, bool(g.counts_idle[i])))  # type: ignore[index]
        return PointPlan(tuple(out), bool(self.fits[i]), self.reasons.get(i, ""))


def plan_points(points: Sequence[Point], each_line: EachLines | None = None) -> Plans:
    """Replay the scheduler's plan for every token of every point (``sim.transport.planning``, the scheduler's own
    rules, over arrays of points: the points' memory on a ``planning.Ledger``), with no simulation. Pure; builds one
    graph per window size of each line (the points that differ only in depth and budget) read alone, none for the lines
    of a family read at once (``sim.replay_family``). ``each_line``: called with line numbers (``Plans.lines``) right
    after they were read (a line read alone while ``sim.run.point.graph_at`` keeps its graphs; ``family`` True: a
    family's lines read at once)."""
    n = len(points)
    parts = point_parts(points) if n else None
    line_of, firsts = _lines(points, parts)
    la = line_arrays(firsts, _one_line, each_line)
    n_dev = la.total.shape[1]
    ledger = planning.Ledger(la.total[line_of], la.used[line_of])
    align = la.align[line_of]
    align[align == 0] = 1
    io = la.io[line_of]
    cfgs, cfg_of = parts[2] if parts is not None else objects_of(points, 2)
    pol = planning.Policy.of(cfgs)  # each config object once
    pol = planning.Policy(*(getattr(pol, f)[cfg_of] for f in planning.Policy.__dataclass_fields__))
    tokens = la.tokens[line_of]
    rings = {d: planning.RingState.empty(n) for d in range(n_dev)}
    made_at = {d: np.full(n, 1 << 30, dtype=np.int64) for d in range(n_dev)}
    rank = {d: np.zeros(n, dtype=np.int64) for d in range(n_dev)}
    failed_at = np.full(n, 1 << 30, dtype=np.int64)
    graphs, snaps, rows = [], [], []
    for k in range(int(tokens.max(initial=0))):
        live = (tokens > k) & ledger.fits
        arr = la.at(k, line_of)
        rows.append(np.take(np.ascontiguousarray(la.rows[:, k]), line_of))
        gp = planning.GraphPlan.empty(n)
        for d in range(n_dev):  # the --kv-gpu-layers prefix is placed before any ring is sized (not on the resident arm)
            ledger.alloc(d, "resident", arr.kv_bytes, live & arr.kv[:, d] & ~pol.resident_arm &
                         (ledger.held(d, "resident") < 0), must=True)
        for d in range(n_dev):
            here = live & ledger.fits & arr.staged[:, d]
            planning.plan_ring(gp, rings[d], ledger, pol, d, here, arr.n_splits[:, d], arr.need[:, d], arr.full[:, d],
                               align[:, d], arr.rank[:, d])
            first = here & pol.ring & (made_at[d] > k)
            made_at[d] = np.where(first, k, made_at[d])
            rank[d] = np.where(first, arr.rank[:, d], rank[d])
        for d in range(n_dev):
            gpu = live & ledger.fits & arr.gpu[:, d]
            planning.reserve_graph(gp, rings, ledger, pol, d, gpu, arr.staged[:, d], arr.need[:, d], GRAPH_BASE_BYTES, io)
        for d in range(n_dev):
            ledger.alloc(d, "resident", arr.host_cache, live & ledger.fits & arr.gpu[:, d] & pol.resident_arm &
                         (ledger.held(d, "resident") < 0), must=True)
        planning.account_idle(gp, rings, ledger, pol)
        failed_at = np.where(live & ~ledger.fits & (failed_at > k), k, failed_at)
        graphs.append(gp)
        snaps.append({d: (r.made.copy(), gp.active.get(d, np.zeros(n, dtype=bool)) & r.made, r.alloc.copy(), r.frozen.copy())
                      for d, r in rings.items()})
    return Plans(points, line_of, list(firsts), pol, tokens, graphs, snaps, rows, made_at, rank, ledger.fits,
                 failed_at, ledger.reasons)


def plan_point(point: Point) -> PointPlan:
    """Replay the scheduler's plan for every token of ``point`` (:func:`plan_points` of one point). Pure."""
    return plan_points([point]).point_plan(0)
