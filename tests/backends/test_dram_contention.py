"""Copies and kernels share device memory: a copy that overlaps a kernel stretches it by bytes / DRAM bandwidth."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.base import CopyRange, Work
from backends.profile import load_profile, profile_from_dict
from backends.simpy_machine import SimMachine
from tests.conftest import fast_profile

GB = 1e9


def _machine(dram_gbps: float, h2d_gbps: float = 10.0) -> SimMachine:
    hw = fast_profile(load_profile("rtx4070-gen4x16"), h2d_gbps=h2d_gbps)
    hw = replace(hw, devices=tuple(replace(d, dram_bytes_per_s=dram_gbps * GB) for d in hw.devices))
    return SimMachine(hw, trace=True)


def _kernel_end(m: SimMachine, copy_bytes: int, kernel_s: float) -> float:
    """A copy on one stream and a kernel on another, issued at t = 0; returns the kernel's end (s)."""
    def prog():  # type: ignore[no-untyped-def]
        consumer, transfer = m.create_stream(0, "consumer0"), m.create_stream(0, "transfer0")
        host = m.alloc_host(max(copy_bytes, 1), "host")
        dev = m.alloc(0, max(copy_bytes, 1), "dev")
        if copy_bytes:
            yield from m.copy(transfer, dev, host, [CopyRange(0, 0, copy_bytes)], tag="delivery0")
        yield from m.launch(consumer, Work("k", kernel_s, 1))
        yield from m.synchronize(consumer)
        yield from m.synchronize(transfer)

    m.run(prog())
    return next(s.end_s for s in m.timeline() if s.track == "consumer0" and s.name == "k")


def test_a_copy_under_a_kernel_costs_it_the_bytes_over_dram_bandwidth() -> None:
    # 1 GB at 10 GB/s = 0.1 s, entirely under a 0.5 s kernel: + 1 GB / 100 GB/s = 10 ms
    assert _kernel_end(_machine(100.0), 10**9, 0.5) == pytest.approx(0.5 + 0.01, rel=1e-9)


def test_no_overlap_no_cost_and_zero_bandwidth_is_off() -> None:
    assert _kernel_end(_machine(100.0), 0, 0.5) == pytest.approx(0.5)
    assert _kernel_end(_machine(0.0), 10**9, 0.5) == pytest.approx(0.5)


def test_a_copy_longer_than_the_kernel_counts_pro_rata_and_the_stretch_charges_again() -> None:
    # 1 GB at 1 GB/s = 1 s; a 0.2 s kernel sees 0.2 GB at 10 GB/s -> +20 ms, which overlaps 0.02 GB more -> +2 ms, then +0.2 ms
    end = _kernel_end(_machine(10.0, h2d_gbps=1.0), 10**9, 0.2)
    assert end == pytest.approx(0.2 + 0.02 + 0.002 + 0.0002, rel=1e-9)


def test_profile_files_read_dram_gbps_and_refuse_a_negative_one() -> None:
    data = {"name": "x", "host": {}, "devices": [{"name": "d", "memory_total_mib": 1024, "dram_GBps": 504.2,
                                       "links": {"h2d_pinned": {"latency_us": 1, "points": [[1, 10]]},
                                                 "h2d_pageable": {"latency_us": 1, "points": [[1, 5]]},
                                                 "d2h_pinned": {"latency_us": 1, "points": [[1, 10]]}}}]}
    assert profile_from_dict(data).devices[0].dram_bytes_per_s == pytest.approx(504.2e9)
    data["devices"][0]["dram_GBps"] = -1
    with pytest.raises(ValueError, match="dram_GBps must be >= 0"):
        profile_from_dict(data)
