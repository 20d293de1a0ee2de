"""The CuPy backend: the copy shape it issues; real streams, copies, events and the scheduler on a GPU.

GPU tests carry the ``gpu`` marker and skip with the reason where CuPy or a
CUDA device is missing. The scheduler-driving path they cover is also run on
the SimPy machine in tests/test_validate.py. What every backend must do alike
(bytes of 1D, strided and multi-range copies, refusals) is
tests/backends/test_backend_conformance.py, which uses the stand-in made here.
"""

from __future__ import annotations

import ctypes
import sys
import time
import types

import numpy as np
import pytest

from backends import get_backend
from backends.base import Backend, BackendUnavailable, CopyCall, CopyRange, Work, copy_calls, drive, ranges_2d
from backends.cupy_gpu import CupyGPU
from sim.transport.scheduler import TransportConfig


def make_fake_cupy() -> tuple[types.ModuleType, types.ModuleType]:
    """A synchronous stand-in for CuPy on NumPy: every call the backend makes, done at once on the host.

    Copies are ``ctypes.memmove`` at the raw addresses the backend computes;
    events read the host clock. It checks the backend's plumbing (addresses,
    2D pitches, event pairs, spans), not CUDA's concurrency: that is what the
    ``gpu`` tests are for.
    """
    cp = types.ModuleType("cupy")
    cp.__version__ = "fake"
    used = {"bytes": 0}

    class Err(Exception):
        pass

    class Memory:
        def __init__(self, n: int) -> None:
            if n > 1 << 34:
                raise Err("out of memory")
            self.array = np.zeros(n, dtype=np.uint8)
            self.ptr = self.array.ctypes.data
            used["bytes"] += n

        def __del__(self) -> None:
            used["bytes"] -= self.array.nbytes

    class MemoryPointer:
        def __init__(self, mem: Memory, off: int) -> None:
            self.mem, self.off = mem, off

    def ndarray(shape, dtype, memptr):  # type: ignore[no-untyped-def]
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return memptr.mem.array[memptr.off : memptr.off + n].view(dtype).reshape(shape)

    class Event:
        def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
            self.t = 0.0

        def record(self, stream=None) -> None:  # type: ignore[no-untyped-def]
            self.t = time.perf_counter()

        def synchronize(self) -> None:
            pass

    class Stream:
        null: Stream

        def __init__(self, null: bool = False, non_blocking: bool = False) -> None:
            self.ptr = id(self)

        def __enter__(self) -> Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def wait_event(self, ev: Event) -> None:
            pass

    Stream.null = Stream()

    class Device:
        def __init__(self, d: int = 0) -> None:
            pass

        def __enter__(self) -> Device:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def memcpy2d(dst, dpitch, src, spitch, w, h, kind, stream):  # type: ignore[no-untyped-def]
        for i in range(h):
            ctypes.memmove(dst + i * dpitch, src + i * spitch, w)

    runtime = types.SimpleNamespace(
        CUDARuntimeError=Err,
        getDeviceCount=lambda: 1,
        memcpyAsync=lambda dst, src, n, kind, stream: ctypes.memmove(dst, src, n),
        memcpy2DAsync=memcpy2d,
        memGetInfo=lambda: ((80 << 30) - used["bytes"], 80 << 30),
        getDeviceProperties=lambda d: {"name": b"Fake GPU"},
        driverGetVersion=lambda: 0,
        runtimeGetVersion=lambda: 0,
        deviceSynchronize=lambda: None,
    )

    class RandomState:
        def __init__(self, seed: int) -> None:
            self.rng = np.random.default_rng(seed)

        def standard_normal(self, shape, dtype=np.float32):  # type: ignore[no-untyped-def]
            return self.rng.standard_normal(shape, dtype=dtype)

    cp.cuda = types.SimpleNamespace(
        runtime=runtime, Stream=Stream, Event=Event, Device=Device, MemoryPointer=MemoryPointer,
        memory=types.SimpleNamespace(Memory=Memory, OutOfMemoryError=Err),
        get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
    )
    cp.ndarray = ndarray
    cp.random = types.SimpleNamespace(RandomState=RandomState)
    cp.RawKernel = lambda src, name: (lambda grid, block, args: time.sleep(int(args[0]) * 1e-9))
    cp.get_default_pinned_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    cp.__getattr__ = lambda name: getattr(np, name)  # type: ignore[attr-defined]
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype: np.zeros(shape, dtype=dtype)
    return cp, cupyx


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> CupyGPU:
    cp, cupyx = make_fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    return CupyGPU()


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
        [CopyRange(0, 0, 16, 2, 64), CopyRange(200, 16, 16, 2, 64)],  # strided ranges are one 2D copy each
        [CopyRange(0, 0, 16, 2, 64), CopyRange(200, 16, 16)],
    ],
)
def test_ranges_2d_refuses_other_shapes(ranges: list[CopyRange]) -> None:
    assert ranges_2d(ranges) is None


def test_copy_calls_make_a_strided_range_one_2d_call_packed_in_the_destination() -> None:
    assert copy_calls([CopyRange(0, 0, 8, rows=2, src_pitch=100)]) == (CopyCall(0, 0, 4, 2, 100, 4),)
    assert copy_calls([CopyRange(0, 0, 100), CopyRange(1000, 128, 100)]) == (CopyCall(0, 0, 100, 2, 1000, 128),)
    assert copy_calls([CopyRange(5, 6, 7), CopyRange(9, 9, 0), CopyRange(50, 60, 3)]) == (CopyCall(5, 6, 7), CopyCall(50, 60, 3))


def test_fake_issues_one_raw_call_per_planned_call_with_its_pitches(fake_gpu: CupyGPU, monkeypatch: pytest.MonkeyPatch) -> None:
    be = fake_gpu
    calls: list[tuple[object, ...]] = []
    rt = be.rt
    monkeypatch.setattr(rt, "memcpyAsync", lambda d, s, n, kind, st: calls.append(("1d", n, kind)))
    monkeypatch.setattr(rt, "memcpy2DAsync", lambda d, dp, s, sp, w, h, kind, st: calls.append(("2d", dp, sp, w, h, kind)))
    st = be.create_stream(0, "s")
    host, dev = be.alloc_host(4096, "h"), be.alloc(0, 4096, "d")
    be.run(be.copy(st, dev, host, [CopyRange(0, 0, 8, rows=2, src_pitch=100), CopyRange(500, 64, 10)]))
    be.run(be.copy(st, host, dev, [CopyRange(i * 300, i * 128, 100) for i in range(3)]))
    assert calls == [("2d", 4, 100, 4, 2, 1), ("1d", 10, 1), ("2d", 128, 300, 100, 3, 2)]


def test_the_array_module_is_xp_and_keeps_its_old_name(fake_gpu: CupyGPU) -> None:
    assert fake_gpu.xp is fake_gpu.cp is sys.modules["cupy"]


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
    assert float(x.sum().get()) == 512.0  # 256 floats, written 1 then doubled
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
    from sim.program import WeightStore
    from sim.program import gpu_program as GpuProgram
    from sim.workload import Workload, cache_type, load_model
    from validate.gpu_run import run_group

    be = _gpu()
    q = cache_type("q8_0")
    wl = Workload(load_model("qwen3.8-27b"), q, q, (2000,), tokens=3)
    hw = load_profile("h200-gen5x16-kvpipe")
    prog = GpuProgram(wl, be.cp, WeightStore(), scale=0.05)
    g = run_group(be, wl, hw, [TransportConfig(depth=d, budget_mib=0.0) for d in (0, 1, 2, 4)], prog, reps=1)
    hashes = {tuple(r.step_hashes) for r in g.runs}
    assert len(hashes) == 1 and len(next(iter(hashes))) == 4


# ------------------------------------------------------- the plumbing, on a stand-in


def test_fake_copies_land_at_the_computed_addresses(fake_gpu: CupyGPU) -> None:
    be = fake_gpu
    s = be.create_stream(0, "consumer0")
    host = be.alloc_host(1 << 16, "h")
    dev = be.alloc(0, 1 << 16, "d")
    back = be.alloc_host(1 << 16, "b", pinned=False)
    host.array[:] = np.arange(1 << 16, dtype=np.uint32).astype(np.uint8)
    ranges = [CopyRange(i * 4096, i * 1024, 1000) for i in range(4)]
    drive(be.copy(s, dev, host, ranges, tag="delivery0"))
    drive(be.copy(s, back, dev, [CopyRange(0, 0, 1 << 16)], tag="down"))
    for r in ranges:
        assert (back.array[r.dst_offset : r.dst_offset + r.nbytes] == host.array[r.src_offset : r.src_offset + r.nbytes]).all()
    spans = be.timeline()
    assert [sp.track for sp in spans if sp.name == "delivery0"] == ["consumer0", "h2d0"] or \
        sorted(sp.track for sp in spans if sp.name == "delivery0") == ["consumer0", "h2d0"]
    assert next(sp for sp in spans if sp.name == "delivery0" and sp.track == "h2d0").args["bytes"] == 4000
    assert any(sp.track == "host" and sp.name.startswith("sync") for sp in spans)  # pageable copy blocked the host


def test_fake_engine_track_is_serialised(fake_gpu: CupyGPU) -> None:
    from backends.base import Span

    be = fake_gpu
    s = be.create_stream(0, "a")
    host, dev = be.alloc_host(4096, "h"), be.alloc(0, 4096, "d")
    for i in range(3):
        drive(be.copy(s, dev, host, [CopyRange(0, 0, 4096)], tag=f"c{i}"))
    eng = [sp for sp in be.timeline() if sp.track == "h2d0"]
    assert all(isinstance(sp, Span) for sp in eng)
    assert all(b.start_s >= a.end_s for a, b in zip(eng, eng[1:], strict=False))


def test_fake_gpu_runs_the_scheduler_and_the_report(fake_gpu: CupyGPU, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from backends.profile import load_profile
    from sim.program import WeightStore
    from sim.program import gpu_program as GpuProgram
    from sim.workload import Workload, cache_type
    from tests.conftest import toy_model
    from validate.gpu_run import run_group
    from validate.report import write_report

    be = fake_gpu
    q = cache_type("q8_0")
    wl = Workload(toy_model(8, every=4), q, q, (700,), tokens=2)
    hw = load_profile("h200-gen5x16-kvpipe")
    prog = GpuProgram(wl, be.cp, WeightStore())
    g = run_group(be, wl, hw, [TransportConfig(depth=d, budget_mib=0.0) for d in (0, 1, 2)], prog, reps=2)
    assert len({tuple(r.step_hashes) for r in g.runs}) == 1
    assert any(sp.name.startswith("delivery") and sp.track == "h2d0" for r in g.runs for sp in r.spans)
    doc = write_report(tmp_path, [g], hw, {"device": "fake", "command": "test"})
    assert doc["summary"]["exactness_gate"] and len(doc["points"]) == 3
