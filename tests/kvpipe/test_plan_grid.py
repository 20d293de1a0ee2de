"""A plan's grid answered as arrays (``sim.points.PointGrid``: no ``Point`` made up front) is answered as the same
points in a list are: the same figures, the same boundaries, the same sample drawn and checked."""

from __future__ import annotations

import os
from dataclasses import fields, replace
from typing import Any

import pytest

from kvpipe import plan_run, sweep_work
from kvpipe.plan_run import PlanRequest, Runner, grid, points
from sim.points import PointGrid

_CHECK_ROWS = sweep_work.check_rows


def _answers(req: PlanRequest, pts: Any, monkeypatch: pytest.MonkeyPatch, marked: int | None) -> dict[str, Any]:
    """What a runner says of ``pts`` run as a grid, then a list of other points, with point ``marked`` of the grid (if
    any) and one of the list marked."""
    seen: list[Any] = []

    def spy(sample: list, rows: list, *rest: Any) -> Any:  # type: ignore[type-arg]
        seen.append([(p.context, p.transport.depth, p.transport.budget_mib, p.transport.arm, p.workload.pinned, r)
                     for p, r in zip(sample, rows, strict=True)])
        return _CHECK_ROWS(sample, rows, *rest)

    monkeypatch.setattr(sweep_work, "check_rows", spy)
    with Runner(req) as runner:
        f = runner.run(pts, grid=True)
        extra = points(req, [6000, 12000], [0, 2], [0.0])
        extra = [*extra, *(replace(p, transport=replace(p.transport, arm="resident", depth=0)) for p in extra[:2])]
        g = runner.run(extra)
        runner.mark([extra[1], *([] if marked is None else [pts[marked]])])
        total, worst = runner.check(6)
    return {"figures": [getattr(f, x.name).tolist() for x in fields(f)], "extra": [getattr(g, x.name).tolist() for x in fields(g)],
            "check": (total, worst, runner.checked, runner.checked_exact), "sample": seen, "bounds": runner._bounds}


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("pageable", [False, True])
def test_a_grid_is_answered_as_its_points(jobs: int, pageable: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Runner.run`` and ``Runner.check`` of a ``PointGrid`` (``kvpipe.plan_run.grid``) and of its points as a list:
    every figure, the grid's boundaries, the check's sample (drawn, boundaries, marked points) and its rows equal,
    one process or two workers in pieces; ``pageable``: one context's host cache pageable, outside the evaluator's
    envelope (simulated), so the grid's evaluated points are a subset taken as arrays."""
    monkeypatch.setattr(plan_run, "PARALLEL_LINES", 1)  # pieces however few the lines
    req = PlanRequest(contexts=(2048, 5000, 9000, 17000, 30000), tokens=2, max_depth=3, jobs=jobs)
    g = grid(req, list(req.contexts), [0, 1, 2, 3], [0.0, 32.0, 64.0])
    if pageable:
        g = g.with_workloads(lambda w: replace(w, pinned=False) if w.context == (9000,) else w)
    assert isinstance(g, PointGrid) and not g.made()
    unmarked = {x[:3] for x in _answers(req, g.points(), monkeypatch, None)["sample"][0]}
    mark = next(i for i, p in enumerate(g.points()) if (p.context, p.transport.depth, p.transport.budget_mib) not in unmarked)
    as_grid = _answers(req, g, monkeypatch, mark)
    as_list = _answers(req, g.points(), monkeypatch, mark)
    assert as_grid == as_list
    assert (g[mark].context, g[mark].transport.depth, g[mark].transport.budget_mib) in {x[:3] for x in as_grid["sample"][0]}
    assert as_grid["sample"] and as_grid["check"][1] <= 1e-9
    assert sum(not e for e in as_grid["figures"][-1]) == (12 if pageable else 0)  # the pageable context's, simulated
    assert len(g.made()) < len(g)  # the grid's points made only where read


def test_the_gpu_compute_kept_per_window_is_the_one_made_afresh() -> None:
    """``kvpipe.plan_peak.gpu_compute_s`` keeps its answers by model, caches, pinning, machine, packing and window: asked
    in a mixed order over all of them, each answer equals the one made with nothing kept, bit for bit."""
    import itertools

    from kvpipe import plan_peak
    from sim.evaluator import clear_caches

    combos = []
    for hw, cache, pinned, pack, rows in itertools.product(("rtx4070-gen4x16", "rtx3060-gen3x4"), ("q8_0", "f16"), (True, False),
                                                           (True, False), (2048, 9000, 33000)):
        req = PlanRequest(hardware=hw, cache_type=cache, pinned=pinned, contexts=(4096,))
        p = points(req, [4096], [0], 0.0)[0]
        combos.append((replace(p, transport=replace(p.transport, pack_streams=pack)), rows))
    plan_peak._COMPUTE_S.clear()
    kept = [plan_peak.gpu_compute_s(p, rows) for p, rows in combos + combos[::-1]]
    fresh = []
    for p, rows in combos + combos[::-1]:
        plan_peak._COMPUTE_S.clear()
        clear_caches()
        fresh.append(plan_peak.gpu_compute_s(p, rows))
    assert kept == fresh and len(set(kept)) == 12  # two machines x two caches x three windows


def test_the_envelope_asked_once_per_workload_at_any_context_is_each_points() -> None:
    """``Runner._inside_of`` asks ``sim.evaluator.in_envelope`` once per workload at any context, machine and config
    but depth and budget: over contexts, pinned and pageable caches, --kv-gpu-layers, two sequences, two machines (one
    of two devices), the resident arm and a mutation, each point's answer is its own ``in_envelope``'s."""
    from kvpipe.executors import PackedPoints
    from sim.evaluator import in_envelope
    from sim.points import GridSpec
    from sim.points import points as grid_points

    base = grid_points(GridSpec(contexts=((2048,), (9000,)), depths=(0, 2), budgets_mib=(0, 64), kv_gpu_layers=(0, 3),
                                parallels=(1, 2), kv_offload=(True, False), hardware=("rtx4070-gen4x16", "rtx3060-gen3x4")))
    pageable = [replace(p, workload=replace(p.workload, pinned=False)) for p in base[::3]]  # the same machine objects
    mutated = [replace(p, transport=replace(p.transport, mutations=frozenset({"no-boundary-wait"})))
               for p in base[1::4] if p.transport.arm == "transport"]
    two = grid_points(GridSpec(contexts=((2048,),), depths=(1,), hardware=("rtx4070-gen4x16+rtx3060-gen3x4",)))
    pts = [p for group in zip(base, [*pageable, *mutated, *two, *base][: len(base)], strict=True) for p in group]
    want = [in_envelope(p) is None for p in pts]
    runner = Runner(PlanRequest())
    assert runner._inside_of(pts, PackedPoints(pts)).tolist() == want
    assert 0 < sum(want) < len(want)


def test_a_run_goes_before_the_checks_simulations_and_the_check_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the runner's pool, a run submitted while the check's boundary simulations wait (``Ahead``) cancels those not
    started and submits them again after its own pieces: the simulations held are resumed, and every figure, the
    sample and its rows, and the check are those of one process (no pool, nothing held).

    The simulations are made to wait, not left to timing: before the first of them, as many calls as the pool can have
    started (each worker's, and its call queue's) are submitted that block reading a pipe the test holds; the test
    writes to it once the next run has begun (``Runner.start`` returned). So every piece of the check's simulations is
    still waiting when that run comes, and all are held."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import EXTRA_QUEUED_CALLS

    monkeypatch.setattr(plan_run, "PARALLEL_LINES", 1)
    held: list[int] = []
    waiting: list[int] = []  # the pieces of the check's simulations submitted when the first was held
    gate: dict[str, Any] = {}
    real_hold, real_submit, real_start = sweep_work.Ahead.hold, sweep_work.Ahead.submit, Runner.start

    def submit(self: sweep_work.Ahead, ex: Any, pts: Any, workers: int) -> None:
        if isinstance(ex, ProcessPoolExecutor) and "blockers" not in gate:  # the pool's every startable call blocks
            n = 2 * gate["jobs"] + EXTRA_QUEUED_CALLS  # running, plus the call queue's room
            gate["blockers"] = [ex.submit(os.read, gate["read"], 1) for _ in range(n)]
        real_submit(self, ex, pts, workers)

    def hold(self: sweep_work.Ahead) -> list[tuple[int, int]]:
        if not held:
            waiting.append(sum(len(submitted) for _, submitted in self.batches))
        got = real_hold(self)
        held.append(len(got))
        return got

    def start(self: Runner, pts: Any, grid: bool = False) -> Any:
        collect = real_start(self, pts, grid)
        if "blockers" in gate and not gate.get("open"):  # a run begun after the check's simulations: let them go
            gate["open"] = os.write(gate["write"], b"x" * len(gate["blockers"]))
        return collect

    monkeypatch.setattr(sweep_work.Ahead, "submit", submit)
    monkeypatch.setattr(sweep_work.Ahead, "hold", hold)
    monkeypatch.setattr(Runner, "start", start)
    answers = {}
    gate["read"], gate["write"] = os.pipe()  # before the pool is made: its workers (forked) read it
    try:
        for jobs in (1, 2):
            gate["jobs"] = jobs
            req = PlanRequest(contexts=tuple(range(2048, 2048 * 25, 2048)), tokens=2, max_depth=3, jobs=jobs)
            answers[jobs] = _answers(req, grid(req, list(req.contexts), [0, 1, 2, 3], [0.0, 32.0, 64.0]), monkeypatch, None)
    finally:
        os.close(gate["read"])
        os.close(gate["write"])
    assert answers[1] == answers[2]
    assert gate.get("open") and all(f.result() == b"x" for f in gate["blockers"])  # the pool waited on the pipe
    assert held and waiting and held[0] == waiting[0] > 0  # every piece of the check's simulations was held, and resumed
