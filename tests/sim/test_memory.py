"""sim.memory: what a device holds is computed from the model and the card, never read from a profile."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.profile import load_profile
from sim.memory import (
    GIB,
    MIB,
    N_UBATCH,
    compute_buffer_bytes,
    device_memory,
    held_before_ring,
    host_kv_bytes,
    host_weight_bytes,
    kv_layer_bytes,
    kv_on_device_bytes,
    weights_on_devices,
)
from sim.run.point import Point, placed_hardware
from sim.run.run import run_point
from sim.transport.config import TransportConfig
from sim.workload import Workload, cache_type, load_model

Q8 = cache_type("q8_0")


def _wl(model: str = "llama-3.1-8b", context: int = 16384, **kw: object) -> Workload:
    return Workload(load_model(model), Q8, Q8, (context,), tokens=2, **kw)  # type: ignore[arg-type]


def test_the_weights_on_the_gpu_are_the_last_ngl_layers_share() -> None:
    wl = _wl()
    per = wl.model.layer_weight_bytes
    assert weights_on_devices(wl, 1) == (int(per * 32),)
    assert weights_on_devices(replace(wl, n_gpu_layers=20), 1) == (int(per * 20),)
    assert host_weight_bytes(replace(wl, n_gpu_layers=20)) == int(per * 12)
    assert weights_on_devices(replace(wl, n_gpu_layers=0), 1) == (0,)
    # a layer split over two devices: every GPU layer once, by proportion
    two = replace(wl, split_mode="layer", tensor_split=(1.0, 1.0), n_gpu_layers=16)
    assert sum(weights_on_devices(two, 2)) == pytest.approx(per * 16, abs=2)


def test_the_compute_buffer_grows_with_the_cells_as_llama_cpp_s_kq_mask_does() -> None:
    small, big = _wl(context=4096), _wl(context=65536)
    m = small.model
    assert compute_buffer_bytes(small) == N_UBATCH * 4 * (m.vocab + m.hidden) + N_UBATCH * small.cells * 2
    assert compute_buffer_bytes(big) - compute_buffer_bytes(small) == N_UBATCH * 2 * (big.cells - small.cells)
    assert compute_buffer_bytes(replace(small, n_gpu_layers=0)) == 0  # no GPU layer, no GPU graph


def test_kv_on_the_device_counts_resident_attention_layers_only() -> None:
    wl = _wl()
    layer = wl.cells * wl.row_bytes
    assert kv_layer_bytes(wl) == layer
    assert kv_on_device_bytes(wl, kv_offload=True) == 32 * layer  # -nkvo 0: every GPU attention layer
    assert kv_on_device_bytes(replace(wl, kv_gpu_layers=8), kv_offload=False) == 8 * layer
    assert host_kv_bytes(replace(wl, kv_gpu_layers=8), kv_offload=False) == 24 * layer
    assert kv_on_device_bytes(replace(wl, n_gpu_layers=16), kv_offload=True) == 16 * layer  # CPU layers keep theirs


def test_a_profile_says_what_the_card_keeps_and_the_model_what_it_places() -> None:
    hw = load_profile("rtx4070-gen4x16")
    dev = hw.devices[0]
    assert dev.memory_used_bytes == 0
    wl = _wl()
    held = held_before_ring(wl, (dev.memory_reserved_bytes,))[0]
    assert held == dev.memory_reserved_bytes + weights_on_devices(wl, 1)[0] + compute_buffer_bytes(wl)
    placed = placed_hardware(Point(wl, hw, TransportConfig()))
    assert placed.devices[0].memory_used_bytes == held
    # the 8B model on the 12 GB card leaves ~6.5 GiB, where the reference model's weights left 1.4
    assert 6.0 * GIB < dev.memory_total_bytes - held < 7.0 * GIB


def test_an_8b_model_s_ring_is_not_declined_for_memory_the_reference_model_used() -> None:
    """The newcomer's report: an 8B model at 196,608 with no budget cap declined the ring on a 12 GB card."""
    hw = load_profile("rtx4070-gen4x16")
    r = run_point(Point(replace(_wl(context=196608), tokens=1), hw, TransportConfig(depth=1, budget_mib=0)), checked=False, warmup=0)
    ring = r.graphs[0]
    assert not ring.declined, ring.decline_reason
    assert ring.ring_alloc_bytes > 1000 * MIB


def test_the_account_adds_up_and_says_when_it_does_not_fit() -> None:
    wl = _wl("llama-3.1-70b", 4096)
    dev = load_profile("rtx4070-gen4x16").devices[0]
    mem = device_memory(wl, dev.memory_total_bytes, dev.memory_reserved_bytes, kv_offload=False)
    assert mem.used_bytes == mem.reserved_bytes + mem.weights_bytes + mem.compute_buffer_bytes + mem.kv_bytes
    assert not mem.fits and mem.free_bytes < -25 * GIB
    assert device_memory(replace(wl, n_gpu_layers=10), dev.memory_total_bytes, dev.memory_reserved_bytes, False).fits
