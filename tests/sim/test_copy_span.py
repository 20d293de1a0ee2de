"""--kv-copy span: upstream llama.cpp's ordered copy of a split cache, one extent over the streams with the whole stream
as its stride ((n_streams - 1) x cells_per_stream + window rows), beside the fork's copy of each stream's window."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.errors import InputError
from sim.evaluator import evaluate, in_envelope, row_disagreement
from sim.graph import layout_of
from sim.points import GridSpec, points
from sim.rows import KEY_FIELDS, key_of_row, row
from sim.run.point import Point, graphs_for
from sim.run.run import run_point
from sim.transport.config import TransportConfig
from sim.transport.deliveries import plan_deliveries, slot_entries, span_fn
from sim.workload import Workload, cache_type, load_model
from tests.sim.test_scheduler import run_recorded

Q8 = cache_type("q8_0")


def split(n: int, cells_per_stream: int, context: int = 960, span: bool = True, **kw) -> Workload:  # type: ignore[no-untyped-def]
    return Workload(load_model("llama-3.1-8b"), Q8, Q8, (context,), tokens=2, n_parallel=n, unified=False,
                    ctx_size=n * cells_per_stream, copy_span=span, **kw)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_each_window_is_one_copy_from_stream_0_over_the_whole_strides(rtx4070, n):  # type: ignore[no-untyped-def]
    wl = split(n, 2048)
    rec, sched, _, _ = run_recorded(Point(wl, rtx4070, TransportConfig(depth=0)))
    layout, g = layout_of(wl), next(graphs_for(Point(wl, rtx4070, TransportConfig(depth=0))))
    assert layout.copy_span and g.window_rows == 1024 and layout.cells_per_stream == 2048
    gm = sched.graph_mem[0]
    ranges = [r for c in rec.of("copy") if c.detail[1] is gm for r in c.detail[3] if r.src_offset < layout.nbytes]
    starts = {r.src_offset: r.nbytes for r in ranges}
    for j in range(wl.model.n_attn):  # K, then V: the extent from stream 0's first row to the last stream's window end
        for offset, row_b in ((layout.k_offset, wl.k_row_bytes), (layout.v_offset, wl.v_row_bytes)):
            assert starts[offset(j, 0, 0)] == ((n - 1) * 2048 + 1024) * row_b
    assert len(ranges) == 2 * wl.model.n_attn * 2  # two graphs, one range per window


def test_span_moves_the_formula_s_bytes_more_and_runs_slower(rtx4070):  # type: ignore[no-untyped-def]
    for n, cps in ((2, 2048), (8, 2048), (4, 1536)):
        got = {s: run_point(Point(split(n, cps, span=s), rtx4070, TransportConfig(depth=0)), exact=True).graphs[-1]
               for s in (False, True)}
        kv = {s: got[s].ordered_bytes - got[False].ordered_bytes + n * 1024 * 32 * 2176 for s in (False, True)}
        assert kv[True] / kv[False] == pytest.approx(((n - 1) * cps + 1024) / (n * 1024), rel=1e-12)
        assert got[True].total_s > got[False].total_s


def test_one_stream_or_streams_no_longer_than_the_window_change_nothing(rtx4070):  # type: ignore[no-untyped-def]
    q = load_model("llama-3.1-8b")
    cases = [Workload(q, Q8, Q8, (960,), tokens=2, n_parallel=4, unified=True, ctx_size=16384),  # unified: one stream
             Workload(q, Q8, Q8, (960,), tokens=2),  # one sequence
             split(4, 1024, span=False)]  # streams as long as the window: upstream's extent is the streams' windows
    for wl in cases:
        a, b = (row(run_point(Point(replace(wl, copy_span=s), rtx4070, TransportConfig(depth=0)), exact=True)) for s in (False, True))
        assert a["ms_per_token"] == b["ms_per_token"] and a["ordered_mib"] == b["ordered_mib"]


def test_functional_bytes_exact_under_the_span_copy(rtx4070):  # type: ignore[no-untyped-def]
    wl = Workload(load_model("llama-3.1-8b"), Q8, Q8, (96 * 32, 80 * 32, 100 * 32), tokens=3, n_parallel=3, unified=False,
                  ctx_size=3 * 16384)
    runs = {s: run_point(Point(replace(wl, copy_span=s), rtx4070, TransportConfig(depth=0)), functional=True) for s in (False, True)}
    assert runs[True].extra["output_hash"] == runs[False].extra["output_hash"]
    assert runs[True].extra["hazards"] == runs[False].extra["hazards"] == 0
    assert runs[True].graphs[-1].ordered_bytes > runs[False].graphs[-1].ordered_bytes  # the gaps moved too


def test_no_pipelined_path_a_grid_says_so_and_the_planner_refuses(rtx4070):  # type: ignore[no-untyped-def]
    spec = GridSpec(models=("llama-3.1-8b",), contexts=((960,),), parallels=(8,), depths=(0, 2), unified=False,
                    ctx_size=16384, copy_span=True)
    with pytest.raises(InputError, match="--kv-copy span with --depth 2.*allowed: --depth 0"):
        points(spec)
    assert len(points(replace(spec, depths=(0,)))) == 1
    assert len(points(replace(spec, unified=True))) == 2  # one stream: nothing to span
    g = next(graphs_for(Point(split(8, 2048), rtx4070, TransportConfig(depth=0))))
    span = span_fn(True, 256)
    need, entries = slot_entries(g.staged_splits, span)
    with pytest.raises(ValueError, match="no pipelined delivery"):
        plan_deliveries(g.staged_splits, entries, 3, lambda slot: slot * need, span)


def test_workload_refuses_what_it_does_not_model() -> None:
    with pytest.raises(ValueError, match="kv-gpu-layers 4: the span copy is upstream"):
        split(8, 2048, kv_gpu_layers=4)
    with pytest.raises(ValueError, match="split-mode tensor is not modelled"):
        split(8, 2048, split_mode="tensor")


def test_rows_say_span_the_evaluator_leaves_it_to_the_simulator(rtx4070):  # type: ignore[no-untyped-def]
    ordered, resident = (Point(split(8, 2048), rtx4070, TransportConfig(depth=0, arm=a)) for a in ("transport", "resident"))
    assert "kv-copy span" in (in_envelope(ordered) or "")
    assert in_envelope(resident) is None  # the resident arm copies no window
    got, want = evaluate([resident])[0], row(run_point(resident, exact=True))
    assert row_disagreement(got, want) < 1e-9 and got["kv_copy"] == want["kv_copy"] == "span"
    r = row(run_point(ordered, exact=True))
    assert key_of_row(r)[KEY_FIELDS.index("kv_copy")] == "span"
    old = {k: v for k, v in r.items() if k != "kv_copy"}  # rows of the fork's copy carry no kv_copy field
    assert key_of_row(old)[KEY_FIELDS.index("kv_copy")] == "streams"
