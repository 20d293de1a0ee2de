"""What a device and the host hold for one workload: the memory model the ledger and the planner share.

A card's profile says what the card has (``memory_total``) and what its driver and runtime keep
(``memory_reserved``); it never says what a model used. Everything else is computed here from the workload:

* the **weights** placed on each device: the layers llama.cpp's ``-ngl`` puts on the GPU (the last ones), spread
  by layer or by head under a split; the layers before them stay in host memory;
* llama.cpp's **compute buffer**, estimated as llama.cpp sizes it for a ubatch of ``N_UBATCH`` tokens (the logits
  and one activation row set in f32, and the f16 KQ mask of ``n_ubatch x n_ctx``): an *estimate*, said so in rows;
* the **KV cache on the device**: every attention layer's with the cache on the device (``-nkvo 0``), the first
  ``--kv-gpu-layers`` attention layers' with the cache in host memory, none of a CPU layer's;
* the **ring** and the scheduler's own buffers, which the transport scheduler allocates (and the planner adds).

``held_before_ring`` is what the device ledger starts from (the scheduler allocates the resident KV, the ring and
its buffers itself, so they are left out); ``device_memory`` is the full account a plan prints. The host holds the
cache of every attention layer that is not on the device and the weights of the CPU layers. Bytes throughout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sim.workload import Workload

MIB = 1 << 20
GIB = 1 << 30
N_UBATCH = 512  # llama.cpp's default -ub: the compute buffer is reserved for a ubatch this long


@dataclass(frozen=True)
class DeviceMemory:
    """One device's account for a workload, bytes. ``free_bytes`` < 0: it does not fit."""

    device: int
    total_bytes: int
    reserved_bytes: int
    weights_bytes: int
    compute_buffer_bytes: int
    kv_bytes: int
    ring_bytes: int = 0

    @property
    def used_bytes(self) -> int:
        return self.reserved_bytes + self.weights_bytes + self.compute_buffer_bytes + self.kv_bytes + self.ring_bytes

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes

    @property
    def fits(self) -> bool:
        return self.free_bytes >= 0

    def as_gib(self) -> dict[str, float]:
        """The account in GiB, for rows and tables."""
        return {k: v / GIB for k, v in (("total", self.total_bytes), ("reserved", self.reserved_bytes),
                                          ("weights", self.weights_bytes), ("compute_buffer", self.compute_buffer_bytes),
                                          ("kv", self.kv_bytes), ("ring", self.ring_bytes), ("free", self.free_bytes))}


def gpu_layers(wl: Workload) -> range:
    """The layers llama.cpp runs on the GPU (``-ngl``: the last ones)."""
    return range(wl.gpu_layer_start, wl.model.n_layers)


def weights_on_devices(wl: Workload, n_devices: int) -> tuple[int, ...]:
    """Weight bytes on each device: the GPU layers' share, by layer (layer split) or by KV head (tensor split)."""
    per_layer = wl.model.layer_weight_bytes
    layers = gpu_layers(wl)
    if n_devices < 2 or wl.split_mode == "none":
        return (int(per_layer * len(layers)),) + (0,) * (n_devices - 1)
    if wl.split_mode == "layer":
        devs = wl.devices_of_layers(n_devices)
        return tuple(int(sum(per_layer for layer in layers if devs[layer] == i)) for i in range(n_devices))
    from sim.graph import head_ranges

    heads = head_ranges(wl.model.n_head_kv, wl.tensor_split, n_devices)
    return tuple(int(per_layer * len(layers) * (b - a) / wl.model.n_head_kv) for a, b in heads)


def host_weight_bytes(wl: Workload) -> int:
    """Weight bytes of the CPU layers (those before ``-ngl``'s GPU layers), in host memory."""
    return int(wl.model.layer_weight_bytes * wl.gpu_layer_start)


def compute_buffer_bytes(wl: Workload) -> int:
    """llama.cpp's device compute buffer, estimated: logits and one activation row set (f32) for a ubatch of
    ``N_UBATCH`` tokens, and the f16 KQ mask of ``N_UBATCH x cells``. An estimate (llama.cpp measures its graph at
    load); 0 when no layer runs on the GPU. Pure."""
    if wl.gpu_layer_start >= wl.model.n_layers:
        return 0
    m = wl.model
    return N_UBATCH * 4 * (m.vocab + m.hidden) + N_UBATCH * cache_sizes(wl)[0] * 2


def kv_layer_bytes(wl: Workload) -> int:
    """Bytes of one attention layer's K and V cache, every cell of every stream."""
    cells, row_bytes = cache_sizes(wl)
    return cells * row_bytes


def cache_sizes(wl: Workload) -> tuple[int, int]:
    """(``wl.cells``, ``wl.row_bytes``): the cache's rows per layer and bytes per row, kept per workload object (a
    memory plan reads them of each candidate several times; the workload is frozen and the entry keeps it alive, so
    its id is not reused). Pure."""
    got = _CACHE_SIZES.get(id(wl))
    if got is None or got[0] is not wl:
        if len(_CACHE_SIZES) >= CACHE_SIZES_KEPT:
            _CACHE_SIZES.clear()
        got = _CACHE_SIZES[id(wl)] = (wl, wl.cells, wl.row_bytes)
    return got[1], got[2]


CACHE_SIZES_KEPT = 1 << 15  # workloads whose cache sizes are kept (a plan's contexts' candidates)
_CACHE_SIZES: dict[int, tuple[Workload, int, int]] = {}


def gpu_attention_layers(wl: Workload) -> int:
    """Attention layers whose layer runs on the GPU (``-ngl``)."""
    start = wl.gpu_layer_start  # (a property: read once, not once per layer)
    return sum(1 for a in wl.model.attn_layers if a >= start)


def kv_on_device_bytes(wl: Workload, kv_offload: bool) -> int:
    """KV bytes on the device: every GPU attention layer's with ``kv_offload`` (llama.cpp without ``-nkvo``), else the
    first ``kv_gpu_layers`` attention layers' (the fork's ``--kv-gpu-layers``)."""
    n = gpu_attention_layers(wl) if kv_offload else wl.kv_gpu_layers
    return n * kv_layer_bytes(wl)


def host_kv_bytes(wl: Workload, kv_offload: bool) -> int:
    """KV bytes in host memory: every attention layer not on the device."""
    return wl.model.n_attn * kv_layer_bytes(wl) - kv_on_device_bytes(wl, kv_offload)


def held_before_ring(wl: Workload, reserved_bytes: tuple[int, ...]) -> tuple[int, ...]:
    """What each device holds before the scheduler allocates anything: the driver's reservation, the weights placed
    on it and (on devices that run layers) the compute buffer. Bytes. Pure."""
    weights = weights_on_devices(wl, len(reserved_bytes))
    buf = compute_buffer_bytes(wl)
    return tuple(r + w + (buf if w or i == 0 else 0) for i, (r, w) in enumerate(zip(reserved_bytes, weights, strict=True)))


def device_memory(wl: Workload, total_bytes: int, reserved_bytes: int, kv_offload: bool, ring_bytes: int = 0) -> DeviceMemory:
    """The full account of a one-device workload: weights, compute buffer, KV on the device and the ring."""
    return DeviceMemory(0, total_bytes, reserved_bytes, weights_on_devices(wl, 1)[0], compute_buffer_bytes(wl),
                        kv_on_device_bytes(wl, kv_offload), ring_bytes)


def host_memory_bytes() -> int:
    """This machine's physical memory, bytes (``--host-mem``'s default). Does not block."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0
