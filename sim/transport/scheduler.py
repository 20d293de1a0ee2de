"""The transport scheduler: when each staged KV window crosses the link. Written once, run on any backend.

It imports the backend Protocol (``backends.base``) and the graph's data
(``sim.graph``) and nothing of a machine: the same host program drives the
SimPy machine and a real GPU, so what the simulation predicts is what the GPU
executes. Three jobs, three modules:

* **plan** -- ``sim.transport.ring`` decides, per graph and device, whether a ring of
  N + 2 slots fits the budget and the headroom, and sizes it;
  ``sim.transport.deliveries`` (pure, no backend) turns the device's staged splits into
  delivery records: slot, early ranges, late ranges, kernel bindings (its
  docstring walks one delivery from plan to slot to event);
* **execute** -- this module issues them, as llama.cpp's scheduler does;
* **mutations** -- ``sim.transport.config.Mutations``, a policy consulted at
  named decision points; **schedules** -- ``sim.transport.config.Schedule``, when
  the copies go (all off: the reference; ``sim.transport.policies``, docs/schedules.md).

Two paths:

* **Ordered** (depth 0, a declined plan, or a device frozen ordered): for each
  split the host waits for the consumer stream, copies the split's inputs with
  blocking copies, then launches it. A token costs copy + compute in series.
* **Pipelined** (depth N in 1..14): delivery ``o`` (staged split ``o``'s
  windows) goes into slot ``o mod n_slots``: its stable prefix on the
  *transfer* stream, after that stream waited on the slot's ``release`` event
  (stream to stream), then ``ready`` is recorded. The late part (rows written
  this ubatch) goes on the consumer stream at the split, which then waits on
  ``ready``, runs, and records ``release``. Deliveries are issued *after* a
  staged split is enqueued, while ``o <= consumed + N``, so delivery o follows
  the enqueue of staged split o - N - 1. Priming issues the first N + 1 at
  graph start.

The plan is re-evaluated every graph; a ring that cannot sit next to the
graph's own memory is released, the reservation retried ordered, and that
device stays ordered. After more than ``idle_release_graphs`` graphs that stage
nothing the ring is released. The arms ``resident`` and ``copy-only``
(``TransportConfig.arm``) run the same graph with the windows already on the
device, or with no kernels. The kernels of a split write the first
``kernel_io_bytes`` of the device's io buffer (the new K/V rows of every
sequence, at least 64 KiB); the small inputs of the next split are staged above
them.

All times in seconds, sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.base import Access, Backend, BackendError, Buffer, HostOp, OutOfDeviceMemory, Work, WorkKind
from sim.bindings import IO
from sim.graph import DecodeGraph, Split, StagedInput
from sim.transport import planning
from sim.transport.config import ARMS, MAX_BUDGET_MIB, MAX_DEPTH, MIB, MUTATIONS, GraphStats, Mutations, Schedule, TransportConfig
from sim.transport.deliveries import (
    Delivery,
    align_up,
    in_pieces,
    next_pow2,
    piece_range,
    plan_deliveries,
    span_fn,
    stable_early,
)
from sim.transport.ordered_path import OrderedPath
from sim.transport.policies import SchedulePolicies, fresh_rows
from sim.transport.program import Binding, Program
from sim.transport.ring import Ring

__all__ = ["ARMS", "KERNEL_IO_BYTES", "MAX_BUDGET_MIB", "MAX_DEPTH", "MIB", "MUTATIONS", "GraphStats", "Mutations", "Program",
           "TransportConfig", "TransportScheduler", "align_up", "next_pow2", "piece_range"]

KERNEL_IO_BYTES = 1 << 16
@dataclass
class _DevicePlan:
    """One device's staged splits this graph: is the ring on, what a slot needs, and the deliveries."""

    active: bool
    slot_need: int = 0
    entries: dict[int, list[tuple[StagedInput, int]]] = field(default_factory=dict)  # split index -> (input, offset in slot)
    order: list[Split] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    target: Buffer | None = None
    issued: int = 0
    consumed: int = 0
    primed: bool = False
    fresh_of: dict[int, Delivery] = field(default_factory=dict)  # producing split index -> the delivery it stores into


class TransportScheduler(OrderedPath, SchedulePolicies):
    """Runs decode graphs on a backend, ordered or pipelined.

    ``alignment_bytes`` and ``graph_base_bytes`` come from the caller (per
    device). ``host_cache`` is the host buffer the staged windows live in.
    Nothing here knows which backend it drives.
    """

    def __init__(self, backend: Backend, config: TransportConfig, host_cache: Buffer, alignment_bytes: Sequence[int] = (256,),
                 graph_base_bytes: Sequence[int] = (0,), program: Program | None = None, io_bytes: int = 1 << 20) -> None:
        self.be, self.cfg, self.host_cache, self.program, self.io_bytes = backend, config, host_cache, program, io_bytes
        self.policy: Mutations = config.policy
        self.align = [max(a, config.min_alignment_bytes) for a in alignment_bytes]
        self.span = [span_fn(config.pack_streams, a) for a in self.align]
        self.graph_base = list(graph_base_bytes)
        self.consumer = [backend.create_stream(d, f"consumer{d}") for d in range(backend.device_count())]
        self.rings: dict[int, Ring] = {}
        self.graph_mem: dict[int, Buffer] = {}
        self.io_dev: dict[int, Buffer] = {}
        self.resident: dict[int, Buffer] = {}
        self.resident_base = 0  # the host-cache offset where the resident arm's device copy starts (past -ngl CPU layers)
        self.io_host = backend.alloc_host(io_bytes, "io_host", pinned=True)
        self.kernel_io_bytes = KERNEL_IO_BYTES
        self.history: list[GraphStats] = []
        self._last_gpu_device = 0
        self._producers: set[int] = set()
        self._inputs: dict[str, Any] = {}
        self.schedule = config.schedule if config.arm in ("transport", "copy-only") else Schedule()  # copy-only: its bytes
        self._plans: dict[int, _DevicePlan] = {}
        self._rows_down: dict[int, Any] = {}
        self._deferred: list[tuple[Split, Any]] = []
        self._next_slot: dict[int, int] = {}
        self._ahead: dict[int, Any] = {}  # device -> the plan whose first delivery went ahead, for ``self.upcoming``
        self._ahead_tried, self._rows_done = False, set[int]()  # this graph: ahead issued?, layers whose rows were written
        self.upcoming: DecodeGraph | None = None  # the next graph, when the decode loop knows it
        if program is not None:
            program.setup(backend, host_cache)

    # ------------------------------------------------------------- plan

    def _ring(self, device: int) -> Ring | None:
        """The device's ring state, created lazily (the transfer stream too)."""
        if self.cfg.depth == 0 or self.cfg.arm == "resident":
            return None
        ring = self.rings.get(device)
        if ring is None:
            ring = Ring(device, self.be.create_stream(device, f"transfer{device}"), self.cfg.n_slots)
            try:
                ring.ready = [self.be.create_event(device, f"ready{device}.{i}") for i in range(ring.n_slots)]
                ring.release = [self.be.create_event(device, f"release{device}.{i}") for i in range(ring.n_slots)]
            except BackendError:
                ring.frozen_ordered = True
            ring.slot_used = [False] * ring.n_slots
            self.rings[device] = ring
        return ring

    def _plan(self, graph: DecodeGraph, stats: GraphStats) -> dict[int, _DevicePlan]:
        """Each staged device's ring decision for this graph (``sim.transport.planning.plan_ring``)."""
        plans: dict[int, _DevicePlan] = {}
        gp, mem, pol = planning.GraphPlan.empty(1), planning.memory_of(self), planning.policy_of(self.cfg)
        for dev, splits, need, entries, full in self._slot_needs(graph):
            ring = self._ring(dev)
            here, n_splits, need_a, full_a = planning.one(True, len(splits), need, full)
            planning.plan_ring(gp, ring.state if ring else None, mem, pol, dev, here, n_splits, need_a, full_a, self.align[dev])
            if ring is not None and gp.fresh[dev][0]:
                ring.slot_used = [False] * ring.n_slots
            plans[dev] = _DevicePlan(bool(gp.active[dev][0]), need, entries, splits)
        gp.to_stats(stats, self.cfg)
        return plans

    def _slot_needs(self, graph: DecodeGraph) -> list[planning.SlotNeed]:
        """Per device with staged splits: (device, its staged splits, slot need, entries, full-context need), kept with
        the graph (``sim.transport.planning.slot_needs``)."""
        return planning.slot_needs(graph, self.span, (self.cfg.pack_streams, tuple(self.align)))

    def _plan_deliveries(self, dev: int, plan: _DevicePlan, graph: DecodeGraph) -> None:
        """The deliveries of an active plan, into the ring (or, mutated, the graph allocator's input region)."""
        ring = self.rings[dev]
        if self.policy.ring_staging:
            assert ring.buffer is not None
            plan.target, slot_bytes = ring.buffer, ring.slot_alloc_bytes
        else:
            plan.target, slot_bytes = self.graph_mem[dev], 0
        early_of = None  # the stable prefix of each piece, as the graph gives it
        if not self.policy.refresh_prefix:  # the stale-prefix mutation: each piece's prefix as the ring first saw it

            def early_of(inp: StagedInput, i: int, prefix: int, nbytes: int) -> int:
                p = inp.pieces[i]
                return stable_early(p._replace(prefix_bytes=min(ring.stale_prefix(f"{inp.name}#{i}", prefix), nbytes)))

        fresh = fresh_rows(graph, plan.order) if self.schedule.fresh_on_device else None
        first = self._next_slot.get(dev, 0)  # 0 unless the slots go on round across tokens
        plan.deliveries = plan_deliveries(plan.order, plan.entries, ring.n_slots, lambda slot: slot * slot_bytes, self.span[dev],
                                          early_of, one_cell_early=not self.policy.stream_sized_ranges, fresh=fresh,
                                          first_slot=first)
        plan.fresh_of = {d.split - 2: d for d in plan.deliveries if d.fresh}
        if self.schedule.across_tokens:
            self._next_slot[dev] = (first + len(plan.deliveries)) % ring.n_slots

    def _reserve_graph(self, graph: DecodeGraph, plans: dict[int, _DevicePlan], stats: GraphStats) -> HostOp:
        """Allocate each device's graph memory next to its ring; fall back to ordered once on failure
        (``sim.transport.planning.reserve_graph``); the resident arm's cache once."""
        devices = sorted({s.device for s in graph.splits if s.kind == "gpu"})
        gp, mem, pol = planning.GraphPlan.empty(1), planning.memory_of(self), planning.policy_of(self.cfg)
        gp.active = {dev: planning.one(p.active)[0] for dev, p in plans.items()}
        rings = {dev: ring.state for dev, ring in self.rings.items()}
        for dev in devices:
            plan = plans.get(dev)
            gpu, staged, need = planning.one(True, plan is not None, plan.slot_need if plan else 0)
            planning.reserve_graph(gp, rings, mem, pol, dev, gpu, staged, need, self.graph_base[dev], self.io_bytes)
            if plan is not None:
                plan.active = bool(gp.active[dev][0])
        gp.to_stats(stats, self.cfg, declines_only=True)
        if self.cfg.arm == "resident":  # past the -ngl CPU layers' blocks, which stay in host memory
            yield from self._make_resident(devices, stats, start=graph.host_only_kv_bytes)

    def _does_not_fit(self, dev: int, need: int) -> OutOfDeviceMemory:
        free = self.be.free_bytes(dev) + (self.graph_mem[dev].nbytes if dev in self.graph_mem else 0)
        return OutOfDeviceMemory(f"the graph does not fit device {dev} even on the ordered path: its windows and buffers need "
                                 f"{need / MIB:,.1f} MiB, the device has {free / MIB:,.1f} MiB free beside the model")

    def _grow_graph_mem(self, dev: int, need: int) -> bool:
        """Make device ``dev``'s graph memory hold ``need`` bytes (``sim.transport.planning.grow_graph``)."""
        return bool(planning.grow_graph(planning.memory_of(self), dev, *planning.one(need, True))[0])

    def _account_idle(self, plans: dict[int, _DevicePlan]) -> None:
        """Count idle graphs; release a ring idle too long (``sim.transport.planning.account_idle``)."""
        gp = planning.GraphPlan.empty(1)
        gp.active = {dev: planning.one(p.active)[0] for dev, p in plans.items()}
        planning.account_idle(gp, {dev: r.state for dev, r in self.rings.items()}, planning.memory_of(self),
                              planning.policy_of(self.cfg))

    # ---------------------------------------------------------- execute

    def run_graph(self, graph: DecodeGraph) -> HostOp:
        """The host thread's program for one graph. Returns its GraphStats. Blocks the host as the real calls do."""
        be = self.be
        stats = GraphStats(token=graph.token)
        if graph.device_kv_bytes and self.cfg.arm != "resident":
            # --kv-gpu-layers: the prefix is placed once, before any ring is sized and before the token's clock starts
            # (llama.cpp holds those layers on the device from the prompt on: a model load, not a decode cost)
            yield from self._make_resident(sorted({s.device for s in graph.splits if s.resident}), GraphStats(), graph.device_kv_bytes)
        t0 = be.now_s()
        self.kernel_io_bytes = graph.memo.get("kernel_io_bytes") or graph.memo.setdefault("kernel_io_bytes", align_up(
            max([KERNEL_IO_BYTES, *(sum(i.nbytes for i in s.ordered) for s in graph.splits if s.kind == "cpu")]), KERNEL_IO_BYTES))
        if self.policy.boundary_wait:
            yield from self._boundary_wait(stats)
        if graph.host_writes_at_start:
            yield from self._host_writes(graph, stats)
        self._inputs = self.program.graph_inputs(graph) if self.program else {}
        plans = self._plans = self._plan(graph, stats)
        yield from self._reserve_graph(graph, plans, stats)
        self._account_idle(plans)
        for dev, plan in plans.items():
            if plan.active and not self._take_ahead(dev, plan, graph):
                self._plan_deliveries(dev, plan, graph)
        self._ahead, self._ahead_tried, self._rows_done = {}, False, set()
        yield from self._prime_all(stats, at_inputs=False)
        yield from self._deliver_ahead(stats, "start")  # only under its mutation: before the rows are written
        for split in graph.splits:
            if split.kind == "gpu":
                yield from self._gpu_split(split, plans.get(split.device), stats)
            elif self.cfg.arm in ("transport", "host-attention") or (self.cfg.arm == "resident" and not split.stores_rows):
                yield from self._cpu_split_or_defer(split, graph, stats)  # resident: the kernels store the rows
        yield from self._run_deferred(stats)
        yield from self._deliver_ahead(stats, "end")
        # The decode loop reads the logits: the host waits for every device still running
        # (not after an intermediate ubatch, whose output nobody reads: the boundary wait covers it).
        if graph.reads_output:
            for dev in sorted(self._producers) or [graph.splits[-1].device]:
                yield from self._wait_consumer(dev, stats)
            self._producers.clear()
        stats.total_s = be.now_s() - t0
        self.history.append(stats)
        return stats

    def _gpu_split(self, split: Split, plan: _DevicePlan | None, stats: GraphStats) -> HostOp:
        dev = split.device
        self._last_gpu_device = dev
        self._producers.add(dev)
        bindings: dict[str, Binding] = {}
        pieces: dict[str, Binding] = {}  # per-stream parts of the windows (inside their window's range)
        if split.ordered:
            yield from self._small_inputs(split, stats, bindings)
        pipelined = plan is not None and plan.active and bool(split.staged)
        if pipelined:  # inputs-first: a staged first split needs its delivery now; any other primes once it is launched
            yield from self._prime_all(stats, at_inputs=True)
        if self.cfg.arm == "resident":
            self._bind_device_kv(bindings, pieces, split.staged + split.resident, self.resident[dev], self.resident_base)
        elif split.staged and not pipelined:
            yield from self._ordered_windows(split, stats, bindings, pieces)
        elif pipelined:  # the delivery's late ranges on the consumer stream, then a wait on its ``ready``
            assert plan is not None and plan.target is not None
            if self.policy.issue_before_enqueue:
                yield from self._prefetch(plan, stats, limit_extra=1)
            d = plan.deliveries[plan.consumed]
            assert d.split == split.index, f"delivery {d.o} is staged split {d.split}, not {split.index}"
            for parts in d.parts:
                self._bind_parts(bindings, pieces, plan.target, parts)
            if d.late:
                yield from self.be.copy(self.consumer[dev], plan.target, self.host_cache, d.late, tag="late")
                stats.late_bytes += d.late_bytes
            if self.schedule.late_first:  # delivery o after split o - N's late copy: nothing of it queued ahead
                yield from self._prefetch(plan, stats, limit_extra=0)
            yield from self.be.wait_event(self.consumer[dev], self.rings[dev].ready[d.slot])
        if split.resident and self.cfg.arm != "resident":  # --kv-gpu-layers: these layers' windows where the device keeps them
            self._bind_device_kv(bindings, pieces, split.resident, self.resident[dev])
        io = self.io_dev[dev]
        accesses = [Access(b, o, n, False) for b, o, n in bindings.values()]
        accesses.append(Access(io, 0, self.kernel_io_bytes, True))
        for rows in split.resident_rows:
            accesses += [Access(self.resident[dev], o, n, True, count, pitch) for o, n, count, pitch in rows.row_pattern]
        if plan is not None and plan.active and split.index in plan.fresh_of:
            self._bind_fresh(plan, plan.fresh_of[split.index], pieces, accesses)
        bindings.update(pieces)
        bindings[IO] = (io, 0, io.nbytes)
        if self.cfg.arm != "copy-only":
            run = self.program.gpu_run(split, bindings) if self.program else None
            work = Work(split.name, split.compute_s, split.n_launches, run, tuple(accesses), WorkKind.GPU_SPLIT)
            yield from self.be.launch(self.consumer[dev], work)
        yield from self._prime_all(stats, at_inputs=True)
        if pipelined:
            assert plan is not None
            yield from self.be.record(self.rings[dev].release[plan.deliveries[plan.consumed].slot], self.consumer[dev])
            plan.consumed += 1
            if not self.policy.issue_before_enqueue and not self.schedule.late_first:
                yield from self._prefetch(plan, stats, limit_extra=0)
        if self._deferred:  # fresh rows: the CPU splits behind the split just launched
            yield from self._run_deferred(stats)
        yield from self._deliver_ahead(stats, "ready")

    def _prefetch(self, plan: _DevicePlan, stats: GraphStats, limit_extra: int) -> HostOp:
        """Issue deliveries while ``o <= consumed + N`` (+ ``limit_extra`` for the issue-before-enqueue mutation).

        One delivery: its early ranges on the transfer stream, after its slot's release; then ``ready``. (Inline, not
        a generator of its own: every host operation below resumes through each generator layer above it.)
        """
        be, policy = self.be, self.policy
        t = be.now_s()
        limit = plan.consumed + self.cfg.depth + limit_extra
        deliveries = plan.deliveries
        while plan.issued < len(deliveries) and plan.issued <= limit:
            d = deliveries[plan.issued]
            ring = self.rings[plan.order[d.o].device]
            if ring.slot_used[d.slot] and policy.ring_staging:
                if policy.recycle == "host":
                    yield from be.wait_host(ring.release[d.slot])
                elif policy.recycle == "stream":
                    yield from be.wait_event(ring.transfer, ring.release[d.slot])
                    stats.recycle_waits += 1
            if d.early:
                assert plan.target is not None
                for piece in in_pieces(d.early, self.schedule.piece_bytes):  # one copy, unless cut in pieces
                    yield from be.copy(ring.transfer, plan.target, self.host_cache, piece, tag=f"delivery{d.o}")
                stats.early_bytes += d.early_bytes
            yield from be.record(ring.ready[d.slot], ring.transfer)
            ring.slot_used[d.slot] = True
            stats.deliveries += 1
            plan.issued += 1
        if plan.issued < len(deliveries):
            stats.depth_stops += 1
        stats.issue_s += be.now_s() - t
