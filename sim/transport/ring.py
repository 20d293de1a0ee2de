"""One device's staging ring: its slots, events and transfer stream, and the decisions about its memory.

The ring holds ``n_slots`` = N + margin slots of equal size, each guarded by a
``ready`` event (recorded on the transfer stream after its delivery) and a
``release`` event (recorded on the consumer stream after the split that read
it). Each graph the scheduler asks :meth:`Ring.decline_reason` whether the
ring the graph needs fits the budget and the device's headroom, then
:meth:`Ring.ensure_slots` to grow it: slots allocated in powers of two, capped
by the full-context need, the budget share and the headroom share. Memory
calls only (``alloc``, ``free``, ``free_bytes``), none of which blocks the host.

Units: bytes (MiB only in messages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from backends.base import Buffer, Event, OutOfDeviceMemory, Stream
from sim.transport.config import MIB, TransportConfig
from sim.transport.deliveries import align_up, next_pow2


class Memory(Protocol):
    """The part of a backend a ring's decisions read: its device memory (a ``Backend`` is one; so is the point
    planner's ledger, ``sim.distinct``). None of these calls blocks."""

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer: ...

    def free(self, buffer: Buffer) -> None: ...

    def free_bytes(self, device: int) -> int: ...


@dataclass(eq=False)
class Ring:
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

    def decline_reason(self, cfg: TransportConfig, be: Memory, need: int, full_need: int) -> str:
        """Why a ring of ``need``-byte slots cannot run this graph ('' if it can). Does not block."""
        if self.frozen_ordered:
            return "device kept on the ordered path (events unavailable or ring could not sit next to the graph)"
        ring_need = need * self.n_slots
        budget = cfg.budget_bytes
        if budget and ring_need > budget:
            return (
                f"ring needs {ring_need / MIB:.1f} MiB > budget {cfg.budget_mib:g} MiB "
                f"({full_need * self.n_slots / MIB:.1f} MiB at full context)"
            )
        held = self.slot_alloc_bytes * self.n_slots
        free = be.free_bytes(self.device) + held
        headroom = int(cfg.headroom_mib * MIB)
        if free - ring_need < headroom:
            return (
                f"ring needs {ring_need / MIB:.1f} MiB but device {self.device} would keep "
                f"{(free - ring_need) / MIB:.1f} MiB free < headroom {cfg.headroom_mib:g} MiB"
            )
        return ""

    def ensure_slots(self, cfg: TransportConfig, be: Memory, alignment: int, need: int, full_need: int) -> str:
        """Make every slot hold ``need`` bytes; powers of two, capped. Returns a decline reason or ''. Does not block."""
        if self.buffer is not None and self.slot_alloc_bytes >= need:
            return ""
        n = self.n_slots
        held = self.slot_alloc_bytes * n
        free = be.free_bytes(self.device) + held
        caps = [max(full_need, need), (free - int(cfg.headroom_mib * MIB)) // n]
        if cfg.budget_bytes:
            caps.append(cfg.budget_bytes // n)
        alloc = max(need, min([next_pow2(need), *caps]))
        alloc = align_up(alloc, alignment)
        self.free(be)
        try:
            self.buffer = be.alloc(self.device, alloc * n, f"ring{self.device}")
        except OutOfDeviceMemory:
            return f"ring of {alloc * n / MIB:.1f} MiB could not be allocated on device {self.device}"
        self.slot_alloc_bytes = alloc
        self.slot_used = [False] * n
        return ""

    def free(self, be: Memory) -> None:
        """Give the slots' memory back (the caller orders it after their last use). Does not block."""
        if self.buffer is not None:
            be.free(self.buffer)
        self.buffer = None
        self.slot_alloc_bytes = 0

    def stale_prefix(self, name: str, prefix: int) -> int:
        """The stale-prefix mutation: the prefix bytes piece ``name`` had in the first graph that asked, never updated
        (the scheduler otherwise reads each graph's own, ``sim.transport.deliveries.stable_early``). Does not block."""
        return self.prefix_rows_last.setdefault(name, prefix)
