"""Parallel sequences and several devices: per-stream ranges, packing, prefixes, layer and tensor split."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.profile import load_profile
from sim.graph import decode_graph, head_ranges, layout_of
from sim.rows import row
from sim.run.point import Point, graphs_for
from sim.run.run import run_point
from sim.transport.scheduler import MIB, TransportConfig, align_up
from sim.workload import Workload, cache_type, load_model
from tests.sim.test_scheduler import run_recorded

Q8 = cache_type("q8_0")


def split_cache(contexts: tuple[int, ...], tokens: int = 2, ctx_size: int = 32768, **kw) -> Workload:  # type: ignore[no-untyped-def]
    return Workload(load_model("qwen3.8-27b"), Q8, Q8, contexts, tokens=tokens, ctx_size=ctx_size,
                    n_parallel=len(contexts) if len(contexts) > 1 else kw.pop("n_parallel", 8), unified=False, **kw)


def test_each_stream_window_covered_once_from_its_own_offset_and_gaps_never_moved(rtx4070):  # type: ignore[no-untyped-def]
    wl = split_cache((2048,) * 4 + (1000,) * 4, tokens=1)
    point = Point(wl, rtx4070, TransportConfig(depth=1, budget_mib=0))
    rec, sched, stats, _ = run_recorded(point)
    layout = layout_of(wl)
    ring = sched.rings[0].buffer
    assert ring is not None
    g = next(graphs_for(point))
    moved = sorted((r.src_offset, r.src_offset + r.nbytes) for c in rec.of("copy") if c.detail[1] is ring for r in c.detail[3])
    for j in range(wl.model.n_attn):
        for s in range(wl.n_streams):
            lo = layout.k_offset(j, s, 0)
            covered = sum(min(hi, lo + g.window_rows * 1088) - max(a, lo) for a, hi in moved if a < lo + g.window_rows * 1088 and hi > lo)
            assert covered == g.window_rows * 1088  # exactly once
            gap_lo, gap_hi = lo + g.window_rows * 1088, layout.k_offset(j, s, layout.cells_per_stream)
            assert not any(a < gap_hi and hi > gap_lo for a, hi in moved)  # cells between windows never moved
    assert stats[0].ordered_bytes < 1 * MIB


def test_packed_stride_is_the_window_padded_and_unpacked_reserves_the_stream_stride(rtx4070):  # type: ignore[no-untyped-def]
    wl = split_cache((2048,), n_parallel=8, tokens=128)
    packed = run_point(Point(wl, rtx4070, TransportConfig(depth=1, budget_mib=128)), checked=False, warmup=0)
    unpacked = run_point(Point(wl, rtx4070, TransportConfig(depth=1, budget_mib=128, pack_streams=False)), checked=False, warmup=0)
    window = 2304 * 1088  # 2,048 + 128 rows padded to 256, K of one stream
    slot = 2 * 8 * align_up(window, 256)
    assert packed.graphs[0].slot_need_bytes == slot  # 38.25 MiB: 8 streams x 2,304 rows x 2,176 B (K+V)
    assert packed.graphs[0].ring_need_bytes == 3 * packed.graphs[0].slot_need_bytes  # N + 2 slots at depth 1
    assert packed.graphs[0].ring_need_bytes / MIB == pytest.approx(114.75)
    assert packed.graphs[0].slot_alloc_bytes / MIB == pytest.approx(128 / 3, abs=0.01)  # capped at the budget share
    assert not any(s.declined for s in packed.graphs)
    assert unpacked.graphs[0].slot_need_bytes == 2 * 8 * 4096 * 1088  # each stream's whole stride: 68 MiB
    assert unpacked.graphs[0].ring_need_bytes / MIB == pytest.approx(204.0)
    assert all(s.declined and s.deliveries == 0 for s in unpacked.graphs)


def test_ordered_path_of_a_split_cache_moves_n_streams_windows_not_the_span(rtx4070):  # type: ignore[no-untyped-def]
    wl = split_cache((2048,), n_parallel=8, tokens=1)
    r = run_point(Point(wl, rtx4070, TransportConfig(depth=0)), checked=False, warmup=0)
    windows = 16 * 8 * 2304 * 2176
    assert windows <= r.graphs[0].ordered_bytes < windows + 1 * MIB


def test_per_stream_prefix_keeps_the_others_early_after_one_sequence_resets(rtx4070):  # type: ignore[no-untyped-def]
    contexts = (2048, 12, 2048, 2048, 2048, 2048, 2048, 2048)
    per_stream = run_point(Point(split_cache(contexts, tokens=1), rtx4070, TransportConfig(depth=1)), checked=False, warmup=0)
    flat = run_point(Point(split_cache(contexts, tokens=1, flat_prefix=True), rtx4070, TransportConfig(depth=1)), checked=False, warmup=0)
    total = 16 * 8 * 2304 * 2176
    p, f = per_stream.graphs[0], flat.graphs[0]
    assert p.early_bytes + p.late_bytes == f.early_bytes + f.late_bytes == total
    assert p.early_bytes == 16 * (7 * 2048 + 12) * 2176  # every stream keeps its own prefix
    assert f.early_bytes == 16 * 2048 * 2176  # one flat prefix: stream 0 writes first, everything above it goes late
    assert p.early_bytes > 6 * f.early_bytes


def test_prefix_past_a_streams_bytes_counts_as_the_whole_window_only():  # type: ignore[no-untyped-def]
    wl = split_cache((2048,), n_parallel=2, tokens=1)
    g = decode_graph(wl, load_profile("rtx4070-gen4x16").devices[0].compute, step=0, prefix_row=10**6)
    for inp in g.staged_splits[0].staged:
        for p in inp.pieces:
            assert p.prefix_bytes == p.nbytes  # clamped to the stream, never spilling into the next


def test_equal_ranges_go_as_one_2d_copy():  # type: ignore[no-untyped-def]
    from backends.base import CopyRange
    from backends.profile import LinkCurve
    from backends.simpy_machine import copy_seconds

    link = LinkCurve((1.0,), (10e9,), 10e-6)
    same = [CopyRange(i * 1000, i * 500, 400) for i in range(8)]
    ragged = [CopyRange(i * 1000, i * 500, 400 + i) for i in range(8)]
    assert copy_seconds(link, same) == pytest.approx(10e-6 + 3200 / 10e9)
    assert copy_seconds(link, ragged) == pytest.approx(8 * 10e-6 + sum(400 + i for i in range(8)) / 10e9)


def test_unified_cache_is_one_range_and_budget_covers_all_sequences(rtx4070):  # type: ignore[no-untyped-def]
    wl = Workload(load_model("qwen3.8-27b"), Q8, Q8, (2048,), tokens=1, n_parallel=8, unified=True)
    g = next(graphs_for(Point(wl, rtx4070, TransportConfig())))
    assert all(len(i.pieces) == 1 for s in g.staged_splits for i in s.staged)
    assert g.window_rows == 16640  # 8 x 2,048 prompts + 8 new rows, padded
    r = row(run_point(Point(wl, rtx4070, TransportConfig(depth=1)), checked=False, warmup=0))
    assert r["ring_mib"] == pytest.approx(3 * 16640 * 2176 / MIB)
    assert r["parallel"] == 8


# ------------------------------------------------------------ several devices


def pair() -> object:
    return load_profile("rtx4070-gen4x16+rtx3060-gen3x4")


def test_layer_split_gives_each_device_its_ring_stream_and_link():  # type: ignore[no-untyped-def]
    hw = pair()
    wl = Workload(load_model("qwen3.8-27b-q5km"), Q8, Q8, (4096,), tokens=1, split_mode="layer")
    point = Point(wl, hw, TransportConfig(depth=1, budget_mib=128))
    rec, sched, stats, machine = run_recorded(Point(wl, _placed(point), point.transport))
    assert set(sched.rings) == {0, 1} and all(r.buffer is not None for r in sched.rings.values())
    streams = {c.target for c in rec.of("create_stream")}
    assert {"consumer0", "consumer1", "transfer0", "transfer1"} <= streams
    tracks = {s.track for s in machine.timeline()}
    assert {"h2d0", "h2d1"} <= tracks
    handoffs = [c for c in rec.of("copy") if c.target.startswith("act_from")]
    assert handoffs  # activations cross from one device to the next
    devs = wl.devices_of_layers(2)
    assert devs[0] == 0 and devs[-1] == 1 and sorted(set(devs)) == [0, 1]


def _placed(point: Point):  # type: ignore[no-untyped-def]
    from sim.run.point import placed_hardware

    return placed_hardware(point)


def test_a_device_without_room_for_its_ring_falls_back_alone():  # type: ignore[no-untyped-def]
    hw = pair()
    d1 = hw.devices[1]
    small = replace(d1, memory_total_bytes=d1.memory_reserved_bytes + 9 * 2**30 + 560 * MIB, memory_used_bytes=d1.memory_reserved_bytes)
    hw = replace(hw, devices=(hw.devices[0], small))
    wl = Workload(load_model("qwen3.8-27b-q5km"), Q8, Q8, (16384,), tokens=1, split_mode="layer")
    point = Point(wl, hw, TransportConfig(depth=1, budget_mib=0))
    r = run_point(point, checked=False, warmup=0)
    s = r.graphs[0]
    assert s.declined and "device 1" in s.decline_reason and "headroom" in s.decline_reason
    assert s.deliveries > 0  # device 0 still delivers
    staged_on_0 = sum(1 for x in next(graphs_for(point)).staged_splits if x.device == 0)
    assert s.deliveries == staged_on_0


def test_tensor_split_delivers_each_device_only_its_kv_heads_and_slow_link_bounds(rtx4070):  # type: ignore[no-untyped-def]
    hw = pair()
    wl = Workload(load_model("qwen3.8-27b"), Q8, Q8, (4096,), tokens=1, split_mode="tensor")
    g = next(graphs_for(Point(wl, hw, TransportConfig())))
    heads = head_ranges(4, (), 2)
    assert heads == [(0, 2), (2, 4)]
    by_dev = {d: [s for s in g.staged_splits if s.device == d] for d in (0, 1)}
    assert len(by_dev[0]) == len(by_dev[1]) == 16
    p0 = by_dev[0][0].staged[0].pieces[0]
    p1 = by_dev[1][0].staged[0].pieces[0]
    assert p0.rows == p1.rows == 4352 and p0.src_pitch == 1088 and p0.width == p1.width == 544
    assert p1.src_offset - p0.src_offset == 544  # whole heads, side by side in each row
    point = Point(wl, hw, TransportConfig(depth=1, budget_mib=0))
    rec, _, stats, machine = run_recorded(Point(wl, _placed(point), point.transport))
    spans = machine.timeline()
    h2d = {t: sum(s.end_s - s.start_s for s in spans if s.track == t and s.name.startswith("delivery")) for t in ("h2d0", "h2d1")}
    assert h2d["h2d1"] > 5 * h2d["h2d0"]  # the same bytes take 7x longer on the gen3 x4 link
    assert stats[0].total_s >= h2d["h2d1"]  # the slowest link bounds the token


def test_split_mode_needs_several_devices(capsys):  # type: ignore[no-untyped-def]
    from kvpipe.cli import main

    assert main(["simulate", "--split-mode", "layer"]) == 2
    assert "needs several devices" in capsys.readouterr().err


def test_cli_parallel_flags(capsys):  # type: ignore[no-untyped-def]
    import json

    from kvpipe.cli import main

    code = main(["simulate", "--parallel", "2", "--no-kv-unified", "--ctx-size", "16384", "--context", "4000:12",
                 "--depth", "1", "--tokens", "1", "--json"])
    assert code == 0
    r = json.loads(capsys.readouterr().out)[0]
    assert r["contexts"] == [4000, 12] and r["parallel"] == 2 and r["unified"] is False
    assert main(["simulate", "--parallel", "3", "--context", "1:2"]) == 2
    assert "one per sequence" in capsys.readouterr().err


def test_recorder_sees_one_copy_per_stream_group():  # type: ignore[no-untyped-def]
    # A delivery over 8 streams is one copy call holding 8 ranges (one strided 2D copy when equal).
    hw = load_profile("rtx4070-gen4x16")
    wl = split_cache((2048,), n_parallel=8, tokens=1)
    point = Point(wl, hw, TransportConfig(depth=1, budget_mib=0))
    rec, _, _, _ = run_recorded(point)
    deliveries = [c for c in rec.of("copy") if c.target.startswith("delivery")]
    assert len(deliveries) == len({c.target for c in deliveries}) == wl.model.n_attn  # one call per delivery, none per stream
    d = next(c for c in deliveries if c.target == "delivery0")
    assert len(d.detail[3]) == 16  # K and V, one range per stream each
