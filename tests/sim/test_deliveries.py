"""The pure delivery planner: slots, early and late ranges, bindings -- with no backend at all."""

from __future__ import annotations

from backends.profile import load_profile
from sim.graph import decode_graph
from sim.transport.deliveries import plan_deliveries, slot_entries, span_fn
from tests.conftest import reference_workload


def _plan(context: int = 16384, n_slots: int = 3, one_cell: bool = False, **kw: object):  # type: ignore[no-untyped-def]
    wl = reference_workload(context, **kw)  # type: ignore[arg-type]
    g = decode_graph(wl, load_profile("rtx4070-gen4x16").devices[0].compute, step=0)
    span = span_fn(True, 256)
    order = list(g.staged_splits)
    need, entries = slot_entries(order, span)

    def early_of(inp, i, prefix, nbytes):  # type: ignore[no-untyped-def]
        p = inp.pieces[i]
        e = min(prefix, nbytes)
        return e // p.width * p.width if p.rows > 1 else e

    return g, order, need, plan_deliveries(order, entries, n_slots, lambda s: s * need, span, early_of, one_cell)


def test_delivery_o_is_staged_split_o_in_slot_o_mod_n() -> None:
    g, order, need, ds = _plan(n_slots=3)
    assert [d.split for d in ds] == [s.index for s in order]
    assert [d.slot for d in ds] == [o % 3 for o in range(len(order))]
    assert all(d.base == d.slot * need for d in ds)


def test_early_then_late_cover_every_window_byte_once_inside_its_slot() -> None:
    g, order, need, ds = _plan()
    for d, split in zip(ds, order, strict=True):
        window = sum(inp.nbytes for inp in split.staged)
        assert d.early_bytes + d.late_bytes == window
        assert d.late_bytes > 0 and d.early_bytes > d.late_bytes  # the fresh rows go late, the prefix early
        for r in d.early + d.late:
            assert d.base <= r.dst_offset and r.dst_offset + r.nbytes <= d.base + need
        # each late range starts where its piece's early range ended
        assert sorted(r.dst_offset for r in d.early + d.late) == sorted({r.dst_offset for r in d.early + d.late})
        names = {name for name, _, _ in d.windows}
        assert names == {f"window:{inp.name}" for inp in split.staged}


def test_several_streams_bind_each_stream_and_one_cell_ranges_lose_the_rest_of_the_prefix() -> None:
    kw = dict(context=(4096, 4096), n_parallel=2, unified=False)
    _, order, _, ds = _plan(context=4096, **{k: v for k, v in kw.items() if k != "context"})
    assert any(name.endswith("#1") for d in ds for name, _, _ in d.windows)
    _, _, _, cut = _plan(context=4096, one_cell=True, **{k: v for k, v in kw.items() if k != "context"})
    for a, b in zip(ds, cut, strict=True):
        assert b.late == a.late and b.early_bytes < a.early_bytes  # the late part still starts at the full prefix
