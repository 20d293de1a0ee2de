"""The happens-before checker on hand-built host programs: what it orders, what it reports."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from backends.base import Access, Backend, BackendError, CopyRange, HostOp, Work
from backends.checked import CheckedBackend
from backends.profile import load_profile
from backends.simpy_machine import SimMachine
from sim.run.point import Point
from sim.run.run import check, run_point
from sim.transport.scheduler import TransportConfig
from tests.conftest import reference_workload

Program = Callable[[CheckedBackend], HostOp]


def run(program: Program) -> CheckedBackend:
    machine = SimMachine(load_profile("rtx4070-gen4x16"), trace=False)
    checker = CheckedBackend(machine)
    machine.run(program(checker))
    return checker


def setup(be: CheckedBackend) -> tuple[Any, ...]:
    host = be.alloc_host(4096, "host")
    dev = be.alloc(0, 4096, "dev")
    a, b = be.create_stream(0, "a"), be.create_stream(0, "b")
    return host, dev, a, b


def reader(dev: Any, lo: int = 0, n: int = 1024) -> Work:
    return Work("reader", 1e-5, 1, None, (Access(dev, lo, n, False),))


def test_copy_then_kernel_on_another_stream_without_event_is_a_named_hazard() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, b = setup(be)
        yield from be.copy(a, dev, host, [CopyRange(0, 0, 1024)], tag="delivery0")
        yield from be.launch(b, reader(dev, 512, 1024))

    c = run(prog)
    assert c.hazard_count == 1
    h = c.examples[0]
    assert (h.buffer, h.lo, h.hi) == ("dev", 512, 1024)
    assert (h.first.name, h.first.actor, h.first_write) == ("delivery0", "a", True)
    assert (h.second.name, h.second.actor, h.second_write) == ("reader", "b", False)
    assert "delivery0" in c.report()[0] and "reader" in c.report()[0] and "dev[512:1024]" in c.report()[0]


@pytest.mark.parametrize("order", ["event", "host-sync", "same-stream", "host-event"])
def test_each_ordering_removes_the_hazard(order: str) -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, b = setup(be)
        ev = be.create_event(0, "ready")
        yield from be.copy(a, dev, host, [CopyRange(0, 0, 1024)], tag="delivery0")
        consumer = b
        if order == "event":
            yield from be.record(ev, a)
            yield from be.wait_event(b, ev)
        elif order == "host-sync":
            yield from be.synchronize(a)
        elif order == "same-stream":
            consumer = a
        else:
            yield from be.record(ev, a)
            yield from be.wait_host(ev)
        yield from be.launch(consumer, reader(dev))

    assert run(prog).hazard_count == 0


def test_a_wait_on_an_event_recorded_only_later_orders_nothing() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, b = setup(be)
        ev = be.create_event(0, "ready")
        yield from be.wait_event(b, ev)  # never recorded yet: a no-op, as in CUDA
        yield from be.copy(a, dev, host, [CopyRange(0, 0, 1024)], tag="delivery0")
        yield from be.record(ev, a)
        yield from be.launch(b, reader(dev))

    assert run(prog).hazard_count == 1


def test_event_snapshot_is_taken_at_record_time() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, b = setup(be)
        ev = be.create_event(0, "ready")
        yield from be.record(ev, a)
        yield from be.copy(a, dev, host, [CopyRange(0, 0, 1024)], tag="after_record")
        yield from be.wait_event(b, ev)
        yield from be.launch(b, reader(dev))

    assert run(prog).hazard_count == 1


def test_host_write_under_an_in_flight_copy_and_the_sync_that_fixes_it() -> None:
    def prog(sync: bool) -> Program:
        def p(be: CheckedBackend) -> HostOp:
            host, dev, a, _ = setup(be)
            yield from be.copy(a, dev, host, [CopyRange(100, 0, 200)], tag="delivery0")
            if sync:
                yield from be.synchronize(a)
            yield from be.run_host(Work("cpu_rows", 0.0, 0, None, (Access(host, 250, 100, True),)))

        return p

    bad = run(prog(False))
    assert bad.hazard_count == 1
    h = bad.examples[0]
    assert (h.buffer, h.lo, h.hi, h.kind) == ("host", 250, 300, "read/write")
    assert h.second.kind == "cpu" and h.second.actor == "host"
    assert run(prog(True)).hazard_count == 0


def test_reads_never_conflict_and_disjoint_bytes_never_conflict() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, b = setup(be)
        yield from be.launch(a, reader(dev, 0, 1024))
        yield from be.launch(b, reader(dev, 0, 1024))  # read/read
        yield from be.copy(a, dev, host, [CopyRange(0, 2048, 1024)], tag="elsewhere")
        yield from be.launch(b, reader(dev, 0, 2048))  # ends where the copy starts

    assert run(prog).hazard_count == 0


def test_write_write_on_two_streams_is_reported() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, b = setup(be)
        yield from be.copy(a, dev, host, [CopyRange(0, 0, 64)], tag="one")
        yield from be.copy(b, dev, host, [CopyRange(0, 32, 64)], tag="two")

    c = run(prog)
    assert c.hazard_count == 1 and c.examples[0].kind == "write/write" and (c.examples[0].lo, c.examples[0].hi) == (32, 64)


# Every way an in-flight operation on stream a and a later one on stream b can share a buffer
# (copies are host -> dev or dev -> host; a kernel reads or writes dev), and whether it is a hazard.
# The checker skips an in-flight copy by its two buffers before it looks at any range, so each
# pairing of buffers must be right.
PAIRINGS = {
    "copy in, copy out of what it writes": ("h2d", "d2h", True),
    "copy out, copy in over what it reads": ("d2h", "h2d", True),
    "copy in, copy in: both write dev": ("h2d", "h2d", True),
    "copy out, copy out: both read dev": ("d2h", "d2h", False),
    "copy in, kernel reads": ("h2d", "read", True),
    "copy out, kernel writes": ("d2h", "write", True),
    "copy out, kernel reads": ("d2h", "read", False),
    "kernel writes, copy out": ("write", "d2h", True),
    "kernel reads, copy in": ("read", "h2d", True),
    "kernel reads, copy out": ("read", "d2h", False),
    "kernel writes, kernel reads": ("write", "read", True),
}


@pytest.mark.parametrize("name", PAIRINGS)
def test_every_pairing_of_in_flight_operations_on_one_buffer(name: str) -> None:
    first, second, hazard = PAIRINGS[name]

    def op(be: CheckedBackend, stream: Any, kind: str, host: Any, dev: Any, out: Any) -> HostOp:
        if kind == "h2d":
            return be.copy(stream, dev, host, [CopyRange(0, 0, 64)], tag=kind)
        if kind == "d2h":
            return be.copy(stream, out, dev, [CopyRange(0, 0, 64)], tag=kind)
        return be.launch(stream, Work(kind, 1e-5, 1, None, (Access(dev, 0, 64, kind == "write"),)))

    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, b = setup(be)
        out_a, out_b = be.alloc_host(4096, "out_a"), be.alloc_host(4096, "out_b")  # a copy out per stream: they share only dev
        yield from op(be, a, first, host, dev, out_a)
        yield from op(be, b, second, host, dev, out_b)

    c = run(prog)
    assert c.hazard_count == (1 if hazard else 0)
    if hazard:
        assert c.examples[0].buffer == "dev" and (c.examples[0].first.name, c.examples[0].second.name) == (first, second)


def test_strided_source_rows_only_touch_their_rows() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, _ = setup(be)
        yield from be.copy(a, dev, host, [CopyRange(0, 0, 256, rows=4, src_pitch=128)], tag="strided")
        yield from be.run_host(Work("gap_write", 0.0, 0, None, (Access(host, 64, 64, True),)))  # between rows 0 and 1
        yield from be.run_host(Work("row_write", 0.0, 0, None, (Access(host, 130, 4, True),)))  # inside row 1

    c = run(prog)
    assert c.hazard_count == 1 and c.examples[0].second.name == "row_write"


def test_pageable_copy_blocks_the_host_and_orders_it() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host = be.alloc_host(4096, "pageable", pinned=False)
        dev = be.alloc(0, 4096, "dev")
        a = be.create_stream(0, "a")
        yield from be.copy(a, dev, host, [CopyRange(0, 0, 1024)], tag="pageable_copy")
        yield from be.run_host(Work("overwrite", 0.0, 0, None, (Access(host, 0, 1024, True),)))

    assert run(prog).hazard_count == 0


def test_freeing_a_buffer_under_a_copy_is_a_hazard() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, _ = setup(be)
        yield from be.copy(a, dev, host, [CopyRange(0, 0, 1024)], tag="in_flight")
        be.free(dev)

    c = run(prog)
    assert c.hazard_count == 1 and c.examples[0].second.kind == "free"


def test_hazards_are_counted_once_per_pair_of_operations() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, b = setup(be)
        yield from be.copy(a, dev, host, [CopyRange(0, 0, 64), CopyRange(128, 128, 64)], tag="two_ranges")
        yield from be.launch(b, Work("k", 1e-6, 1, None, (Access(dev, 0, 64, False), Access(dev, 128, 64, False))))

    assert run(prog).hazard_count == 1


def test_an_actor_that_first_touches_a_buffer_later_is_seen_by_walks_cached_before() -> None:
    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, b = setup(be)
        yield from be.copy(b, dev, host, [CopyRange(0, 0, 64)], tag="first")  # b's walk for writes to dev: nothing yet
        yield from be.launch(a, reader(dev, 0, 64))  # a's first access to dev: unordered after "first"
        yield from be.copy(b, dev, host, [CopyRange(0, 0, 64)], tag="second")  # must now see a's read

    c = run(prog)
    assert c.hazard_count == 2
    assert [(h.first.name, h.second.name) for h in c.examples] == [("first", "reader"), ("reader", "second")]


def test_pruning_keeps_what_the_host_does_not_know_and_a_freed_buffer_starts_afresh() -> None:
    def prog(sync: bool) -> Program:
        def p(be: CheckedBackend) -> HostOp:
            host, dev, a, b = setup(be)
            yield from be.copy(a, dev, host, [CopyRange(0, 0, 8)], tag="old")
            for i in range(1, 200):  # well past the pruning threshold
                yield from be.copy(a, dev, host, [CopyRange(8 * i, 8 * i, 8)], tag=f"c{i}")
                if sync and i == 100:
                    yield from be.synchronize(a)
            yield from be.launch(b, reader(dev, 0, 8))
            yield from be.launch(b, reader(dev, 8 * 150, 8))
            yield from be.synchronize(a)
            yield from be.synchronize(b)
            be.free(dev)
            dev2 = be.alloc(0, 4096, "dev2")
            yield from be.launch(a, reader(dev2, 0, 8))
            yield from be.run_host(Work("w", 0.0, 0, None, (Access(dev2, 0, 8, True),)))

        return p

    unsynced = run(prog(False))
    assert unsynced.hazard_count == 3  # old/reader, c150/reader, dev2's read/write
    assert [(h.buffer, h.first.name, h.second.name) for h in unsynced.examples] == [
        ("dev", "old", "reader"),
        ("dev", "c150", "reader"),
        ("dev2", "reader", "w"),
    ]
    synced = run(prog(True))  # the host learned "old" at the sync: pruned, and never reportable anyway
    assert [(h.first.name, h.second.name) for h in synced.examples] == [("c150", "reader"), ("reader", "w")]


def test_checked_backend_is_a_backend_and_forwards() -> None:
    machine = SimMachine(load_profile("rtx4070-gen4x16"))
    c = CheckedBackend(machine)
    assert isinstance(c, Backend)
    assert c.device_count() == machine.device_count() and c.free_bytes(0) == machine.free_bytes(0)
    assert c.inner is machine and not hasattr(c, "env")  # only the Protocol: the inner backend is at .inner
    assert c.xp is machine.xp and c.describe() == machine.describe()

    def prog() -> HostOp:
        yield from c.synchronize(c.create_stream(0, "s"))
        return 7

    assert c.run(prog()) == 7


def test_a_copy_the_machine_refuses_leaves_no_trace_in_the_checker() -> None:
    c = CheckedBackend(SimMachine(load_profile("rtx4070-gen4x16")), record_copies=True)
    s = c.create_stream(0, "s")
    host, dev = c.alloc_host(64, "h"), c.alloc(0, 64, "d")
    with pytest.raises(BackendError, match=r"copy oob: range .* outside h \(64 B\) or d \(64 B\)"):
        c.copy(s, dev, host, [CopyRange(0, 0, 65)], tag="oob")
    assert c.copies == [] and c._kept == [[], []]


def test_plain_simulation_matches_unchecked_timing() -> None:
    point = Point(reference_workload(16384, tokens=3), load_profile("rtx4070-gen4x16"), TransportConfig(depth=1))
    checked = check(point).result
    plain = run_point(point, checked=False, warmup=0)
    assert [g.total_s for g in checked.graphs] == [g.total_s for g in plain.graphs]
    assert checked.extra["hazards"] == 0 and "hazard_examples" not in checked.extra


@pytest.mark.benchmark
def test_checker_cost_in_a_plain_simulation() -> None:
    """Wall time of the reference grid with and without the checker (prints figures; not a pass/fail timing).

    A benchmark: it asserts nothing (the figures it prints are read by a person, not held to a threshold)."""
    hw = load_profile("rtx4070-gen4x16")
    points = [Point(reference_workload(c, tokens=32), hw, TransportConfig(depth=d)) for c in (4096, 16384, 32768) for d in (0, 1)]
    runs: dict[str, Callable[[Point], Any]] = {"plain": lambda p: run_point(p, checked=False, warmup=0), "checked": check}
    best = {label: float("inf") for label in runs}
    for _ in range(7):  # interleaved, best of 7: the machine is shared
        for label, fn in runs.items():
            t = time.perf_counter()
            for p in points:
                fn(p)
            best[label] = min(best[label], time.perf_counter() - t)
    print(f"plain {best['plain']:.3f} s, checked {best['checked']:.3f} s, overhead {best['checked'] / best['plain'] - 1:+.1%}")


@pytest.mark.parametrize(("read_at", "hit"), [(240, True), (300, False), (990, True), (1040, False), (160, False)])
def test_a_strided_access_is_checked_row_by_row(read_at: int, hit: bool) -> None:
    """``Access(repeat=4, pitch=256)``: four 64-byte rows at 200, 456, 712, 968; a copy reading 32 bytes at ``copy_at``
    conflicts with a row it touches and not with the gaps between them or the bytes past the last."""

    def prog(be: CheckedBackend) -> HostOp:
        host, dev, a, _ = setup(be)
        yield from be.copy(a, dev, host, [CopyRange(read_at, 0, 32)], tag="delivery0")
        yield from be.run_host(Work("cpu_rows", 0.0, 0, None, (Access(host, 200, 64, True, repeat=4, pitch=256),)))

    c = run(prog)
    assert c.hazard_count == (1 if hit else 0)
    if hit:
        lo = c.examples[0].lo
        assert (lo - 200) % 256 < 64
