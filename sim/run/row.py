"""A run as a result row: the schema every command writes (``simulate --json``, ``sweep``, ``plan``, ``validate``).

``row`` averages a run's per-graph telemetry and adds the point's coordinates, its memory account
(:func:`memory_fields`), its prediction band (:func:`interval_fields`) and where its layers and KV are placed
(:func:`placement_fields`). Which of its fields are the point's key, and how a gain is computed: ``sim.rows``.

Units: rows say theirs in their field names (ms, MiB, GiB).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from backends.profile import ComputeModel, prediction_band, workload_entry
from sim.graph import cost_terms_ms
from sim.memory import compute_buffer_bytes, held_before_ring, weights_on_devices
from sim.placement import cpu_layers_cost
from sim.run.graphs import graph_at
from sim.run.point import Point, RunResult
from sim.transport.scheduler import MIB
from sim.workload import Workload, ngl_of

ROW_SCHEMA = "kvpipe.row/1"  # the result row's version (docs/schema.md)


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
