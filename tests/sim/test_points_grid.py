"""``sim.points.points`` gives, in product order, the points a plain walk of the grid's product gives: equal points,
the same workload and config objects shared (one per workload, one per depth/budget/arm/schedule), and the same
one-line errors -- the plain walk re-made here as the straightforward loop it replaced."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import sim.points as sp
from sim.errors import InputError
from sim.points import GridSpec, points
from sim.run.point import Point
from sim.transport.config import Schedule, TransportConfig
from sim.workload import Workload, layers_of_ngl


def _plain(spec: GridSpec) -> list[Point]:
    out, made, configs = [], {}, {}  # type: ignore[var-annotated]
    models, hws = [sp.model(m) for m in spec.models], [sp.hardware(h) for h in spec.hardware]
    caches, caches_v = [sp.cache(c) for c in spec.cache_types], [sp.cache(c) for c in spec.cache_types_v] or [None]
    for (m, h, c, cv, ctx, npar), (kv, ngl, off, d, b, sched) in itertools.product(
            itertools.product(models, hws, caches, caches_v, spec.contexts, spec.parallels),
            list(itertools.product(spec.kv_gpu_layers, spec.n_gpu_layers, spec.kv_offload, spec.depths, spec.budgets_mib,
                                   spec.schedules))):
        if not off and (d, b, kv, sched) != (spec.depths[0], spec.budgets_mib[0], spec.kv_gpu_layers[0], spec.schedules[0]):
            continue
        if d == 0 and sched != spec.schedules[0]:
            continue
        gl = layers_of_ngl(ngl, m.n_layers)
        key = (id(m), id(h), id(c), id(cv), ctx, npar, kv if off else 0, gl)
        if key not in made:
            made[key] = (Workload(m, c, cv or c, ctx, tokens=spec.tokens, pinned=spec.pinned, n_parallel=npar, unified=spec.unified,
                                  ctx_size=spec.ctx_size, split_mode=spec.split_mode, tensor_split=spec.tensor_split,
                                  flat_prefix=spec.flat_prefix, kv_gpu_layers=kv if off else 0, n_gpu_layers=gl),
                         sp.for_workload(h, m.name, c.name, (cv or c).name))
        if spec.split_mode != "none" and len(h.devices) < 2:
            raise InputError(f"--split-mode {spec.split_mode} needs several devices; give --hardware A+B (got {h.name})")
        host_attn = off and sp.nkvo_attention(h) == "host"
        if host_attn and d:
            raise InputError(f"--depth {d} on {h.name}: its llama.cpp runs -nkvo attention on the CPU (upstream, no "
                             "pipelined path); allowed: --depth 0")
        arm = ("host-attention" if host_attn else "transport") if off else "resident"
        if (d, b, arm, sched) not in configs:
            configs[d, b, arm, sched] = TransportConfig(depth=d if off else 0, budget_mib=b if off else 0.0,
                                                        mutations=spec.mutations if off else frozenset(),
                                                        pack_streams=spec.pack_streams, arm=arm,
                                                        schedule=sched if arm == "transport" else Schedule())
        out.append(Point(*made[key], configs[d, b, arm, sched]))
    return out


def _sharing(pts: list[Point]) -> list[tuple[int, int, int]]:
    ids: dict[int, int] = {}
    return [(ids.setdefault(id(p.workload), len(ids)), ids.setdefault(id(p.hardware), len(ids)),
             ids.setdefault(id(p.transport), len(ids))) for p in pts]


SPECS = [GridSpec(), GridSpec(kv_offload=(True, False), depths=(0, 1, 2), budgets_mib=(0, 64), kv_gpu_layers=(0, 2)),
         GridSpec(hardware=("rtx4070-gen4x16", "h200-gen5x16"), cache_types=("q8_0", "f16"), cache_types_v=("q4_0",),
                  parallels=(1, 2), depths=(0, 1), schedules=(Schedule(), Schedule(late_first=True))),
         GridSpec(models=("llama-3.1-8b", "qwen3.8-27b"), n_gpu_layers=(99, 20), contexts=((4096,), (1000, 3000)),
                  parallels=(2,), kv_offload=(False, True))]


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("host", [False, True])
def test_points_are_the_plain_walk(spec: GridSpec, host: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if host:  # upstream's -nkvo attention on the CPU: depth 0 only
        monkeypatch.setattr(sp, "nkvo_attention", lambda h: "host")
        spec = GridSpec(**{**spec.__dict__, "depths": (0,)})
    got, want = points(spec), _plain(spec)
    assert got == want
    assert _sharing(got) == _sharing(want)
    assert [hash(p) for p in got] == [hash(p) for p in want]


@pytest.mark.parametrize(("change", "message"), [({"depths": (0, 2)}, "--depth 2 on rtx4070-gen4x16: its llama.cpp runs"),
                                                 ({"split_mode": "layer"}, "--split-mode layer needs several devices"),
                                                 ({"n_gpu_layers": (500,)}, "")])
def test_bad_grids_fail_as_the_plain_walk(change: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sp, "nkvo_attention", lambda h: "host")
    spec = GridSpec(**{**GridSpec().__dict__, **change})
    try:
        _plain(spec)
        want = ""
    except (InputError, ValueError) as exc:
        want = str(exc)
    with pytest.raises(InputError) as got:
        points(spec)
    assert message in str(got.value) and (want in str(got.value) or not want)


def test_object_groups_are_the_id_walk() -> None:
    """``sim.replay.object_groups`` (arrays of ids) numbers points as a walk keyed by (workload object, profile
    object, config class) does, in order of first appearance; ``_lines`` then joins equal workloads' groups."""
    import random
    from dataclasses import replace

    from sim import replay

    pts = points(GridSpec(contexts=((4096,), (8192,), (16384,)), depths=(0, 1, 2), budgets_mib=(0, 64), kv_offload=(True, False)))
    twins = [replace(p, workload=replace(p.workload), transport=replace(p.transport)) for p in pts[::3]]  # equal, not shared
    mixed = pts + twins + pts[:5]
    random.Random(1).shuffle(mixed)
    walk: dict[tuple[int, int, int], int] = {}
    want = [walk.setdefault((id(p.workload), id(p.hardware), replay.config_class(p.transport)), len(walk)) for p in mixed]
    group, firsts = replay.object_groups(mixed)
    assert group.tolist() == want
    assert firsts == [want.index(g) for g in range(len(walk))]
    lines: dict[object, int] = {}
    line_of, first_points = replay._lines(mixed)
    assert line_of.tolist() == [lines.setdefault(replay.line_key(p), len(lines)) for p in mixed]
    assert [replay.line_key(p) for p in first_points] == list(lines)
    empty = replay.object_groups([])
    assert len(empty[0]) == 0 and empty[1] == []



def test_line_arrays_are_the_point_walk() -> None:
    """``sim.points.line_arrays`` (ids as arrays) gives each point the context, depth and budget a walk over the points
    reads, and lines that a walk keyed by the line's fields (model, machine, caches, sequences, tokens, arm,
    placement) tells apart exactly as it does -- equal workloads not shared included; the plan's boundaries over them
    are the boundaries over the walk's arrays."""
    import random
    from dataclasses import replace

    import numpy as np

    from kvpipe.plan_run import Figures, boundaries
    from sim.evaluator.check import boundaries as changes

    pts = points(GridSpec(contexts=((4096,), (8192,), (16384,)), depths=(0, 1, 2), budgets_mib=(0, 64), kv_offload=(True, False),
                          kv_gpu_layers=(0, 2), cache_types=("q8_0", "f16"), hardware=("rtx4070-gen4x16", "rtx3060-gen3x4")))
    twins = [replace(p, workload=replace(p.workload), transport=replace(p.transport)) for p in pts[::3]]  # equal, not shared
    mixed = pts + twins + pts[:5]
    random.Random(3).shuffle(mixed)
    walk: dict[tuple[object, ...], int] = {}
    want = [walk.setdefault((p.workload.model.name, p.hardware.name, p.workload.cache_k.name, p.workload.cache_v.name,
                             p.workload.n_parallel, p.workload.unified, p.workload.split_mode, p.workload.tokens, p.transport.arm,
                             p.workload.kv_gpu_layers, p.workload.n_gpu_layers, p.workload.pinned), len(walk)) for p in mixed]
    line, context, depth, budget = sp.line_arrays(mixed)
    assert len(set(zip(line.tolist(), want, strict=True))) == len(walk) == len(set(line.tolist()))  # the same partition
    assert context.tolist() == [p.context for p in mixed] and depth.tolist() == [p.transport.depth for p in mixed]
    assert budget.tolist() == [p.transport.budget_mib for p in mixed]
    from kvpipe.executors import PackedPoints

    packed = sp.line_arrays(mixed, PackedPoints(mixed).parts)  # the indices a run packed its points with: the same
    assert all(np.array_equal(a, b) for a, b in zip(packed, (line, context, depth, budget), strict=True))
    rng = np.random.default_rng(4)
    for _ in range(20):
        tps = rng.choice([1.0, 2.0, 3.0], len(mixed))
        declined = rng.random(len(mixed)) < 0.3
        figs = Figures(tps, declined, *(np.zeros(len(mixed)) for _ in range(6)), np.ones(len(mixed), dtype=bool))
        assert boundaries(mixed, figs) == changes(np.array(want), context, depth, budget, tps, declined)
    assert boundaries([], figs.take([])) == set()


def test_packed_points_come_back_equal_and_shared_through_pickle() -> None:
    """``kvpipe.executors.PackedPoints`` (what a worker is sent) gives the points back, in order, equal, sharing their
    objects as the originals did, and ``summarize_packed`` answers as ``summarize`` does."""
    import pickle
    import random

    import numpy as np

    from kvpipe.executors import PackedPoints, summarize_packed
    from sim.evaluator import summarize

    pts = points(GridSpec(contexts=((4096,), (8192,), (20000,)), depths=(0, 1, 3), budgets_mib=(0, 64), kv_offload=(True, False)))
    pts = pts + pts[:4]
    random.Random(2).shuffle(pts)
    back = pickle.loads(pickle.dumps(PackedPoints(pts))).points()
    assert back == pts and _sharing(back) == _sharing(pts)
    for lo, hi in ((0, len(pts)), (3, 17), (5, 5), (len(pts) - 2, len(pts))):  # a piece: the same points as a slice
        piece = pickle.loads(pickle.dumps(PackedPoints(pts).take(lo, hi))).points()
        assert piece == pts[lo:hi] and _sharing(piece) == _sharing(pts[lo:hi])
    got, want = summarize_packed(PackedPoints(pts)), summarize(pts)
    assert all(np.array_equal(getattr(got, f), getattr(want, f)) for f in want.__dataclass_fields__)


def test_a_packed_piece_carries_only_the_objects_its_points_use() -> None:
    """A piece of ``PackedPoints`` (what a worker is sent) holds the workload, machine and config objects its points use
    and no other, in the whole's order, the same objects (the whole's list itself where the piece uses every one); its
    points are the slice's, sharing as they did, and ``summarize_packed`` of each piece answers as ``summarize`` of the
    slice, bit for bit -- a list of points with configs shared across workloads (the memory plan's) and a grid."""
    import random

    from kvpipe.executors import PackedPoints, summarize_packed
    from sim.evaluator import summarize

    pts = points(GridSpec(contexts=((4096,), (8192,), (20000,), (65536,)), depths=(0, 1, 3), budgets_mib=(0, 64),
                          kv_offload=(True, False)))
    pts = pts + pts[:6]
    random.Random(5).shuffle(pts)
    grid = sp.point_grid(GridSpec(contexts=tuple((c,) for c in range(1024, 1024 * 9, 1024)), depths=(0, 2), budgets_mib=(0, 32)))
    for whole in (pts, grid):
        packed = PackedPoints(whole)
        n = len(whole)
        for lo, hi in ((0, n), (0, n // 3), (n // 3, 2 * n // 3), (n - 1, n), (4, 5)):
            piece = packed.take(lo, hi)
            for (objs, idx), (all_objs, all_idx) in zip(piece.parts, packed.parts, strict=True):
                want = [all_objs[i] for i in sorted(set(all_idx[lo:hi].tolist()))]
                assert len(objs) == len(want) and all(a is b for a, b in zip(objs, want, strict=True))
                assert [objs[i] for i in idx.tolist()] == [all_objs[i] for i in all_idx[lo:hi].tolist()]
                assert idx.dtype == all_idx.dtype
                if len(want) == len(all_objs):
                    assert objs is all_objs
            made = piece.points()
            sliced = [whole[i] for i in range(lo, hi)]
            assert made == sliced and _sharing(made) == _sharing(sliced)
            got, exp = summarize_packed(piece), summarize(sliced)
            for f in exp.__dataclass_fields__:
                a, b = getattr(got, f), getattr(exp, f)
                assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("spec", SPECS)
def test_a_point_grid_makes_the_plain_walks_points_when_asked(spec: GridSpec) -> None:
    """``sim.points.point_grid`` holds the walk's points as arrays: each one asked for is the walk's (equal, sharing its
    objects as the walk does), made once (asked again, the same object), by index, negative index or slice; a subset
    (``take``), a field per object (``field``), its packing for a worker and its workloads replaced
    (``with_workloads``) are those of the walk's list."""
    from dataclasses import replace

    import numpy as np

    from kvpipe.executors import PackedPoints

    want = _plain(spec)
    g = sp.point_grid(spec)
    assert len(g) == len(want) and not g.made()
    got = [g[i] for i in range(len(g))]
    assert got == want and _sharing(got) == _sharing(want)
    assert all(g[i] is p for i, p in enumerate(got)) and g[-1] is got[-1] and g[1:4] == got[1:4] and g.points()[0] is got[0]
    with pytest.raises(IndexError):
        g[len(g)]
    idx = np.array([len(g) - 1, 0, len(g) // 2, 0])
    sub = g.take(idx)
    assert sub.points() == [want[i] for i in idx] and _sharing(sub.points()) == _sharing([want[i] for i in idx])
    assert all(sub[k] is g[int(i)] for k, i in enumerate(idx)) and sub.take(np.array([2, 1]))[0] is g[int(idx[2])]
    fresh = sp.point_grid(spec)
    view = fresh.take(idx)
    assert view.made() == {} and (view[0] is fresh[int(idx[0])]) and set(view.made()) == {0}
    assert g.field(2, lambda c: c.arm, object).tolist() == [p.transport.arm for p in want]
    assert g.field(0, lambda w: max(w.context)).tolist() == [p.context for p in want]
    back = PackedPoints(g).points()
    assert back == want and _sharing(back) == _sharing(want)
    assert PackedPoints(g).take(1, 3).points() == want[1:3]
    changed = g.with_workloads(lambda w: replace(w, pinned=not w.pinned))
    flipped = [replace(p, workload=replace(p.workload, pinned=not p.workload.pinned)) for p in want]
    assert changed.points() == flipped and _sharing(changed.points()) == _sharing(want)


@pytest.mark.parametrize("resident", [False, True])
def test_a_point_grid_is_evaluated_as_its_points(resident: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sim.evaluator.summarize`` of a ``PointGrid`` (its objects numbered off its arrays, batches as grids, no point
    made but a line's first) equals that of its points as a list, bit for bit -- in small batches, for a shuffled view
    with repeats, two machines, ``--kv-gpu-layers``, two sequences and (``resident``) the resident arm; the groups read
    off the grid are the id walk's, its line arrays the same but for the lines' numbers (the same partition)."""
    import sys

    import numpy as np

    from kvpipe.executors import PackedPoints, summarize_packed
    from sim import replay
    from sim.evaluator import summarize

    monkeypatch.setattr(sys.modules["sim.evaluator.evaluate"], "BATCH_POINTS", 7)
    spec = GridSpec(contexts=((4096,), (8192,), (20000,)), depths=(0, 1, 3), budgets_mib=(0, 64), kv_gpu_layers=(0, 2),
                    hardware=("rtx4070-gen4x16", "rtx3060-gen3x4"), parallels=(1, 2), tokens=3, kv_offload=(True, False)
                    if resident else (True,))
    g = sp.point_grid(spec)
    view = g.take(np.random.default_rng(5).permutation(np.r_[np.arange(len(g)), np.arange(0, len(g), 4)]))
    for grid in (g, view):
        pts = grid.points()
        got, want = summarize(grid), summarize(pts)
        assert all(np.array_equal(getattr(got, f), getattr(want, f)) for f in want.__dataclass_fields__)
        assert resident or grid is view or len(g.made()) < len(g) // 2  # a batch's lines' first points (a resident batch's all)
        packed = summarize_packed(PackedPoints(grid))
        assert all(np.array_equal(getattr(packed, f), getattr(want, f)) for f in want.__dataclass_fields__)
        a, b = replay.object_groups(grid), replay.object_groups(pts)
        assert a[0].tolist() == b[0].tolist() and a[1] == b[1]
        (line, *rest), (want_line, *want_rest) = sp.line_arrays(grid), sp.line_arrays(pts)
        assert all(np.array_equal(x, y) for x, y in zip(rest, want_rest, strict=True))
        assert len(set(zip(line.tolist(), want_line.tolist(), strict=True))) == len(set(line.tolist())) == len(set(want_line.tolist()))
