"""The drain-rule and DRAM-contention measurements recover what a simulated machine was built with."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.profile import load_profile
from backends.simpy_machine import SimMachine
from validate import contention
from validate.micro import run_on


@pytest.mark.parametrize("drains,dram_gbps,measurable", [(True, 900.0, True), (False, 0.0, False), (True, 4800.0, False)])
def test_calibration_recovers_the_drain_rule_and_the_dram_rate(drains: bool, dram_gbps: float, measurable: bool) -> None:
    # at 4.8 TB/s a 55 GB/s copy slows a memory-bound kernel by 1.1%: under MIN_SLOWDOWN, so contention stays off
    hw = load_profile("h200-gen5x16-kvpipe")
    hw = replace(hw, devices=tuple(replace(d, copy_engine_drains_stream=drains, dram_bytes_per_s=dram_gbps * 1e9) for d in hw.devices))
    be = SimMachine(hw)
    assert run_on(be, contention.drain_rule(be))["drains"] is drains
    got = run_on(be, contention.dram_contention(be, kernel_bytes=256 << 20, copy_bytes=2 << 30))
    assert got["kernels_inside_copy"] >= 6
    if measurable:
        assert got["dram_bytes_per_s"] == pytest.approx(dram_gbps * 1e9, rel=0.05)
    else:
        assert got["dram_bytes_per_s"] == 0.0 and got["slowdown"] < contention.MIN_SLOWDOWN
