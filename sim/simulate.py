"""Run one workload point on a backend and report it as a row.

A *point* is (model, hardware, cache type, context, depth, budget): decode
``tokens`` tokens starting at ``context`` on the given backend with the
transport scheduler, and average the per-graph telemetry. The row schema is
the one every command writes (``simulate --json``, ``sweep``, ``validate``).

``run_decode`` is the loop shared by the simulation and the GPU: it builds
each token's graph and hands it to the scheduler; the backend decides whether
time is simulated or real.

A token's graph is a pure function of the workload, the devices' compute
models and the step, and building the graphs takes about a sixth of a
simulation's wall time; ``graphs_for`` therefore keeps the graphs of the last
few points (per thread), so the points of a grid that differ only in
transport settings (depth, budget) build them once.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from backends.base import Backend, Buffer, HostOp, Span
from backends.profile import ComputeModel, HardwareProfile, prediction_band, workload_entry
from sim.graph import DecodeGraph, cost_terms_ms, decode_graph
from sim.memory import compute_buffer_bytes, held_before_ring, weights_on_devices
from sim.placement import cpu_layers_cost
from sim.transport.scheduler import MIB, GraphStats, Program, TransportConfig, TransportScheduler
from sim.workload import Workload, ngl_of

GRAPH_BASE_BYTES = 16 * MIB
ROW_SCHEMA = "kvpipe.row/1"  # the result row's version (docs/schema.md)
GRAPH_CACHE_POINTS = 4  # points whose graphs are kept (per thread)
GRAPH_CACHE_SIZE = 4096  # graphs kept per point: tokens x sequences x attention layers (the reference at 64 tokens: 1,024)


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


_graphs = threading.local()  # .cache: OrderedDict of the last points' graphs (step -> graph), least recently used first


def graph_at(point: Point, step: int, start_token: int = 0) -> DecodeGraph:
    """The decode graph of ``point``'s step ``step`` (every sequence writes one new row).

    Built on first use and kept for the last ``GRAPH_CACHE_POINTS`` points (graphs are frozen, and the
    same arguments build equal graphs), as many of a point's graphs as ``GRAPH_CACHE_SIZE`` (sequences x
    attention layers of each graph) holds: the first ones asked for; the others are built afresh. Does not block.
    """
    wl = point.workload
    computes = tuple(d.compute for d in point.hardware.devices)
    n_dev = len(point.hardware.devices) if wl.split_mode != "none" else 1
    host_attention = point.transport.arm == "host-attention"
    key = (wl, computes, n_dev, start_token, host_attention)
    built = _kept_graphs(key) if _hashable(key) else {}
    graph = built.get(step)
    if graph is None:
        graph = decode_graph(wl, computes, step=step, token=start_token + step, n_devices=n_dev, host_attention=host_attention)
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


def memory_fields(p: Point) -> dict[str, Any]:
    """A row's memory account (GiB): the weights on the devices (the GPU layers'), the devices' memory, whether the
    weights fit beside each driver's reservation and the compute buffer (``sim.memory``), and what the devices hold
    before the scheduler allocates. The compute buffer is an estimate. Pure."""
    wl, devs = p.workload, p.hardware.devices
    weights = weights_on_devices(wl, len(devs))
    held = held_before_ring(wl, tuple(d.memory_reserved_bytes for d in devs))
    return {
        "weights_gib": sum(weights) / 2**30,
        "devices_gib": sum(d.memory_total_bytes for d in devs) / 2**30,
        "weights_fit": all(h <= d.memory_total_bytes for h, d in zip(held, devs, strict=True)),
        "compute_buffer_mib_estimate": compute_buffer_bytes(wl) / MIB,
        "held_gib": [h / 2**30 for h in held],
    }


def io_bytes_for(wl: Workload) -> int:
    """Bytes of the small-input staging buffers: graph inputs, the KQ mask at full context, new rows, activations."""
    mask = wl.cells * 2 * wl.n_parallel
    rows = 2 * wl.n_parallel * wl.row_bytes
    return (1 << 20) + sum(wl.model.small_inputs_bytes) + mask + rows + 4 * wl.model.hidden * wl.n_parallel


def new_scheduler(backend: Backend, point: Point, first: DecodeGraph, program: Program | None = None,
                  host_cache: Buffer | None = None) -> TransportScheduler:
    """The transport scheduler of ``point`` on ``backend``, with the host cache ``first`` (the first graph) needs. Does not block."""
    wl = point.workload
    if host_cache is None:
        host_cache = backend.alloc_host(first.host_cache_bytes, "host_kv_cache", pinned=wl.pinned)
    n_dev = backend.device_count()
    return TransportScheduler(
        backend,
        point.transport,
        host_cache,
        alignment_bytes=[point.hardware.devices[d].alignment_bytes for d in range(n_dev)],
        graph_base_bytes=[GRAPH_BASE_BYTES] * n_dev,
        program=program,
        io_bytes=io_bytes_for(wl),
    )


def run_decode(
    backend: Backend,
    point: Point,
    program: Program | None = None,
    graphs: Callable[[Point], Iterator[DecodeGraph]] = graphs_for,
    host_cache: Buffer | None = None,
) -> HostOp:
    """The host program: set up the scheduler, run every graph, return (scheduler, stats list)."""
    sched = new_scheduler(backend, point, next(iter(graphs(point))), program, host_cache)
    stats = []
    it = iter(graphs(point))
    g = next(it, None)
    peek = point.transport.schedule.across_tokens  # only then is the next graph taken before this one runs
    while g is not None:
        sched.upcoming = nxt = next(it, None) if peek else None
        stats.append((yield from sched.run_graph(g)))
        g = nxt if peek else next(it, None)
    return sched, stats


def simulate(point: Point, trace: bool = False, functional: bool = False, program: Program | None = None) -> RunResult:
    """Run ``point`` on a fresh SimPy machine. Blocks for the wall time of the simulation (not simulated time)."""
    from backends.simpy_machine import SimMachine

    t = time.perf_counter()
    point = replace(point, hardware=placed_hardware(point))
    machine = SimMachine(point.hardware, functional=functional, trace=trace)
    _, stats = machine.run(run_decode(machine, point, program))
    first = next(iter(graphs_for(point)))
    return RunResult(point, stats, machine.timeline() if trace else [], first.window_rows, time.perf_counter() - t)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def interval_fields(point: Point, tokens_per_s: float) -> dict[str, Any]:
    """``tokens_per_s_interval`` ([low, high] t/s, or None) and ``interval``: the band's size and source, or why none."""
    band = prediction_band(point.hardware, point.workload.model.name, point.workload.cache_k.name,
                           point.workload.cache_v.name)
    if band is None:
        return {"tokens_per_s_interval": None, "interval": "uncalibrated: the profile has no calibration residuals for this "
                f"model and cache type ({point.workload.model.name}, {point.workload.cache_k.name})"}
    return {"tokens_per_s_interval": [tokens_per_s * (1 - band.relative), tokens_per_s * (1 + band.relative)],
            "interval": f"+-{band.relative:.1%}: {band.source}"}


def row(result: RunResult, model: str = "", hardware: str = "", cache_type: str = "") -> dict[str, Any]:
    """The result row (schema shared by simulate --json, sweep and validate)."""
    g = result.graphs
    p = result.point
    ms = mean([s.total_s for s in g]) * 1e3
    last = g[-1]
    declined = any(s.declined for s in g) and not any(s.deliveries for s in g)
    found = workload_entry(p.hardware, p.workload.model.name, p.workload.cache_k.name, p.workload.cache_v.name)
    calibrated = "" if not p.hardware.meta.get("workloads") else found[0] if found else "none for this model and cache type"
    return {
        "schema": ROW_SCHEMA,
        "model": model or p.workload.model.name,
        "hardware": hardware or p.hardware.name,
        "cache_type": cache_type or p.workload.cache_k.name,
        "context": p.context,
        "contexts": list(p.workload.contexts),
        "parallel": p.workload.n_parallel,
        "unified": p.workload.unified,
        "split_mode": p.workload.split_mode,
        "devices": len(p.hardware.devices),
        "cache_type_v": p.workload.cache_v.name,
        "arm": p.transport.arm,
        "depth": p.transport.depth,
        "budget_mib": p.transport.budget_mib,
        "tokens": len(g),
        "window_rows": result.window_rows,
        "tokens_per_s": p.workload.n_parallel * 1e3 / ms if ms > 0 else 0.0,
        "ms_per_token": ms,
        "ring_mib": last.ring_need_bytes / MIB,
        "ring_alloc_mib": last.ring_alloc_bytes / MIB if not declined else 0.0,
        "declined": declined,
        "decline_reason": next((s.decline_reason for s in g if s.decline_reason), ""),
        "calibrated_entry": calibrated,  # a calibrated profile's workload entry used ("" for a preset)
        **interval_fields(p, p.workload.n_parallel * 1e3 / ms if ms > 0 else 0.0),
        **memory_fields(p),
        "early_mib": mean([s.early_bytes for s in g]) / MIB,
        "late_mib": mean([s.late_bytes for s in g]) / MIB,
        "ordered_mib": mean([s.ordered_bytes for s in g]) / MIB,
        "ordered_copies": mean([s.ordered_copies for s in g]),
        "deliveries": mean([s.deliveries for s in g]),
        "depth_stops": mean([s.depth_stops for s in g]),
        "recycle_waits": mean([s.recycle_waits for s in g]),
        "breakdown_ms": {
            "total": ms,
            "blocked_in_ordered_copies": mean([s.blocked_ordered_s for s in g]) * 1e3,
            "waiting_for_consumer": mean([s.consumer_wait_s for s in g]) * 1e3,
            "issuing_deliveries": mean([s.issue_s for s in g]) * 1e3,
            "boundary_wait": mean([s.boundary_wait_s for s in g]) * 1e3,
        },
        # the compute model's terms of the first step (weights once, attention, what each sequence past the first adds)
        "batch_ms": cost_terms_ms(p.workload, p.hardware.devices[0].compute, graph_at(p, 0)),
        **placement_fields(p.workload, p.hardware.devices[0].compute),
        **({"schedule": p.transport.schedule.name} if p.transport.schedule.active else {}),  # docs/schedules.md
        **result.extra,
    }


def placement_fields(wl: Workload, compute: ComputeModel | None = None) -> dict[str, Any]:
    """``kv_gpu_layers`` where some attention layers keep their KV on the device; ``n_gpu_layers`` (the layers on the
    GPU) where some layers run on the CPU, with ``cpu_layers_cost`` given ``compute`` (``profile`` or ``estimate``:
    how the CPU layers were priced, ``sim.placement``). Absent: 0, and every layer on the GPU (rows of the default
    placement keep the fields they always had). Pure."""
    out: dict[str, Any] = {}
    if wl.kv_gpu_layers:
        out["kv_gpu_layers"] = wl.kv_gpu_layers
    if wl.gpu_layer_start:
        out["n_gpu_layers"] = ngl_of(wl)  # llama.cpp's -ngl: the GPU layers and the output layer
        if compute is not None:
            out["cpu_layers_cost"] = cpu_layers_cost(compute)
    return out
