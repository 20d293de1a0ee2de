"""The transport scheduler: when each staged KV window crosses the link.

Written once, run on any backend. It imports the backend Protocol and nothing
else of a machine: the same host program drives the SimPy machine and a real
GPU, so what the simulation predicts is what the GPU executes.

Two paths, as in llama.cpp's scheduler:

* **Ordered** (depth 0, a declined plan, or a device frozen ordered): for each
  split the host waits for the consumer stream, copies the split's inputs with
  blocking copies, then launches it. A token costs copy + compute in series.
* **Pipelined** (depth N in 1..14): each device holds a *ring* of N + 2 slots
  (the margin of 2 keeps the look-ahead clear of the slot still being read).
  Delivery ``o`` (the window of the o-th staged split) goes into slot
  ``o mod n_slots``: its stable prefix on the *transfer* stream, after the
  transfer stream waited on the slot's ``release`` event (stream to stream),
  then ``ready`` is recorded. The late part (rows written this ubatch) goes on
  the consumer stream at the split, which then waits on ``ready``, runs, and
  records ``release``. Deliveries are issued *after* a staged split is
  enqueued, while ``o <= consumed + N``, so delivery o follows the enqueue of
  staged split o - N - 1. Priming issues the first N + 1 at graph start.

The plan is re-evaluated every graph: the ring the graph needs (slot need x
n_slots) against the budget and the device's headroom; slots allocated in
powers of two capped by the full-context need, the budget share and the
headroom share; a ring that cannot sit next to the graph's own memory is
released, the reservation retried ordered, and that device stays ordered.
After more than ``idle_release_graphs`` graphs that stage nothing the ring is
released. The configuration is frozen after the first graph.

``mutations`` switch off one load-bearing piece each (see docs/correctness.md);
they exist so tests can show what each piece is worth. ``one-cell-range``
instead reproduces the bug the reference's parallel exactness gate caught:
each stream's early range of a multi-stream window sized from one cell, not
from the stream's window, so the rest of the prefix is never delivered.

The kernels of a split write the first ``kernel_io_bytes`` of the device's io
buffer (the new K/V rows of every sequence, at least 64 KiB); the small
inputs of the next split are staged above them.

All times in seconds, sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from backends.base import (
    Access,
    Backend,
    BackendError,
    Buffer,
    CopyRange,
    Event,
    HostOp,
    OutOfDeviceMemory,
    Stream,
    Work,
)
from sim.graph import DecodeGraph, Split, StagedInput, WindowPiece

MIB = 1024 * 1024
MAX_DEPTH = 14
MAX_BUDGET_MIB = 65536
MUTATIONS = (
    "margin0",
    "issue-before-enqueue",
    "host-recycle",
    "no-release-wait",
    "no-boundary-wait",
    "stale-prefix",
    "allocator-staging",
    "one-cell-range",
)
KERNEL_IO_BYTES = 1 << 16
#: What a run measures: ``transport`` (the decode loop, ordered or pipelined), ``resident`` (the windows already in
#: device memory: no transport, the kernels alone -- what ``-nkvo 0`` runs) and ``copy-only`` (the same deliveries,
#: no kernels and no CPU splits). The last two bound a token from below: ceiling t/s = 1 / max(resident, copy-only).
ARMS = ("transport", "resident", "copy-only")


@dataclass(frozen=True)
class TransportConfig:
    """How the scheduler delivers staged inputs. Frozen after the first graph."""

    depth: int = 1
    budget_mib: float = 128.0
    headroom_mib: float = 512.0
    margin_slots: int = 2
    idle_release_graphs: int = 4
    min_alignment_bytes: int = 128
    pack_streams: bool = True
    mutations: frozenset[str] = frozenset()
    arm: str = "transport"

    def __post_init__(self) -> None:
        if not isinstance(self.depth, int) or not 0 <= self.depth <= MAX_DEPTH:
            raise ValueError(f"depth {self.depth} out of range; allowed: 0..{MAX_DEPTH}")
        if not 0 <= self.budget_mib <= MAX_BUDGET_MIB:
            raise ValueError(f"budget {self.budget_mib:g} MiB out of range; allowed: 0 (no cap) .. {MAX_BUDGET_MIB}")
        if self.headroom_mib < 0:
            raise ValueError(f"headroom {self.headroom_mib:g} MiB out of range; allowed: >= 0")
        if self.arm not in ARMS:
            raise ValueError(f"arm {self.arm!r} unknown; allowed: {', '.join(ARMS)}")
        bad = set(self.mutations) - set(MUTATIONS)
        if bad:
            raise ValueError(f"unknown mutation {sorted(bad)[0]!r}; allowed: {', '.join(MUTATIONS)}")

    @property
    def n_slots(self) -> int:
        margin = self.margin_slots - (1 if "margin0" in self.mutations else 0)
        return self.depth + margin

    @property
    def budget_bytes(self) -> int:
        return int(self.budget_mib * MIB)

    def mutated(self, name: str) -> bool:
        return name in self.mutations


@dataclass
class GraphStats:
    """What one graph cost and moved (the reference's telemetry fields)."""

    token: int = 0
    total_s: float = 0.0
    blocked_ordered_s: float = 0.0
    consumer_wait_s: float = 0.0
    issue_s: float = 0.0
    boundary_wait_s: float = 0.0
    early_bytes: int = 0
    late_bytes: int = 0
    ordered_bytes: int = 0
    ordered_copies: int = 0
    depth_stops: int = 0
    recycle_waits: int = 0
    deliveries: int = 0
    ring_slots: int = 0
    slot_need_bytes: int = 0
    slot_alloc_bytes: int = 0
    full_slot_need_bytes: int = 0
    declined: bool = False
    decline_reason: str = ""
    staged_splits: int = 0

    @property
    def ring_need_bytes(self) -> int:
        return self.slot_need_bytes * self.ring_slots

    @property
    def ring_alloc_bytes(self) -> int:
        return self.slot_alloc_bytes * self.ring_slots


class Program(Protocol):
    """Real work behind the splits (functional simulation, GPU). Optional.

    ``bindings`` map names to ``(buffer, offset, nbytes)``: ``window:<input>``
    for each staged input as the kernel will read it, ``small:<input>`` for
    ordered inputs, ``host_cache`` and ``io`` buffers.
    """

    def setup(self, backend: Backend, host_cache: Buffer) -> None: ...

    def gpu_run(self, split: Split, bindings: dict[str, tuple[Buffer, int, int]]) -> Callable[[Any], None] | None: ...

    def cpu_run(self, split: Split, bindings: dict[str, tuple[Buffer, int, int]]) -> Callable[[Any], None] | None: ...

    def graph_inputs(self, graph: DecodeGraph) -> dict[str, Any]:
        """Bytes (uint8 arrays) of named small inputs, written into the host io buffer before their copy."""
        ...

    def host_update_run(self, graph: DecodeGraph) -> Callable[[Any], None] | None: ...


@dataclass(eq=False)
class _Ring:
    """One device's staging ring and its transfer stream."""

    device: int
    transfer: Stream
    n_slots: int
    buffer: Buffer | None = None
    slot_alloc_bytes: int = 0
    ready: list[Event] = field(default_factory=list)
    release: list[Event] = field(default_factory=list)
    slot_used: list[bool] = field(default_factory=list)
    delivered_last_graph: bool = False
    idle_graphs: int = 0
    frozen_ordered: bool = False
    prefix_rows_last: dict[str, int] = field(default_factory=dict)


@dataclass
class _DevicePlan:
    active: bool
    slot_need: int = 0
    entries: dict[int, list[tuple[StagedInput, int]]] = field(default_factory=dict)  # split index -> (input, offset in slot)
    order: list[Split] = field(default_factory=list)
    issued: int = 0
    consumed: int = 0


def piece_range(p: WindowPiece, dst_offset: int, start: int, end: int) -> CopyRange:
    """The copy of bytes ``[start, end)`` of piece ``p`` (whole rows for a strided piece) to ``dst_offset + start``."""
    if p.rows == 1:
        return CopyRange(p.src_offset + start, dst_offset + start, end - start)
    w = p.width
    return CopyRange(p.src_offset + start // w * p.src_pitch, dst_offset + start, end - start, (end - start) // w, p.src_pitch)


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class TransportScheduler:
    """Runs decode graphs on a backend, ordered or pipelined.

    ``alignment_bytes`` and ``headroom`` come from the caller (the device's
    buffer alignment). ``host_cache`` is the host buffer the staged windows
    live in. Nothing here knows which backend it drives.
    """

    def __init__(
        self,
        backend: Backend,
        config: TransportConfig,
        host_cache: Buffer,
        alignment_bytes: Sequence[int] = (256,),
        graph_base_bytes: Sequence[int] = (0,),
        program: Program | None = None,
        io_bytes: int = 1 << 20,
    ) -> None:
        self.be = backend
        self.io_bytes = io_bytes
        self.cfg = config
        self.host_cache = host_cache
        self.align = [max(a, config.min_alignment_bytes) for a in alignment_bytes]
        self.graph_base = list(graph_base_bytes)
        self.program = program
        n_dev = backend.device_count()
        self.consumer = [backend.create_stream(d, f"consumer{d}") for d in range(n_dev)]
        self.rings: dict[int, _Ring] = {}
        self.graph_mem: dict[int, Buffer] = {}
        self.io_dev: dict[int, Buffer] = {}
        self.io_host = backend.alloc_host(io_bytes, "io_host", pinned=True)
        self.graphs_run = 0
        self._last_gpu_device = 0
        self._producers: set[int] = set()
        self.kernel_io_bytes = KERNEL_IO_BYTES
        self.history: list[GraphStats] = []
        self._inputs: dict[str, Any] = {}
        self.resident: dict[int, Buffer] = {}
        if program is not None:
            program.setup(backend, host_cache)

    # ------------------------------------------------------------- plan

    def _ring(self, device: int) -> _Ring | None:
        """The device's ring state, created lazily (the transfer stream too)."""
        if self.cfg.depth == 0 or self.cfg.arm == "resident":
            return None
        ring = self.rings.get(device)
        if ring is None:
            ring = _Ring(device, self.be.create_stream(device, f"transfer{device}"), self.cfg.n_slots)
            try:
                ring.ready = [self.be.create_event(device, f"ready{device}.{i}") for i in range(ring.n_slots)]
                ring.release = [self.be.create_event(device, f"release{device}.{i}") for i in range(ring.n_slots)]
            except BackendError:
                ring.frozen_ordered = True
            ring.slot_used = [False] * ring.n_slots
            self.rings[device] = ring
        return ring

    def _slot_need(self, splits: Sequence[Split], device: int) -> tuple[int, dict[int, list[tuple[StagedInput, int]]]]:
        need = 0
        entries: dict[int, list[tuple[StagedInput, int]]] = {}
        for s in splits:
            off = 0
            lst = []
            for inp in s.staged:
                lst.append((inp, off))
                off += sum(self._span(p, device) for p in inp.pieces)
            entries[s.index] = lst
            need = max(need, off)
        return need, entries

    def _span(self, p: WindowPiece, device: int) -> int:
        """Bytes a piece takes in a slot: its window padded (packed) or the stream's whole stride (unpacked)."""
        size = p.nbytes if self.cfg.pack_streams else max(p.nbytes, p.reserve_bytes)
        return align_up(size, self.align[device])

    def _full_need(self, split: Split, device: int, graph: DecodeGraph) -> int:
        """What the split's slot would need with every window at the full context."""
        scale = graph.full_window_rows / max(1, graph.window_rows)
        return sum(self._span(replace(p, nbytes=int(p.nbytes * scale), prefix_bytes=0, rows=1), device)
                   for inp in split.staged for p in inp.pieces)

    def _plan(self, graph: DecodeGraph, stats: GraphStats) -> dict[int, _DevicePlan]:
        plans: dict[int, _DevicePlan] = {}
        by_dev: dict[int, list[Split]] = {}
        for s in graph.staged_splits:
            by_dev.setdefault(s.device, []).append(s)
        for dev, splits in by_dev.items():
            stats.staged_splits += len(splits)
            ring = self._ring(dev)
            need, entries = self._slot_need(splits, dev)
            full_need = max(self._full_need(s, dev, graph) for s in splits)
            stats.slot_need_bytes = max(stats.slot_need_bytes, need)
            stats.full_slot_need_bytes = max(stats.full_slot_need_bytes, full_need)
            plan = _DevicePlan(False, need, entries, splits)
            plans[dev] = plan
            if ring is None:
                continue
            stats.ring_slots = ring.n_slots
            reason = self._decline_reason(ring, need, full_need)
            if not reason:
                reason = self._ensure_slots(ring, need, full_need)
            if reason:
                stats.declined = True
                stats.decline_reason = reason
                continue
            plan.active = True
            stats.slot_alloc_bytes = max(stats.slot_alloc_bytes, ring.slot_alloc_bytes)
        return plans

    def _decline_reason(self, ring: _Ring, need: int, full_need: int) -> str:
        if ring.frozen_ordered:
            return "device kept on the ordered path (events unavailable or ring could not sit next to the graph)"
        ring_need = need * ring.n_slots
        budget = self.cfg.budget_bytes
        if budget and ring_need > budget:
            return (
                f"ring needs {ring_need / MIB:.1f} MiB > budget {self.cfg.budget_mib:g} MiB "
                f"({full_need * ring.n_slots / MIB:.1f} MiB at full context)"
            )
        held = ring.slot_alloc_bytes * ring.n_slots
        free = self.be.free_bytes(ring.device) + held
        headroom = int(self.cfg.headroom_mib * MIB)
        if free - ring_need < headroom:
            return (
                f"ring needs {ring_need / MIB:.1f} MiB but device {ring.device} would keep "
                f"{(free - ring_need) / MIB:.1f} MiB free < headroom {self.cfg.headroom_mib:g} MiB"
            )
        return ""

    def _ensure_slots(self, ring: _Ring, need: int, full_need: int) -> str:
        """Make every slot hold ``need`` bytes; powers of two, capped. Returns a decline reason or ''."""
        if ring.buffer is not None and ring.slot_alloc_bytes >= need:
            return ""
        n = ring.n_slots
        held = ring.slot_alloc_bytes * n
        free = self.be.free_bytes(ring.device) + held
        caps = [max(full_need, need), (free - int(self.cfg.headroom_mib * MIB)) // n]
        if self.cfg.budget_bytes:
            caps.append(self.cfg.budget_bytes // n)
        alloc = max(need, min([next_pow2(need), *caps]))
        alloc = align_up(alloc, self.align[ring.device])
        self._free_ring(ring)
        try:
            ring.buffer = self.be.alloc(ring.device, alloc * n, f"ring{ring.device}")
        except OutOfDeviceMemory:
            return f"ring of {alloc * n / MIB:.1f} MiB could not be allocated on device {ring.device}"
        ring.slot_alloc_bytes = alloc
        ring.slot_used = [False] * n
        return ""

    def _free_ring(self, ring: _Ring) -> None:
        if ring.buffer is not None:
            self.be.free(ring.buffer)
        ring.buffer = None
        ring.slot_alloc_bytes = 0

    def _reserve_graph(self, graph: DecodeGraph, plans: dict[int, _DevicePlan], stats: GraphStats) -> HostOp:
        """Allocate each device's graph memory next to its ring; fall back to ordered once on failure."""
        devices = {s.device for s in graph.splits if s.kind == "gpu"}
        for dev in sorted(devices):
            plan = plans.get(dev)
            inputs_here = plan is not None and (not plan.active or self.cfg.mutated("allocator-staging")) and self.cfg.arm != "resident"
            need = self.graph_base[dev] + (plan.slot_need if inputs_here and plan else 0)
            if not self._grow_graph_mem(dev, need):
                ring = self.rings.get(dev)
                if ring is None or ring.buffer is None:
                    raise OutOfDeviceMemory(f"the graph does not fit device {dev} even on the ordered path")
                self._free_ring(ring)
                ring.frozen_ordered = True
                if plan is not None:
                    plan.active = False
                stats.declined = True
                stats.decline_reason = f"graph reservation failed next to the ring on device {dev}; retried ordered"
                need = self.graph_base[dev] + (plan.slot_need if plan else 0)
                if not self._grow_graph_mem(dev, need):
                    raise OutOfDeviceMemory(f"the graph does not fit device {dev} even on the ordered path")
            if dev not in self.io_dev:
                self.io_dev[dev] = self.be.alloc(dev, self.io_bytes, f"io{dev}")
        if self.cfg.arm == "resident":
            yield from self._make_resident(sorted(devices), stats)

    def _make_resident(self, devices: list[int], stats: GraphStats) -> HostOp:
        """The resident arm: the whole cache on each device, copied once (the first graph's ordered bytes)."""
        for dev in devices:
            if dev not in self.resident:
                self.resident[dev] = self.be.alloc(dev, self.host_cache.nbytes, f"resident{dev}")
                whole = [CopyRange(0, 0, self.host_cache.nbytes)]
                yield from self._blocking_copy(self.consumer[dev], self.resident[dev], self.host_cache, whole, stats, "resident")

    def _grow_graph_mem(self, dev: int, need: int) -> bool:
        cur = self.graph_mem.get(dev)
        if cur is not None and cur.nbytes >= need:
            return True
        if cur is not None:
            self.be.free(cur)
            del self.graph_mem[dev]
        try:
            self.graph_mem[dev] = self.be.alloc(dev, max(need, 1), f"graph{dev}")
        except OutOfDeviceMemory:
            return False
        return True

    # ---------------------------------------------------------- execute

    def run_graph(self, graph: DecodeGraph) -> HostOp:
        """The host thread's program for one graph. Returns its GraphStats. Blocks the host as the real calls do."""
        be = self.be
        stats = GraphStats(token=graph.token)
        t0 = be.now_s()
        rows = [sum(i.nbytes for i in s.ordered) for s in graph.splits if s.kind == "cpu"]
        self.kernel_io_bytes = align_up(max([KERNEL_IO_BYTES, *rows]), KERNEL_IO_BYTES)
        if not self.cfg.mutated("no-boundary-wait"):
            for ring in self.rings.values():
                if ring.delivered_last_graph:
                    t = be.now_s()
                    yield from be.synchronize(ring.transfer)
                    yield from be.synchronize(self.consumer[ring.device])
                    stats.boundary_wait_s += be.now_s() - t
        if graph.host_writes_at_start:
            yield from be.run_host(
                Work(
                    "host_cache_update",
                    0.0,
                    0,
                    self._host_update_run(graph),
                    tuple(Access(self.host_cache, o, n, True) for o, n in graph.host_writes_at_start),
                )
            )
            for dev, cache in self.resident.items():  # the resident cache takes the same rows (llama.cpp rewrites its cells)
                ranges = [CopyRange(o, o, n) for o, n in graph.host_writes_at_start]
                yield from self._blocking_copy(self.consumer[dev], cache, self.host_cache, ranges, stats, "resident_update")
        self._inputs = self.program.graph_inputs(graph) if self.program else {}
        plans = self._plan(graph, stats)
        yield from self._reserve_graph(graph, plans, stats)
        self._account_idle(plans)

        for plan in plans.values():
            if plan.active:
                yield from self._prefetch(plan, stats, limit_extra=0)
        for split in graph.splits:
            if split.kind == "cpu":
                if self.cfg.arm == "transport":  # resident: the kernels write the device cache; copy-only: no kernels
                    yield from self._cpu_split(split, stats)
            else:
                yield from self._gpu_split(split, plans.get(split.device), stats)
        # The decode loop reads the logits: the host waits for every device still running
        # (not after an intermediate ubatch, whose output nobody reads: the boundary wait covers it).
        if graph.reads_output:
            for dev in sorted(self._producers) or [graph.splits[-1].device]:
                yield from self._wait_consumer(dev, stats)
            self._producers.clear()
        stats.total_s = be.now_s() - t0
        self.graphs_run += 1
        self.history.append(stats)
        return stats

    def _account_idle(self, plans: dict[int, _DevicePlan]) -> None:
        for dev, ring in self.rings.items():
            plan = plans.get(dev)
            if plan is not None and plan.active:
                ring.idle_graphs = 0
                ring.delivered_last_graph = True
                continue
            ring.delivered_last_graph = False
            ring.idle_graphs += 1
            if ring.idle_graphs > self.cfg.idle_release_graphs:
                self._free_ring(ring)

    def _host_update_run(self, graph: DecodeGraph) -> Callable[[Any], None] | None:
        return self.program.host_update_run(graph) if self.program else None

    def _set_input(self, name: str, offset: int, nbytes: int) -> None:
        """Write the program's bytes of input ``name`` (if any) into the host io buffer, before its copy. Host memory only."""
        data = self._inputs.get(name)
        if data is None or self.io_host.array is None:
            return
        if len(data) > nbytes:
            raise ValueError(f"graph input {name}: the program wrote {len(data)} B into a {nbytes} B input")
        self.io_host.array[offset : offset + len(data)] = data

    # ordered pieces --------------------------------------------------

    def _wait_consumer(self, device: int, stats: GraphStats) -> HostOp:
        t = self.be.now_s()
        yield from self.be.synchronize(self.consumer[device])
        stats.consumer_wait_s += self.be.now_s() - t

    def _blocking_copy(self, stream: Stream, dst: Buffer, src: Buffer, ranges: list[CopyRange], stats: GraphStats, tag: str) -> HostOp:
        t = self.be.now_s()
        yield from self.be.copy(stream, dst, src, ranges, tag=tag)
        yield from self.be.synchronize(stream)
        stats.blocked_ordered_s += self.be.now_s() - t
        stats.ordered_bytes += sum(r.nbytes for r in ranges)
        stats.ordered_copies += 1

    def _cpu_split(self, split: Split, stats: GraphStats) -> HostOp:
        producers = sorted(self._producers) or [self._last_gpu_device]
        for dev in producers:
            yield from self._wait_consumer(dev, stats)
        self._producers.clear()
        producer = producers[0]
        io = self.io_dev[producer]
        bindings: dict[str, tuple[Buffer, int, int]] = {}
        accesses: list[Access] = []
        off = 0
        for inp in split.ordered:
            yield from self._blocking_copy(
                self.consumer[producer], self.io_host, io, [CopyRange(off, off, inp.nbytes)], stats, inp.name
            )
            bindings[inp.name] = (self.io_host, off, inp.nbytes)
            accesses.append(Access(self.io_host, off, inp.nbytes, False))
            for t, (row_off, row_bytes) in enumerate(inp.rows):
                key = f"cache:{inp.name}" if len(inp.rows) == 1 else f"cache:{inp.name}#{t}"
                bindings[key] = (self.host_cache, row_off, row_bytes)
                accesses.append(Access(self.host_cache, row_off, row_bytes, True))
            off += inp.nbytes
        run = self.program.cpu_run(split, bindings) if self.program else None
        yield from self.be.run_host(Work(split.name, split.compute_s, 0, run, tuple(accesses), tag="cpu"))

    def _producer_device(self, split: Split) -> int:
        """The device whose split produced a CPU split's inputs (the last GPU split run)."""
        return self._last_gpu_device

    def _gpu_split(self, split: Split, plan: _DevicePlan | None, stats: GraphStats) -> HostOp:
        dev = split.device
        self._last_gpu_device = dev
        self._producers.add(dev)
        consumer = self.consumer[dev]
        io = self.io_dev[dev]
        bindings: dict[str, tuple[Buffer, int, int]] = {}
        pieces: dict[str, tuple[Buffer, int, int]] = {}  # per-stream parts of the windows (inside their window's range)
        if split.ordered:
            off = self.kernel_io_bytes  # small inputs live above the region a split's kernels write
            for small in split.ordered:
                if small.src_device >= 0:  # activation handed over from another device, through the host
                    src_dev = small.src_device
                    yield from self._wait_consumer(src_dev, stats)
                    yield from self._blocking_copy(self.consumer[src_dev], self.io_host, self.io_dev[src_dev],
                                                   [CopyRange(0, off, small.nbytes)], stats, small.name)
            yield from self._wait_consumer(dev, stats)
            for small in split.ordered:
                self._set_input(small.name, off, small.nbytes)
                yield from self._blocking_copy(consumer, io, self.io_host, [CopyRange(off, off, small.nbytes)], stats, small.name)
                bindings[f"small:{small.name}"] = (io, off, small.nbytes)
                off += small.nbytes
        pipelined = plan is not None and plan.active and split.staged
        slot = -1
        if self.cfg.arm == "resident":
            cache = self.resident[dev]
            for inp in split.staged:
                self._bind_resident(bindings, pieces, inp, cache)
            bindings["resident:cache"] = (cache, 0, cache.nbytes)  # the split's kernels write their new rows there
        elif split.staged and not pipelined:
            yield from self._wait_consumer(dev, stats)
            gm = self.graph_mem[dev]
            off = 0
            for inp in split.staged:
                ranges = []
                self._bind_window(bindings, pieces, inp, gm, off, dev)
                for p in inp.pieces:
                    ranges.append(piece_range(p, off, 0, p.nbytes))
                    off += self._span(p, dev)
                yield from self._blocking_copy(consumer, gm, self.host_cache, ranges, stats, inp.name)
        elif pipelined:
            assert plan is not None
            ring = self.rings[dev]
            o = plan.consumed
            if self.cfg.mutated("issue-before-enqueue"):
                yield from self._prefetch(plan, stats, limit_extra=1)
            slot = o % ring.n_slots
            dst, base = self._delivery_target(ring, dev, slot)
            late_ranges = []
            for inp, entry_off in plan.entries[split.index]:
                off = base + entry_off
                for i, p in enumerate(inp.pieces):
                    early = self._prefix(ring, inp, i, p.prefix_bytes, p.nbytes)
                    if p.nbytes > early:
                        late_ranges.append(piece_range(p, off, early, p.nbytes))
                    off += self._span(p, dev)
                self._bind_window(bindings, pieces, inp, dst, base + entry_off, dev)
            if late_ranges:
                yield from self.be.copy(consumer, dst, self.host_cache, late_ranges, tag="late")
                stats.late_bytes += sum(r.nbytes for r in late_ranges)
            yield from self.be.wait_event(consumer, ring.ready[slot])
        accesses = [Access(b, o, n, False) for b, o, n in bindings.values()]
        accesses.append(Access(io, 0, self.kernel_io_bytes, True))
        bindings.update(pieces)
        bindings["io"] = (io, 0, io.nbytes)
        if self.cfg.arm != "copy-only":
            run = self.program.gpu_run(split, bindings) if self.program else None
            yield from self.be.launch(consumer, Work(split.name, split.compute_s, split.n_launches, run, tuple(accesses), tag="gpu"))
        if pipelined:
            assert plan is not None
            ring = self.rings[dev]
            yield from self.be.record(ring.release[slot], consumer)
            plan.consumed += 1
            if not self.cfg.mutated("issue-before-enqueue"):
                yield from self._prefetch(plan, stats, limit_extra=0)

    def _bind_window(self, bindings: dict[str, tuple[Buffer, int, int]], pieces: dict[str, tuple[Buffer, int, int]],
                     inp: StagedInput, buf: Buffer, start: int, dev: int) -> None:
        """Bind ``inp`` as the kernel reads it from ``start`` of ``buf``: ``window:<name>``, and with several
        streams also ``window:<name>#<i>`` per stream (packed or unpacked, as ``_span`` lays them out)."""
        if len(inp.pieces) == 1:
            bindings[f"window:{inp.name}"] = (buf, start, inp.nbytes)
            return
        off = start
        for i, p in enumerate(inp.pieces):
            pieces[f"window:{inp.name}#{i}"] = (buf, off, p.nbytes)
            end = off + p.nbytes
            off += self._span(p, dev)
        bindings[f"window:{inp.name}"] = (buf, start, end - start)

    @staticmethod
    def _bind_resident(bindings: dict[str, tuple[Buffer, int, int]], pieces: dict[str, tuple[Buffer, int, int]],
                       inp: StagedInput, cache: Buffer) -> None:
        """Bind ``inp`` where the resident cache holds it: at its host-cache offsets (one range per stream)."""
        first = inp.pieces[0]
        if len(inp.pieces) == 1:
            bindings[f"window:{inp.name}"] = (cache, first.src_offset, first.nbytes)
            return
        for i, p in enumerate(inp.pieces):
            pieces[f"window:{inp.name}#{i}"] = (cache, p.src_offset, p.nbytes)
        last = inp.pieces[-1]
        bindings[f"window:{inp.name}"] = (cache, first.src_offset, last.src_offset + last.nbytes - first.src_offset)

    # pipelined pieces ------------------------------------------------

    def _delivery_target(self, ring: _Ring, dev: int, slot: int) -> tuple[Buffer, int]:
        """Where slot ``slot`` lives: the ring, or (mutation) the graph allocator's recycled input region."""
        if self.cfg.mutated("allocator-staging"):
            return self.graph_mem[dev], 0
        assert ring.buffer is not None
        return ring.buffer, slot * ring.slot_alloc_bytes

    def _prefetch(self, plan: _DevicePlan, stats: GraphStats, limit_extra: int) -> HostOp:
        """Issue deliveries while ``o <= consumed + N`` (+ ``limit_extra`` for the issue-before-enqueue mutation)."""
        t = self.be.now_s()
        limit = plan.consumed + self.cfg.depth + limit_extra
        while plan.issued < len(plan.order) and plan.issued <= limit:
            yield from self._deliver(plan, plan.issued, stats)
            plan.issued += 1
        if plan.issued < len(plan.order):
            stats.depth_stops += 1
        stats.issue_s += self.be.now_s() - t

    def _deliver(self, plan: _DevicePlan, o: int, stats: GraphStats) -> HostOp:
        split = plan.order[o]
        ring = self.rings[split.device]
        slot = o % ring.n_slots
        dst, base = self._delivery_target(ring, split.device, slot)
        if ring.slot_used[slot] and not self.cfg.mutated("allocator-staging"):
            if self.cfg.mutated("host-recycle"):
                yield from self.be.wait_host(ring.release[slot])
            elif not self.cfg.mutated("no-release-wait"):
                yield from self.be.wait_event(ring.transfer, ring.release[slot])
                stats.recycle_waits += 1
        ranges = []
        for inp, entry_off in plan.entries[split.index]:
            off = base + entry_off
            for i, p in enumerate(inp.pieces):
                early = self._prefix(ring, inp, i, p.prefix_bytes, p.nbytes)
                if early and len(inp.pieces) > 1 and self.cfg.mutated("one-cell-range"):
                    early = min(early, p.cell_bytes or p.width)  # the range sized from one cell, not the stream's window
                if early:
                    ranges.append(piece_range(p, off, 0, early))
                off += self._span(p, split.device)
        if ranges:
            yield from self.be.copy(ring.transfer, dst, self.host_cache, ranges, tag=f"delivery{o}")
            stats.early_bytes += sum(r.nbytes for r in ranges)
        yield from self.be.record(ring.ready[slot], ring.transfer)
        ring.slot_used[slot] = True
        stats.deliveries += 1

    def _prefix(self, ring: _Ring, inp: StagedInput, piece: int, prefix: int, nbytes: int) -> int:
        """Early bytes of one piece: its stable prefix (stale-prefix mutation: the first graph's, never refreshed)."""
        if self.cfg.mutated("stale-prefix"):
            prefix = ring.prefix_rows_last.setdefault(f"{inp.name}#{piece}", prefix)
        early = min(prefix, nbytes)
        p = inp.pieces[piece]
        return early if p.rows == 1 else early // p.width * p.width
