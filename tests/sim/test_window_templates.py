"""Window templates (``sim.evaluator.window_costs``, ``sim.replay_shapes``) give a window's numbers and planning shape
bit for bit as its own decode graph does.

Every point's every token is compared with a reference read straight off that token's graph (``graph_at`` then
``costs._build`` of its deliveries; ``replay.graph_shape``), after the evaluator answered the whole grid with its
caches cleared -- so most windows come from a confirmed template, which each test asserts it used. Dense grids of
contexts (every 128 rows to 16 Ki and near 400 Ki, every model preset, K/V cache types alike and mixed, ``--kv-gpu-layers``, four
machines) and random points (hypothesis); families outside the template's shape (several sequences, ``-ngl``) keep
the graph path; a template that does not reproduce its family's second window is given up.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.evaluator.costs as costs
import sim.replay_shapes as shapes
from sim import replay
from sim.evaluator import clear_caches
from sim.evaluator.window_costs import Template
from sim.points import GridSpec, points
from sim.run.point import Point, clear_graph_cache, graph_at
from sim.transport.deliveries import span_fn
from sim.workload import model_preset_names

HARDWARE = ("rtx4070-gen4x16", "rtx3060-gen3x4", "h200-gen5x16", "gh200-c2c")


def _reference(p: Point, step: int) -> tuple[costs.TokenCosts, tuple[object, ...]]:
    """Step ``step`` of ``p`` read off its own graph: its numbers and its planning shape."""
    graph = graph_at(p, step)
    h2d, d2h, span = costs._links(p)
    align = max(p.hardware.devices[0].alignment_bytes, p.transport.min_alignment_bytes)
    got = costs._build(graph, h2d, d2h, span, costs._deliveries(graph, span, (p.transport.pack_streams, (align,))))
    return got, replay.graph_shape(graph, [span_fn(p.transport.pack_streams, align)], (p.transport.pack_streams, (align,)))


def _check(pts: list[Point]) -> tuple[int, int]:
    """Every token of ``pts`` through the evaluator's caches (templates on), then against its graph: (confirmed cost
    templates, confirmed shape templates) the run used."""
    clear_caches()
    clear_graph_cache()
    made = [costs.point_costs(p) for p in pts]
    made_shapes = [[replay._Line.of(p).shape(k) for k in range(p.workload.tokens)] for p in pts]
    used = (sum(1 for t in costs._TEMPLATES.values() if t and t[2]), sum(1 for t in shapes.TEMPLATES.values() if t and t[1]))
    for p, mine, mine_shapes in zip(pts, made, made_shapes, strict=True):
        for k in range(p.workload.tokens):
            want, want_shape = _reference(p, k)
            got = mine[k]
            assert got.layout is want.layout and got.window_rows == want.window_rows, (p.context, k)
            assert np.array_equal(got.values, want.values), (p.context, k, np.flatnonzero(got.values != want.values))
            assert tuple(getattr(mine_shapes[k], f) for f in replay._Shape.__dataclass_fields__) == want_shape, (p.context, k)
    return used


@pytest.mark.parametrize("model", model_preset_names())
@pytest.mark.parametrize(("cache_k", "cache_v", "kv"), [("q8_0", "", 0), ("f16", "q4_0", 0), ("q8_0", "", 3)])
def test_a_dense_grid_of_windows_matches_the_graphs(model: str, cache_k: str, cache_v: str, kv: int) -> None:
    pts = points(GridSpec(models=(model,), cache_types=(cache_k,), cache_types_v=(cache_v,) if cache_v else (),
                          contexts=tuple((c,) for c in [*range(128, 16385, 128), *range(400_000, 401_025, 128)]), depths=(1,),
                          budgets_mib=(0.0,), tokens=4,
                          kv_gpu_layers=(kv,)))
    assert _check(pts) == (1, 1)  # one family, its template confirmed and used for the other ~70 windows


@st.composite
def _grid(draw: st.DrawFn) -> list[Point]:
    start = draw(st.integers(1, 400_000))
    step = draw(st.sampled_from([1, 7, 128, 255, 256, 1000, 4096]))
    return points(GridSpec(models=(draw(st.sampled_from(model_preset_names())),), hardware=(draw(st.sampled_from(HARDWARE)),),
                           cache_types=(draw(st.sampled_from(["f16", "q8_0", "q4_0"])),),
                           cache_types_v=(draw(st.sampled_from(["f16", "q8_0", "q4_0"])),),
                           contexts=tuple((start + i * step,) for i in range(draw(st.integers(2, 12)))), depths=(1,),
                           budgets_mib=(0.0,), tokens=draw(st.integers(1, 6)), kv_gpu_layers=(draw(st.integers(0, 6)),),
                           pack_streams=draw(st.booleans())))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_grid())
def test_random_windows_match_their_graphs(pts: list[Point]) -> None:
    _check(pts)


@pytest.mark.parametrize("placed", [{"parallels": (2,)}, {"n_gpu_layers": (40,)}])
def test_families_outside_the_shape_keep_the_graph_path(placed: dict[str, tuple[int, ...]]) -> None:
    pts = points(GridSpec(contexts=tuple((c,) for c in range(4096, 40000, 2048)), depths=(1,), budgets_mib=(0.0,), tokens=3,
                          **placed))  # type: ignore[arg-type]
    assert _check(pts) == (0, 0)


def test_a_template_that_misses_the_second_window_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Template.values_at

    def off(self: Template, rows: int) -> np.ndarray:  # right at the window it was read from, wrong elsewhere
        v = real(self, rows)
        return v if rows == self.rows0 else v * (1 + 1e-15) + 1e-18

    monkeypatch.setattr(Template, "values_at", off)
    pts = points(GridSpec(contexts=tuple((c,) for c in range(128, 8193, 128)), depths=(1,), budgets_mib=(0.0,), tokens=2))
    assert _check(pts)[0] == 0
    assert list(costs._TEMPLATES.values()) == [None]


def test_steps_of_are_each_steps_writes_kept_per_workload_object() -> None:
    """``sim.replay_shapes.steps_of`` gives each step's window rows (``replay.window_rows_at``) and its first sequence's
    row (``Workload.writes``) for one sequence and several (unified and split), and keeps them per object: an equal
    workload that is another object, or a new object at a reused id, is read afresh, never given another's steps."""
    from dataclasses import replace

    pts = points(GridSpec(contexts=((100,), (4096,)), parallels=(1, 2), tokens=5, depths=(0,)))
    pts += points(GridSpec(contexts=((4000, 70),), parallels=(2,), tokens=5, depths=(0,)))
    pts += points(GridSpec(contexts=((300, 9000),), parallels=(2,), unified=False, tokens=3, depths=(0,)))
    ones = [p.workload for p in pts if p.workload.n_parallel == 1]  # one sequence: split, a cache the window reaches
    wls = [p.workload for p in pts] + [replace(w, unified=u, ctx_size=w.contexts[0] + w.tokens + extra)
                                       for w in ones for u in (True, False) for extra in (0, 1, 300)]
    assert any(w.window_rows(w.contexts[0] + w.tokens - 1) == w.cells_per_stream for w in wls)
    for wl in wls:
        want = (tuple(replay.window_rows_at(wl, k) for k in range(wl.tokens)), tuple(wl.writes(k)[0][1] for k in range(wl.tokens)))
        assert shapes.steps_of(wl) == want and shapes.steps_of(replace(wl)) == want
        other = replace(wl, context=tuple(c + 1000 for c in wl.context), ctx_size=wl.ctx_size and wl.ctx_size + 1000)
        shapes._STEPS[id(other)] = (wl, *want)  # a stale entry at this object's id: another object's steps
        assert shapes.steps_of(other) == (tuple(replay.window_rows_at(other, k) for k in range(other.tokens)),
                                          tuple(other.writes(k)[0][1] for k in range(other.tokens)))
        assert shapes.steps_of(other) != want


def test_placed_devices_are_placed_hardwares_shared_by_the_bytes_held() -> None:
    """``sim.replay_shapes.placed_devices`` (what the point planner's lines read) is ``placed_hardware(p).devices`` for
    every point -- --kv-gpu-layers, -ngl, contexts, a measured profile, two devices -- and the points of one profile
    that hold the same bytes share one placed tuple; a stale entry at another profile's id is not given out."""
    from dataclasses import replace

    from sim.memory import held_before_ring
    from sim.run.point import placed_hardware

    shapes._PLACED.clear()
    grid = GridSpec(contexts=((4096,), (65536,)), kv_gpu_layers=(0, 3, 9), depths=(0,), hardware=("rtx4070-gen4x16", "h200-gen5x16"),
                    tokens=1)
    pts = points(grid) + points(replace(grid, kv_gpu_layers=(0,), n_gpu_layers=(8, 20)))
    pts += points(GridSpec(contexts=((4096,),), split_mode="layer", hardware=("rtx4070-gen4x16+rtx3060-gen3x4",), depths=(0,), tokens=1))
    fixed = replace(pts[0].hardware, devices=(replace(pts[0].hardware.devices[0], memory_used_bytes=3 << 30),))
    pts.append(replace(pts[0], hardware=fixed))
    assert len({len(p.hardware.devices) for p in pts}) == 2
    held = {}
    for p in pts:
        got = shapes.placed_devices(p)
        assert got == placed_hardware(p).devices
        key = (id(p.hardware), held_before_ring(p.workload, tuple(d.memory_reserved_bytes for d in p.hardware.devices)))
        assert held.setdefault(key, got) is got
    assert len(held) < len(pts) and len({d[0].memory_used_bytes for d in held.values()}) > 4
    other = replace(pts[0].hardware)  # an equal profile, another object: read afresh
    key = (id(other), held_before_ring(pts[0].workload, (other.devices[0].memory_reserved_bytes,)))
    shapes._PLACED[key] = (pts[0].hardware, (fixed.devices[0],))  # a stale entry at its id
    assert shapes.placed_devices(replace(pts[0], hardware=other)) == placed_hardware(pts[0]).devices


def test_shape_arrays_are_each_lines_shape() -> None:
    """``sim.replay_shapes.ShapeArrays`` (each distinct shape read once) gives every point its line's shape fields,
    zeros where a line has no shape at the token, on two devices with shared and distinct shape objects."""
    rng = np.random.default_rng(5)
    made = [replay._Shape(tuple((d, int(rng.integers(1, 1 << 30)), int(rng.integers(1, 1 << 30)), int(rng.integers(1, 40)))
                                for d in sorted(rng.choice(2, size=int(rng.integers(0, 3)), replace=False).tolist())),
                          tuple(sorted(set(rng.integers(0, 2, size=2).tolist()))), int(rng.integers(0, 1 << 40)),
                          tuple(sorted(set(rng.integers(0, 2, size=int(rng.integers(0, 2))).tolist()))),
                          int(rng.integers(0, 1 << 33))) for _ in range(6)]
    n_lines = 40
    here = {li: made[int(rng.integers(0, len(made)))] for li in range(n_lines) if rng.random() < 0.8}
    line_of = rng.integers(0, n_lines, size=300)
    arr = shapes.ShapeArrays(here, n_lines, 2, line_of)
    for i, li in enumerate(line_of.tolist()):
        sh = here.get(li)
        staged = {d: (nd, fl, ns, r) for r, (d, nd, fl, ns) in enumerate(sh.staged)} if sh else {}
        for d in range(2):
            want = staged.get(d, (0, 0, 0, 0))
            assert (arr.need[i, d], arr.full[i, d], arr.n_splits[i, d], arr.rank[i, d]) == want
            assert arr.staged[i, d] == (d in staged)
            assert arr.gpu[i, d] == bool(sh and d in sh.gpu_devices) and arr.kv[i, d] == bool(sh and d in sh.device_kv)
        assert (arr.kv_bytes[i], arr.host_cache[i]) == ((sh.device_kv_bytes, sh.host_cache_bytes) if sh else (0, 0))
    assert len(here) < n_lines and len({id(s) for s in here.values()}) < len(here)
