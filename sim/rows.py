"""One row schema: which fields of a result row identify its point, and the one rule for a row's gain.

A row (``sim.rows.row``) carries its grid coordinates (``KEY_FIELDS``) beside its figures. Rows written before
a coordinate existed lack it; ``KEY_DEFAULTS`` says what they meant. ``key_of_row`` turns a row into the hashable key
the sweep's journal, resume and de-duplication use.

The gain of a row is its tokens/s over the *ordered path* of the same point: the depth-0 row of the ``transport``
arm with the same coordinates but depth, budget and arm (the ordered path does not depend on the budget). Every arm is
measured against that one baseline, so a resident (``-nkvo 0``) row says what keeping the cache on the device buys,
and a pipelined row's gain does not depend on which arm a grid listed first. Rows of a grid without an ordered
transport row take the depth-0 row of their own arm (upstream llama.cpp's ``host-attention`` grids); none: ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from backends.profile import ComputeModel, HardwareProfile, prediction_band, workload_entry
from sim.graph import cost_terms_ms
from sim.memory import compute_buffer_bytes, held_before_ring, weights_on_devices
from sim.placement import cpu_layers_cost
from sim.run.point import Point, RunResult, graph_at
from sim.transport.config import MIB
from sim.workload import Workload, ngl_of

#: Row fields that identify a point (its grid coordinates).
KEY_FIELDS = ("model", "hardware", "cache_type", "context", "contexts", "parallel", "unified", "split_mode", "depth",
              "budget_mib", "tokens", "arm", "cache_type_v", "kv_gpu_layers", "n_gpu_layers", "kv_copy")
#: Key fields rows written before they existed lack, and the value those rows meant (rows of the default placement
#: still lack the last three: ``placement_fields``).
KEY_DEFAULTS = {"arm": "transport", "kv_gpu_layers": 0, "n_gpu_layers": "all", "kv_copy": "streams"}
#: The coordinates a gain's baseline may differ in.
BASELINE_FREE = ("depth", "budget_mib", "arm")

Key = tuple[Any, ...]


def key_of_row(r: dict[str, Any]) -> Key:
    """The grid coordinates of a result row (lists as tuples, budget as float). Raises KeyError for a row without them."""
    return tuple(_norm(k, r[k] if k in r else _default(r, k)) for k in KEY_FIELDS)


def _default(r: dict[str, Any], field: str) -> Any:
    """A key field that rows written before it existed lack: the value they meant. KeyError for any other."""
    if field == "cache_type_v":
        return r["cache_type"]  # the V cache was the K cache's type
    return KEY_DEFAULTS[field]


def _norm(field: str, value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(int(v) for v in value)
    if field == "budget_mib":
        return float(value)
    if field in ("context", "parallel", "depth", "tokens", "kv_gpu_layers"):
        return int(value)
    if field == "unified":
        return bool(value)
    return str(value)


def _base_key(r: dict[str, Any]) -> Key:
    return tuple(_norm(k, r[k] if k in r else _default(r, k)) for k in KEY_FIELDS if k not in BASELINE_FREE)


def gains(rows: Sequence[dict[str, Any]]) -> list[float | None]:
    """Each row's gain over its ordered path (see the module), in the rows' order. Pure."""
    ordered: dict[Key, float] = {}
    own: dict[tuple[Key, str], float] = {}
    for r in rows:
        if r["depth"] == 0 and r.get("tokens_per_s"):
            arm = r.get("arm", "transport")
            own.setdefault((_base_key(r), arm), r["tokens_per_s"])
            if arm == "transport":
                ordered.setdefault(_base_key(r), r["tokens_per_s"])
    out: list[float | None] = []
    for r in rows:
        k = _base_key(r)
        b = ordered.get(k) or own.get((k, r.get("arm", "transport")))
        out.append(r["tokens_per_s"] / b - 1.0 if b else None)
    return out


def with_gains(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with ``gain`` added (:func:`gains`). Pure."""
    rows = list(rows)
    return [{**r, "gain": g} for r, g in zip(rows, gains(rows), strict=True)]


# ------------------------------------------------------------------ a run as a row

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
    relative, text = _band(point.hardware, point.workload.model.name, point.workload.cache_k.name, point.workload.cache_v.name)
    if relative is None:
        return {"tokens_per_s_interval": None, "interval": text}
    return {"tokens_per_s_interval": [tokens_per_s * (1 - relative), tokens_per_s * (1 + relative)], "interval": text}


def _band(hw: HardwareProfile, model: str, cache_k: str, cache_v: str) -> tuple[float | None, str]:
    """(the band's relative size or None, the row's ``interval`` text) of ``prediction_band``, kept per profile object
    and types (a memory plan asks it of every candidate; a profile is frozen and the entry keeps it alive, so its id
    is not reused). Pure."""
    key = (id(hw), model, cache_k, cache_v)
    got = _BANDS.get(key)
    if got is None or got[0] is not hw:
        band = prediction_band(hw, model, cache_k, cache_v)
        text = (f"uncalibrated: the profile has no calibration residuals for this model and cache type ({model}, {cache_k})"
                if band is None else f"+-{band.relative:.1%}: {band.source}")
        if len(_BANDS) >= BANDS_KEPT:
            _BANDS.clear()
        got = _BANDS[key] = (hw, None if band is None else band.relative, text)
    return got[1], got[2]


BANDS_KEPT = 4096  # (profile, model, cache types) whose band is kept
_BANDS: dict[tuple[int, str, str, str], tuple[HardwareProfile, float | None, str]] = {}


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
    how the CPU layers were priced, ``sim.placement``); ``kv_copy`` ``span`` where the ordered path copies a split
    cache's window as upstream llama.cpp does (``Workload.copy_span``). Absent: 0, every layer on the GPU, and the
    fork's copy (rows of the default placement keep the fields they always had). Pure."""
    out: dict[str, Any] = {}
    if wl.copy_span:
        out["kv_copy"] = "span"
    if wl.kv_gpu_layers:
        out["kv_gpu_layers"] = wl.kv_gpu_layers
    if wl.gpu_layer_start:
        out["n_gpu_layers"] = ngl_of(wl)  # llama.cpp's -ngl: the GPU layers and the output layer
        if compute is not None:
            out["cpu_layers_cost"] = cpu_layers_cost(compute)
    return out
