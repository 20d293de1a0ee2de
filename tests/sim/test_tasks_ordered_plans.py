"""The point planner's ordered runs planned together (``sim.run.tasks.tasks``) give the tasks and rows of each planned alone.

An ordered group (a declined or depth-0 point) is simulated at depth 0; its run's plan was ``plan_point`` of that run
alone, and is now one ``plan_points`` over every such run of the call. The reference below is ``tasks`` as it was
(Round 22's code), kept unchanged: every task equal to its (point, plan by repr, members), and every row of the sample
check's simulations (``kvpipe.sweep_work._sample_rows``) equal field for field, over points of the kinds BIG's check
re-simulates (the plan's default model and card, 4 tokens, depths 0-14, every budget the plan asks, the resident arm,
``--kv-gpu-layers``) and random points of other kinds (several sequences, a layer split over two cards, more tokens).
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

import kvpipe.sweep_work as sweep_work
from sim import replay
from sim.points import GridSpec, points
from sim.run import tasks
from sim.run.point import Point

BUDGETS = (0.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)


def _tasks_reference(points_: list[Point], todo: list[bool] | None = None, exact: bool = False,
                     share: bool = True) -> list[tasks.Task]:
    """``sim.run.tasks.tasks`` at 8f11c9d / 1219966: each ordered group's depth-0 run planned alone."""
    todo = todo if todo is not None else [True] * len(points_)
    if exact:
        return [tasks.Task(p, None, (tasks.Member(p, tasks.UNPLANNED, tasks._label(p), 1, i),), True)
                for i, p in enumerate(points_) if todo[i]]
    plans = tasks._plans(points_)
    if not share:
        keys: list[Any] = [("alone", i) for i in range(len(points_))]
    else:
        keys = [tasks.sim_key(p, pl, i) for i, (p, pl) in enumerate(zip(points_, plans, strict=True))]
    groups: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out = []
    for k, idx in groups.items():
        if not any(todo[i] for i in idx):
            continue
        first = points_[idx[0]]
        ordered = k[-1] == "ordered" and first.transport.depth != 0
        sim = replace(first, transport=replace(first.transport, depth=0)) if ordered else first
        members = tuple(tasks.Member(points_[i], plans[i], tasks._label(sim), len(idx), i) for i in idx if todo[i])
        out.append(tasks.Task(sim, replay.plan_point(sim) if ordered else plans[idx[0]], members, exact))
    return out


def _check_kinds(seed: int) -> list[Point]:
    """Points of the kinds BIG's sample check re-simulates, at random contexts of the plan's range."""
    rng = random.Random(seed)
    ctx = tuple((128 * rng.randrange(1, 4097),) for _ in range(3))
    depths = (0, *sorted(rng.sample(range(1, 15), 5)))
    pts = points(GridSpec(contexts=ctx[:1], depths=depths, budgets_mib=BUDGETS, tokens=4))
    pts += points(GridSpec(contexts=ctx[1:], depths=depths[1:], budgets_mib=BUDGETS, tokens=4))  # lines drawn without depth 0
    small = ((128 * rng.randrange(1, 256),),)  # the resident arm holds the whole cache on the card
    pts += points(GridSpec(contexts=small, kv_offload=(False,), depths=(0, 3), budgets_mib=(0.0, 256.0), tokens=4))
    pts += points(GridSpec(contexts=ctx[:1], kv_gpu_layers=(rng.randrange(1, 15),), depths=(0, 1, 6), budgets_mib=(0.0, 64.0),
                           tokens=4))
    pts = _fitting(pts)
    return [pts[i] for i in sorted(rng.sample(range(len(pts)), len(pts) // 2))]  # a sample, as the check draws: grid order


def _fitting(pts: list[Point]) -> list[Point]:
    """The points whose graphs fit their card (the check simulates only those)."""
    return [p for p, plan in zip(pts, tasks._plans(pts), strict=True) if plan.fits]


def _random_kinds(seed: int) -> list[Point]:
    rng = random.Random(seed)
    specs = [
        GridSpec(contexts=((rng.randrange(512, 8000),),), parallels=(rng.randrange(2, 9),), depths=(0, 2, 4), tokens=6),
        GridSpec(contexts=((rng.randrange(512, 8000),),), parallels=(3,), unified=False, depths=(0, 1, 4), tokens=5),
        GridSpec(contexts=((rng.randrange(8000, 40000),),), hardware=("rtx4070-gen4x16+rtx3060-gen3x4",),
                 split_mode="layer", depths=(0, 1, 3), budgets_mib=(0.0, 64.0), tokens=rng.choice([8, 13])),
        GridSpec(contexts=((rng.randrange(40000, 70000),),), kv_gpu_layers=(0, 2, 8), depths=(0, 1, 3), budgets_mib=(0.0, 128.0),
                 tokens=rng.choice([6, 9])),
        GridSpec(contexts=((rng.randrange(2000, 200000),),), depths=tuple(range(8)), budgets_mib=BUDGETS[::3],
                 tokens=rng.choice([4, 8])),
    ]
    return _fitting([p for spec in specs for p in points(spec)])


def _same_tasks(got: list[tasks.Task], want: list[tasks.Task]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.point == w.point and g.exact == w.exact and g.members == w.members
        assert g.plan == w.plan and repr(g.plan) == repr(w.plan)  # every float bit for bit (repr tells -0.0 and 0.0 apart)


def _same_rows(pts: list[Point], monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    got = sweep_work._sample_rows(pts, False)
    with monkeypatch.context() as m:
        m.setattr(tasks, "tasks", _tasks_reference)
        want = sweep_work._sample_rows(pts, False)
    assert len(got) == len(want) == len(pts)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        assert {k: repr(v) for k, v in g.items()} == {k: repr(v) for k, v in w.items()}, (g["context"], g["depth"], g["budget_mib"])
    return got


@pytest.mark.parametrize("seed", [1, 2])
def test_the_checks_kinds_of_points_give_the_tasks_and_rows_of_each_run_planned_alone(seed: int,
                                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pts = _check_kinds(seed)
    got = tasks.tasks(pts)
    _same_tasks(got, _tasks_reference(pts))
    assert sum(all(m.point is not t.point for m in t.members) for t in got) >= 2  # runs made at depth 0 for deeper points
    rows = _same_rows(pts, monkeypatch)
    assert any(r["declined"] for r in rows) and any(r["arm"] == "resident" for r in rows)


@pytest.mark.parametrize("seed", [3, 4])
def test_random_points_give_the_tasks_and_rows_of_each_run_planned_alone(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    pts = _random_kinds(seed)
    pts = [p for i, p in enumerate(pts) if i % 3]  # some lines without their depth-0 point
    todo = [random.Random(seed).random() < 0.7 for _ in pts]
    _same_tasks(tasks.tasks(pts, todo), _tasks_reference(pts, todo))
    _same_tasks(tasks.tasks(pts, share=False), _tasks_reference(pts, share=False))
    rows = _same_rows(pts, monkeypatch)
    assert any(r["parallel"] > 1 for r in rows) and any(r["split_mode"] == "layer" and r["depth"] for r in rows)


def test_runs_that_cannot_be_planned_together_are_planned_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the ordered runs' replay together raises, each is planned alone: the same tasks, and a run that cannot be
    planned raises what ``plan_point`` raises."""
    pts = _check_kinds(5)
    want = _tasks_reference(pts)
    assert sum(all(m.point is not t.point for m in t.members) for t in want) >= 2
    real = tasks.plan_points

    def not_together(ps: Any, *a: Any, **k: Any) -> Any:
        if len(ps) > 1 and all(p.transport.depth == 0 for p in ps):
            raise RuntimeError("not together")
        return real(ps, *a, **k)

    monkeypatch.setattr(tasks, "plan_points", not_together)
    _same_tasks(tasks.tasks(pts), want)

    def never(ps: Any, *a: Any, **k: Any) -> Any:
        if all(p.transport.depth == 0 for p in ps):
            raise ValueError("cannot plan this run")
        return real(ps, *a, **k)

    monkeypatch.setattr(tasks, "plan_points", never)
    monkeypatch.setattr(tasks, "plan_point", lambda p: never([p]).point_plan(0))
    with pytest.raises(ValueError, match="cannot plan this run"):
        tasks.tasks(pts)
