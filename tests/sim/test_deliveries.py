"""The pure delivery planner: slots, early and late ranges, bindings -- with no backend at all."""

from __future__ import annotations

import numpy as np
import pytest

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


def _copy_into(slot_bytes: np.ndarray, base: int, ranges, host_of) -> None:  # type: ignore[no-untyped-def]
    """Apply ``ranges`` to the slot starting at ``base`` as a copy engine would: each destination byte gets its source
    byte's id. A range reaching outside the slot fails the test."""
    for r in ranges:
        dst = r.dst_offset - base
        assert 0 <= dst and dst + r.nbytes <= len(slot_bytes), f"{r} writes outside its slot"
        for src, n in r.src_rows():
            slot_bytes[dst:dst + n] = host_of(src, n)
            dst += n


def _piece_bytes(p) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The host byte offsets of piece ``p`` in the order the kernels read them (row by row for a strided piece)."""
    w = p.nbytes // p.rows
    return np.concatenate([np.arange(p.src_offset + i * p.src_pitch, p.src_offset + i * p.src_pitch + w) for i in range(p.rows)])


@pytest.mark.parametrize("kw", [{"context": 1024}, {"context": (512, 512), "n_parallel": 2, "unified": False}],
                         ids=["one-seq", "two-streams"])
def test_early_then_late_deliver_each_window_byte_once_the_prefix_early_and_the_fresh_rows_late(kw) -> None:  # type: ignore[no-untyped-def]
    # Byte-level: copy every range of every delivery into a slot image whose bytes record which host byte they hold;
    # the kernels' window binding must then read the window's host bytes in order, the stable prefix of each piece
    # must have arrived early, the rows written this step late, and nothing outside the slot is touched.
    kw = dict(kw)
    ctx = kw.pop("context")
    g, order, need, ds = _plan(context=ctx[0] if isinstance(ctx, tuple) else ctx, **kw)
    for d, split in zip(ds, order, strict=True):
        image = np.full(need, -1, dtype=np.int64)  # the delivery's own slot
        came = np.zeros(need, dtype=np.int8)  # 1: early, 2: late
        _copy_into(image, d.base, d.early, lambda src, n: np.arange(src, src + n))
        came[image >= 0] = 1
        before = image.copy()
        _copy_into(image, d.base, d.late, lambda src, n: np.arange(src, src + n))
        came[(image != before)] = 2
        bound = {name: (off, n) for name, off, n in d.windows}
        for inp in split.staged:
            off, _ = bound[f"window:{inp.name}"]
            pos = off - d.base
            for p in inp.pieces:
                want = _piece_bytes(p)
                assert (image[pos:pos + p.nbytes] == want).all(), f"{inp.name}: the kernels would read other bytes"
                prefix = p.prefix_bytes if p.rows == 1 else p.prefix_bytes // p.width * p.width
                assert (came[pos:pos + prefix] == 1).all(), "a stable-prefix byte was not delivered early"
                assert (came[pos + prefix:pos + p.nbytes] == 2).all(), "a fresh row was not delivered late"
                assert p.nbytes > prefix, "a decode step writes at least one fresh row into every window"
                pos += span_fn(True, 256)(p.nbytes, p.reserve_bytes)


def test_several_streams_bind_each_stream_and_one_cell_ranges_lose_the_rest_of_the_prefix() -> None:
    kw = dict(context=(4096, 4096), n_parallel=2, unified=False)
    _, order, _, ds = _plan(context=4096, **{k: v for k, v in kw.items() if k != "context"})
    assert any(name.endswith("#1") for d in ds for name, _, _ in d.windows)
    _, _, _, cut = _plan(context=4096, one_cell=True, **{k: v for k, v in kw.items() if k != "context"})
    for a, b in zip(ds, cut, strict=True):
        assert b.late == a.late and b.early_bytes < a.early_bytes  # the late part still starts at the full prefix
