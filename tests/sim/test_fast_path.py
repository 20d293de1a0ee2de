"""The fast path held to the exact one: the point planner (``sim.run.tasks``) and the steady tokens (``sim.run.decode``).

The exact side of the 1,000-point grid runs once for the module (every point, every token, two processes, nothing
kept between runs); the planner's per-token plan and the fast path's rows are compared with it.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest

from kvpipe.cli import main
from kvpipe.sweep import executor_for, run_sweep
from sim import replay
from sim.points import GridSpec, points
from sim.rows import row
from sim.run import decode, run, tasks
from sim.run.point import Point, RunResult, graph_at
from sim.run.run import run_point

GRID = GridSpec(contexts=tuple((c,) for c in range(1024, 52225, 1024)), depths=(0, 1, 2, 3, 4), budgets_mib=(0, 64, 128, 256))
#: Row fields the fast path must give bit-identical (the time fields within REL of exact).
SAME = ("ring_mib", "ring_alloc_mib", "declined", "decline_reason", "early_mib", "late_mib", "ordered_mib", "ordered_copies",
        "deliveries", "depth_stops", "recycle_waits", "tokens", "window_rows", "depth", "budget_mib", "context", "hazards")
REL = 1e-3


def _exact(pts: list[Point]) -> list[RunResult]:
    with executor_for(2) as ex:
        return list(ex.map(run_point, pts, chunksize=16))


@pytest.fixture(scope="module")
def grid() -> tuple[list[Point], list[RunResult]]:
    pts = points(GRID)
    assert len(pts) == 1020 and {p.workload.tokens for p in pts} == {8}  # the sweep's default tokens
    return pts, _exact(pts)


def _held_to_exact(fast: list[dict[str, Any]], exact: list[RunResult]) -> float:
    """Assert each fast row against its exact run; returns the worst relative ms/token difference."""
    assert len(fast) == len(exact)
    worst = 0.0
    for f, e in zip(fast, (row(r) for r in exact), strict=True):
        assert {k: f[k] for k in SAME} == {k: e[k] for k in SAME}, (f["context"], f["depth"], f["budget_mib"])
        worst = max(worst, abs(f["ms_per_token"] - e["ms_per_token"]) / e["ms_per_token"])
    assert worst <= REL
    return worst


def test_the_planner_decides_what_the_simulation_decides_on_the_grid(grid: tuple[list[Point], list[RunResult]]) -> None:
    pts, exact = grid
    for p, r in zip(pts, exact, strict=True):
        plan = replay.plan_point(p)
        assert plan.fits and len(plan.tokens) == len(r.graphs)
        for t, g in zip(plan.tokens, r.graphs, strict=True):
            assert t.fields() == {f: getattr(g, f) for f in replay.PLAN_FIELDS}, (p.context, p.transport, g.token)
            assert t.active == ((0,) if g.deliveries else ())
    p = pts[-1]
    assert [replay.window_rows_at(p.workload, i) for i in range(8)] == [graph_at(p, i).window_rows for i in range(8)]


def test_the_evaluator_holds_to_exact_on_the_grid(grid: tuple[list[Point], list[RunResult]]) -> None:
    """The compiled evaluator (``sim.evaluator``, the sweep's default for these points): every row field within 1e-9
    relative of the exact simulation's and the declined flags equal, on the whole grid."""
    from sim.evaluator import evaluate, row_disagreement

    pts, exact = grid
    worst = 0.0
    for got, r in zip(evaluate(pts), exact, strict=True):
        want = row(r)
        assert got["declined"] == want["declined"]
        worst = max(worst, row_disagreement(got, want))
    assert worst <= 1e-9
    print(f"the evaluator on the 1,020-point grid: max relative disagreement {worst:.3g}")


def test_the_fast_sweep_holds_to_exact_on_the_grid(grid: tuple[list[Point], list[RunResult]]) -> None:
    pts, exact = grid
    res = run_sweep(pts, None, jobs=2, progress=False, evaluator=False)  # the simulator's fast path, not the evaluator
    assert len(res.rows) == 1020 and res.simulations < 300  # 51 ordered runs and one per pipelined (context, depth)
    _held_to_exact(res.rows, exact)
    assert {r["tokens_simulated"] for r in res.rows} == {3}  # token 0, then a steady pair; 5 tokens extrapolated
    for r in res.rows:  # rows keep their labels and say where they came from
        if r["depth"] == 0 or r["declined"]:
            assert r["simulated_as"]["depth"] == 0 and r["shared_with_n"] >= 4
        else:
            assert r["simulated_as"]["depth"] == r["depth"]
    assert sum(r["simulated_as"] == {"depth": r["depth"], "budget_mib": r["budget_mib"]} for r in res.rows) == res.simulations


def test_a_ring_that_pipelines_token_0_and_declines_after_is_not_the_ordered_run() -> None:
    # token 0's ring fits beside the headroom, token 1's does not (the window grows by a padding step); the context
    # moved from 83,968 to 80,352 when llama.cpp's compute buffer, whose KQ mask grows with the cells, joined sim.memory
    pts = points(replace(GRID, contexts=((80352,),)))
    piped = next(p for p in pts if (p.transport.depth, p.transport.budget_mib) == (3, 0))
    plan = replay.plan_point(piped)
    assert [t.active for t in plan.tokens] == [(0,)] + [()] * 7
    assert "headroom" in plan.tokens[1].fields()["decline_reason"]
    task = next(t for t in tasks.tasks(pts) if any(m.point is piped for m in t.members))
    assert task.point is piped and len(task.members) == 1
    assert [(s.start, s.stop) for s in decode.segments(plan)][:3] == [(0, 1), (1, 2), (2, 3)]  # the ring idles, counted
    _held_to_exact(run_sweep(pts, None, jobs=1, progress=False, evaluator=False).rows, [run_point(p) for p in pts])


def _random_specs(seed: int) -> list[GridSpec]:
    rng = random.Random(seed)
    specs = [
        GridSpec(contexts=((4473,),), depths=(2,), budgets_mib=(512,), tokens=300),  # its time turns within a block
        GridSpec(contexts=((1020,),), depths=(0, 1), budgets_mib=(0,), tokens=8),  # crosses a 256-row block
        GridSpec(contexts=((rng.randrange(512, 8000),),), parallels=(rng.randrange(2, 9),), depths=(0, 2), tokens=6),
        GridSpec(contexts=((rng.randrange(512, 8000),),), parallels=(3,), unified=False, depths=(0, 1, 4), tokens=5),
        GridSpec(contexts=((rng.randrange(8000, 40000),),), hardware=("rtx4070-gen4x16+rtx3060-gen3x4",),
                 split_mode="layer", depths=(0, 1, 3), budgets_mib=(0, 64), tokens=rng.choice([8, 13])),
        # --kv-gpu-layers: the device's prefix placed before the ring (a headroom decline moves with it), a layer split
        GridSpec(contexts=((rng.randrange(40000, 70000),),), kv_gpu_layers=(0, 2, 4, 8), depths=(0, 1, 3), budgets_mib=(0, 128),
                 tokens=rng.choice([6, 9])),
        GridSpec(contexts=((rng.randrange(4000, 20000),),), hardware=("rtx4070-gen4x16+rtx3060-gen3x4",), split_mode="layer",
                 kv_gpu_layers=(4, 16), depths=(0, 2), budgets_mib=(0,), tokens=5),
    ]
    for _ in range(3):  # budgets either side of the decline
        spec = GridSpec(contexts=((rng.randrange(2000, 60000),),), depths=(rng.randrange(1, 5),), tokens=rng.choice([4, 8, 13]))
        last = replay.plan_point(points(spec)[0]).tokens[-1].fields()
        need = last["slot_need_bytes"] * last["ring_slots"] / 2**20
        specs.append(replace(spec, depths=(0, *spec.depths), budgets_mib=tuple(sorted({round(need + d, 2) for d in (-0.01, 0, 0.01)}))))
    return specs


def test_random_points_hold_to_exact() -> None:
    pts = [p for spec in _random_specs(15) for p in points(spec)]
    exact = [run_point(p) for p in pts]
    res = run_sweep(pts, None, jobs=1, progress=False, evaluator=False)
    _held_to_exact(res.rows, exact)
    assert any(r["declined"] for r in res.rows) and any(r["parallel"] > 1 and not r["unified"] for r in res.rows)
    assert any(r["split_mode"] == "layer" and r["depth"] and not r["declined"] for r in res.rows)
    assert any(r.get("kv_gpu_layers") and r["depth"] and not r["declined"] for r in res.rows)
    assert any(r.get("kv_gpu_layers") and r["declined"] for r in res.rows)


def test_the_extrapolation_is_checked_where_it_runs_long(monkeypatch: pytest.MonkeyPatch) -> None:
    (p,) = points(GridSpec(contexts=((4473,),), depths=(2,), budgets_mib=(512,), tokens=300))
    exact = row(run_point(p))["ms_per_token"]
    fast = run_point(p, exact=False)
    assert len(fast.graphs) == 300 and [g.token for g in fast.graphs] == list(range(300))
    simulated = [g.token for g in fast.graphs if g.extrapolated_from < 0]
    assert 0 in simulated and len(simulated) < 40
    assert abs(row(fast)["ms_per_token"] - exact) / exact < 1e-5
    monkeypatch.setattr(decode, "UNCHECKED_TOKENS", 10**9)  # one pair per block, trusted to its end: visibly worse
    assert abs(row(run_point(p, exact=False))["ms_per_token"] - exact) / exact > 1e-4


def test_extrapolated_tokens_are_marked_copies_of_the_steady_pair() -> None:
    (p,) = points(GridSpec(contexts=((16384,),), depths=(1,), budgets_mib=(128,), tokens=8))
    fast, exact = run_point(p, exact=False), run_point(p)
    assert [g.extrapolated_from for g in fast.graphs] == [-1, -1, -1, 2, 2, 2, 2, 2]
    assert [g.extrapolated_from for g in exact.graphs] == [-1] * 8
    assert [g.early_bytes for g in fast.graphs] == [g.early_bytes for g in exact.graphs]  # the prefix grows a row a token
    a, b = fast.graphs[1:3]
    assert fast.graphs[5] == replace(b, token=5, extrapolated_from=2, **{f: getattr(b, f) + 3 * decode.step(a, b, f)
                                                                         for f in decode.DRIFT_FIELDS})
    assert decode.step(a, b, "total_s") == b.total_s - a.total_s != 0  # this point's time moves a little every token
    (q,) = points(GridSpec(contexts=((32768,),), depths=(0,), tokens=8))
    ordered = run_point(q, exact=False)
    assert {g.total_s for g in ordered.graphs[2:]} == {ordered.graphs[2].total_s}  # noise is no step: the same token


def test_tokens_that_never_match_are_all_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "STEADY_RTOL", -1.0)
    (p,) = points(GridSpec(contexts=((16384,),), depths=(2,), budgets_mib=(0,), tokens=6))
    fast, exact = run_point(p, exact=False), run_point(p)
    assert fast.graphs == exact.graphs


def test_traces_mutations_and_the_exact_flag_simulate_every_token(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    grid = ["--context", "16384", "--depth", "0,1", "--budget", "0,128", "--tokens", "5", "--json"]
    assert main(["simulate", *grid]) == 0
    fast = json.loads(capsys.readouterr().out)
    assert [(r["depth"], r["budget_mib"], r["shared_with_n"], r["tokens_simulated"]) for r in fast] == [
        (0, 0.0, 2, 3), (0, 128.0, 2, 3), (1, 0.0, 2, 3), (1, 128.0, 2, 3)]
    assert fast[1]["simulated_as"] == {"depth": 0, "budget_mib": 0.0}
    for extra in (["--exact"], ["--trace", str(tmp_path / "t.json")], ["--mutate", "stale-prefix", "--no-fail-on-hazard"]):
        assert main(["simulate", *grid, *extra]) in (0, 1)
        rows = json.loads(capsys.readouterr().out)
        assert all(r["tokens_simulated"] == 5 and r["shared_with_n"] == 1 for r in rows), extra
    assert main(["sweep", *grid[:-1], "--exact", "--out", str(tmp_path / "sw"), "--quiet"]) == 0
    swept = json.loads((tmp_path / "sw" / "rows.json").read_text())
    assert all(r["tokens_simulated"] == 5 and r["shared_with_n"] == 1 for r in swept)
    assert main(["sweep", *grid[:-1], "--out", str(tmp_path / "sw"), "--quiet"]) == 2  # exact rows are not resumed fast
    capsys.readouterr()
    plans = []
    for extra in ([], ["--exact"]):
        assert main(["plan", "--context", "8192,32768", "--max-depth", "2", "--tokens", "3", "--json", *extra]) == 0
        plans.append(json.loads(capsys.readouterr().out))
    for f, e in zip(*plans, strict=True):
        assert f["best_depth"] == e["best_depth"] and f["uncapped_gain"] == pytest.approx(e["uncapped_gain"], abs=2e-3)


def test_a_fast_run_that_finds_a_hazard_runs_again_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    real, fast_calls = run.check, []

    def check(point: Point, **kw: Any) -> run.Checked:
        got = real(point, **kw)
        fast_calls.append(kw.get("steady_plan") is not None)
        if fast_calls[-1]:
            got.result.extra["hazards"] = 1  # as if the checker had found one in a simulated token
        return got

    monkeypatch.setattr(run, "check", check)
    (p,) = points(GridSpec(contexts=((8192,),), depths=(1,), tokens=6))
    result = run_point(p, exact=False)
    assert fast_calls == [True, False] and result.extra["hazards"] == 0
    assert [g.extrapolated_from for g in result.graphs] == [-1] * 6  # every token, every hazard counted


@pytest.mark.parametrize("exact_path", [False, True])
def test_the_sample_checks_shared_runs_are_each_points_own(grid: tuple[list[Point], list[RunResult]], exact_path: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvpipe.sweep_work.simulated_rows`` (what the sample checks compare with: the simulator's default path, no race
    checker) and ``exact_rows`` (what they fall back on) run each distinct simulation once -- on the fast path, or every
    token -- and give each point a row within 1e-9 (default path) or 1e-12 (exact) of its own exact, checked simulation
    (fields that say how a row was made aside)."""
    from kvpipe.sweep import _Serial, exact_rows, simulated_rows
    from sim.evaluator import row_disagreement

    pts, exact = grid
    pick = sorted(random.Random(8).sample(range(len(pts)), 240))
    ran: list[int] = []
    real = tasks.run_task

    def counting(task: Any, checked: bool = True) -> Any:
        ran.append(len(task.members))
        assert task.exact == exact_path and not checked
        return real(task, checked=checked)

    monkeypatch.setattr(tasks, "run_task", counting)
    got = (exact_rows if exact_path else simulated_rows)(_Serial(), [pts[i] for i in pick])
    assert len(got) == len(pick) and sum(ran) == len(pick) and len(ran) < len(pick) * 3 // 4  # shared, and every point once
    assert all((r["tokens_simulated"] == 8) == exact_path for r in got)  # 8 tokens; the fast path extrapolates
    for i, r in zip(pick, got, strict=True):
        want = row(exact[i])
        assert (r["context"], r["depth"], r["budget_mib"]) == (want["context"], want["depth"], want["budget_mib"])
        assert row_disagreement(r, want) <= (1e-12 if exact_path else 1e-9), (want["context"], want["depth"], want["budget_mib"])
