"""How close a delivery came to overwriting a slot still being read: the release margin, from a run's timeline.

Delivery ``o`` of a graph writes slot ``o mod n_slots``, which split
``o - n_slots`` of the same graph read before it. With the release wait in
place the transfer stream cannot start the copy before that split's kernels
end; with ``no-release-wait`` nothing but timing keeps it out. The *margin*
of a delivery is its copy's start on the H2D engine track minus the end of the
previous reader's kernels on the consumer track: negative means the copy ran
while the slot was being read -- the race the exactness gate then catches, or
not, depending on which bytes the overlap touched. (Across graphs the boundary
wait orders the first ``n_slots`` deliveries.)

Spans as every backend writes them: deliveries ``delivery<o>`` on ``h2d<dev>``,
GPU splits by name on ``consumer<dev>``, a graph's first split ``gpu0``.
Units: seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.base import Span
from sim.transport.scheduler import TransportConfig
from sim.workload import Workload


def _graphs(spans: Sequence[Span], track: str, starts: Any) -> list[list[Span]]:
    out: list[list[Span]] = []
    for s in sorted((s for s in spans if s.track == track), key=lambda s: s.start_s):
        if starts(s) or not out:
            out.append([])
        out[-1].append(s)
    return out


def release_margins(spans: Sequence[Span], wl: Workload, transport: TransportConfig, device: int = 0) -> dict[str, Any]:
    """Per pipelined run: deliveries paired with their slot's previous reader, the smallest margin, how many were negative."""
    n = transport.n_slots
    order = [f"gpu_attn_l{a}" for a in wl.model.attn_layers]
    deliveries = _graphs([s for s in spans if s.name.startswith("delivery")], f"h2d{device}", lambda s: s.name == "delivery0")
    kernels = _graphs([s for s in spans if s.name.startswith("gpu")], f"consumer{device}", lambda s: s.name == "gpu0")
    margins = []
    for ds, ks in zip(deliveries, kernels, strict=False):
        end = {k.name: k.end_s for k in ks}
        for d in ds:
            o = int(d.name[len("delivery"):])
            if o >= n and order[o - n] in end:
                margins.append(d.start_s - end[order[o - n]])
    return {"pairs": len(margins), "min_margin_us": min(margins) * 1e6 if margins else 0.0,
            "negative": sum(m < 0 for m in margins)}
