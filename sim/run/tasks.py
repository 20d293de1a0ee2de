"""The point planner's tasks: which simulation decides each requested point, found before anything is simulated.

A grid asks for many points that are one simulation in disguise. The ordered path (depth 0) never reads the
budget, so every budget of a depth-0 point is the same run; a pipelined point whose ring is declined at every
token runs the ordered path too; and two budgets that let the scheduler make the same plan at every token (the
same rings on, the same slots allocated, the same declines) are the same run. Which of these a point is follows
from the plan the scheduler would make, not from a row flag: ``sim.replay.plan_points`` replays the scheduler's
planning for every token of many points at once, without simulating anything (re-exported here with its records;
a test holds it to what the simulation decides on the 1,000-point grid).

:func:`tasks` groups the requested points by the simulation that decides them (the key of :func:`sim_key`). Each
group is one :class:`Task`: the point to simulate (an ordered group simulates at depth 0) and its members, each of
which keeps its own labels (depth and budget as requested) and says in its row which run it came from
(``simulated_as``: that run's depth and budget; ``shared_with_n``: how many requested points share it).
:func:`run_task` runs a task once (``sim.run.run.run_point``) and :func:`member_result` turns the run into each
member's result: its point, and its plan's per-token ring fields (a declined depth-3 point reports its ring and why
it was declined, over the ordered run's times and bytes).

Units: bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sim.replay import PLAN_FIELDS, Plans, PointPlan, TokenPlan, context_free, line_key, plan_point, plan_points, window_rows_at
from sim.run.point import Point, RunResult
from sim.run.run import run_point

__all__ = ["PLAN_FIELDS", "Member", "Plans", "PointPlan", "Task", "TokenPlan", "context_free", "line_key", "partitions",
           "member_result", "plan_point", "plan_points", "run_task", "sim_key", "tasks", "window_rows_at"]


UNPLANNED = PointPlan(())  # the plan of a point run exact, as asked (never read)

# ------------------------------------------------------------------ grouping


def _base(point: Point) -> Any:
    """Everything a simulation depends on but depth and budget."""
    return line_key(point)


def sim_key(point: Point, plan: PointPlan, index: int = 0) -> Any:
    """The key of the simulation that decides ``point``: equal keys, one simulation. Pure.

    Ordered (depth 0, or no ring delivers at any token): the ordered run of the point's workload, whatever the
    depth and budget. Pipelined: the depth and the plan of every token (a budget that changes no token's plan
    shares). A point whose graph does not fit, or that is mutated, runs alone (``index`` tells it apart).
    """
    if not plan.fits or point.transport.mutations:
        return ("alone", index)
    if not plan.pipelined:
        return (_base(point), "ordered")
    return (_base(point), point.transport.depth, tuple((t.stats, t.rings) for t in plan.tokens))


@dataclass(frozen=True)
class Member:
    """A requested point (``index`` in the list asked for), its plan, and which simulation its row comes from."""

    point: Point
    plan: PointPlan
    simulated_as: dict[str, Any] = field(default_factory=dict)
    shared_with_n: int = 1
    index: int = 0  # its place in the points asked for


@dataclass(frozen=True)
class Task:
    """One simulation (``point``, planned as ``plan``; None: exact, not planned) and the requested points it decides."""

    point: Point
    plan: PointPlan | None
    members: tuple[Member, ...]
    exact: bool = False


def partitions(points: Sequence[Point]) -> list[list[int]]:
    """The indices of ``points`` in groups that no simulation crosses (the same point but for depth and budget), in
    order of first appearance: a worker given whole partitions plans them as the whole grid would. Pure."""
    groups: dict[Any, list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault(_base(p), []).append(i)
    return list(groups.values())


def tasks(points: list[Point], todo: list[bool] | None = None, exact: bool = False, share: bool = True) -> list[Task]:
    """The simulations that decide ``points`` (grid order), each with its members among those ``todo`` marks.

    ``exact`` or not ``share``: one task per point, simulated as asked (``exact`` also runs every token). A group's
    simulation is its first point in grid order (an ordered group's at depth 0); ``shared_with_n`` counts the
    whole grid, so a resumed sweep's rows say the same. Pure (plans every point, then the ordered groups' depth-0 runs
    together; builds a graph per window size).
    """
    todo = todo if todo is not None else [True] * len(points)
    if exact:  # every point as asked: nothing to plan
        return [Task(p, None, (Member(p, UNPLANNED, _label(p), 1, i),), True) for i, p in enumerate(points) if todo[i]]
    plans = _plans(points)
    if not share:
        keys: list[Any] = [("alone", i) for i in range(len(points))]
    else:
        keys = [sim_key(p, pl, i) for i, (p, pl) in enumerate(zip(points, plans, strict=True))]
    groups: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    runs = []  # (the group's indices, its simulation's point, whether that is the depth-0 run of a deeper first point)
    for k, idx in groups.items():
        if not any(todo[i] for i in idx):
            continue
        first = points[idx[0]]
        ordered = k[-1] == "ordered" and first.transport.depth != 0
        runs.append((idx, replace(first, transport=replace(first.transport, depth=0)) if ordered else first, ordered))
    ordered_plans = iter(_plans([sim for _, sim, ordered in runs if ordered], alone=plan_point))
    out = []
    for idx, sim, ordered in runs:
        members = tuple(Member(points[i], plans[i], _label(sim), len(idx), i) for i in idx if todo[i])
        out.append(Task(sim, next(ordered_plans) if ordered else plans[idx[0]], members, exact))
    return out


def _label(sim: Point) -> dict[str, Any]:
    """``simulated_as``: the depth and budget of the run (its other coordinates are every member's own)."""
    return {"depth": sim.transport.depth, "budget_mib": sim.transport.budget_mib}


def _plans(points: list[Point], alone: Callable[[Point], PointPlan] | None = None) -> list[PointPlan]:
    """Every point's plan, planned together (a point's plan is the same whatever else the replay holds: its arrays are
    per point); if that raises, each ``alone`` (default :func:`_plan_or_alone`; ``plan_point`` raises what the first
    point that cannot be planned raises). Pure."""
    if not points:
        return []
    try:
        together = plan_points(points)
    except Exception:  # noqa: BLE001 - some point cannot be planned: find which, point by point
        return [(alone or _plan_or_alone)(p) for p in points]
    return [together.point_plan(i) for i in range(len(points))]


def _plan_or_alone(point: Point) -> PointPlan:
    """The point's plan; one that cannot be planned runs alone, and its simulation says why."""
    try:
        return plan_point(point)
    except Exception as exc:  # noqa: BLE001 - the simulation of the point raises it again, where it is reported
        return PointPlan((), False, f"{type(exc).__name__}: {exc}")


# ------------------------------------------------------------------ running


def member_result(result: RunResult, member: Member, simulated: Point) -> RunResult:
    """The result of ``member`` from the run of ``simulated``: its own point and labels (the run's own point where
    the member is the point simulated: a functional run reports its scaled point), and its plan's ring fields per
    token where its depth differs from the run's (a declined point over the ordered run). Pure."""
    graphs = result.graphs
    if member.point.transport.depth != simulated.transport.depth and member.plan.fits:
        graphs = [replace(g, **t.fields()) for g, t in zip(graphs, member.plan.tokens, strict=True)]
    extra = {**result.extra, "simulated_as": dict(member.simulated_as), "shared_with_n": member.shared_with_n}
    return replace(result, point=result.point if member.point is simulated else member.point, graphs=graphs, extra=extra)


def run_task(task: Task, trace: bool = False, functional: bool = False, checked: bool = True) -> list[RunResult]:
    """Simulate ``task`` once (``run_point``; the fast path unless the task is exact; under the race checker unless not
    ``checked``) and return one result per member. Blocks for the simulation's wall time. Raises what the simulation
    raises."""
    result = run_point(task.point, exact=task.exact, trace=trace, functional=functional, plan=task.plan, checked=checked)
    result.extra["tokens_simulated"] = sum(1 for g in result.graphs if g.extrapolated_from < 0)
    return [member_result(result, m, task.point) for m in task.members]
