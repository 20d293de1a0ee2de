"""The fast graph builder (kept window tables, values built by filling ``__dict__``) gives the graphs a plain one would.

Each random point's graph is checked against a reference built by the straightforward path -- every window piece
and new row from ``CacheLayout``'s own offsets, every value re-made by its dataclass's constructor, the GPU splits'
seconds from the compute model in the builder's order -- and against the graph's invariants: built cold (every kept
table emptied) or warm it is the same graph, and equal window layouts share a layout id while other layouts do not.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.graph_windows as graph_mod
from backends.profile_types import ComputeModel
from sim.graph import DecodeGraph, decode_graph, head_ranges, layout_of
from sim.graph_parts import SmallInput, Split, StagedInput, WindowPiece
from sim.workload import Workload, cache_type, load_model, model_preset_names

MODELS = {n: load_model(n) for n in model_preset_names()}
TYPES = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0")]
COMPUTE = ComputeModel(layer_s=1.1e-5, weight_bytes_per_s=9e11, attn_s=2.3e-6, attn_bytes_per_s=1.7e12, head_s=9e-5,
                       cpu_split_s=3e-6, host_attn_s=4e-6, host_attn_bytes_per_s=6e10, layer_seq_s=1.3e-7, attn_seq_s=7e-8,
                       cpu_row_s=2e-7, host_layer_s=5e-6, host_weight_bytes_per_s=4e10)


@st.composite
def points(draw: st.DrawFn) -> tuple[Workload, int, int, bool]:
    """(workload, devices, step, host attention) over every preset, cache types, sequences, placements, split modes."""
    m = MODELS[draw(st.sampled_from(sorted(MODELS)))]
    ck, cv = draw(st.sampled_from(TYPES))
    n_par = draw(st.sampled_from([1, 1, 2, 3, 5]))
    ctx = draw(st.lists(st.integers(1, 40000), min_size=1, max_size=1)) if n_par == 1 or draw(st.booleans()) \
        else draw(st.lists(st.integers(1, 40000), min_size=n_par, max_size=n_par))
    mode = draw(st.sampled_from(["none", "none", "layer", "tensor"]))
    n_dev = 1 if mode == "none" else draw(st.integers(1, 3))
    split = tuple(draw(st.lists(st.sampled_from([0.0, 1.0, 3.0]), min_size=n_dev, max_size=n_dev)))
    kv_gpu = 0 if mode == "tensor" else draw(st.sampled_from([0, 0, 1, m.n_attn // 2, m.n_attn]))
    ngl = 999 if kv_gpu else draw(st.sampled_from([999, 999, m.n_layers - 1, m.n_layers // 2]))
    wl = Workload(m, cache_type(ck), cache_type(cv), tuple(ctx), n_parallel=n_par, unified=draw(st.booleans()),
                  split_mode=mode, tensor_split=split if sum(split) else (), n_gpu_layers=ngl, kv_gpu_layers=kv_gpu)
    return wl, n_dev, draw(st.integers(0, 3)), kv_gpu == 0 and draw(st.booleans()) and draw(st.booleans())


def _remade(value: object) -> object:
    """``value`` rebuilt through its class's own constructor (all fields, recursively)."""
    if isinstance(value, WindowPiece):
        return WindowPiece(*value)  # its checks run
    if isinstance(value, tuple):
        return tuple(_remade(v) for v in value)
    if isinstance(value, (Split, SmallInput, StagedInput)):
        return type(value)(**{f.name: _remade(getattr(value, f.name)) for f in dataclasses.fields(value)})
    return value


def _check_against_reference(wl: Workload, g: DecodeGraph, n_dev: int, step: int, host_attention: bool) -> None:
    layout, model = layout_of(wl), wl.model
    writes = wl.writes(step)
    assert g.positions == tuple(r for _, r in writes)
    assert [s.index for s in g.splits] == list(range(len(g.splits)))
    lowest = {s: min(r for st_, r in writes if st_ == s) for s, _ in writes}
    tensor = wl.split_mode == "tensor" and n_dev > 1
    heads = head_ranges(model.n_head_kv, wl.tensor_split, n_dev) if tensor else [None]
    for s in g.splits:
        assert _remade(s) == s and repr(_remade(s)) == repr(s)  # the fast-built value is the constructor's
        for inp in (*s.staged, *s.resident):
            j = model.attn_layers.index(inp.layer)
            kind = inp.name[6]
            hr = heads[s.device] if s.staged and tensor else None
            row_b = layout.k_row_bytes if kind == "k" else layout.v_row_bytes
            offset = layout.k_offset if kind == "k" else layout.v_offset
            width = row_b if hr is None else (hr[1] - hr[0]) * (row_b // model.n_head_kv)
            for stream, p in enumerate(inp.pieces):
                start = offset(j, stream, 0) + (0 if hr is None else hr[0] * (row_b // model.n_head_kv))
                prefix = min(g.window_rows, lowest.get(stream, g.window_rows))
                strided = (g.window_rows, row_b) if hr else (1, 0)
                assert p == (start, g.window_rows * width, prefix * width, *strided, layout.cells_per_stream * width, width)
        for r in (*s.ordered, *s.resident_rows):
            if r.name[1:6] == "_cur_" and r.name[0] in "kv":
                j = model.attn_layers.index(int(r.name.split("_l")[1]))
                offset = layout.k_offset if r.name[0] == "k" else layout.v_offset
                assert [o for o, _ in r.rows] == [offset(j, *w) for w in writes]
        if s.kind == "gpu" and not tensor and not s.resident:  # every device has COMPUTE
            c = COMPUTE
            secs = len(s.layers) * c.layer_seconds(model.layer_weight_bytes)
            if s.staged:
                secs += c.attention_seconds(sum(i.nbytes for i in s.staged))
            secs += c.batch_seconds(len(writes), len(s.layers), s.attn_layer >= 0)
            if s is g.splits[-1]:
                secs += c.head_s
            assert s.compute_s == secs


def _layout_ids_name_layouts(graphs: list[DecodeGraph]) -> None:
    """Equal piece layouts (every field but the prefix) share an id; different layouts never do."""
    by_id: dict[int, set[object]] = {}
    by_layout: dict[object, set[int]] = {}
    for g in graphs:
        for s in g.splits:
            for inp in (*s.staged, *s.resident):
                lay = tuple((p.src_offset, p.nbytes, p.rows, p.src_pitch, p.reserve_bytes, p.cell_bytes) for p in inp.pieces)
                by_id.setdefault(inp.layout_id, set()).add(lay)
                by_layout.setdefault(lay, set()).add(inp.layout_id)
    assert all(len(v) == 1 for v in by_id.values()) and all(len(v) == 1 for v in by_layout.values())


def _without_ids(g: DecodeGraph) -> str:
    return re.sub(r"layout_id=\d+", "", repr(g))


def _empty_kept_tables() -> None:
    graph_mod._WINDOWS.clear()
    graph_mod._ID_BLOCKS.clear()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(points())
def test_random_points_build_the_reference_graph(case: tuple[Workload, int, int, bool]) -> None:
    wl, n_dev, step, host_attention = case
    computes = (COMPUTE,) * n_dev
    warm = [decode_graph(wl, computes, step=k, token=k, n_devices=n_dev, host_attention=host_attention) for k in range(step + 1)]
    _empty_kept_tables()
    cold = decode_graph(wl, computes, step=step, token=step, n_devices=n_dev, host_attention=host_attention)
    assert cold == warm[-1] and _without_ids(cold) == _without_ids(warm[-1])  # ids differ: the kept ones were dropped
    _check_against_reference(wl, cold, n_dev, step, host_attention)
    _layout_ids_name_layouts(warm)


def test_a_hand_checked_graph() -> None:
    """llama-3.1-8b, f16 K and V (8 KV heads x 128: 2,048 B a row), context 1,000: the first token writes row 1,000,
    the window is 1,024 rows (1,001 padded to 256), the cache 1,024 cells (1,000 + 4 tokens, padded); 32 attention layers."""
    wl = Workload(MODELS["llama-3.1-8b"], cache_type("f16"), cache_type("f16"), (1000,))
    g = decode_graph(wl, COMPUTE, step=0)
    assert (g.window_rows, g.full_window_rows, g.positions) == (1024, 1024, (1000,))
    assert len(g.splits) == 1 + 2 * 32 and [s.kind for s in g.splits[:3]] == ["gpu", "cpu", "gpu"]
    cpu, attn = g.splits[1], g.splits[2]
    assert (cpu.name, attn.name, attn.attn_layer) == ("cpu_rows_l0", "gpu_attn_l0", 0)
    k, v = attn.staged
    assert k.pieces == (WindowPiece(0, 1024 * 2048, 1000 * 2048, 1, 0, 1024 * 2048, 2048),)
    assert v.pieces == (WindowPiece(1024 * 2048, 1024 * 2048, 1000 * 2048, 1, 0, 1024 * 2048, 2048),)
    assert [(r.name, r.host_offset, r.nbytes) for r in cpu.ordered] == [("k_cur_l0", 1000 * 2048, 2048),
                                                                          ("v_cur_l0", (1024 + 1000) * 2048, 2048)]
    layer_1 = g.splits[4].staged[0]
    assert layer_1.pieces[0].src_offset == 2 * 1024 * 2048 and layer_1.layout_id not in (k.layout_id, v.layout_id)
    again = decode_graph(wl, COMPUTE, step=1)
    assert again.splits[4].staged[0].layout_id == layer_1.layout_id  # the same window size: the same layout
    assert again.splits[4].staged[0].pieces[0].prefix_bytes == 1001 * 2048


def test_a_negative_prefix_still_raises() -> None:
    wl = Workload(MODELS["llama-3.1-8b"], cache_type("f16"), cache_type("f16"), (1000,))
    with pytest.raises(ValueError, match="prefix -2048 outside 0..2097152"):
        decode_graph(wl, COMPUTE, step=0, prefix_row=-1)
