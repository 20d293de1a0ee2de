"""A point, its decode graphs, and what running it produced.

A *point* is (model, hardware, cache type, context, depth, budget): decode ``tokens`` tokens starting at ``context``
on the given machine with the transport scheduler (``sim.run.run.run_point`` runs it). :class:`RunResult` is what a
run produced: per-graph stats and the timeline; ``sim.rows.row`` turns it into the result row every command writes.
:func:`placed_hardware` is the machine as the workload's weights leave it, before the scheduler allocates.

A token's graph is a pure function of the workload, the devices' compute models and the step, and building the
graphs takes about a sixth of a simulation's wall time; :func:`graph_at` therefore keeps the graphs of the last few
points (per thread), so the points of a grid that differ only in transport settings (depth, budget) build them once.

Units: seconds and bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from backends.base import Span
from backends.profile import HardwareProfile
from sim.graph import DecodeGraph, decode_graph
from sim.memory import held_before_ring
from sim.transport.config import MIB, GraphStats, TransportConfig
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


GRAPH_BASE_BYTES = 16 * MIB  # the scheduler's own buffers of a graph, per device
GRAPH_CACHE_POINTS = 4  # points whose graphs are kept (per thread)
GRAPH_CACHE_SIZE = 4096  # graphs kept per point: tokens x sequences x attention layers (the reference at 64 tokens: 1,024)

_graphs = threading.local()  # .cache: OrderedDict of the last points' graphs (step -> graph), least recently used first


def graph_at(point: Point, step: int, start_token: int = 0) -> DecodeGraph:
    """The decode graph of ``point``'s step ``step`` (every sequence writes one new row).

    Built on first use and kept for the last ``GRAPH_CACHE_POINTS`` points (graphs are frozen, and the
    same arguments build equal graphs), as many of a point's graphs as ``GRAPH_CACHE_SIZE`` (sequences x
    attention layers of each graph) holds: the first ones asked for; the others are built afresh. Does not block.
    """
    wl, hw = point.workload, point.hardware
    host_attention = point.transport.arm == "host-attention"
    last = getattr(_graphs, "last", None)  # the point asked last (its objects: hashing a workload costs ~10 us)
    if last is not None and last[0] is wl and last[1] is hw and last[2] == start_token and last[3] == host_attention:
        built = last[4]
    else:
        computes = tuple(d.compute for d in hw.devices)
        n_dev = len(hw.devices) if wl.split_mode != "none" else 1
        key = (wl, computes, n_dev, start_token, host_attention)
        built = _kept_graphs(key) if _hashable(key) else {}
        _graphs.last = (wl, hw, start_token, host_attention, built)  # the most recently used: kept while it is last
    graph = built.get(step)
    if graph is None:
        n_dev = len(hw.devices) if wl.split_mode != "none" else 1
        graph = decode_graph(wl, tuple(d.compute for d in hw.devices), step=step, token=start_token + step, n_devices=n_dev,
                             host_attention=host_attention)
        if (len(built) + 1) * wl.n_parallel * len(wl.model.attn_layers) <= GRAPH_CACHE_SIZE:
            built[step] = graph
    return graph


def graphs_for(point: Point, start_token: int = 0) -> Iterator[DecodeGraph]:
    """The decode graphs of ``point``, one per decode step, in order (see :func:`graph_at`); built lazily."""
    for i in range(point.workload.tokens):
        yield graph_at(point, i, start_token)


def _kept_graphs(key: Any) -> dict[int, DecodeGraph]:
    """The kept graphs of one point (step -> graph), made the most recently used."""
    cache = _graph_cache()
    built = cache.setdefault(key, {})
    cache.move_to_end(key)
    while len(cache) > GRAPH_CACHE_POINTS:
        cache.popitem(last=False)
    return built


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def _graph_cache() -> OrderedDict[Any, dict[int, DecodeGraph]]:
    if not hasattr(_graphs, "cache"):
        _graphs.cache = OrderedDict()
    cache: OrderedDict[Any, dict[int, DecodeGraph]] = _graphs.cache
    return cache


def clear_graph_cache() -> None:
    """Forget the kept graphs of this thread (a timing that must build them, as ``kvpipe bench`` does)."""
    _graphs.cache = OrderedDict()
    _graphs.last = None


def io_bytes_for(wl: Workload) -> int:
    """Bytes of the small-input staging buffers: graph inputs, the KQ mask at full context, new rows, activations."""
    mask = wl.cells * 2 * wl.n_parallel
    rows = 2 * wl.n_parallel * wl.row_bytes
    return (1 << 20) + sum(wl.model.small_inputs_bytes) + mask + rows + 4 * wl.model.hidden * wl.n_parallel


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
