"""The point planner: which simulation decides each requested point, found before anything is simulated.

A grid asks for many points that are one simulation in disguise. The ordered path (depth 0) never reads the
budget, so every budget of a depth-0 point is the same run; a pipelined point whose ring is declined at every
token runs the ordered path too; and two budgets that let the scheduler make the same plan at every token (the
same rings on, the same slots allocated, the same declines) are the same run. Which of these a point is follows
from the plan the scheduler would make, not from a row flag, so this module *replays the scheduler's planning*
per token without simulating anything: the ring's own decisions (``sim.transport.ring.Ring.decline_reason`` and
``Ring.ensure_slots``, run against a ledger of the device's memory), the slot need of the token's staged splits
(``sim.transport.deliveries``), the graph's memory next to the ring, the idle release. That replay is :func:`plan_point`; a
test holds it to what the simulation decides on the 1,000-point grid.

:func:`tasks` groups the requested points by the simulation that decides them (the key of :func:`sim_key`). Each
group is one :class:`Task`: the point to simulate (an ordered group simulates at depth 0) and its members, each of
which keeps its own labels (depth and budget as requested) and says in its row which run it came from
(``simulated_as``: that run's depth and budget; ``shared_with_n``: how many requested points share it).
:func:`member_result` turns the run into a member's result: its point, and its plan's per-token ring fields
(a declined depth-3 point reports its ring and why it was declined, over the ordered run's times and bytes).

Units: bytes.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from backends.base import Buffer, OutOfDeviceMemory, Stream
from sim.graph import Split
from sim.simulate import GRAPH_BASE_BYTES, Point, graph_at, io_bytes_for, placed_hardware
from sim.transport.config import GraphStats
from sim.transport.deliveries import full_need, slot_entries, span_fn
from sim.transport.ring import Ring
from sim.workload import Workload

#: The GraphStats fields the plan decides (the rest are what the simulation measures).
PLAN_FIELDS = ("ring_slots", "slot_need_bytes", "slot_alloc_bytes", "full_slot_need_bytes", "declined", "decline_reason",
               "staged_splits")


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


class _Ledger:
    """A device-memory ledger with the three calls a ring makes (``alloc``, ``free``, ``free_bytes``), as the SimPy
    machine keeps it: every allocation that fits is granted, nothing else is modelled. Does not block."""

    def __init__(self, point: Point) -> None:
        self.total = [d.memory_total_bytes for d in point.hardware.devices]
        self.used = [d.memory_used_bytes for d in point.hardware.devices]

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        nbytes = int(nbytes)
        if nbytes > self.free_bytes(device):
            raise OutOfDeviceMemory(f"{name}: {nbytes} B > {self.free_bytes(device)} B free on device {device}")
        self.used[device] += nbytes
        return Buffer(name, nbytes, device)

    def free(self, buffer: Buffer) -> None:
        self.used[buffer.device] -= buffer.nbytes

    def free_bytes(self, device: int) -> int:
        return self.total[device] - self.used[device]


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
SHAPES_KEPT = 64


def _shape(point: Point, step: int, rows: int, spans: list[Any], slot_key: Any) -> _Shape:
    """The shape of step ``step``'s graph (its window: ``rows``); kept for the next points of the same workload
    (``slot_key``: what the slot spans depend on)."""
    wl = point.workload
    key = (wl, tuple(d.compute for d in point.hardware.devices), point.transport.arm, rows, slot_key)
    shape = _SHAPES.get(key)
    if shape is None:
        shape = _SHAPES[key] = _build_shape(point, step, spans)
        while len(_SHAPES) > SHAPES_KEPT:
            _SHAPES.popitem(last=False)
    return shape


def _build_shape(point: Point, step: int, spans: list[Any]) -> _Shape:
    graph = graph_at(point, step)
    by_dev: dict[int, list[Split]] = {}
    for s in graph.staged_splits:
        by_dev.setdefault(s.device, []).append(s)
    staged = []
    for dev, splits in by_dev.items():
        need, _ = slot_entries(splits, spans[dev])
        staged.append((dev, need, max(full_need(s, graph, spans[dev]) for s in splits), len(splits)))
    gpus = tuple(sorted({s.device for s in graph.splits if s.kind == "gpu"}))
    kv = tuple(sorted({s.device for s in graph.splits if s.resident}))
    return _Shape(tuple(staged), gpus, graph.host_cache_bytes - graph.host_only_kv_bytes, kv, graph.device_kv_bytes)


class _DoesNotFit(Exception):
    """The scheduler would raise OutOfDeviceMemory at this token."""


class _Replay:
    """The scheduler's planning state for one point, over a memory ledger: rings, graph memory, what is placed once.
    Its steps mirror ``TransportScheduler.run_graph``'s placing of the --kv-gpu-layers prefix, ``_plan``,
    ``_reserve_graph`` and ``_account_idle``."""

    def __init__(self, point: Point) -> None:
        self.point, self.cfg = point, point.transport
        placed = replace(point, hardware=placed_hardware(point))
        self.ledger = _Ledger(placed)
        self.align = [max(d.alignment_bytes, self.cfg.min_alignment_bytes) for d in placed.hardware.devices]
        self.spans = [span_fn(self.cfg.pack_streams, a) for a in self.align]
        self.slot_key = (self.cfg.pack_streams, tuple(self.align))
        self.rings: dict[int, Ring] = {}
        self.graph_mem: dict[int, Buffer] = {}
        self.placed_once: set[tuple[str, int]] = set()
        self.io_bytes = io_bytes_for(point.workload)
        self.shapes: dict[int, _Shape] = {}

    def token(self, step: int) -> TokenPlan:
        """Plan decode step ``step``. Raises _DoesNotFit or OutOfDeviceMemory where the scheduler raises."""
        rows = window_rows_at(self.point.workload, step)
        shape = self.shapes.get(rows) or self.shapes.setdefault(rows, _shape(self.point, step, rows, self.spans, self.slot_key))
        st = GraphStats()
        if shape.device_kv_bytes and self.cfg.arm != "resident":  # the scheduler places the prefix before any ring
            for dev in shape.device_kv:
                self._once("resident", dev, shape.device_kv_bytes)
        active, needs = self._plan(shape, st)
        self._reserve(shape, st, active, needs)
        counts_idle = self._account_idle(active)
        rings = tuple((d, bool(active.get(d)), r.slot_alloc_bytes, r.frozen_ordered) for d, r in self.rings.items())
        return TokenPlan(rows, tuple(getattr(st, f) for f in PLAN_FIELDS), rings, counts_idle)

    def _plan(self, shape: _Shape, st: GraphStats) -> tuple[dict[int, bool], dict[int, int]]:
        """Per device with staged splits: is the ring on (decline and sizing by ``sim.transport.ring``), and the slot need."""
        cfg = self.cfg
        active: dict[int, bool] = {}
        needs: dict[int, int] = {}
        for dev, need, full, n_splits in shape.staged:
            st.staged_splits += n_splits
            st.slot_need_bytes = max(st.slot_need_bytes, need)
            st.full_slot_need_bytes = max(st.full_slot_need_bytes, full)
            needs[dev], active[dev] = need, False
            if cfg.depth == 0 or cfg.arm == "resident":
                continue
            ring = self.rings.get(dev)
            if ring is None:
                ring = self.rings[dev] = Ring(dev, Stream(f"transfer{dev}", dev), cfg.n_slots)
                ring.slot_used = [False] * ring.n_slots
            st.ring_slots = ring.n_slots
            reason = ring.decline_reason(cfg, self.ledger, need, full) or ring.ensure_slots(cfg, self.ledger, self.align[dev], need, full)
            if reason:
                st.declined, st.decline_reason = True, reason
                continue
            active[dev] = True
            st.slot_alloc_bytes = max(st.slot_alloc_bytes, ring.slot_alloc_bytes)
        return active, needs

    def _reserve(self, shape: _Shape, st: GraphStats, active: dict[int, bool], needs: dict[int, int]) -> None:
        """Each GPU device's graph memory next to its ring (a failure frees the ring and freezes the device ordered),
        its io buffer once, and the resident arm's cache once."""
        cfg = self.cfg
        for dev in shape.gpu_devices:
            here = dev in needs and (not active[dev] or not cfg.policy.ring_staging) and cfg.arm != "resident"
            if not self._grow(dev, GRAPH_BASE_BYTES + (needs[dev] if here else 0)):
                ring = self.rings.get(dev)
                if ring is None or ring.buffer is None:
                    raise _DoesNotFit(f"the graph does not fit device {dev}")
                ring.free(self.ledger)
                ring.frozen_ordered = True
                if dev in needs:
                    active[dev] = False
                st.declined = True
                st.decline_reason = f"graph reservation failed next to the ring on device {dev}; retried ordered"
                if not self._grow(dev, GRAPH_BASE_BYTES + needs.get(dev, 0)):
                    raise _DoesNotFit(f"the graph does not fit device {dev}")
            self._once("io", dev, self.io_bytes)
        if cfg.arm == "resident":
            for dev in shape.gpu_devices:
                self._once("resident", dev, shape.host_cache_bytes)

    def _grow(self, dev: int, need: int) -> bool:
        cur = self.graph_mem.get(dev)
        if cur is not None and cur.nbytes >= need:
            return True
        if cur is not None:
            self.ledger.free(self.graph_mem.pop(dev))
        try:
            self.graph_mem[dev] = self.ledger.alloc(dev, max(need, 1), f"graph{dev}")
        except OutOfDeviceMemory:
            return False
        return True

    def _once(self, what: str, dev: int, nbytes: int) -> None:
        if (what, dev) not in self.placed_once:
            self.ledger.alloc(dev, nbytes, f"{what}{dev}")
            self.placed_once.add((what, dev))

    def _account_idle(self, active: dict[int, bool]) -> bool:
        """Reset or count each ring's idle graphs, releasing a ring idle too long. Returns whether an idle ring held
        slots (its count mattered)."""
        counted = False
        for dev, ring in self.rings.items():
            if active.get(dev):
                ring.idle_graphs, ring.delivered_last_graph = 0, True
                continue
            counted = counted or ring.buffer is not None
            ring.delivered_last_graph = False
            ring.idle_graphs += 1
            if ring.idle_graphs > self.cfg.idle_release_graphs:
                ring.free(self.ledger)
        return counted


def plan_point(point: Point) -> PointPlan:
    """Replay the scheduler's plan for every token of ``point`` (as ``sim.transport.scheduler.TransportScheduler`` makes it in
    ``_plan``, ``_reserve_graph`` and ``_account_idle``), with no simulation. Pure; builds one graph per window size."""
    replay = _Replay(point)
    out: list[TokenPlan] = []
    try:
        for step in range(point.workload.tokens):
            out.append(replay.token(step))
    except (_DoesNotFit, OutOfDeviceMemory) as exc:
        return PointPlan(tuple(out), False, str(exc))
    return PointPlan(tuple(out))


UNPLANNED = PointPlan(())  # the plan of a point run exact, as asked (never read)

# ------------------------------------------------------------------ grouping


def _base(point: Point) -> Any:
    """Everything a simulation depends on but depth and budget."""
    return point.workload, point.hardware, replace(point.transport, depth=0, budget_mib=0.0)


def sim_key(point: Point, plan: PointPlan, index: int = 0) -> Any:
    """The key of the simulation that decides ``point``: equal keys, one simulation. Pure.

    Ordered (depth 0, or no ring delivers at any token): the ordered run of the point's workload, whatever the
    depth and budget. Pipelined: the depth and the plan of every token (a budget that changes no token's plan
    shares). A point whose graph does not fit, or that is mutated, runs alone (``index`` tells it apart).
    """
    if not plan.fits or point.transport.mutations:
        return ("alone", index)
    if not plan.pipelined:
        return (_base(point), "ordered")
    return (_base(point), point.transport.depth, tuple((t.stats, t.rings) for t in plan.tokens))


@dataclass(frozen=True)
class Member:
    """A requested point (``index`` in the list asked for), its plan, and which simulation its row comes from."""

    point: Point
    plan: PointPlan
    simulated_as: dict[str, Any] = field(default_factory=dict)
    shared_with_n: int = 1
    index: int = 0  # its place in the points asked for


@dataclass(frozen=True)
class Task:
    """One simulation (``point``, planned as ``plan``; None: exact, not planned) and the requested points it decides."""

    point: Point
    plan: PointPlan | None
    members: tuple[Member, ...]
    exact: bool = False


def partitions(points: Sequence[Point]) -> list[list[int]]:
    """The indices of ``points`` in groups that no simulation crosses (the same point but for depth and budget), in
    order of first appearance: a worker given whole partitions plans them as the whole grid would. Pure."""
    groups: dict[Any, list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault(_base(p), []).append(i)
    return list(groups.values())


def tasks(points: list[Point], todo: list[bool] | None = None, exact: bool = False, share: bool = True) -> list[Task]:
    """The simulations that decide ``points`` (grid order), each with its members among those ``todo`` marks.

    ``exact`` or not ``share``: one task per point, simulated as asked (``exact`` also runs every token). A group's
    simulation is its first point in grid order (an ordered group's at depth 0); ``shared_with_n`` counts the
    whole grid, so a resumed sweep's rows say the same. Pure (plans every point; builds a graph per window size).
    """
    todo = todo if todo is not None else [True] * len(points)
    if exact:  # every point as asked: nothing to plan
        return [Task(p, None, (Member(p, UNPLANNED, _label(p), 1, i),), True) for i, p in enumerate(points) if todo[i]]
    plans = [_plan_or_alone(p) for p in points]
    if not share:
        keys: list[Any] = [("alone", i) for i in range(len(points))]
    else:
        keys = [sim_key(p, pl, i) for i, (p, pl) in enumerate(zip(points, plans, strict=True))]
    groups: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out = []
    for k, idx in groups.items():
        if not any(todo[i] for i in idx):
            continue
        first = points[idx[0]]
        ordered = k[-1] == "ordered" and first.transport.depth != 0
        sim = replace(first, transport=replace(first.transport, depth=0)) if ordered else first
        members = tuple(Member(points[i], plans[i], _label(sim), len(idx), i) for i in idx if todo[i])
        out.append(Task(sim, plan_point(sim) if ordered else plans[idx[0]], members, exact))
    return out


def _label(sim: Point) -> dict[str, Any]:
    """``simulated_as``: the depth and budget of the run (its other coordinates are every member's own)."""
    return {"depth": sim.transport.depth, "budget_mib": sim.transport.budget_mib}


def _plan_or_alone(point: Point) -> PointPlan:
    """The point's plan; one that cannot be planned runs alone, and its simulation says why."""
    try:
        return plan_point(point)
    except Exception as exc:  # noqa: BLE001 - the simulation of the point raises it again, where it is reported
        return PointPlan((), False, f"{type(exc).__name__}: {exc}")
