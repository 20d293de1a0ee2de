"""One device's staging ring: its slots, events and transfer stream.

The ring holds ``n_slots`` = N + margin slots of equal size, each guarded by a
``ready`` event (recorded on the transfer stream after its delivery) and a
``release`` event (recorded on the consumer stream after the split that read
it). What the ring decides about its memory each graph -- declined, grown,
released after idling -- is ``sim.transport.planning``'s, the one set of rules
the point planner and the evaluator run too; the ring keeps that state as a
``planning.RingState`` of one point (:attr:`Ring.state`), which its properties
read, and its buffer; :meth:`Ring.decline_reason` asks the rule without acting.

Units: bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backends.base import Buffer, Event, Stream
from sim.transport import planning
from sim.transport.config import TransportConfig
from sim.transport.planning import RingState


@dataclass(eq=False)
class Ring:
    """One device's staging ring and its transfer stream."""

    device: int
    transfer: Stream
    n_slots: int
    buffer: Buffer | None = None
    ready: list[Event] = field(default_factory=list)
    release: list[Event] = field(default_factory=list)
    slot_used: list[bool] = field(default_factory=list)
    prefix_rows_last: dict[str, int] = field(default_factory=dict)
    state: RingState = field(default_factory=lambda: RingState.empty(1, made=True))

    @property
    def slot_alloc_bytes(self) -> int:
        """Bytes each slot holds (0: no buffer)."""
        return int(self.state.alloc[0])

    @property
    def frozen_ordered(self) -> bool:
        """The device stays on the ordered path (events unavailable, or the ring could not sit next to the graph)."""
        return bool(self.state.frozen[0])

    @frozen_ordered.setter
    def frozen_ordered(self, value: bool) -> None:
        self.state.frozen[0] = value

    @property
    def delivered_last_graph(self) -> bool:
        return bool(self.state.delivered[0])

    @property
    def idle_graphs(self) -> int:
        """Graphs since the ring last delivered."""
        return int(self.state.idle[0])

    def decline_reason(self, cfg: TransportConfig, be: Any, need: int, full_need: int) -> str:
        """Why a ring of ``need``-byte slots cannot run a graph now ('' if it can): ``sim.transport.planning``'s rule
        for this ring, changing nothing. Reads ``be.free_bytes``; does not block."""
        return planning.decline_reason(self.state, be.free_bytes(self.device), cfg, self.device, need, full_need)

    def stale_prefix(self, name: str, prefix: int) -> int:
        """The stale-prefix mutation: the prefix bytes piece ``name`` had in the first graph that asked, never updated
        (the scheduler otherwise reads each graph's own, ``sim.transport.deliveries.stable_early``). Does not block."""
        return self.prefix_rows_last.setdefault(name, prefix)
