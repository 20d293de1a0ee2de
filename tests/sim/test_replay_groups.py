"""The point planner's cheaper bookkeeping held to what it replaced, bit for bit (issue 26, round 26).

``sim.replay.object_groups`` (codes packed by ``sim.replay_groups``, first appearance by a scatter of minima, a grid's
own object lists) against its earlier form, kept here unchanged as the oracle (three ``np.unique`` passes over
``sim.points.objects_of``); ``LineArrays.at`` (contiguous columns taken) against the strided fancy index it replaced;
``replay_shapes.placed_memory`` against ``sim.run.point.placed_hardware``; and ``plan_points`` of a grid (its own
lists) against the same points as a list (``objects_of``), every array and dtype.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from sim import replay, replay_family, replay_groups
from sim.points import GridSpec, objects_of, point_grid, points
from sim.replay_family import SHAPE_FIELDS, LineArrays, line_arrays
from sim.replay_shapes import placed_memory
from sim.run.point import Point, placed_hardware


def _old_object_groups(points: Any) -> tuple[np.ndarray, list[int]]:
    """``sim.replay.object_groups`` as it was at 7c32073 (the oracle)."""
    n = len(points)
    if not n:
        return np.zeros(0, dtype=np.intp), []
    code = np.zeros(n, dtype=np.int64)
    for k in range(3):
        objs, inv = objects_of(points, k)
        count = len(objs)
        if k == 2:
            classes, inv = np.unique(np.array([replay.config_class(c) for c in objs], dtype=np.int64)[inv], return_inverse=True)
            count = len(classes)
        _, code = np.unique(code * count + inv.reshape(-1), return_inverse=True)
        code = code.reshape(-1)
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    number = np.empty(len(first), dtype=np.intp)
    number[order] = np.arange(len(first))
    return number[inv.reshape(-1)], first[order].tolist()


def _spec() -> GridSpec:
    return GridSpec(contexts=((4096,), (8192,), (16384,), (3000,)), depths=(0, 1, 2), budgets_mib=(0, 64, 256),
                    kv_offload=(True, False), kv_gpu_layers=(0, 2), hardware=("rtx4070-gen4x16", "h200-gen5x16"), tokens=2)


def _same(a: tuple[np.ndarray, list[int]], b: tuple[np.ndarray, list[int]]) -> None:
    assert a[0].dtype == b[0].dtype and a[0].tolist() == b[0].tolist() and a[1] == b[1]


@pytest.mark.parametrize("seed", range(6))
def test_object_groups_of_lists_are_the_old_ones(seed: int) -> None:
    """Random batches of points -- shared objects, equal copies not shared (another group), repeats, any order, any
    size from one point -- are grouped and numbered as before, with the table and with the sort."""
    rng = random.Random(seed)
    pts = points(_spec())
    twins = [replace(p, workload=replace(p.workload), transport=replace(p.transport)) for p in rng.sample(pts, 20)]
    pool = pts + twins
    for size in (1, 2, 7, 50, 400):
        batch = [rng.choice(pool) for _ in range(size)]
        want = _old_object_groups(batch)
        _same(replay.object_groups(batch), want)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(replay_groups, "DENSE_PER_POINT", -10**9)  # every code space past the table: the sort
            _same(replay.object_groups(batch), want)
    _same(replay.object_groups([]), (np.zeros(0, dtype=np.intp), []))


@pytest.mark.parametrize("seed", range(4))
def test_object_groups_of_grids_and_their_views_are_the_old_ones(seed: int) -> None:
    """A grid read off its own object lists (objects no point of a view uses among them) is grouped as its points
    listed are, and as before; so is a view with repeats in any order."""
    rng = np.random.default_rng(seed)
    grid = point_grid(_spec())
    _same(replay.object_groups(grid), _old_object_groups(grid))
    for size in (1, 3, 100, len(grid)):
        view = grid.take(rng.integers(0, len(grid), size=size))
        want = _old_object_groups(list(view))
        _same(replay.object_groups(view), want)
        _same(_old_object_groups(view), want)


def test_first_appearance_is_a_walk_over_the_codes() -> None:
    """Codes packed from index tuples (radices past 2**62 compacted first) are numbered by their first point, as a walk
    over the tuples numbers them, by the table and by the sort alike."""
    rng = np.random.default_rng(3)
    for counts, n in (((5, 1, 3), 200), ((1 << 40, 1 << 40, 7), 300), ((1, 1, 1), 4), ((1000, 999, 2), 50)):
        invs = [rng.integers(max(0, c - 6), c, size=n) for c in counts]  # the largest indices: a code past 2**63 wraps
        walk: dict[tuple[int, ...], int] = {}
        want = [walk.setdefault(t, len(walk)) for t in zip(*(i.tolist() for i in invs), strict=True)]
        firsts = [want.index(g) for g in range(len(walk))]
        code, size = replay_groups.combined(list(zip(invs, counts, strict=True)))
        assert code.dtype == np.int64 and 0 <= code.min() and code.max() < size < 1 << 63
        for dense in (4, -10**9):
            with pytest.MonkeyPatch.context() as m:
                m.setattr(replay_groups, "DENSE_PER_POINT", dense)
                got = replay_groups.first_appearance((code, size))
            assert got[0].dtype == np.intp and got[0].tolist() == want and got[1] == firsts


@pytest.mark.parametrize("seed", range(3))
def test_a_tokens_shapes_taken_are_the_strided_index(seed: int) -> None:
    """``LineArrays.at`` gives every shape field of every token the values and dtype of ``field[:, k][line_of]``."""
    rng = np.random.default_rng(seed)
    n_lines, n_tok, n_dev, n = 37, 5, 3, 1000
    arrays = {}
    for f in ("total", "used", "align"):
        arrays[f] = rng.integers(0, 1 << 40, size=(n_lines, n_dev))
    for f in ("io", "tokens"):
        arrays[f] = rng.integers(0, 1 << 40, size=n_lines)
    arrays["rows"] = rng.integers(0, 1 << 20, size=(n_lines, n_tok))
    for f in SHAPE_FIELDS:
        shape = (n_lines, n_tok) if f in ("kv_bytes", "host_cache") else (n_lines, n_tok, n_dev)
        arrays[f] = rng.random(shape) < 0.5 if f in ("staged", "gpu", "kv") else rng.integers(-(1 << 50), 1 << 50, size=shape)
    la = LineArrays(**arrays)
    line_of = rng.integers(0, n_lines, size=n).astype(np.intp)
    for k in range(n_tok):
        got = la.at(k, line_of)
        for f in SHAPE_FIELDS:
            want = getattr(la, f)[:, k][line_of]
            assert getattr(got, f).dtype == want.dtype and getattr(got, f).shape == want.shape
            assert np.array_equal(getattr(got, f), want), (k, f)


def _memory_points() -> list[Point]:
    hws = ("rtx4070-gen4x16", "h200-gen5x16")
    pts = points(GridSpec(contexts=((4096,), (70000,), (300000,)), kv_gpu_layers=(0, 3), depths=(0,), hardware=hws, tokens=1))
    pts += points(GridSpec(contexts=((4096,), (300000,)), depths=(0,), n_gpu_layers=(20, 1), hardware=hws, tokens=1))
    pts += points(GridSpec(contexts=((4096,), (100000,)), split_mode="layer", hardware=("rtx4070-gen4x16+rtx3060-gen3x4",),
                           depths=(0,), tokens=1))
    out = []
    for p in pts:
        devs = p.hardware.devices
        small = replace(p.hardware, devices=tuple(replace(d, memory_total_bytes=d.memory_reserved_bytes + (1 << 30)) for d in devs))
        out += [p, replace(p, hardware=small)]  # held past the total: the total
        if len(devs) == 1:  # a measured profile keeps its use
            out.append(replace(p, hardware=replace(p.hardware, devices=(replace(devs[0], memory_used_bytes=3 << 30),))))
    return out


def test_placed_memory_is_the_placed_profiles() -> None:
    """``placed_memory`` gives each device's total and used bytes of ``placed_hardware`` over one and two devices,
    every -ngl, a resident prefix, contexts to 300 Ki, totals below what the workload holds, and measured profiles."""
    pts = _memory_points()
    clipped = measured = 0
    for p in pts:
        devs = placed_hardware(p).devices
        total, used = placed_memory(p)
        assert total == tuple(d.memory_total_bytes for d in devs) and used == tuple(d.memory_used_bytes for d in devs)
        assert all(type(x) is int for x in total + used)
        clipped += any(u == t for u, t in zip(used, total, strict=True))
        measured += p.hardware.devices[0].memory_used_bytes > 0
    assert clipped and measured and any(len(p.hardware.devices) == 2 for p in pts)


def _plan_arrays(plans: replay.Plans) -> dict[str, Any]:
    out: dict[str, Any] = {"line_of": plans.line_of, "tokens": plans.tokens, "fits": plans.fits, "failed_at": plans.failed_at,
                           "reasons": plans.reasons, "lines": [id(p) for p in plans.lines]}
    for f in plans.policy.__dataclass_fields__:
        out["policy." + f] = getattr(plans.policy, f)
    for k, (g, snap, rows) in enumerate(zip(plans.graphs, plans.rings, plans.rows, strict=True)):
        out[f"rows{k}"] = rows
        for f in g.__dataclass_fields__:
            out[f"g{k}.{f}"] = getattr(g, f)
        for d, arrs in snap.items():
            for j, a in enumerate(arrs):
                out[f"r{k}.{d}.{j}"] = a
    for d in plans.made_at:
        out[f"made{d}"], out[f"rank{d}"] = plans.made_at[d], plans.rank[d]
    return out


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def test_a_grids_plans_are_its_points_plans() -> None:
    """``plan_points`` of a grid and of a view (its own object lists, configs no point uses among them) equals that
    of the same points as a list, every token's arrays and every dtype, the lines' first points the same objects."""
    grid = point_grid(GridSpec(contexts=((4095,), (50000,), (200000,)), depths=(0, 1, 3, 8), budgets_mib=(0, 16, 512),
                               kv_offload=(True, False), tokens=3))
    rng = np.random.default_rng(4)
    for pts in (grid, grid.take(rng.integers(0, len(grid), size=40)), grid.take(np.arange(len(grid))[::-3])):
        replay.clear_shapes()
        want = _plan_arrays(replay.plan_points(list(pts)))
        replay.clear_shapes()
        got = _plan_arrays(replay.plan_points(pts))
        assert got.keys() == want.keys()
        assert [k for k in want if not _equal(got[k], want[k])] == []
        for i in rng.integers(0, len(pts), size=12).tolist():  # each token's window rows: the point's own
            wl = pts[i].workload
            assert [int(got[f"rows{k}"][i]) for k in range(wl.tokens)] == [replay.window_rows_at(wl, k) for k in range(wl.tokens)]


def test_families_sharing_cache_sizes_are_each_lines_own_graphs() -> None:
    """Families alike but for ``--kv-gpu-layers`` over the same contexts, the same on another machine and another
    model's, read in one batch once their templates are trusted (``line_arrays``: each cache size's memory, io buffer
    and layout read once for all of them, ``sizes_key``) give every line the memory of its own placed profile
    (``placed_devices``), its own io buffer and windows, and every token the shape read off the token's own graph."""
    from sim.replay_shapes import ShapeArrays, placed_devices
    from sim.run.point import graph_at, io_bytes_for
    from sim.transport.deliveries import span_fn

    contexts = tuple((c,) for c in range(4000, 4000 + 16 * 900, 900))
    pts = points(GridSpec(contexts=contexts, kv_gpu_layers=(0, 1, 3), depths=(2,), tokens=2,
                          hardware=("rtx4070-gen4x16", "h200-gen5x16")))
    pts += points(GridSpec(models=("llama-3.1-8b",), contexts=contexts, kv_gpu_layers=(0, 2), depths=(2,), tokens=2))
    pts += points(GridSpec(contexts=contexts, kv_offload=(False,), depths=(0,), tokens=2))
    random.Random(2).shuffle(pts)
    replay.clear_shapes()
    for p in pts:  # the templates learnt and confirmed
        replay._one_line(p)
    _, firsts = replay._lines(pts)
    la = line_arrays(firsts, replay._one_line)
    assert all(replay_family._trusted(p) for p in firsts)
    for li, p in enumerate(firsts):
        devs, wl, cfg = placed_devices(p), p.workload, p.transport
        assert la.total[li].tolist() == [d.memory_total_bytes for d in devs]
        assert la.used[li].tolist() == [d.memory_used_bytes for d in devs]
        assert la.io[li] == io_bytes_for(wl) and la.tokens[li] == wl.tokens
        align = tuple(max(d.alignment_bytes, cfg.min_alignment_bytes) for d in devs)
        spans = [span_fn(cfg.pack_streams, a) for a in align]
        for k in range(wl.tokens):
            assert la.rows[li, k] == replay.window_rows_at(wl, k)
            shape = replay._Shape(*replay.graph_shape(graph_at(p, k), spans, (cfg.pack_streams, align)))
            want = ShapeArrays({0: shape}, 1, la.total.shape[1], np.zeros(1, dtype=np.intp))
            got = la.at(k, np.array([li], dtype=np.intp))
            for f in SHAPE_FIELDS:
                assert getattr(got, f).tolist() == getattr(want, f).tolist(), (li, k, f)
