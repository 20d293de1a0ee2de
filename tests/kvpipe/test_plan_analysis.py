"""The plan's analysis over arrays gives the per-context Python's answers: best depths, and the runs it takes from the
grid (held to the paths they replace)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest

from kvpipe import plan_run
from kvpipe.plan import TIE_GAIN, PlanRequest, _best_depth, _best_depths, plan
from kvpipe.plan_run import Runner


def test_best_depths_as_arrays_are_the_best_depth_of_each_row() -> None:
    """``_best_depths`` over (budget, context, depth) equals ``_best_depth`` of each row's dict, bit for bit: ties within
    TIE_GAIN (just inside and just outside) to the shallower, rows with no positive gain (0, 0.0), a NaN row."""
    rng = np.random.default_rng(7)
    gains = rng.uniform(-0.5, 0.8, size=(4, 60, 9))
    gains[0, :10] = -rng.uniform(0.0, 1.0, size=(10, 9))  # none positive
    gains[1, :10, 3] = gains[1, :10].max(axis=1) + 0.25  # a clear best at depth 4
    gains[1, 10:20, 6] = gains[1, 10:20, 3] = gains[1, 10:20].max(axis=1) + 0.1  # an exact tie: the shallower
    gains[1, 20:30, 7] = gains[1, 20:30].max(axis=1) + 0.1
    gains[1, 20:30, 2] = gains[1, 20:30, 7] - TIE_GAIN * 0.5  # within the tie: depth 3 though lower
    gains[1, 30:40, 7] = gains[1, 30:40].max(axis=1) + 0.1
    gains[1, 30:40, 2] = gains[1, 30:40, 7] - TIE_GAIN * 4  # outside it: depth 8
    gains[2, :5] = 0.0

    def by_dict(g: np.ndarray) -> tuple[list, list]:  # type: ignore[type-arg]
        got = [[_best_depth(dict(zip(range(1, g.shape[-1] + 1), row, strict=True))) for row in plane] for plane in g.tolist()]
        return [[d for d, _ in plane] for plane in got], [[x for _, x in plane] for plane in got]

    d, g = _best_depths(gains)
    assert (d.tolist(), g.tolist()) == by_dict(gains)
    assert {x for plane in d.tolist() for x in plane} >= {0, 3, 4, 8}
    gains[3, 5, 4] = np.nan  # a NaN after the first depth: the dict path's max passes it over
    d, g = _best_depths(gains)
    assert (d.tolist(), g.tolist()) == by_dict(gains)


def _planned(req: PlanRequest, monkeypatch: pytest.MonkeyPatch, from_grid: bool) -> dict[str, Any]:
    """A plan's answers, its runner's record (points and figures of every run) and its check."""
    from kvpipe import plan as gain_plan

    taken: list[bool] = []
    pairs = gain_plan._Grid.pairs

    def spy(self: Any, todo: Any) -> Any:
        got = pairs(self, todo) if from_grid else None
        taken.append(got is not None)
        return got

    monkeypatch.setattr(gain_plan._Grid, "pairs", spy)
    with Runner(req) as runner:
        out = plan(req, runner)
        check = runner.check(8)
    monkeypatch.undo()
    return {"plans": [p.to_json() for p in out], "check": (check, runner.checked, runner.checked_exact), "taken": taken,
            "record": [(list(ps), [getattr(f, x.name).tolist() for x in fields(f)]) for ps, f in runner.evaluated]}


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_budgets_runs_taken_from_the_grid_answer_as_the_runs_they_replace(jobs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default budget's and ``--budget-for-gain``'s pairs, where the grid has them (the default budget is one of
    ``--budget``), are taken from the grid's figures: every context's plan, every run the check draws from (its points,
    equal to the points the run would have made, and every figure, bit for bit) and the check equal those of the runs
    made again; a plan whose points the evaluator does not answer (a pageable host cache) runs them."""
    monkeypatch.setattr(plan_run, "PARALLEL_LINES", 1)  # pieces however few the lines
    req = PlanRequest(contexts=(2048, 5000, 9000, 17000, 9000, 30000), tokens=2, max_depth=3, jobs=jobs,
                      budgets_mib=(0.0, 32.0, 128.0), budget_for_gain=1.0)
    new, old = _planned(req, monkeypatch, True), _planned(req, monkeypatch, False)
    assert new["taken"][0] and not any(old["taken"])  # the default budget's pairs came from the grid
    assert new["plans"] == old["plans"] and new["check"] == old["check"] and new["record"] == old["record"]
    assert len(new["record"]) >= 3 and new["check"][0][1] <= 1e-9
    off = replace(req, pinned=False, contexts=(2048, 9000), budget_for_gain=None, max_depth=1)
    new, old = _planned(off, monkeypatch, True), _planned(off, monkeypatch, False)
    assert new["taken"] == [False] and new["plans"] == old["plans"] and new["record"] == old["record"] == []


@pytest.mark.parametrize("model", ["qwen3.8-27b", "llama-3.1-70b"])
def test_a_choice_from_its_unfigured_part_made_ahead_is_the_choice_made_at_once(model: str) -> None:
    """``choice_of`` given ``unfigured`` of its candidate (made while the workers answer the candidates) equals it made
    at once, for every candidate of a few contexts -- the resident arm, resident layers, a declined ring (figures
    made up so that some decline), -ngl below every layer (70B on a 12 GB card) -- with the figures its run gives."""
    from kvpipe.capacity import Choice, choice_of, limits_of, ring_estimate_mib, unfigured
    from kvpipe.capacity_fit import candidates, host_need_bytes, placed
    from sim.memory import GIB, MIB, device_memory
    from sim.rows import interval_fields, placement_fields
    from sim.workload import ngl_of

    req = PlanRequest(model=model, contexts=(2048, 30000, 131072), tokens=2, max_depth=3, jobs=1)
    base = plan_run.points(req, [2048], [0], 0.0)[0]
    limits = limits_of(None, 64.0, base.hardware.devices[0].memory_total_bytes, req.hardware, 64 * GIB)
    pts = []
    for c in req.contexts:
        pt = replace(base, workload=replace(base.workload, context=(c,), n_gpu_layers=40 if model == "llama-3.1-70b" else 99))
        got = placed(pt, limits, "fork", model == "llama-3.1-70b")
        pts += candidates(pt, limits, req.max_depth, {d: ring_estimate_mib(pt.workload, d) for d in range(4)}, "fork",
                          model == "llama-3.1-70b", got)
    figs = Runner(req).run(pts)
    figs = replace(figs, declined=figs.declined | (np.arange(len(pts)) % 3 == 1))
    made = [choice_of(p, figs, i, limits) for i, p in enumerate(pts)]
    ahead = [choice_of(p, figs, i, limits, unfigured(p, limits)) for i, p in enumerate(pts)]

    def at_once(p: Any, i: int) -> Choice:  # the choice as it was made, every part from its candidate at once
        wl, tc, resident = p.workload, p.transport, p.transport.arm == "resident"
        ring = 0 if figs.declined[i] else int(float(figs.ring_alloc_mib[i]) * MIB)
        mem = device_memory(wl, limits.vram_bytes, p.hardware.devices[0].memory_reserved_bytes, kv_offload=resident,
                            ring_bytes=ring)
        tps = float(figs.tokens_per_s[i])
        return Choice(resident, ngl_of(wl), wl.kv_gpu_layers, wl.pinned, tc.depth, tc.budget_mib, tps,
                      interval_fields(p, tps)["tokens_per_s_interval"], mem, host_need_bytes(wl, resident),
                      bool(figs.declined[i]), str(placement_fields(wl, p.hardware.devices[0].compute).get("cpu_layers_cost", "")))

    assert ahead == made == [at_once(p, i) for i, p in enumerate(pts)]
    assert any(c.declined for c in made)
    if model == "llama-3.1-70b":  # CPU layers: priced, and no resident layers beside them
        assert all(c.cpu_layers_cost and c.n_gpu_layers < 81 for c in made)
    else:
        assert {c.resident for c in made} == {True, False} and any(c.kv_gpu_layers for c in made)
        assert any(c.memory.ring_bytes for c in made)


def test_the_rings_the_memory_plan_starts_from_are_the_plans_rings() -> None:
    """``plan(then=...)`` is given, before the plans are made, each planned context's ring by depth read off the grid:
    equal to the plans' ``ring_mib_by_depth`` (a context asked twice once; one that does not fit the device not at
    all), and nothing more."""
    req = PlanRequest(contexts=(4096, 16384, 4096, 464384), tokens=1, max_depth=2, jobs=1, budgets_mib=(0.0, 64.0))
    seen: list[dict[int, dict[int, float]]] = []
    out = plan(req, then=seen.append)
    assert len(seen) == 1 and seen[0] == {p.context: p.ring_mib_by_depth for p in out}
    assert sorted(seen[0]) == [4096, 16384] and len(out) == 3 and all(len(r) == 2 for r in seen[0].values())
