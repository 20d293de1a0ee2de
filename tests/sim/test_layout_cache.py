"""What is derived from a window's layout alone is kept by layout id: the name and the buffers still decide."""

from __future__ import annotations

from backends.base import Buffer, CopyRange, KeptRanges
from backends.profile import load_profile
from backends.simpy_machine import SimMachine
from sim.graph import StagedInput, WindowPiece, decode_graph
from sim.transport.deliveries import ordered_copy, span_fn, window_parts
from sim.workload import Workload, cache_type, load_model


def test_equal_layouts_share_an_id_and_other_layouts_do_not() -> None:
    q, m = cache_type("q8_0"), load_model("qwen3.8-27b")
    compute = load_profile("rtx4070-gen4x16").devices[0].compute
    wl = Workload(m, q, q, (2048,) * 3, tokens=2, n_parallel=3, unified=False)
    g0, g1 = decode_graph(wl, compute, step=0), decode_graph(wl, compute, step=1)
    a0, a1 = (next(s for s in g.splits if s.staged).staged[0] for g in (g0, g1))
    assert a0.layout_id == a1.layout_id >= 0  # the same window rows: the same layout, another prefix
    assert [p.prefix_bytes for p in a0.pieces] != [p.prefix_bytes for p in a1.pieces]
    other = decode_graph(Workload(m, q, q, (9000,) * 3, tokens=2, n_parallel=3, unified=False), compute, step=0)
    assert next(s for s in other.splits if s.staged).staged[0].layout_id != a0.layout_id


def test_the_kept_bindings_carry_each_inputs_own_name() -> None:
    pieces = (WindowPiece(0, 1024, 512, reserve_bytes=4096, cell_bytes=64), WindowPiece(4096, 1024, 512, reserve_bytes=4096, cell_bytes=64))
    span = span_fn(False, 256)
    a, b = StagedInput("cache_k_l3", 3, pieces, layout_id=10**9), StagedInput("cache_k_l7", 7, pieces, layout_id=10**9)
    assert window_parts(a, 0, span)[0] == (("window:cache_k_l3", 0, 5120),)
    assert window_parts(b, 0, span)[0] == (("window:cache_k_l7", 0, 5120),)  # same layout id, its own name
    assert [n for n, _, _ in window_parts(b, 0, span)[1]] == ["window:cache_k_l7#0", "window:cache_k_l7#1"]
    ranges, spanned = ordered_copy(a, 256, span)
    assert ranges == (CopyRange(0, 256, 1024), CopyRange(4096, 256 + 4096, 1024)) and spanned == 8192
    assert ordered_copy(b, 256, span)[0] is ranges  # kept: one tuple for every token of this window size


def test_a_kept_copy_plan_is_the_plan_of_its_own_buffers() -> None:
    """The machine plans a copy of the same ranges tuple once per pair of buffers: another destination is checked again."""
    m = SimMachine(load_profile("rtx4070-gen4x16"), trace=False)
    host = m.alloc_host(1 << 16, "host")
    big, small = m.alloc(0, 1 << 16, "big"), m.alloc(0, 2048, "small")
    stream = m.create_stream(0, "s")
    ranges = KeptRanges((CopyRange(0, 0, 1024), CopyRange(4096, 4096, 1024)))

    def prog(dst: Buffer) -> object:
        yield from m.copy(stream, dst, host, ranges)
        yield from m.synchronize(stream)

    m.run(prog(big))
    try:
        m.run(prog(small))
    except Exception as exc:  # the kept plan of `big` must not let this one through
        assert "outside" in str(exc)
    else:
        raise AssertionError("a copy past the end of `small` went through on a kept plan")


def test_evenly_spaced_new_rows_are_described_without_a_list_and_land_where_each_sequence_writes() -> None:
    """A CPU split's new rows: one per sequence at ``layout.k_offset(j, stream, row)``, whether the input lists them
    (uneven contexts) or describes them as ``n_rows`` rows ``row_pitch`` apart (a split cache; a unified one's
    neighbouring cells); the checker's row pattern is one access for the even cases."""
    from sim.graph import layout_of

    q, m = cache_type("q8_0"), load_model("qwen3.8-27b")
    compute = load_profile("rtx4070-gen4x16").devices[0].compute
    cases = [((2048,) * 4, False, True), ((2048,) * 4, True, True), ((1000, 2048, 3000, 512), False, False)]
    for contexts, unified, even in cases:
        wl = Workload(m, q, q, contexts, tokens=2, n_parallel=4, unified=unified)
        layout, writes = layout_of(wl), wl.writes(1)
        cpu = [s for s in decode_graph(wl, compute, step=1).splits if s.kind == "cpu"]
        for j, split in enumerate(cpu):
            k, v = split.ordered
            assert [o for o, _ in k.rows] == [layout.k_offset(j, st, r) for st, r in writes]
            assert [o for o, _ in v.rows] == [layout.v_offset(j, st, r) for st, r in writes]
            assert (k.n_rows == 4 and not k.row_offsets) is even
            assert len(k.row_pattern) == (1 if even else len({o for o, _ in k.row_spans}))
