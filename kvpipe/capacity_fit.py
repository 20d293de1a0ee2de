"""What fits the memory cap, and the points a context's memory plan tries (``kvpipe.capacity`` plans with them).

:class:`Limits` is the device and host memory a plan must fit; ``fits_*`` and ``*_need_bytes`` account a workload
against them; :func:`candidates` makes one context's points: the resident arm where the cache fits the device, and
the host cache at each depth with the most resident attention layers beside that depth's ring. What a context's
candidates read whatever the rings (:func:`placed`) is made apart, so that a plan makes it while its grid runs.

Units: bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sim.memory import MIB, DeviceMemory, device_memory, gpu_attention_layers, host_kv_bytes, host_weight_bytes, kv_layer_bytes
from sim.points import new_point
from sim.run.point import GRAPH_BASE_BYTES, Point, io_bytes_for
from sim.transport.config import TransportConfig
from sim.workload import Workload

HEADROOM_BYTES = int(TransportConfig().headroom_mib * MIB)  # the default config's headroom beside a ring, bytes


@dataclass(frozen=True)
class Limits:
    """What the plan must fit: device bytes (``--vram`` or the card), host bytes (``--host-mem``) and where they came from."""

    vram_bytes: int
    host_bytes: int
    vram_from: str
    host_from: str


def scheduler_need_bytes(wl: Workload) -> int:
    """The scheduler's own device buffers on the ordered path: the graph's base, the io buffer, one attention layer's
    K and V window at full context (what the ordered path stages). Bytes."""
    return GRAPH_BASE_BYTES + io_bytes_for(wl) + kv_layer_bytes(wl)


def host_need_bytes(wl: Workload, kv_offload: bool) -> int:
    """Host bytes: the host cache of every attention layer not on the device, and the CPU layers' weights."""
    return host_kv_bytes(wl, kv_offload) + host_weight_bytes(wl)


def ngl_that_fits(wl: Workload, limits: Limits, reserved: int, resident: bool = False) -> int:
    """The largest ``-ngl`` whose weights, compute buffer and the scheduler's ordered buffers fit ``limits.vram``
    (``resident``: with the GPU layers' KV on the device too, llama.cpp without -nkvo); 0: not even one layer."""
    for ngl in range(min(wl.n_gpu_layers, wl.model.n_layers), -1, -1):
        w = replace(wl, n_gpu_layers=ngl, kv_gpu_layers=0)
        if (fits_resident if resident else fits_host_cache)(w, replace(limits, host_bytes=1 << 62), reserved):
            return ngl
    return 0


def max_resident_layers(wl: Workload, free_bytes: int) -> int:
    """Attention layers whose KV fits ``free_bytes`` (not all: all of them is the cache on the device)."""
    per = kv_layer_bytes(wl)
    return _resident_layers(per, gpu_attention_layers(wl) if per else 0, free_bytes)


def _resident_layers(layer_bytes: int, gpu_attention: int, free_bytes: int) -> int:
    """:func:`max_resident_layers` of a workload whose one attention layer's KV is ``layer_bytes`` (``kv_layer_bytes``)
    and that has ``gpu_attention`` GPU attention layers (``gpu_attention_layers``): for the depths of one workload,
    which share both."""
    return max(0, min(gpu_attention - 1, free_bytes // layer_bytes)) if layer_bytes else 0


def fits_host_cache(wl: Workload, limits: Limits, reserved: int) -> bool:
    """The ordered host-cache run fits: the device holds weights, buffers and one staged window; the host its cache."""
    return host_cache_memory(wl, limits, reserved) is not None


def host_cache_memory(wl: Workload, limits: Limits, reserved: int) -> DeviceMemory | None:
    """The device's account of the ordered host-cache run (its ring: the scheduler's buffers) where it fits
    (:func:`fits_host_cache`), else None. Bytes. Pure."""
    mem = device_memory(wl, limits.vram_bytes, reserved, kv_offload=False, ring_bytes=scheduler_need_bytes(wl))
    return mem if mem.fits and host_need_bytes(wl, False) <= limits.host_bytes else None


def fits_resident(wl: Workload, limits: Limits, reserved: int) -> bool:
    """The whole cache fits on the device (llama.cpp without -nkvo) next to the scheduler's buffers."""
    mem = device_memory(wl, limits.vram_bytes, reserved, kv_offload=True, ring_bytes=GRAPH_BASE_BYTES + io_bytes_for(wl))
    return mem.fits and host_weight_bytes(wl) <= limits.host_bytes


@dataclass(frozen=True)
class Placed:
    """What one context's candidates read whatever the rings (:func:`placed`): the context's point, the resident arm's
    candidate (if the cache fits the device), and the host cache's workload and the device's free bytes before the
    ring (``wl`` None: the host cache does not fit)."""

    point: Point
    first: tuple[Point, ...]
    wl: Workload | None
    free0: int


def placed(point: Point, limits: Limits, build: str, auto_ngl: bool = False) -> Placed:
    """The part of :func:`candidates` that does not read the rings (made while a plan's grid is on its workers)."""
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
    mem = host_cache_memory(wl, limits, reserved)
    if mem is None:
        return Placed(point, tuple(out), None, 0)
    # the device's free bytes before the ring (integers: less the ring, the same as with it in the account)
    return Placed(point, tuple(out), wl, mem.free_bytes)


def candidates(point: Point, limits: Limits, max_depth: int, rings_mib: dict[int, float], build: str,
               auto_ngl: bool = False, known: Placed | None = None,
               configs: dict[tuple[int, int, float], tuple[TransportConfig, TransportConfig]] | None = None) -> list[Point]:
    """The points to simulate for one context: the resident arm where the cache fits; the host cache at each depth
    with the most resident attention layers that fit beside that depth's ring (the upstream build: depth 0, none, in
    pageable memory: upstream cannot pin its host cache). ``auto_ngl``: each arm at the largest -ngl that fits it.
    ``known``: :func:`placed` of the same arguments, made already. ``configs``: the host cache's configs made so far
    (kept by the config they are made from, depth and budget: the contexts of one plan share them; their points'
    configs then are the same objects, equal to those made anew)."""
    got = known if known is not None else placed(point, limits, build, auto_ngl)
    out, wl = list(got.first), got.wl
    if wl is None:
        return out
    configs = {} if configs is None else configs
    placed_n: dict[int, Workload] = {}  # the candidates with the same resident layers share their workload
    # the fork's resident layers with every layer on the GPU (kvpipe does not model them beside CPU layers); what they
    # read of the workload, once for its depths
    resident = build == "fork" and not wl.gpu_layer_start
    per = kv_layer_bytes(wl) if resident else 0
    gpu_attention = gpu_attention_layers(wl) if per else 0
    for depth in range(0, (max_depth if build == "fork" else 0) + 1):
        ring = int(math.ceil(rings_mib.get(depth, 0.0)) * MIB) if depth else 0
        free = got.free0 - ring - (HEADROOM_BYTES if depth else 0)
        if depth and free < 0:
            continue
        n = _resident_layers(per, gpu_attention, free) if resident else 0
        budget = float(math.ceil(rings_mib.get(depth, 0.0))) if depth else 0.0
        wl_n = placed_n.get(n)
        if wl_n is None:
            wl_n = placed_n[n] = replace(wl, kv_gpu_layers=n)
        kept = configs.get((id(point.transport), depth, budget))  # (the entry keeps its source alive: its id is not reused)
        if kept is None:
            kept = configs[id(point.transport), depth, budget] = (
                point.transport, replace(point.transport, arm="transport", depth=depth, budget_mib=budget))
        out.append(new_point(wl_n, point.hardware, kept[1]))
    return out
