"""What the transport scheduler is told (TransportConfig), what it reports (GraphStats), and the mutation policy.

A :class:`TransportConfig` is frozen and passed whole: the CLI builds it, the
scheduler reads it, ``dataclasses.replace`` derives an arm from another. Its
``mutations`` switch off one load-bearing piece each (docs/correctness.md);
the scheduler consults them only through :class:`Mutations`, a policy with one
named answer per decision point, so the hot path reads ``policy.release_wait``
rather than string tests.

Units: seconds and bytes (MiB only in the field names that say so).
"""

from __future__ import annotations

from dataclasses import dataclass

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
#: What a run measures: ``transport`` (the decode loop, ordered or pipelined), ``resident`` (the windows already in
#: device memory: no transport, the kernels alone -- what ``-nkvo 0`` runs) and ``copy-only`` (the same deliveries,
#: no kernels and no CPU splits). The last two bound a token from below: ceiling t/s = 1 / max(resident, copy-only).
#: ``host-attention`` is upstream llama.cpp's ``-nkvo``: attention runs on the CPU over the host cache (each attention
#: layer's Q/K/V rows go D2H, its output H2D), no window crosses the link, and there is no pipelined path (depth 0).
ARMS = ("transport", "resident", "copy-only", "host-attention")


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
        if self.arm == "host-attention" and self.depth:
            raise ValueError(f"depth {self.depth} on the host-attention arm (upstream llama.cpp's -nkvo, attention on the "
                             "CPU); allowed: depth 0 (it has no pipelined path)")
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

    @property
    def policy(self) -> Mutations:
        return Mutations.of(self.mutations)


@dataclass(frozen=True)
class Mutations:
    """The scheduler's decision points, each answered the correct way unless a mutation switches it off.

    ``issue_before_enqueue``: deliver one split further ahead, before the
    split is enqueued. ``recycle``: how a delivery waits for its slot's
    ``release`` -- ``stream`` (the transfer stream waits on the event),
    ``host`` (the host blocks on it) or ``none``. ``boundary_wait``: sync the
    rings' streams at a graph start after a graph that delivered.
    ``refresh_prefix``: recompute each window's stable prefix every graph
    (off: keep the first graph's). ``ring_staging``: deliver into the ring
    (off: into the graph allocator's recycled input region).
    ``stream_sized_ranges``: size each stream's early range from its window
    (off: from one cell).
    """

    issue_before_enqueue: bool = False
    recycle: str = "stream"
    boundary_wait: bool = True
    refresh_prefix: bool = True
    ring_staging: bool = True
    stream_sized_ranges: bool = True

    @staticmethod
    def of(names: frozenset[str]) -> Mutations:
        return Mutations(
            issue_before_enqueue="issue-before-enqueue" in names,
            recycle="host" if "host-recycle" in names else "none" if "no-release-wait" in names else "stream",
            boundary_wait="no-boundary-wait" not in names,
            refresh_prefix="stale-prefix" not in names,
            ring_staging="allocator-staging" not in names,
            stream_sized_ranges="one-cell-range" not in names,
        )


@dataclass
class GraphStats:
    """What one graph cost and moved (the reference's telemetry fields).

    A token of the fast path (``sim.steady``) that was not simulated says which steady token it was extrapolated
    from in ``extrapolated_from``; a simulated one has -1 there.
    """

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
    extrapolated_from: int = -1  # -1: simulated; else the steady token this one was extrapolated from (sim.steady)

    @property
    def ring_need_bytes(self) -> int:
        return self.slot_need_bytes * self.ring_slots

    @property
    def ring_alloc_bytes(self) -> int:
        return self.slot_alloc_bytes * self.ring_slots
