"""``kvpipe.capacity_fit.placed`` and ``candidates`` as they were before Round 21 (at 8f11c9d), kept unchanged as the
reference that ``test_capacity_candidates.py`` holds the current ones to: every depth's resident layers read off the
workload again, a new config per candidate, the host cache's account taken twice. Do not edit: it is the oracle."""

from __future__ import annotations

import math
from dataclasses import replace

from kvpipe.capacity_fit import Limits, Placed, fits_host_cache, fits_resident, ngl_that_fits, scheduler_need_bytes
from sim.memory import MIB, device_memory, kv_layer_bytes
from sim.run.point import Point
from sim.transport.config import TransportConfig
from sim.workload import Workload


def gpu_attention_layers(wl: Workload) -> int:
    return sum(1 for a in wl.model.attn_layers if a >= wl.gpu_layer_start)


def max_resident_layers(wl: Workload, free_bytes: int) -> int:
    per = kv_layer_bytes(wl)
    return max(0, min(gpu_attention_layers(wl) - 1, free_bytes // per)) if per else 0


def placed(point: Point, limits: Limits, build: str, auto_ngl: bool = False) -> Placed:
    wl, dev = point.workload, point.hardware.devices[0]
    reserved = dev.memory_reserved_bytes
    out = []
    res_wl = replace(wl, n_gpu_layers=ngl_that_fits(wl, limits, reserved, resident=True)) if auto_ngl else wl
    if res_wl.n_gpu_layers and fits_resident(res_wl, limits, reserved):
        out.append(replace(point, workload=res_wl, transport=replace(point.transport, arm="resident", depth=0, budget_mib=0.0)))
    if auto_ngl:
        wl = replace(wl, n_gpu_layers=ngl_that_fits(wl, limits, reserved))
    if build == "upstream":
        wl = replace(wl, pinned=False)
    if not fits_host_cache(wl, limits, reserved):
        return Placed(point, tuple(out), None, 0)
    free0 = device_memory(wl, limits.vram_bytes, reserved, kv_offload=False, ring_bytes=scheduler_need_bytes(wl)).free_bytes
    return Placed(point, tuple(out), wl, free0)


def candidates(point: Point, limits: Limits, max_depth: int, rings_mib: dict[int, float], build: str,
               auto_ngl: bool = False, known: Placed | None = None) -> list[Point]:
    got = known if known is not None else placed(point, limits, build, auto_ngl)
    out, wl = list(got.first), got.wl
    if wl is None:
        return out
    headroom = int(TransportConfig().headroom_mib * MIB)
    placed_n: dict[int, Workload] = {}
    for depth in range(0, (max_depth if build == "fork" else 0) + 1):
        ring = int(math.ceil(rings_mib.get(depth, 0.0)) * MIB) if depth else 0
        free = got.free0 - ring - (headroom if depth else 0)
        if depth and free < 0:
            continue
        n = max_resident_layers(wl, free) if build == "fork" and not wl.gpu_layer_start else 0
        budget = float(math.ceil(rings_mib.get(depth, 0.0))) if depth else 0.0
        wl_n = placed_n.get(n)
        if wl_n is None:
            wl_n = placed_n[n] = replace(wl, kv_gpu_layers=n)
        out.append(replace(point, workload=wl_n, transport=replace(point.transport, arm="transport", depth=depth, budget_mib=budget)))
    return out
