"""The transport scheduler on the SimPy machine: the reference's ring checks and timeline assertions."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from backends.base import BackendError, CopyRange
from backends.profile import ComputeModel
from backends.simpy_machine import SimMachine
from sim.graph import DecodeGraph, decode_graph
from sim.rows import row
from sim.run.decode import run_decode
from sim.run.point import Point, graphs_for
from sim.run.run import run_point
from sim.transport.scheduler import MIB, TransportConfig, TransportScheduler
from sim.workload import Workload, cache_type
from tests.conftest import Recorder, fast_profile, reference_workload, toy_model


def run_recorded(point: Point, graphs=graphs_for, machine: SimMachine | None = None):  # type: ignore[no-untyped-def]
    machine = machine or SimMachine(point.hardware, trace=True)
    rec = Recorder(machine)
    sched, stats = machine.run(run_decode(rec, point, graphs=graphs))
    return rec, sched, stats, machine


def staged_launches(rec: Recorder, sched: TransportScheduler) -> list:  # type: ignore[type-arg]
    return [c for c in rec.of("launch") if c.target.startswith("gpu_attn")]


# ------------------------------------------------------------ ring sizes


@pytest.mark.parametrize(
    ("context", "rows", "ring_mib", "tol"),
    [(4096, 4352, 27.1, 0.5), (16384, 16640, 103.6, 1.0), (32768, 33024, 205.6, 2.0)],
)
def test_reference_ring_size_uncapped(rtx4070, context, rows, ring_mib, tol):  # type: ignore[no-untyped-def]
    r = row(run_point(Point(reference_workload(context), rtx4070, TransportConfig(depth=1, budget_mib=0)), checked=False, warmup=0))
    assert r["window_rows"] == rows
    assert r["ring_mib"] == pytest.approx(ring_mib, abs=tol)
    assert r["ring_mib"] == pytest.approx(3 * rows * 2176 / MIB, rel=1e-9)
    assert not r["declined"] and r["deliveries"] == 16


def test_default_budget_fits_then_declines_with_reason(rtx4070):  # type: ignore[no-untyped-def]
    fits = row(run_point(Point(reference_workload(20224), rtx4070, TransportConfig(depth=1)), checked=False, warmup=0))
    over = row(run_point(Point(reference_workload(20480), rtx4070, TransportConfig(depth=1)), checked=False, warmup=0))
    ordered = row(run_point(Point(reference_workload(20480), rtx4070, TransportConfig(depth=0)), checked=False, warmup=0))
    assert fits["window_rows"] == 20480 and not fits["declined"] and fits["deliveries"] > 0
    assert over["window_rows"] == 20736 and over["declined"]
    assert "budget 128 MiB" in over["decline_reason"] and over["deliveries"] == 0
    assert over["tokens_per_s"] == pytest.approx(ordered["tokens_per_s"], rel=0.01)


def test_a_growing_window_keeps_its_slots_until_it_outgrows_them_and_never_takes_more_than_the_full_context(rtx4070):  # type: ignore[no-untyped-def]
    # Twelve tokens from 4,090 rows: the window's need grows (by 256-row padding steps) but the ring is not
    # reallocated each token -- one allocation covers them all; every slot holds its need; none exceeds what the full
    # context's window needs or the budget's share (budget / n_slots).
    cfg = TransportConfig(depth=1, budget_mib=128)
    r = run_point(Point(reference_workload(4090, ctx_size=8192, tokens=12), rtx4070, cfg), checked=False, warmup=0)
    needs = [g.slot_need_bytes for g in r.graphs]
    allocs = [g.slot_alloc_bytes for g in r.graphs]
    assert len(set(needs)) > 1 and len(set(allocs)) == 1
    assert all(a >= n for a, n in zip(allocs, needs, strict=True))
    # near the full context the headroom a growing ring keeps is capped by the full context's need, not doubled
    late = run_point(Point(reference_workload(8000, ctx_size=8192, tokens=2), rtx4070, TransportConfig(depth=1, budget_mib=0)),
                     checked=False, warmup=0)
    g = late.graphs[-1]
    assert g.slot_need_bytes <= g.slot_alloc_bytes == g.full_slot_need_bytes < 2 * g.slot_need_bytes
    assert all(a * cfg.n_slots <= cfg.budget_mib * MIB for a in allocs)


# ----------------------------------------------- series / overlap identity


def _dense_point(h2d_gbps: float, depth: int, context: int = 1023) -> Point:
    from backends.profile import load_profile

    model = toy_model(n_layers=8, small_inputs_bytes=())
    f16 = cache_type("f16")
    wl = Workload(model, f16, f16, (context,), tokens=1)
    hw = fast_profile(load_profile("rtx4070-gen4x16"), h2d_gbps)
    compute = ComputeModel(layer_s=0.5e-3)
    hw = replace(hw, devices=(replace(hw.devices[0], compute=compute),))
    return Point(wl, hw, TransportConfig(depth=depth, budget_mib=0))


def _no_small_inputs(point: Point) -> Iterator[DecodeGraph]:
    for g in graphs_for(point):
        splits = tuple(replace(s, ordered=()) if s.kind == "gpu" else s for s in g.splits)
        yield replace(g, splits=splits)


@pytest.mark.parametrize("h2d_gbps", [2.0, 8.0])  # copy-bound and compute-bound
def test_ordered_is_copy_plus_compute_and_pipelined_is_max_plus_exposure(h2d_gbps):  # type: ignore[no-untyped-def]
    times = {}
    for depth in (0, 1):
        point = _dense_point(h2d_gbps, depth)
        _, _, stats, _ = run_recorded(point, graphs=_no_small_inputs)
        times[depth] = stats[0].total_s
    point = _dense_point(h2d_gbps, 0)
    g = next(_no_small_inputs(point))
    per_copy = [sum(i.nbytes for i in s.staged) / (h2d_gbps * 1e9) for s in g.splits if s.staged]
    per_compute = [s.compute_s for s in g.splits if s.staged]
    copy, compute = sum(per_copy), sum(per_compute)
    assert times[0] == pytest.approx(copy + compute, rel=0.01)
    exposure = per_copy[0] if compute >= copy else per_compute[-1]
    assert times[1] == pytest.approx(max(copy, compute) + exposure, rel=0.01)


# ------------------------------------------------- the reference's checks


def test_each_staged_byte_delivered_once_into_disjoint_entries_inside_the_ring(rtx4070):  # type: ignore[no-untyped-def]
    point = Point(reference_workload(4096, tokens=3), rtx4070, TransportConfig(depth=2, budget_mib=0))
    rec, sched, stats, _ = run_recorded(point)
    ring = sched.rings[0]
    assert ring.buffer is not None
    graphs = list(graphs_for(point))
    copies = [c for c in rec.of("copy") if c.detail[1] is ring.buffer]
    per_graph = len(copies) // len(graphs)
    for gi, g in enumerate(graphs):
        mine = copies[gi * per_graph : (gi + 1) * per_graph]
        src = sorted((r.src_offset, r.src_offset + r.nbytes) for c in mine for r in c.detail[3] if r.nbytes)
        want = sorted((p.src_offset, p.src_offset + p.nbytes) for s in g.staged_splits for i in s.staged for p in i.pieces)
        merged: list[list[int]] = []
        for lo, hi in src:  # adjacent early+late pieces merge; any overlap is a double delivery
            assert not merged or lo >= merged[-1][1], f"byte {lo} delivered twice"
            if merged and lo == merged[-1][1]:
                merged[-1][1] = hi
            else:
                merged.append([lo, hi])
        want_merged: list[list[int]] = []
        for lo, hi in want:
            if want_merged and lo == want_merged[-1][1]:
                want_merged[-1][1] = hi
            else:
                want_merged.append([lo, hi])
        assert merged == want_merged
        assert sum(hi - lo for lo, hi in src) == sum(hi - lo for lo, hi in want)
        # per delivery: early (transfer) + late (consumer) pieces lie inside slot o mod n and overlap nothing
        early = [c for c in mine if c.target.startswith("delivery")]
        late = [c for c in mine if c.target == "late"]
        assert len(early) == len(late) == len(g.staged_splits)
        for o, (e, lt) in enumerate(zip(early, late, strict=True)):
            lo, hi = (o % ring.n_slots) * ring.slot_alloc_bytes, (o % ring.n_slots + 1) * ring.slot_alloc_bytes
            dst = sorted((r.dst_offset, r.dst_offset + r.nbytes) for r in (*e.detail[3], *lt.detail[3]))
            assert all(lo <= a and b <= hi for a, b in dst)
            assert all(a[1] <= b[0] for a, b in zip(dst, dst[1:], strict=False))
            for r in lt.detail[3]:  # the late part continues its entry right where the early part stopped
                assert any(x.src_offset + x.nbytes == r.src_offset and x.dst_offset + x.nbytes == r.dst_offset for x in e.detail[3])


def test_every_wait_follows_a_record_of_its_event(rtx4070):  # type: ignore[no-untyped-def]
    point = Point(reference_workload(4096, tokens=3), rtx4070, TransportConfig(depth=1, budget_mib=0))
    rec, _, _, _ = run_recorded(point)
    recorded: set[str] = set()
    waits = 0
    for c in rec.calls:
        if c.op == "record":
            recorded.add(c.target)
        elif c.op in ("wait_event", "wait_host"):
            waits += 1
            assert c.target in recorded, f"wait on {c.target} before any record"
    assert waits > 0


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_delivery_o_issued_right_after_enqueue_of_staged_split_o_minus_n_minus_1(rtx4070, depth):  # type: ignore[no-untyped-def]
    point = Point(reference_workload(4096, tokens=1), rtx4070, TransportConfig(depth=depth, budget_mib=0))
    rec, sched, _, _ = run_recorded(point)
    launches = staged_launches(rec, sched)
    deliveries = [c for c in rec.of("copy") if c.target.startswith("delivery")]
    assert len(deliveries) == len(launches) == 16
    for o, d in enumerate(deliveries):
        assert d.target == f"delivery{o}"
        if o <= depth:
            assert d.index < launches[0].index  # primed at graph start
        else:
            assert launches[o - depth - 1].index < d.index < launches[o - depth].index


def test_no_slot_written_before_its_release_fired(rtx4070):  # type: ignore[no-untyped-def]
    point = Point(reference_workload(16384, tokens=3), rtx4070, TransportConfig(depth=1, budget_mib=0))
    _, sched, _, machine = run_recorded(point)
    n = sched.rings[0].n_slots
    spans = machine.timeline()
    kernels = [s for s in spans if s.track == "consumer0" and s.name.startswith("gpu_attn")]
    deliveries = [s for s in spans if s.track == "transfer0" and s.name.startswith("delivery")]
    assert len(kernels) == len(deliveries) == 48
    for i, d in enumerate(deliveries):
        if i >= n:
            prev_reader = kernels[i - n]  # the staged split that last used this slot
            assert prev_reader.end_s <= d.start_s + 1e-12
        assert kernels[i].start_s >= d.end_s - 1e-12  # a split runs only after its delivery landed


def test_depth_zero_creates_no_transfer_stream_and_no_events(rtx4070):  # type: ignore[no-untyped-def]
    point = Point(reference_workload(4096), rtx4070, TransportConfig(depth=0))
    rec, sched, stats, _ = run_recorded(point)
    assert [c.target for c in rec.of("create_stream")] == ["consumer0"]
    assert not rec.of("create_event") and not sched.rings
    assert all(s.deliveries == 0 and s.early_bytes == 0 for s in stats)


def _positions(point: Point, positions: list[int]) -> Iterator[DecodeGraph]:
    compute = point.hardware.devices[0].compute
    for i, pos in enumerate(positions):
        yield decode_graph(point.workload, compute, position=pos, token=i)


def test_budget_decline_then_recovery_with_a_smaller_window(rtx4070):  # type: ignore[no-untyped-def]
    wl = reference_workload(4096, ctx_size=32768)
    point = Point(wl, rtx4070, TransportConfig(depth=1, budget_mib=128))
    _, _, stats, _ = run_recorded(point, graphs=lambda p: _positions(p, [4096, 30000, 30001, 4100]))
    assert [s.declined for s in stats] == [False, True, True, False]
    assert [s.deliveries > 0 for s in stats] == [True, False, False, True]
    assert "budget" in stats[1].decline_reason


def test_idle_graphs_keep_then_release_the_ring_but_keep_the_transfer_stream(rtx4070):  # type: ignore[no-untyped-def]
    # Graph 0 uses the ring, graphs 1-6 decline it (their window is over the budget), graph 7 uses it again. The ring
    # is freed once, in the graph that ends idle_release_graphs idle graphs -- one graph later per graph more --, then
    # allocated again; the transfer stream is created once and kept.
    positions = [4096] + [30000] * 6 + [4200]
    freed_in = {}
    for idle in (1, 2, 4):
        point = Point(reference_workload(4096, ctx_size=32768), rtx4070,
                      TransportConfig(depth=1, budget_mib=128, idle_release_graphs=idle))
        machine = SimMachine(point.hardware)
        rec = Recorder(machine)

        def marked(p: Point, rec: Recorder = rec) -> Iterator[DecodeGraph]:
            for i, g in enumerate(_positions(p, positions)):
                rec._log("graph", str(i))  # logged when the scheduler takes the graph
                yield g

        _, stats = machine.run(run_decode(rec, point, graphs=marked))
        ring_frees = [c.index for c in rec.of("free") if c.target == "ring0"]
        assert len(ring_frees) == 1 and len([c for c in rec.of("alloc") if c.target == "ring0"]) == 2
        freed_in[idle] = sum(1 for c in rec.calls if c.op == "graph" and c.index < ring_frees[0])
        assert [c.target for c in rec.of("create_stream")].count("transfer0") == 1
        assert [s.declined for s in stats] == [False] + [True] * 6 + [False] and stats[-1].deliveries == 16
    assert freed_in[2] - freed_in[1] == 1 and freed_in[4] - freed_in[2] == 2


def test_ring_kept_over_one_idle_graph(rtx4070):  # type: ignore[no-untyped-def]
    wl = reference_workload(4096, ctx_size=32768)
    point = Point(wl, rtx4070, TransportConfig(depth=1, budget_mib=128))
    rec, _, stats, _ = run_recorded(point, graphs=lambda p: _positions(p, [4096, 30000, 4097]))
    assert not [c for c in rec.of("free") if c.target == "ring0"]
    assert stats[2].deliveries == 16


def test_reservation_failure_falls_back_ordered_once_and_stays_ordered(rtx4070):  # type: ignore[no-untyped-def]
    # Room for the ring or for the graph next to one window, not for both.
    wl = reference_workload(4096, tokens=3)
    ring = 3 * 4352 * 2176
    free_mib = (ring + 8 * MIB) / MIB
    hw = fast_profile(rtx4070, 24.0, memory_free_mib=free_mib)
    point = Point(wl, hw, TransportConfig(depth=1, budget_mib=0, headroom_mib=0))
    _, sched, stats, _ = run_recorded(point)
    assert stats[0].declined and "reservation failed" in stats[0].decline_reason
    assert all(s.deliveries == 0 for s in stats)
    assert sched.rings[0].frozen_ordered and sched.rings[0].buffer is None
    ordered = run_point(Point(wl, hw, TransportConfig(depth=0)), checked=False, warmup=0)
    assert stats[-1].total_s == pytest.approx(ordered.graphs[-1].total_s, rel=1e-6)


def test_backend_without_events_keeps_that_device_ordered(rtx4070):  # type: ignore[no-untyped-def]
    class NoEvents(SimMachine):
        def create_event(self, device: int, name: str):  # type: ignore[no-untyped-def]
            raise BackendError("no events on this device")

    point = Point(reference_workload(4096), rtx4070, TransportConfig(depth=1, budget_mib=0))
    machine = NoEvents(rtx4070)
    rec, sched, stats, _ = run_recorded(point, machine=machine)
    assert all(s.deliveries == 0 and s.declined for s in stats)
    assert len(rec.of("create_event")) == 1  # asked once, not on every graph


def test_headroom_declines_a_ring_the_card_cannot_keep(rtx4070):  # type: ignore[no-untyped-def]
    r = row(run_point(Point(reference_workload(262144 - 1, tokens=1), rtx4070, TransportConfig(depth=1, budget_mib=0)),
                      checked=False, warmup=0))
    assert r["declined"] and "headroom" in r["decline_reason"]


def test_late_part_rides_the_consumer_stream_and_early_the_transfer_stream(rtx4070):  # type: ignore[no-untyped-def]
    point = Point(reference_workload(4000, tokens=1), rtx4070, TransportConfig(depth=1, budget_mib=0))
    rec, _, stats, _ = run_recorded(point)
    late = [c for c in rec.of("copy") if c.target == "late"]
    early = [c for c in rec.of("copy") if c.target.startswith("delivery")]
    assert late and all(c.detail[0] == "consumer0" for c in late)
    assert early and all(c.detail[0] == "transfer0" for c in early)
    rows_late = 4096 - 4000  # window 4,096 rows, rows 4,000.. written or padding
    assert stats[0].late_bytes == 16 * rows_late * 2176
    assert stats[0].early_bytes == 16 * 4000 * 2176


def test_copy_outside_a_buffer_is_refused(rtx4070):  # type: ignore[no-untyped-def]
    m = SimMachine(rtx4070)
    host = m.alloc_host(100, "h")
    dev = m.alloc(0, 100, "d")
    s = m.create_stream(0, "s")

    def prog():  # type: ignore[no-untyped-def]
        yield from m.copy(s, dev, host, [CopyRange(50, 0, 60)])

    with pytest.raises(BackendError, match="outside"):
        m.run(prog())
