"""The compiled evaluator (sim.evaluator) held to the simulator.

* the figures grid (1,020 points: the reference preset at 51 contexts x depths 0-4 x budgets 0/64/128/256 MiB,
  as ``tools/figures_snapshot.py`` sweeps it): every row field within 1e-9 relative of the exact sweep's rows
  (``run_sweep(..., exact=True)``, what ``kvpipe sweep --exact`` runs) and the declined flags equal -- 200 points
  drawn with a fixed seed in the default run, the whole grid under ``-m benchmark`` (it simulates for ~45 s);
* random points of the envelope (every model preset, four hardware presets, contexts 1..200,000, depths 0..8,
  budgets 0..1,024 MiB) against ``sim.run.run.run_point(point, exact=True)``; and as many of each extension of it:
  ``--kv-gpu-layers`` or ``-ngl``, and several sequences (2-8, unified or split, one context or one each);
* the resident arm (the whole cache on the device; its first graph, the cache's load, a warm-up left out of the
  row): the figures grid's contexts on four machines against the exact sweep, and random points (one or several
  sequences, -ngl, a pinned or pageable host cache) against ``run_point(point, exact=True)``;
* ``check_sample``: what it re-simulates, what it returns, that it raises on a disagreement;
* ``in_envelope``: each reason.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.base import OutOfDeviceMemory
from kvpipe import sweep
from sim.evaluator import EvaluatorDisagreement, check_sample, evaluate, in_envelope, row_disagreement
from sim.evaluator.check import boundary_points
from sim.points import GridSpec, points
from sim.rows import row
from sim.run.point import Point
from sim.run.run import run_point

TOL = 1e-9
GRID = GridSpec(contexts=tuple((c,) for c in range(1024, 52225, 1024)), depths=(0, 1, 2, 3, 4), budgets_mib=(0.0, 64.0, 128.0, 256.0))
MODELS = ("qwen3.8-27b", "qwen3.8-27b-q5km", "llama-3.1-8b", "llama-3.1-70b")
HARDWARE = ("rtx4070-gen4x16", "rtx3060-gen3x4", "h200-gen5x16", "gh200-c2c")


def _against_exact_sweep(pts: list[Point]) -> float:
    """Every point's evaluated row against the exact sweep's; a point the evaluator finds does not fit has no row there."""
    from sim.evaluator import summarize

    exact = {sweep.key_of_row(r): r for r in sweep.run_sweep(pts, jobs=1, progress=False, exact=True).rows}
    fits = summarize(pts).fits.tolist()
    assert [sweep.key_of_point(p) in exact for p in pts] == fits
    pts = [p for p, f in zip(pts, fits, strict=True) if f]
    rows = evaluate(pts)
    worst = 0.0
    for p, r in zip(pts, rows, strict=True):
        want = exact[sweep.key_of_point(p)]
        assert r["declined"] == want["declined"], (p.context, p.transport)
        d = row_disagreement(r, want)
        assert d <= TOL, (p.context, p.transport.depth, p.transport.budget_mib, d)
        worst = max(worst, d)
    return worst


def test_figures_grid_sample_matches_the_exact_sweep() -> None:
    grid = points(GRID)
    assert len(grid) == 1020
    _against_exact_sweep(random.Random(26).sample(grid, 200))


@pytest.mark.benchmark
def test_figures_grid_matches_the_exact_sweep() -> None:
    worst = _against_exact_sweep(points(GRID))
    print(f"figures grid, 1,020 points: max relative disagreement {worst:.3g}")


def test_resident_grid_matches_the_exact_sweep() -> None:
    """The resident arm (one point per context: no depth, no budget) at the figures grid's 51 contexts, four machines."""
    grid = points(replace(GRID, hardware=HARDWARE, kv_offload=(False,)))
    assert len(grid) == 51 * 4 and {p.transport.arm for p in grid} == {"resident"}
    _against_exact_sweep(grid)
    from sim.evaluator import summarize

    fits = summarize(grid).fits
    assert fits.any() and not fits.all()  # the cache outgrows the 12 GB cards within the grid: both answers are held


@st.composite
def resident_points(draw: Any) -> Point:
    """The resident arm: one sequence or several (unified or split, one context or one each), -ngl, pinned or not."""
    n = draw(st.sampled_from([1, 1, 2, 3, 4, 8]))
    each = n > 1 and draw(st.booleans())
    ctx = tuple(draw(st.integers(1, 60_000)) for _ in range(n)) if each else (draw(st.integers(1, 200_000 // n)),)
    ngl = draw(st.sampled_from([999, 999, draw(st.integers(2, 60))]))
    spec = GridSpec(models=(draw(st.sampled_from(MODELS)),), hardware=(draw(st.sampled_from(HARDWARE)),), contexts=(ctx,),
                    parallels=(n,), unified=draw(st.booleans()), kv_offload=(False,), tokens=draw(st.integers(1, 6)),
                    n_gpu_layers=(ngl,), pinned=draw(st.booleans()))
    return points(spec)[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resident_points())
def test_random_resident_points_match_the_simulator(point: Point) -> None:
    assert point.transport.arm == "resident"
    _held(point)


@st.composite
def envelope_points(draw: Any) -> Point:
    spec = GridSpec(models=(draw(st.sampled_from(MODELS)),), hardware=(draw(st.sampled_from(HARDWARE)),),
                    contexts=((draw(st.integers(1, 200_000)),),), depths=(draw(st.integers(0, 8)),),
                    budgets_mib=(float(draw(st.integers(0, 1024))),), tokens=draw(st.integers(1, 6)))
    return points(spec)[0]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envelope_points())
def test_random_envelope_points_match_the_simulator(point: Point) -> None:
    _held(point)


def _held(point: Point) -> None:
    """The evaluator's row of ``point`` equals the simulator's (every token simulated) within TOL; both refuse a point
    that does not fit."""
    assert in_envelope(point) is None
    try:
        want = row(run_point(point, exact=True))
    except OutOfDeviceMemory:
        with pytest.raises(OutOfDeviceMemory):
            evaluate([point])
        return
    got = evaluate([point])[0]
    assert got["declined"] == want["declined"]
    assert row_disagreement(got, want) <= TOL, (point.context, point.transport, point.workload)


@st.composite
def placed_points(draw: Any) -> Point:
    """--kv-gpu-layers (the first N attention layers' KV on the device) or -ngl (the first layers on the CPU)."""
    model = draw(st.sampled_from(MODELS))
    kv, ngl = (draw(st.integers(1, 12)), 999) if draw(st.booleans()) else (0, draw(st.integers(2, 60)))
    spec = GridSpec(models=(model,), hardware=(draw(st.sampled_from(HARDWARE)),), contexts=((draw(st.integers(1, 150_000)),),),
                    depths=(draw(st.integers(0, 8)),), budgets_mib=(float(draw(st.integers(0, 1024))),),
                    tokens=draw(st.integers(1, 6)), kv_gpu_layers=(kv,), n_gpu_layers=(ngl,))
    return points(spec)[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placed_points())
def test_random_kv_gpu_layers_and_ngl_points_match_the_simulator(point: Point) -> None:
    _held(point)


@st.composite
def sequences_points(draw: Any) -> Point:
    """Several sequences, a unified cache or one stream each, the same context or one each."""
    n = draw(st.sampled_from([2, 3, 4, 8]))
    each = draw(st.booleans())
    ctx = tuple(draw(st.integers(1, 60_000)) for _ in range(n)) if each else (draw(st.integers(1, 100_000)),)
    spec = GridSpec(models=(draw(st.sampled_from(MODELS[:3])),), hardware=(draw(st.sampled_from(HARDWARE[:3])),),
                    contexts=(ctx,), parallels=(n,), unified=draw(st.booleans()), depths=(draw(st.integers(0, 8)),),
                    budgets_mib=(float(draw(st.sampled_from([0, 32, 128, 512]))),), tokens=draw(st.integers(1, 5)))
    return points(spec)[0]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences_points())
def test_random_several_sequence_points_match_the_simulator(point: Point) -> None:
    _held(point)


def test_a_short_wait_read_late_in_a_long_run_is_held_on_the_token_time() -> None:
    """A draw of the test above that failed: 8 split sequences of llama-3.1-8b at 62,208 on the 3060, depth 1, budget 0,
    5 tokens -- 10.7 s a token. Its boundary wait is 2.6 us a token, which the simulator reads as a difference of two
    clock readings at up to 53 s, each rounded to ~7e-15 s: the evaluator's differs from it by 1.3e-9 of itself, and
    by 2.5e-16 of the token's time, the scale such fields are held on (``row_disagreement``)."""
    spec = GridSpec(models=("llama-3.1-8b",), hardware=("rtx3060-gen3x4",), contexts=((62208,),), parallels=(8,),
                    unified=False, depths=(1,), budgets_mib=(0.0,), tokens=5)
    _held(points(spec)[0])


def test_every_token_and_field_of_a_point_with_a_decline_midway() -> None:
    """A budget the window outgrows at a block boundary: the ring runs, then is declined; and a ring grown midway."""
    pts = points(GridSpec(contexts=((8190,), (30000,)), depths=(1, 3), budgets_mib=(40.0, 0.0), tokens=6))
    rows = evaluate(pts)
    for p, r in zip(pts, rows, strict=True):
        assert row_disagreement(r, row(run_point(p, exact=True))) <= TOL
    assert {r["engine"] for r in rows} == {"evaluator"} and all("hazards" not in r for r in rows)


@pytest.mark.parametrize("hardware,cache_v,placed", [("rtx4070-gen4x16", (), {}), ("h200-gen5x16", ("f16",), {}),
                                                     ("rtx3060-gen3x4", ("q4_0",), {}),
                                                     ("rtx4070-gen4x16", (), {"kv_gpu_layers": (4,)}),
                                                     ("h200-gen5x16", (), {"n_gpu_layers": (40,)}),
                                                     ("rtx4070-gen4x16", (), {"kv_offload": (False,)}),
                                                     ("h200-gen5x16", (), {"kv_offload": (False,), "n_gpu_layers": (40,)})])
def test_scaled_steps_equal_their_own_graphs(hardware: str, cache_v: tuple[str, ...], placed: dict[str, Any]) -> None:
    """A later step of a window is its first step's numbers with the deliveries scaled to its row: equal, to the bit,
    to the numbers built from its own graph (across a window boundary too; and from another context's first step of
    the same window: 4,090 and 4,091 share the 4,096-row window, in caches of 4,096 and 4,352 cells)."""
    from sim.evaluator.costs import build, clear_costs, token_costs
    from sim.run.point import graph_at

    clear_costs()
    contexts = ((1000,), (4093,), (4090,), (4091,))
    for p in points(GridSpec(hardware=(hardware,), cache_types_v=cache_v, contexts=contexts, depths=(1,), tokens=6, **placed)):
        for k in range(p.workload.tokens):
            got, want = token_costs(p, k), build(p, graph_at(p, k))
            assert got.layout is want.layout and got.values.tolist() == want.values.tolist(), (p.context, k)


def test_check_sample_resimulates_and_reports() -> None:
    pts = points(GridSpec(contexts=((4096,), (16384,), (32768,)), depths=(0, 1, 2), budgets_mib=(0.0, 64.0), tokens=3))
    rows = evaluate(pts)
    assert boundary_points(rows)  # the 64 MiB budget declines the ring somewhere between 4,096 and 32,768
    assert check_sample(pts, rows, n=4) <= TOL
    bad = [dict(r) for r in rows]
    for r in bad:
        r["ms_per_token"] *= 1 + 1e-6
    with pytest.raises(EvaluatorDisagreement, match=r"differs from the simulator's \(exact\) by 1e-06"):
        check_sample(pts, bad, n=len(bad))
    assert check_sample(pts, [{**r, "engine": "simulator"} for r in rows]) == 0.0


def test_check_sample_runs_the_default_path_and_lets_the_exact_path_decide() -> None:
    """The check re-simulates on the simulator's default path (the fast path, no race checker); a row of it that differs
    from the evaluator's by more than the tolerance is simulated again exact, and that row decides."""
    pts = points(GridSpec(contexts=((4096,), (32768,)), depths=(0, 2), budgets_mib=(0.0,), tokens=6))
    rows = evaluate(pts)
    calls: list[tuple[str, int]] = []

    def fast(chosen: list[Point]) -> list[dict[str, Any]]:
        calls.append(("fast", len(chosen)))
        runs = [run_point(p, exact=False, checked=False) for p in chosen]
        assert all(any(g.extrapolated_from >= 0 for g in r.graphs) and "hazards" not in r.extra for r in runs)  # fast, unchecked
        out = [row(r) for r in runs]
        out[0] = {**out[0], "ms_per_token": out[0]["ms_per_token"] * (1 + 1e-6)}  # as if its extrapolation were off
        return out

    def exact(chosen: list[Point]) -> list[dict[str, Any]]:
        calls.append(("exact", len(chosen)))
        return [row(run_point(p, exact=True, checked=False)) for p in chosen]

    assert check_sample(pts, rows, n=len(pts), resimulate=fast, exact=exact) <= TOL
    assert calls == [("fast", len(pts)), ("exact", 1)]  # only the row that differed ran again
    with pytest.raises(EvaluatorDisagreement, match="1e-06"):  # and where the exact row differs too, it fails
        check_sample(pts, rows, n=len(pts), resimulate=fast, exact=lambda chosen: fast(chosen)[:len(chosen)])


def test_row_disagreement() -> None:
    a = {"x": 1.0, "y": {"z": [2.0, 3.0]}, "declined": False, "engine": "evaluator"}
    assert row_disagreement(a, {**a, "engine": "simulator"}) == 0.0
    assert row_disagreement(a, {**a, "x": 1.0 + 1e-12}) == pytest.approx(1e-12, rel=1e-3)
    assert row_disagreement(a, {**a, "declined": True}) == float("inf")
    assert row_disagreement(a, {k: v for k, v in a.items() if k != "x"}) == float("inf")



def test_row_disagreement_holds_clock_differences_on_the_token_time() -> None:
    """``ms_per_token`` and the ``breakdown_ms`` figures are differences of clock readings: a difference in them counts
    relative to the token's time (the larger ``ms_per_token``), not to themselves; every other field to itself."""
    a = {"ms_per_token": 1000.0, "late_mib": 2e-3, "breakdown_ms": {"total": 1000.0, "boundary_wait": 2e-3}}
    wait = {**a, "breakdown_ms": {**a["breakdown_ms"], "boundary_wait": 2e-3 + 1e-10}}
    assert row_disagreement(a, wait) == pytest.approx(1e-13, rel=1e-3)  # 5e-8 of itself
    assert row_disagreement(wait, {**wait, "ms_per_token": 2000.0}) == 0.5  # the larger token time, both ways
    assert row_disagreement({**wait, "ms_per_token": 2000.0}, a) == pytest.approx(0.5)
    assert row_disagreement(a, {**a, "late_mib": 2e-3 + 1e-10}) == pytest.approx(5e-8, rel=1e-3)  # not a clock's
    far = {**a, "breakdown_ms": {**a["breakdown_ms"], "boundary_wait": 2e-3 + 1e-5}}
    assert row_disagreement(a, far) == pytest.approx(1e-8, rel=1e-3)  # over the tolerance still: 1e-8 of the token
    assert row_disagreement(a["breakdown_ms"], wait["breakdown_ms"]) == pytest.approx(5e-8, rel=1e-3)  # no row: itself


def test_in_envelope_reasons() -> None:
    p = points(GridSpec(contexts=((4096,),), depths=(1,)))[0]
    assert in_envelope(p) is None
    wl, cfg = p.workload, p.transport
    cases = [
        (replace(p, transport=replace(cfg, arm="copy-only")), "arm copy-only"),
        (replace(p, transport=replace(cfg, mutations=frozenset({"margin0"}))), "mutated"),
        (replace(p, workload=replace(wl, pinned=False)), "pageable"),
        (points(GridSpec(hardware=("rtx4070-gen4x16+rtx3060-gen3x4",), split_mode="layer", contexts=((4096,),), depths=(1,)))[0],
         "2 devices"),
        (replace(p, transport=replace(cfg, margin_slots=1)), "margin 1"),
    ]
    for q, why in cases:
        assert why in (in_envelope(q) or ""), why
    with pytest.raises(ValueError, match="outside the evaluator's envelope: pageable"):
        evaluate([cases[2][0]])
    # the resident arm is inside, pinned or not (only its warm-up, the cache's load, reads the host cache)
    assert in_envelope(replace(p, workload=replace(wl, pinned=False), transport=replace(cfg, arm="resident", depth=0))) is None


def test_the_summary_a_plan_reads_is_what_the_rows_say() -> None:
    """``summarize`` (arrays, no rows: what ``kvpipe plan`` reads) gives every point the figures of its row, exactly:
    the same lanes, summed over tokens as ``sim.rows.row`` sums them; and a point that does not fit says so."""
    from sim.evaluator import summarize

    pts = points(GridSpec(contexts=((4096,), (30000,), (80352,)), depths=(0, 1, 3), budgets_mib=(0.0, 40.0), tokens=5))
    pts += points(GridSpec(contexts=((4096,), (30000,)), kv_offload=(False,), tokens=3))  # resident: a warm-up left out
    pts += points(GridSpec(models=("llama-3.1-70b",), contexts=((4096,),), depths=(0, 1)))  # 70B on 12 GB: does not fit
    s = summarize(pts)
    for i, p in enumerate(pts):
        if not s.fits[i]:
            with pytest.raises(OutOfDeviceMemory):
                evaluate([p])
            continue
        r = evaluate([p])[0]
        assert (s.tokens_per_s[i], s.ms_per_token[i], s.declined[i], s.ring_mib[i], s.ring_alloc_mib[i], s.window_rows[i],
                s.late_mib[i], s.blocked_ms[i]) == (r["tokens_per_s"], r["ms_per_token"], r["declined"], r["ring_mib"],
                                                     r["ring_alloc_mib"], r["window_rows"], r["late_mib"],
                                                     r["breakdown_ms"]["blocked_in_ordered_copies"]), p.transport
    assert not s.fits[-1] and s.fits[:-2].all() and s.declined.any()


def test_boundaries_are_changes_of_best_depth_or_decline_not_float_noise() -> None:
    """The sample check's boundaries (over arrays, as a plan of half a million points finds them): a decline that
    flips between neighbouring contexts, and a best depth that changes -- but not two depths within 1e-9 of each
    other trading places, which is float noise between depths that run the same schedule."""
    import numpy as np

    from sim.evaluator.check import boundaries

    # one line, one budget, contexts 1..4, depths 0..2 (index = 3 * context + depth)
    ctx = np.repeat(np.arange(4), 3)
    depth = np.tile(np.arange(3), 4)
    tps = np.array([10, 20, 20 * (1 + 1e-12),  # depth 1 and 2 tie: best is 1
                    10, 20 * (1 + 1e-12), 20,  # tie again, the other way round: still 1
                    10, 20, 30,  # depth 2 is better: a change
                    10, 20, 30], dtype=float)
    declined = np.zeros(12, dtype=bool)
    declined[[2, 5]] = True  # depth 2 declined at contexts 0 and 1, not after: a flip between contexts 1 and 2
    got = boundaries(np.zeros(12, dtype=np.int64), ctx, depth, np.zeros(12), tps, declined)
    assert got == {4, 8} | {5, 8}  # best 1 -> 2 between contexts 1 and 2 (points 4 and 8); the decline flip (5, 8)


def test_lanes_run_one_matrix_per_layout_depth_and_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """``evaluate._run_lanes`` groups its lanes as arrays: one ``run_token`` per (layout, depth and slots, machine) --
    a line's first token (fresh slots) and its later ones (slots used, the boundary wait or not) in one matrix with
    per-lane flags -- every lane in exactly one, and each lane's fields bit for bit what ``run_token`` gives that lane
    run alone under its own decision (``_setup`` of its code: the lanes of a matrix do not affect each other)."""
    import importlib

    import numpy as np

    ev = importlib.import_module("sim.evaluator.evaluate")  # the module (the package exports a function of its name)
    pts = points(GridSpec(contexts=((2048,), (9000,)), kv_gpu_layers=(0, 5), depths=(0, 1, 3), budgets_mib=(0.0, 64.0, 512.0),
                          hardware=("rtx4070-gen4x16", "rtx3060-gen3x4"), tokens=4))
    pts += points(GridSpec(contexts=((3000,),), kv_offload=(False,), depths=(0,), tokens=3))
    got: list[Any] = []
    calls: list[tuple[Any, Any, Any, Any, Any]] = []
    real_lanes, real_token = ev._run_lanes, ev.run_token

    def lanes(*a: Any) -> Any:
        out = real_lanes(*a)
        got.append((a, out))
        return out

    def token(layout: Any, X: Any, setup: Any, host: Any, dev: Any, used: Any = None, boundary: Any = None) -> Any:
        calls.append((layout, setup, host, used, boundary))
        return real_token(layout, X, setup, host, dev, used, boundary)

    monkeypatch.setattr(ev, "_run_lanes", lanes)
    monkeypatch.setattr(ev, "run_token", token)
    ev.summarize(pts)
    (plans, costs_of, keys, n_tok), out = got[0]
    assert len({(id(lay), s, id(h)) for lay, s, h, *_ in calls}) == len(calls) > 4
    assert sum(len(u) for *_, u, _ in calls) == len(keys)
    assert len({c[0] for c in calls}) > 2 and len({id(c[2]) for c in calls}) >= 2
    assert any(u.any() and not u.all() for *_, u, _ in calls) and any(b.any() and not b.all() for *_, b in calls)
    for j, key in enumerate(keys.tolist()):
        li, k = divmod(key >> 24, n_tok)
        c, line = costs_of[li][k], plans.lines[li]
        st = real_token(c.layout, c.values[None, :], ev._setup(key % (1 << 24), c.layout.staged), line.hardware.host,
                        line.hardware.devices[0])
        for f in out:
            assert out[f][j] == np.asarray(st[f]).reshape(-1)[0], (j, f)
