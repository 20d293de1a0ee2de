"""Ring planning: per graph and device, does the staging ring run, how large are its slots, where the graph's memory
goes -- decided for many points at once.

Each graph, for every device that stages windows, the scheduler takes the slot need of its staged splits (the
largest split's windows in the slot layout, :func:`slot_needs`) and asks the device's ring: it is declined when the
device is frozen ordered, when N + margin slots of that need exceed the budget, or when the device would keep less
than the headroom free; otherwise its slots grow to the need (powers of two, capped by the full-context need, the
budget's share and the headroom's share), and a ring that cannot be allocated is declined too (:func:`plan_ring`).
Then each GPU device's graph memory is reserved beside the ring; a ring that leaves it no room is released, the
device frozen ordered and the reservation retried once (:func:`reserve_graph`); and a ring that delivered nothing
for more than ``idle_release_graphs`` graphs is released (:func:`account_idle`).

These rules are written once, here, as arithmetic over NumPy arrays with one element per point, against a
:class:`Memory` that grants or refuses allocations. The scheduler plans its one point on its backend
(:class:`BackendMemory`, arrays of one); the point planner (``sim.replay``) and the compiled evaluator plan
thousands of points at once on a :class:`Ledger`, which keeps each point's device memory as the SimPy machine keeps
it (both in ``sim.transport.ledger``). A ring's state is a :class:`RingState` (arrays over the points); the
scheduler's ``Ring`` holds one of one element. The plan of one graph over the points, the ``GraphStats`` fields it
decides, accumulates in a :class:`GraphPlan`.

Units: bytes (MiB only in messages). Nothing here blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.graph import DecodeGraph, Split, StagedInput
from sim.transport.config import MIB, TransportConfig
from sim.transport.deliveries import SpanFn, full_need, slot_entries
from sim.transport.ledger import BackendMemory, Ledger, Memory, memory_of  # noqa: F401 - re-exported

Arr = np.ndarray
I64 = np.int64
#: Why a device's ring did not run this graph (``decline_message`` says it in words).
RUNS, FROZEN, OVER_BUDGET, NO_HEADROOM, NOT_ALLOCATED, RESERVE_FAILED = range(6)
#: The ``GraphStats`` fields planning decides (the rest are what running the graph measures).
PLAN_FIELDS = ("ring_slots", "slot_need_bytes", "slot_alloc_bytes", "full_slot_need_bytes", "declined", "decline_reason",
               "staged_splits")
SlotNeed = tuple[int, list[Split], int, dict[int, list[tuple[StagedInput, int]]], int]


def slot_needs(graph: DecodeGraph, spans: Sequence[SpanFn], key: Any) -> list[SlotNeed]:
    """Per device with staged splits, in the order the graph first stages on it: (device, its staged splits, the
    bytes one slot needs, each split's (input, offset in the slot), the need at full context). A pure function of
    the graph and the slot layout (``spans`` per device; ``key`` names them), kept with the graph."""
    memo_key = ("slot_needs", key)
    kept = graph.memo.get(memo_key)
    if kept is None:
        by_dev: dict[int, list[Split]] = {}
        for s in graph.staged_splits:
            by_dev.setdefault(s.device, []).append(s)
        kept = []
        for dev, splits in by_dev.items():
            need, entries = slot_entries(splits, spans[dev])
            kept.append((dev, splits, need, entries, max(full_need(s, graph, spans[dev]) for s in splits)))
        graph.memo[memo_key] = kept
    return kept  # type: ignore[no-any-return]


# ------------------------------------------------------------------ what a point's config says


@dataclass(frozen=True)
class Policy:
    """What planning reads of each point's TransportConfig, as arrays over the points."""

    ring: Arr  # bool: the point keeps rings (depth > 0, not the resident arm)
    n_slots: Arr  # slots of a ring (N + margin)
    budget: Arr  # bytes; 0: no cap
    headroom: Arr  # bytes
    idle_release: Arr  # graphs
    ring_staging: Arr  # bool: deliveries go to the ring (off: the graph allocator's input region)
    resident_arm: Arr  # bool
    depth: Arr  # N

    @staticmethod
    def of(cfgs: Sequence[TransportConfig]) -> Policy:
        """The policy of each config (one array element per config). Pure."""
        index: dict[TransportConfig, int] = {}
        by_id: dict[int, int] = {}  # configs are often shared objects: each hashed once

        def at(c: TransportConfig) -> int:
            got = by_id.get(id(c))
            if got is None:
                got = by_id[id(c)] = index.setdefault(c, len(index))
            return got

        which = np.fromiter((at(c) for c in cfgs), dtype=np.intp, count=len(cfgs))
        one = [_policy_row(c) for c in index]
        cols = [np.array(col)[which] for col in zip(*one, strict=True)] if one else [np.zeros(0)] * 8
        return Policy(*cols)


@functools.lru_cache(maxsize=256)
def _policy_row(cfg: TransportConfig) -> tuple[bool, int, int, int, int, bool, bool, int]:
    return (cfg.depth > 0 and cfg.arm != "resident", cfg.n_slots, cfg.budget_bytes, int(cfg.headroom_mib * MIB),
            cfg.idle_release_graphs, cfg.policy.ring_staging, cfg.arm == "resident", cfg.depth)


@functools.lru_cache(maxsize=256)
def policy_of(cfg: TransportConfig) -> Policy:
    """One config's policy (arrays of one element), kept. Pure."""
    return Policy.of([cfg])


def one(*values: Any) -> tuple[Arr, ...]:
    """Each value as an array of one point (the scheduler plans one point)."""
    return tuple(np.array([v]) for v in values)



# ------------------------------------------------------------------ state and results


@dataclass
class RingState:
    """One device's ring over the points: made (the scheduler created it), its slot bytes (0: no buffer: whether
    it holds one is the memory's ``held``), frozen on the ordered path, graphs since it last delivered, delivered
    last graph."""

    made: Arr
    alloc: Arr
    frozen: Arr
    idle: Arr
    delivered: Arr

    @staticmethod
    def empty(n: int, made: bool = False) -> RingState:
        return RingState(np.full(n, made), np.zeros(n, dtype=I64), np.zeros(n, dtype=bool), np.zeros(n, dtype=I64),
                         np.zeros(n, dtype=bool))


@dataclass
class GraphPlan:
    """What planning decided for one graph over the points: the ``PLAN_FIELDS`` (a decline as ``code``, the device
    it names and two numbers for its message) and, per device, whether its ring runs and whether its slots were
    allocated afresh. ``counts_idle``: a ring held slots but delivered nothing."""

    staged_splits: Arr
    slot_need: Arr
    full_need: Arr
    ring_slots: Arr
    slot_alloc: Arr
    code: Arr
    code_device: Arr
    message_a: Arr
    message_b: Arr
    code_rank: Arr
    active: dict[int, Arr] = field(default_factory=dict)
    fresh: dict[int, Arr] = field(default_factory=dict)
    counts_idle: Arr | None = None

    @staticmethod
    def empty(n: int) -> GraphPlan:
        z = np.zeros((10, n), dtype=I64)  # one allocation: a graph of one point is planned every token
        z[9] = -1
        return GraphPlan(z[0], z[1], z[2], z[3], z[4], z[5], z[6], z[7], z[8], z[9], counts_idle=np.zeros(n, dtype=bool))

    @property
    def declined(self) -> Arr:
        return self.code != RUNS  # type: ignore[no-any-return]

    def reason(self, i: int, cfg: TransportConfig) -> str:
        """Point ``i``'s decline reason in words ('' if its rings ran). Pure."""
        return decline_message(int(self.code[i]), int(self.code_device[i]), int(self.message_a[i]), int(self.message_b[i]), cfg)

    def fields(self, i: int, cfg: TransportConfig) -> tuple[Any, ...]:
        """Point ``i``'s ``PLAN_FIELDS`` values, in order. Pure."""
        return (int(self.ring_slots[i]), int(self.slot_need[i]), int(self.slot_alloc[i]), int(self.full_need[i]),
                bool(self.code[i] != RUNS), self.reason(i, cfg), int(self.staged_splits[i]))

    def to_stats(self, stats: Any, cfg: TransportConfig, i: int = 0, declines_only: bool = False) -> None:
        """Write point ``i``'s ``PLAN_FIELDS`` into a GraphStats (``declines_only``: only a decline, if any)."""
        if declines_only:
            if self.code[i] != RUNS:
                stats.declined, stats.decline_reason = True, self.reason(i, cfg)
            return
        for name, value in zip(PLAN_FIELDS, self.fields(i, cfg), strict=True):
            setattr(stats, name, value)

    def _decline(self, where: Arr, code: Arr | int, device: int, a: Arr | int = 0, b: Arr | int = 0,
                 rank: Arr | int = 1 << 30) -> None:
        """Record a decline where asked; of several devices' declines a graph reports the last one the scheduler
        planned (``rank``: the device's place in that order; a failed reservation comes after every ring)."""
        where = where & (rank >= self.code_rank)
        if not where.any():
            return
        self.code_rank = np.where(where, rank, self.code_rank)
        self.code = np.where(where, code, self.code)
        self.code_device = np.where(where, device, self.code_device)
        self.message_a = np.where(where, a, self.message_a)
        self.message_b = np.where(where, b, self.message_b)


def decline_message(code: int, device: int, a: int, b: int, cfg: TransportConfig) -> str:
    """A decline in words: ``a``/``b`` are the ring's bytes and the second figure each reason quotes. Pure."""
    if code == FROZEN:
        return "device kept on the ordered path (events unavailable or ring could not sit next to the graph)"
    if code == OVER_BUDGET:
        return f"ring needs {a / MIB:.1f} MiB > budget {cfg.budget_mib:g} MiB ({b / MIB:.1f} MiB at full context)"
    if code == NO_HEADROOM:
        return (f"ring needs {a / MIB:.1f} MiB but device {device} would keep {b / MIB:.1f} MiB free < headroom "
                f"{cfg.headroom_mib:g} MiB")
    if code == NOT_ALLOCATED:
        return f"ring of {a / MIB:.1f} MiB could not be allocated on device {device}"
    if code == RESERVE_FAILED:
        return f"graph reservation failed next to the ring on device {device}; retried ordered"
    return ""


def next_pow2(n: Arr) -> Arr:
    """``deliveries.next_pow2`` over an array: the smallest power of two >= n (2 for 0), exactly, for |n| < 2**53."""
    _, exp = np.frexp(np.abs(n - 1).astype(np.float64))  # (n - 1).bit_length()
    return np.left_shift(np.ones_like(n, dtype=I64), exp.astype(I64))  # type: ignore[no-any-return]


# ------------------------------------------------------------------ the three steps


def decline_codes(ring: RingState, free_bytes: Arr, pol: Policy, need: Arr) -> tuple[Arr, Arr, Arr, Arr]:
    """Whether a ring of ``need``-byte slots may run (``RUNS``) or why not (frozen, over the budget, no headroom), with
    the ring's bytes, the bytes free counting its own slots, and its slots (at least 1). Pure."""
    n = np.maximum(pol.n_slots, 1)
    ring_need = need * n
    avail = free_bytes + ring.alloc * n
    code = np.where(ring.frozen, FROZEN, np.where((pol.budget > 0) & (ring_need > pol.budget), OVER_BUDGET,
                                                  np.where(avail - ring_need < pol.headroom, NO_HEADROOM, RUNS)))
    return code, ring_need, avail, n


def decline_reason(ring: RingState, free_bytes: int, cfg: TransportConfig, device: int, need: int, full: int) -> str:
    """One point's ring of ``need``-byte slots: why it may not run, in words ('' if it may), as :func:`plan_ring`
    decides it, changing nothing (the across-tokens schedule asks before delivering ahead). Pure."""
    code, ring_need, avail, n = decline_codes(ring, np.array([free_bytes]), policy_of(cfg), np.array([need]))
    c = int(code[0])
    return decline_message(c, device, int(ring_need[0]), int(full * n[0] if c == OVER_BUDGET else avail[0] - ring_need[0]), cfg)


def plan_ring(plan: GraphPlan, ring: RingState | None, mem: Memory, pol: Policy, device: int, staged: Arr, n_splits: Arr,
              need: Arr, full: Arr, alignment: Arr | int, rank: Arr | int = 0) -> None:
    """One device's staged splits in one graph (``staged``: the points where the device stages): count them, and
    where the point keeps a ring decide it and size its slots (the scheduler's ``_plan``). ``ring``: None where
    no point keeps one (the scheduler's depth 0 and resident arm). ``rank``: the device's place among the graph's
    staging devices (the scheduler plans them in that order, so the default 0 lets a later call's decline win)."""
    plan.staged_splits = plan.staged_splits + np.where(staged, n_splits, 0)
    plan.slot_need = np.where(staged, np.maximum(plan.slot_need, need), plan.slot_need)
    plan.full_need = np.where(staged, np.maximum(plan.full_need, full), plan.full_need)
    plan.active[device] = np.zeros_like(staged)
    plan.fresh[device] = np.zeros_like(staged)
    on = staged & pol.ring
    if ring is None or not on.any():
        return
    ring.made = ring.made | on
    plan.ring_slots = np.where(on, pol.n_slots, plan.ring_slots)
    code, ring_need, avail, n = decline_codes(ring, mem.free_bytes(device), pol, need)
    grow = on & (code == RUNS) & ~((mem.held(device, "ring") >= 0) & (ring.alloc >= need))
    if grow.any():
        caps = np.minimum(np.maximum(full, need), (avail - pol.headroom) // n)
        caps = np.where(pol.budget > 0, np.minimum(caps, pol.budget // n), caps)
        size = np.maximum(need, np.minimum(next_pow2(need), caps))
        size = -(-size // alignment) * alignment
        release(ring, mem, device, grow)
        got = mem.alloc(device, "ring", size * n, grow)
        ring.alloc = np.where(got, size, ring.alloc)
        code = np.where(grow & ~got, NOT_ALLOCATED, code)
        plan.fresh[device] = got
    else:
        size = need
    declined = on & (code != RUNS)
    plan._decline(declined, code, device, np.where(code == NOT_ALLOCATED, size * n, ring_need),
                  np.where(code == OVER_BUDGET, full * n, avail - ring_need), rank)
    plan.active[device] = on & (code == RUNS)
    plan.slot_alloc = np.where(plan.active[device], np.maximum(plan.slot_alloc, ring.alloc), plan.slot_alloc)


def reserve_graph(plan: GraphPlan, rings: Mapping[int, RingState], mem: Memory, pol: Policy, device: int, gpu: Arr,
                  staged: Arr, need: Arr, base_bytes: int, io_bytes: Arr | int) -> None:
    """Reserve ``device``'s graph memory where it runs GPU splits (``gpu``): its base, plus the slot need where its
    windows land in the graph's memory (ordered, or the allocator-staging mutation). A failure beside a ring frees the
    ring, freezes the device ordered and retries; with no ring to free the graph does not fit (``Memory.refuse``).
    Then the device's io buffer, once (the scheduler's ``_reserve_graph``)."""
    active = plan.active.get(device, np.zeros_like(gpu))
    here = staged & (~active | ~pol.ring_staging) & ~pol.resident_arm
    first = base_bytes + np.where(here, need, 0)
    failed = gpu & ~grow_graph(mem, device, first, gpu)
    if failed.any():
        ring = rings.get(device)
        freeable = failed & ring.made & (mem.held(device, "ring") >= 0) if ring is not None else np.zeros_like(failed)
        mem.refuse(device, first, failed & ~freeable)
        if ring is not None and freeable.any():
            release(ring, mem, device, freeable)
            ring.frozen = ring.frozen | freeable
            plan.active[device] = active & ~freeable
            plan._decline(freeable, RESERVE_FAILED, device)
            second = base_bytes + np.where(staged, need, 0)
            mem.refuse(device, second, freeable & ~grow_graph(mem, device, second, freeable))
    mem.alloc(device, "io", io_bytes, gpu & (mem.held(device, "io") < 0), must=True)


def grow_graph(mem: Memory, device: int, need: Arr, where: Arr) -> Arr:
    """Make the device's graph memory hold ``need`` bytes where asked (a smaller one is given back first); True where
    it does (the scheduler's ``_grow_graph_mem``)."""
    held = mem.held(device, "graph")
    keep = where & (held >= need)
    redo = where & ~keep
    mem.free(device, "graph", redo & (held >= 0))
    return keep | mem.alloc(device, "graph", np.maximum(need, 1), redo)  # type: ignore[no-any-return]


def release(ring: RingState, mem: Memory, device: int, where: Arr) -> None:
    """Give the ring's slots back where asked (the caller orders it after their last use)."""
    mem.free(device, "ring", where)
    ring.alloc = np.where(where, 0, ring.alloc)


def account_idle(plan: GraphPlan, rings: Mapping[int, RingState], mem: Memory, pol: Policy) -> None:
    """After the graph: a ring that ran is not idle; every other ring the point made counts one idle graph more, and
    past ``idle_release_graphs`` gives its slots back (the scheduler's ``_account_idle``). Sets ``counts_idle``."""
    counted = np.zeros(len(pol.n_slots), dtype=bool)
    for device, ring in rings.items():
        active = ring.made & plan.active.get(device, np.zeros_like(ring.made))
        idle = ring.made & ~active
        counted |= idle & (mem.held(device, "ring") >= 0)
        ring.delivered = np.where(ring.made, active, ring.delivered)
        ring.idle = np.where(active, 0, np.where(idle, ring.idle + 1, ring.idle))
        gone = idle & (ring.idle > pol.idle_release)
        if gone.any():
            release(ring, mem, device, gone)
    plan.counts_idle = counted
