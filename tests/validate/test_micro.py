"""The micro-measurements of ``kvpipe calibrate`` recover, on the SimPy machine, the profile it was built from."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.profile import HardwareProfile, _curve, load_profile
from backends.simpy_machine import SimMachine
from validate import micro

SIZES = micro.LINK_SIZES[:8]  # 4 KiB .. 256 MiB


@pytest.fixture(params=["rtx4070-gen4x16", "h200-gen5x16-kvpipe"])
def hw(request: pytest.FixtureRequest) -> HardwareProfile:
    return load_profile(request.param)


def test_host_costs_are_the_profiles(hw: HardwareProfile) -> None:
    m = SimMachine(hw)
    got = micro.run_on(m, micro.host_costs(m, reps=20))
    want = {"event_s": hw.host.event_s, "copy_issue_s": hw.host.copy_issue_s, "launch_s": hw.host.launch_s,
            "host_wait_s": hw.host.host_wait_s}
    assert got == pytest.approx(want, rel=1e-9)


def test_copy_times_are_the_link_curves_of_the_profile(hw: HardwareProfile) -> None:
    m = SimMachine(hw)
    times, _ = micro.run_on(m, micro.copy_times(m, SIZES, 2, hw.host.host_wait_s, hw.host.copy_issue_s))
    assert set(times) == {("h2d", True), ("h2d", False), ("d2h", True), ("d2h", False)}
    for (direction, pinned), by_size in times.items():
        link = hw.devices[0].link(direction == "h2d", pinned)
        assert by_size == pytest.approx({n: link.seconds(n) for n in by_size}, rel=1e-9), (direction, pinned)


def test_curve_points_give_the_measured_times_back() -> None:
    # The file's curve reproduces each measured time, up to the latency probe's own 256 B (0.7% at 4 KiB on the 4070).
    hw = load_profile("rtx4070-gen4x16")
    m = SimMachine(hw)
    times, _ = micro.run_on(m, micro.copy_times(m, SIZES, 2, hw.host.host_wait_s, hw.host.copy_issue_s))
    for (direction, pinned), by_size in times.items():
        curve = _curve(micro.curve_points(by_size), "measured")
        link = hw.devices[0].link(direction == "h2d", pinned)
        assert curve.latency_s == pytest.approx(link.seconds(micro.LATENCY_PROBE_BYTES), rel=1e-9)  # latency + 256 B
        assert {n: curve.seconds(n) for n in SIZES} == pytest.approx({n: by_size[n] for n in SIZES}, rel=0.01)


def test_engines_tell_one_fifo_engine_and_the_duplex_slowdown_from_two_engines() -> None:
    h200 = load_profile("h200-gen5x16-kvpipe")
    m = SimMachine(h200)
    one = micro.run_on(m, micro.engines(m))
    assert one["h2d_fifo"] and one["d2h_fifo"]
    assert one["duplex_slowdown"] == pytest.approx(h200.devices[0].duplex_slowdown, rel=1e-9)
    two = replace(h200, devices=(replace(h200.devices[0], h2d_engines=2, duplex_slowdown=1.0),))
    m = SimMachine(two)
    got = micro.run_on(m, micro.engines(m))
    assert not got["h2d_fifo"] and got["d2h_fifo"] and got["duplex_slowdown"] == 1.0
