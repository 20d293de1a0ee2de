"""A point and what running it produced: the workload, the machine and the transport it runs with.

A *point* is (model, hardware, cache type, context, depth, budget): decode ``tokens`` tokens starting at ``context``
on the given machine with the transport scheduler (``sim.run.run.run_point`` runs it). :class:`RunResult` is what a
run produced: per-graph stats and the timeline; ``sim.run.row.row`` turns it into the result row every command writes.
:func:`placed_hardware` is the machine as the workload's weights leave it, before the scheduler allocates.

Units: seconds and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from backends.base import Span
from backends.profile import HardwareProfile
from sim.memory import held_before_ring
from sim.transport.config import GraphStats, TransportConfig
from sim.workload import Workload


@dataclass(frozen=True)
class Point:
    """One configuration to run."""

    workload: Workload
    hardware: HardwareProfile
    transport: TransportConfig

    @property
    def context(self) -> int:
        return max(self.workload.context)


@dataclass
class RunResult:
    """What a run of ``tokens`` graphs produced: per-graph stats and the timeline."""

    point: Point
    graphs: list[GraphStats]
    spans: list[Span] = field(default_factory=list)
    window_rows: int = 0
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def placed_hardware(point: Point) -> HardwareProfile:
    """The profile with each device's memory use as this workload places it (``sim.memory.held_before_ring``).

    Each device holds its driver's reservation, the weights of the layers on
    it (``-ngl``, layer or tensor split) and llama.cpp's compute buffer; the
    scheduler allocates the rest. A one-device profile whose ``memory_used``
    is set (> 0: measured for one program, as ``kvpipe calibrate`` does on a
    GPU) keeps it.
    """
    wl, hw = point.workload, point.hardware
    fixed = len(hw.devices) == 1 and hw.devices[0].memory_used_bytes > 0
    if fixed:
        return hw
    held = held_before_ring(wl, tuple(d.memory_reserved_bytes for d in hw.devices))
    devices = tuple(replace(d, memory_used_bytes=min(d.memory_total_bytes, h)) for d, h in zip(hw.devices, held, strict=True))
    return replace(hw, devices=devices)
