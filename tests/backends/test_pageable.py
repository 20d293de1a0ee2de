"""Pageable H2D copies as the driver performs them: a stream sync, host staging chunk by chunk, DMA at the pinned rate."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends.base import CopyRange, Work
from backends.profile import MIB, load_profile
from backends.simpy_machine import SimMachine


def _machine(functional: bool = False) -> SimMachine:
    hw = load_profile("rtx4070-gen4x16")
    hw = replace(hw, host=hw.host.zero(), devices=tuple(replace(d, dram_bytes_per_s=0.0) for d in hw.devices))
    return SimMachine(hw, functional=functional, trace=True)


def _one_copy(m: SimMachine, nbytes: int, before_s: float = 0.0) -> tuple[float, float]:
    """A kernel of ``before_s`` on the stream, then one pageable H2D copy; returns (host return, copy end) in s."""
    out: dict[str, float] = {}

    def prog():  # type: ignore[no-untyped-def]
        s = m.create_stream(0, "transfer0")
        host, dev = m.alloc_host(nbytes, "pageable", pinned=False), m.alloc(0, nbytes, "dev")
        if before_s:
            yield from m.launch(s, Work("k", before_s, 1))
        yield from m.copy(s, dev, host, [CopyRange(0, 0, nbytes)], tag="delivery")
        out["return"] = m.now_s()
        yield from m.synchronize(s)
        out["end"] = m.now_s()

    m.run(prog())
    return out["return"], out["end"]


def test_the_call_costs_the_measured_pageable_time_and_returns_before_the_last_dma() -> None:
    m = _machine()
    dev = m.profile.devices[0]
    n = 64 * MIB
    ret, end = _one_copy(m, n)
    pageable, pinned = dev.link(True, False), dev.link(True, True)
    chunk = dev.pageable_chunk_bytes
    # the host stages every chunk (the measured pageable time less one chunk's DMA); the last chunk's DMA follows
    assert ret == pytest.approx(pageable.seconds(n) - pinned.seconds(chunk), rel=1e-9)
    assert end == pytest.approx(pageable.seconds(n), rel=1e-9)
    engine = [s for s in m.timeline() if s.track == "h2d0"]
    assert len(engine) == n // chunk  # one DMA per chunk, each at the pinned rate
    assert sum(s.end_s - s.start_s for s in engine) == pytest.approx(n // chunk * pinned.seconds(chunk), rel=1e-9)


def test_the_driver_syncs_the_stream_before_it_stages() -> None:
    ret0, _ = _one_copy(_machine(), 4 * MIB)
    ret1, _ = _one_copy(_machine(), 4 * MIB, before_s=0.25)
    assert ret1 == pytest.approx(0.25 + ret0, rel=1e-9)  # the host waited for the kernel ahead of the copy


def test_the_host_may_write_its_pageable_buffer_as_soon_as_the_call_returns() -> None:
    m = _machine(functional=True)
    n = 5 * MIB + 123
    got: dict[str, bytes] = {}

    def prog():  # type: ignore[no-untyped-def]
        s = m.create_stream(0, "transfer0")
        host, dev = m.alloc_host(n, "pageable", pinned=False), m.alloc(0, n, "dev")
        assert host.array is not None and dev.array is not None
        host.array[:] = np.arange(n, dtype=np.uint64).astype(np.uint8)
        want = host.array.tobytes()
        yield from m.copy(s, dev, host, [CopyRange(0, 0, n)], tag="delivery")
        host.array[:] = 0  # the staging buffers hold the bytes already
        yield from m.synchronize(s)
        got["dev"], got["want"] = dev.array.tobytes(), want

    m.run(prog())
    assert got["dev"] == got["want"]


def test_pageable_d2h_stays_synchronous() -> None:
    m = _machine()
    out: dict[str, float] = {}

    def prog():  # type: ignore[no-untyped-def]
        s = m.create_stream(0, "consumer0")
        host, dev = m.alloc_host(MIB, "pageable", pinned=False), m.alloc(0, MIB, "dev")
        yield from m.copy(s, host, dev, [CopyRange(0, 0, MIB)], tag="rows")
        out["return"] = m.now_s()

    m.run(prog())
    assert out["return"] == pytest.approx(m.profile.devices[0].link(False, False).seconds(MIB), rel=1e-9)
