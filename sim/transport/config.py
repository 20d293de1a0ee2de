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
    "no-fresh-store",
    "no-rows-wait",
    "ahead-before-rows",
)
#: What a run measures: ``transport`` (the decode loop, ordered or pipelined), ``resident`` (the windows already in
#: device memory: no transport, the kernels alone -- what ``-nkvo 0`` runs) and ``copy-only`` (the same deliveries,
#: no kernels and no CPU splits). The last two bound a token from below: ceiling t/s = 1 / max(resident, copy-only).
#: ``host-attention`` is upstream llama.cpp's ``-nkvo``: attention runs on the CPU over the host cache (each attention
#: layer's Q/K/V rows go D2H, its output H2D), no window crosses the link, and there is no pipelined path (depth 0).
ARMS = ("transport", "resident", "copy-only", "host-attention")


@dataclass(frozen=True)
class Schedule:
    """When the pipelined path's copies go, beyond the reference mechanism (docs/schedules.md). All off: the reference.

    ``piece_bytes``: cut each early delivery into copies of at most this many bytes (0: one copy per range), so a
    copy another stream queues behind it waits for one piece. ``late_first``: issue the next early delivery only
    after the current split's late rows are on the engine (delivery o after split o - N's late copy, not after
    split o - N - 1's enqueue). ``fresh_on_device``: the split that computes a layer's new K/V rows also writes them
    into that layer's staged slot (single-stream windows), so the slot's delivery is the window less those rows, all
    early, and no late copy crosses the link; the rows still go down to the host cache, through a copy the host
    waits on only after it has launched the split that reads them (the CPU split off the GPU's critical path).
    ``inputs_first``: a graph's first split copies its small inputs and is launched before the ring is primed, so
    they do not queue behind the first deliveries on the one H2D engine (nor, on the H200, the split behind them).
    ``across_tokens``: the next graph's first delivery is issued right behind this graph's last one, once the CPU
    split that writes its layer's row has run (the window's bytes are final), so the copy engine works while the GPU
    computes the token's last layers and the output head.
    """

    piece_bytes: int = 0
    late_first: bool = False
    fresh_on_device: bool = False
    inputs_first: bool = False
    across_tokens: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.piece_bytes, int) or self.piece_bytes < 0:
            raise ValueError(f"piece {self.piece_bytes!r} B out of range; allowed: 0 (whole deliveries) or > 0 bytes")
        if 0 < self.piece_bytes < 64 * 1024:
            raise ValueError(f"piece {self.piece_bytes / MIB:g} MiB out of range; allowed: 0 (whole) or >= 0.0625 MiB")

    @property
    def name(self) -> str:
        """A short name: ``reference`` when every policy is off, else the policies joined by ``+``."""
        parts = [n for n, on in (("late-first", self.late_first), ("fresh", self.fresh_on_device),
                                 ("inputs-first", self.inputs_first), ("across-tokens", self.across_tokens)) if on]
        if self.piece_bytes:
            parts.append(f"piece{self.piece_bytes / MIB:g}")
        return "+".join(parts) or "reference"

    @property
    def active(self) -> bool:
        return self != Schedule()

    @staticmethod
    def parse(name: str) -> Schedule:
        """A schedule from its name (:attr:`name`: ``reference``, or policies joined by ``+``: ``late-first``,
        ``fresh``, ``inputs-first``, ``piece<MiB>``). Raises ValueError naming the allowed values."""
        kw: dict[str, object] = {}
        for part in name.strip().split("+"):
            flag = {"late-first": "late_first", "fresh": "fresh_on_device", "inputs-first": "inputs_first",
                    "across-tokens": "across_tokens"}.get(part)
            if flag:
                kw[flag] = True
            elif part.startswith("piece") and _positive(part[5:]):
                kw["piece_bytes"] = int(float(part[5:]) * MIB)
            elif part != "reference" or name.strip() != "reference":
                raise ValueError(f"schedule {name!r} unknown; allowed: reference, or late-first, fresh, inputs-first, "
                                 "across-tokens, piece<MiB> joined by '+'")
        return Schedule(**kw)  # type: ignore[arg-type]


def _positive(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


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
    schedule: Schedule = Schedule()

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
    (off: from one cell). ``fresh_store``: under ``Schedule.fresh_on_device``,
    the producing split writes the fresh rows into the slot (off: it does not,
    and the slot's rows are whatever it held). ``rows_wait``: under the same
    policy, the host waits for the rows' copy down before the CPU split reads
    them (off: it reads the host io buffer while the copy may be in flight).
    ``ahead_after_rows``: under ``Schedule.across_tokens``, the next graph's
    first delivery is issued after this graph's CPU splits ran (off: before,
    while the host still writes rows its window holds).
    """

    issue_before_enqueue: bool = False
    recycle: str = "stream"
    boundary_wait: bool = True
    refresh_prefix: bool = True
    ring_staging: bool = True
    stream_sized_ranges: bool = True
    fresh_store: bool = True
    rows_wait: bool = True
    ahead_after_rows: bool = True

    @staticmethod
    def of(names: frozenset[str]) -> Mutations:
        return Mutations(
            issue_before_enqueue="issue-before-enqueue" in names,
            recycle="host" if "host-recycle" in names else "none" if "no-release-wait" in names else "stream",
            boundary_wait="no-boundary-wait" not in names,
            refresh_prefix="stale-prefix" not in names,
            ring_staging="allocator-staging" not in names,
            stream_sized_ranges="one-cell-range" not in names,
            fresh_store="no-fresh-store" not in names,
            rows_wait="no-rows-wait" not in names,
            ahead_after_rows="ahead-before-rows" not in names,
        )


@dataclass
class GraphStats:
    """What one graph cost and moved (the reference's telemetry fields).

    A token of the fast path (``sim.run.decode``) that was not simulated says which steady token it was extrapolated
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
    extrapolated_from: int = -1  # -1: simulated; else the steady token this one was extrapolated from (sim.run.decode)

    @property
    def ring_need_bytes(self) -> int:
        return self.slot_need_bytes * self.ring_slots

    @property
    def ring_alloc_bytes(self) -> int:
        return self.slot_alloc_bytes * self.ring_slots
