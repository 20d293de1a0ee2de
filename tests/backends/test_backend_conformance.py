"""One suite, every backend: the same ranges land the same bytes, and the same bad copy is refused the same way.

Parametrized over every machine behind the backend Protocol: the SimPy
machine timing-only and functional, the race checker around the functional
one, a synchronous NumPy stand-in for CuPy (``make_fake_cupy``: copies are
``memmove`` at the addresses the backend computes) and real CuPy (marked
``gpu``, skipped with the reason where there is none). Expected bytes come
from a plain model of :class:`backends.base.CopyRange` written here, not from
the backends' own helpers. A machine that moves no bytes (timing-only SimPy)
is held to the refusals and to what it does instead: the copy takes
simulated time and its span names the bytes.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from backends import get_backend
from backends.base import Backend, BackendError, BackendUnavailable, Buffer, CopyRange, HostOp, Stream, Work
from backends.checked import CheckedBackend
from backends.cupy_gpu import CupyGPU
from backends.profile import load_profile
from backends.simpy_machine import SimMachine
from tests.backends.test_cupy_backend import make_fake_cupy

N = 4096  # bytes of every buffer here


def _simpy(functional: bool) -> Callable[[pytest.MonkeyPatch], Backend]:
    return lambda mp: SimMachine(load_profile("rtx4070-gen4x16"), functional=functional)


def _checked(mp: pytest.MonkeyPatch) -> Backend:
    return CheckedBackend(SimMachine(load_profile("rtx4070-gen4x16"), functional=True))


def _fake_cupy(mp: pytest.MonkeyPatch) -> Backend:
    cp, cupyx = make_fake_cupy()
    mp.setitem(sys.modules, "cupy", cp)
    mp.setitem(sys.modules, "cupyx", cupyx)
    return CupyGPU()


def _cupy(mp: pytest.MonkeyPatch) -> Backend:
    try:
        return get_backend("cupy")  # type: ignore[no-any-return]
    except BackendUnavailable as exc:
        pytest.skip(f"needs CuPy and a CUDA device: {exc}")


TIMING_ONLY = [pytest.param(_simpy(False), id="simpy")]
MOVES_BYTES = [
    pytest.param(_simpy(True), id="simpy-functional"),
    pytest.param(_checked, id="checked-functional"),
    pytest.param(_fake_cupy, id="fake-cupy"),
    pytest.param(_cupy, id="cupy", marks=pytest.mark.gpu),
]
EVERY = TIMING_ONLY + MOVES_BYTES

RANGES = {
    "1d": [CopyRange(16, 40, 100)],
    "strided": [CopyRange(0, 0, 8, rows=2, src_pitch=100)],  # bytes 0-3 and 100-103, packed
    "strided-5-rows": [CopyRange(3, 64, 60, rows=5, src_pitch=37)],
    "multi-one-2d": [CopyRange(i * 300, i * 128, 100) for i in range(4)],
    "multi-ragged": [CopyRange(0, 0, 100), CopyRange(1000, 128, 99), CopyRange(2001, 256, 100)],
    "multi-overlapping-stride": [CopyRange(0, 0, 100), CopyRange(50, 128, 100)],
    "multi-strided": [CopyRange(0, 0, 16, rows=2, src_pitch=64), CopyRange(200, 16, 16, rows=2, src_pitch=64)],
    "multi-mixed": [CopyRange(0, 0, 40, rows=4, src_pitch=50), CopyRange(500, 64, 10), CopyRange(700, 80, 10), CopyRange(900, 96, 0)],
}
CASES = [pytest.param(r, id=k) for k, r in RANGES.items()]


def expected(src: np.ndarray, ranges: Sequence[CopyRange]) -> np.ndarray:
    """The destination after ``ranges`` from ``src`` into zeros: each range's rows, ``src_pitch`` apart, packed at ``dst_offset``."""
    out = np.zeros(N, dtype=np.uint8)
    for r in ranges:
        width = r.nbytes // r.rows
        for i in range(r.rows):
            s = r.src_offset + i * r.src_pitch
            out[r.dst_offset + i * width : r.dst_offset + (i + 1) * width] = src[s : s + width]
    return out


def pattern() -> np.ndarray:
    return (np.arange(N, dtype=np.uint32) * 7 % 251 + 1).astype(np.uint8)  # no zero byte: a missed byte shows


def _run(be: Backend, body: Callable[[], HostOp]) -> Any:
    return be.run(body())


def _upload(be: Backend, s: Stream, dev: Buffer, data: np.ndarray) -> HostOp:
    """The whole of ``data`` into device buffer ``dev`` through a pinned host buffer (device memory may start as garbage)."""
    h = be.alloc_host(N, "upload")
    h.array[:] = data
    yield from be.copy(s, dev, h, [CopyRange(0, 0, N)], tag="upload")
    yield from be.synchronize(s)


def _download(be: Backend, s: Stream, dev: Buffer) -> HostOp:
    """The whole of device buffer ``dev``, copied into a pageable host buffer (the host blocks until it is done)."""
    back = be.alloc_host(N, "download", pinned=False)
    yield from be.copy(s, back, dev, [CopyRange(0, 0, N)], tag="download")
    yield from be.synchronize(s)
    return back.array.copy()


@pytest.fixture(params=MOVES_BYTES)
def machine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    return request.param(monkeypatch)  # type: ignore[no-any-return]


@pytest.fixture(params=EVERY)
def any_machine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    return request.param(monkeypatch)  # type: ignore[no-any-return]


@pytest.fixture(params=TIMING_ONLY)
def timing_machine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    return request.param(monkeypatch)  # type: ignore[no-any-return]


# ------------------------------------------------------------------ bytes


@pytest.mark.parametrize("ranges", CASES)
def test_h2d_lands_the_same_bytes(machine: Backend, ranges: list[CopyRange]) -> None:
    be = machine

    def body() -> HostOp:
        s = be.create_stream(0, "s")
        host, dev = be.alloc_host(N, "h"), be.alloc(0, N, "d")
        host.array[:] = pattern()
        yield from _upload(be, s, dev, np.zeros(N, dtype=np.uint8))
        yield from be.copy(s, dev, host, ranges, tag="ranges")
        return (yield from _download(be, s, dev))

    got = _run(be, body)
    np.testing.assert_array_equal(got, expected(pattern(), ranges))


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
@pytest.mark.parametrize("ranges", CASES)
def test_d2h_lands_the_same_bytes(machine: Backend, ranges: list[CopyRange], pinned: bool) -> None:
    be = machine

    def body() -> HostOp:
        s = be.create_stream(0, "s")
        dev, back = be.alloc(0, N, "d"), be.alloc_host(N, "b", pinned=pinned)
        back.array[:] = 0
        yield from _upload(be, s, dev, pattern())
        yield from be.copy(s, back, dev, ranges, tag="ranges")
        yield from be.synchronize(s)
        return back.array.copy()

    got = _run(be, body)
    np.testing.assert_array_equal(got, expected(pattern(), ranges))


# --------------------------------------------------------------- refusals

OUT_OF_BOUNDS = {
    "src-end": CopyRange(N - 4, 0, 8),
    "dst-end": CopyRange(0, N - 4, 8),
    "src-last-row": CopyRange(0, 0, 8, rows=2, src_pitch=N),  # row 2 starts at N: within nbytes of src_offset, past the end
    "src-last-row-tail": CopyRange(N - 104, 0, 8, rows=2, src_pitch=101),  # row 2 is [N-3, N+1): one byte past the end
}


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("bad", [pytest.param(r, id=k) for k, r in OUT_OF_BOUNDS.items()])
def test_out_of_bounds_is_refused_with_one_message(any_machine: Backend, bad: CopyRange, to_device: bool) -> None:
    be = any_machine
    s = be.create_stream(0, "s")
    host, dev = be.alloc_host(N, "h"), be.alloc(0, N, "d")
    src, dst = (host, dev) if to_device else (dev, host)
    message = f"copy oob: range {bad} outside {src.name} ({N} B) or {dst.name} ({N} B)"

    def body() -> HostOp:
        yield from be.copy(s, dst, src, [CopyRange(0, 0, 4), bad], tag="oob")

    with pytest.raises(BackendError, match=re.escape(message)):
        _run(be, body)


def test_direction_is_refused_with_one_message(any_machine: Backend) -> None:
    be = any_machine
    s = be.create_stream(0, "s")
    a, b = be.alloc_host(N, "a"), be.alloc_host(N, "b")
    d0, d1 = be.alloc(0, N, "d0"), be.alloc(0, N, "d1")
    for src, dst in ((a, b), (d0, d1)):
        with pytest.raises(BackendError, match=re.escape(f"copy {src.name}->{dst.name}: one side must be host memory, the other a device")):
            _run(be, lambda src=src, dst=dst: be.copy(s, dst, src, [CopyRange(0, 0, 4)]))


def test_a_refused_copy_leaves_the_machine_usable(any_machine: Backend) -> None:
    be = any_machine
    s = be.create_stream(0, "s")
    host, dev = be.alloc_host(N, "h"), be.alloc(0, N, "d")
    with pytest.raises(BackendError, match="outside"):
        _run(be, lambda: be.copy(s, dev, host, [CopyRange(0, 0, N + 1)], tag="oob"))

    def body() -> HostOp:
        yield from be.copy(s, dev, host, [CopyRange(0, 0, N)], tag="after")
        yield from be.synchronize(s)

    _run(be, body)
    assert [sp.args["bytes"] for sp in be.timeline() if sp.name == "after" and sp.track == "h2d0"] == [N]


# ------------------------------------------------------- what every one does


@pytest.mark.parametrize("ranges", CASES)
def test_the_copy_span_names_its_engine_and_bytes(any_machine: Backend, ranges: list[CopyRange]) -> None:
    be = any_machine

    def body() -> HostOp:
        s = be.create_stream(0, "s")
        host, dev = be.alloc_host(N, "h"), be.alloc(0, N, "d")
        yield from be.copy(s, dev, host, ranges, tag="up")
        yield from be.copy(s, host, dev, ranges, tag="down")
        yield from be.synchronize(s)

    _run(be, body)
    spans = be.timeline()
    for tag, engine in (("up", "h2d0"), ("down", "d2h0")):
        mine = [sp for sp in spans if sp.name == tag]
        assert sorted(sp.track for sp in mine) == sorted(["s", engine])
        assert {sp.args["bytes"] for sp in mine} == {sum(r.nbytes for r in ranges)}


@pytest.mark.parametrize("ranges", CASES)
def test_a_timing_only_copy_takes_time_and_moves_nothing(timing_machine: Backend, ranges: list[CopyRange]) -> None:
    be = timing_machine

    def body() -> HostOp:
        s = be.create_stream(0, "s")
        host, dev = be.alloc_host(N, "h"), be.alloc(0, N, "d")
        t = be.now_s()
        yield from be.copy(s, dev, host, ranges, tag="up")
        yield from be.synchronize(s)
        return host, dev, be.now_s() - t

    host, dev, took_s = _run(be, body)
    assert host.array is None and dev.array is None
    assert took_s > 0
    (engine,) = [sp for sp in be.timeline() if sp.name == "up" and sp.track == "h2d0"]
    assert engine.end_s >= engine.start_s and engine.args["bytes"] == sum(r.nbytes for r in ranges)


def test_run_returns_the_programs_value(any_machine: Backend) -> None:
    be = any_machine

    def body() -> HostOp:
        s = be.create_stream(0, "s")
        yield from be.synchronize(s)
        return "done"

    assert isinstance(be, Backend)
    assert be.run(body()) == "done"


def test_describe_is_plain_data(any_machine: Backend) -> None:
    info = any_machine.describe()
    assert json.loads(json.dumps(info)) == info
    assert isinstance(info["device"], str) and info["device_count"] == any_machine.device_count()
    assert info["memory_total_bytes"] > 0


def test_kernels_and_cpu_splits_get_the_array_module(any_machine: Backend) -> None:
    be = any_machine
    seen: list[Any] = []

    def body() -> HostOp:
        s = be.create_stream(0, "s")
        yield from be.launch(s, Work("k", 1e-6, 1, seen.append))
        yield from be.synchronize(s)
        yield from be.run_host(Work("c", 1e-6, 0, seen.append))

    _run(be, body)
    assert hasattr(be.xp, "zeros") and hasattr(be.xp, "asarray")
    moves_bytes = be.alloc_host(1, "probe").array is not None
    assert seen == ([be.xp, np] if moves_bytes else [])
