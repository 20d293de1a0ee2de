"""The CuPy backend: 2D-copy detection everywhere; real streams, copies, events and the scheduler on a GPU.

GPU tests carry the ``gpu`` marker and skip with the reason where CuPy or a
CUDA device is missing. The scheduler-driving path they cover is also run on
the SimPy machine in tests/test_validate.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends import get_backend
from backends.base import Backend, BackendUnavailable, CopyRange, Work, drive
from backends.cupy_gpu import ranges_2d


def test_ranges_2d_detects_equal_length_constant_stride() -> None:
    rs = [CopyRange(0, 0, 100), CopyRange(1000, 128, 100), CopyRange(2000, 256, 100)]
    assert ranges_2d(rs) == (100, 3, 1000, 128)


@pytest.mark.parametrize(
    "ranges",
    [
        [CopyRange(0, 0, 100)],
        [CopyRange(0, 0, 100), CopyRange(1000, 128, 99)],
        [CopyRange(0, 0, 100), CopyRange(1000, 128, 100), CopyRange(2001, 256, 100)],
        [CopyRange(0, 0, 100), CopyRange(50, 128, 100)],
    ],
)
def test_ranges_2d_refuses_other_shapes(ranges: list[CopyRange]) -> None:
    assert ranges_2d(ranges) is None


def test_get_backend_rejects_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        get_backend("tpu")


def _gpu() -> Backend:
    try:
        return get_backend("cupy")
    except BackendUnavailable as exc:
        pytest.skip(f"needs CuPy and a CUDA device: {exc}")


@pytest.mark.gpu
def test_copies_round_trip_bytes_1d_and_2d() -> None:
    be = _gpu()
    s = be.create_stream(0, "s")
    host = be.alloc_host(1 << 20, "h")
    back = be.alloc_host(1 << 20, "b", pinned=False)
    dev = be.alloc(0, 1 << 20, "d")
    host.array[:] = np.arange(1 << 20, dtype=np.uint64).astype(np.uint8)
    back.array[:] = 0
    ranges = [CopyRange(i * 4096, i * 1024, 1000) for i in range(8)]
    drive(be.copy(s, dev, host, ranges, tag="2d"))
    drive(be.copy(s, dev, host, [CopyRange(100_000, 200_000, 5000)], tag="1d"))
    drive(be.copy(s, back, dev, [CopyRange(0, 0, 1 << 20)], tag="down"))  # pageable: the host blocks until done
    for r in ranges:
        assert (back.array[r.dst_offset : r.dst_offset + r.nbytes] == host.array[r.src_offset : r.src_offset + r.nbytes]).all()
    assert (back.array[200_000:205_000] == host.array[100_000:105_000]).all()
    tracks = {sp.track for sp in be.timeline()}
    assert {"s", "h2d0", "d2h0"} <= tracks


@pytest.mark.gpu
def test_stream_waits_on_event_and_kernels_run_on_their_stream() -> None:
    be = _gpu()
    a, b = be.create_stream(0, "a"), be.create_stream(0, "b")
    dev = be.alloc(0, 4096, "d")
    ev = be.create_event(0, "ev")
    x = dev.array[:1024].view(np.float32)

    def slow(xp):  # type: ignore[no-untyped-def]
        x[...] = 1.0

    drive(be.launch(a, Work("spin", 0.02)))  # 20 ms spin kernel, then the write
    drive(be.launch(a, Work("write", 0.0, 1, slow)))
    drive(be.record(ev, a))
    drive(be.wait_event(b, ev))
    drive(be.launch(b, Work("double", 0.0, 1, lambda xp: x.__imul__(2.0))))
    drive(be.synchronize(b))
    assert float(x.sum().get()) == 2048.0
    spans = {sp.name: sp for sp in be.timeline()}
    assert spans["spin"].end_s - spans["spin"].start_s >= 0.019
    assert spans["double"].start_s >= spans["write"].end_s - 1e-6


@pytest.mark.gpu
def test_alloc_is_outside_the_pool_and_free_bytes_moves() -> None:
    be = _gpu()
    before = be.free_bytes(0)
    buf = be.alloc(0, 256 << 20, "big")
    assert be.free_bytes(0) <= before - (255 << 20)
    be.free(buf)
    assert buf.array is None


@pytest.mark.gpu
def test_scheduler_output_is_identical_across_depths_on_the_gpu() -> None:
    from backends.profile import load_profile
    from sim.workload import Workload, cache_type, load_model
    from validate.gpu_run import GpuProgram, WeightStore, run_group

    be = _gpu()
    q = cache_type("q8_0")
    wl = Workload(load_model("qwen3.8-27b"), q, q, (2000,), tokens=3)
    hw = load_profile("h200-gen5x16")
    prog = GpuProgram(wl, be.cp, WeightStore(), scale=0.05)
    g = run_group(be, wl, hw, [(0, 0.0), (1, 0.0), (2, 0.0), (4, 0.0)], prog, reps=1)
    hashes = {tuple(r.step_hashes) for r in g.runs}
    assert len(hashes) == 1 and len(next(iter(hashes))) == 4
