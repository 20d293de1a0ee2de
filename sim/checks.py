"""Run a point under the race checker, and optionally with real bytes (functional mode).

One entry point that ``simulate``, ``sweep`` and the tests share: the SimPy
machine wrapped in ``backends.checked.CheckedBackend``, so every row says how
many happens-before hazards the schedule had (``hazards``; with examples when
there are any). In functional mode (:mod:`sim.functional`) the point is
scaled to the CI-sized functional workload, the machine moves real bytes, the
decode program computes real logits, and the row gains ``output_hash``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from backends.checked import CheckedBackend
from backends.simpy_machine import SimMachine
from sim import steady
from sim.distinct import Member, PointPlan, Task, plan_point
from sim.graph import DecodeGraph
from sim.simulate import Point, RunResult, graphs_for, placed_hardware, run_decode

if TYPE_CHECKING:
    from sim.program import DecodeProgram

GraphsFn = Callable[[Point], Iterator[DecodeGraph]]


@dataclass
class Checked:
    """A checked run: the result row's source, the checker, and the program (functional mode)."""

    result: RunResult
    checker: CheckedBackend
    program: DecodeProgram | None = None


def check(
    point: Point,
    trace: bool = False,
    functional: bool = False,
    graphs: GraphsFn | None = None,
    program: DecodeProgram | None = None,
    record_copies: bool = False,
    machine: SimMachine | None = None,
    steady_plan: PointPlan | None = None,
) -> Checked:
    """Simulate ``point`` under the checker, as given (no scaling). Blocks for the simulation's wall time.

    ``graphs`` defaults to the plain decode graphs; ``program`` (functional
    mode) defaults to a :class:`DecodeProgram` of the point's workload;
    ``machine`` (a fresh SimPy machine by default) lets a test inject faults. With ``steady_plan`` (the point's
    plan, ``sim.distinct.plan_point``) the run takes the fast path of ``sim.steady``.
    """
    t = time.perf_counter()
    point = _placed(point)
    if machine is None:
        machine = SimMachine(point.hardware, functional=functional, trace=trace)
    checker = CheckedBackend(machine, record_copies=record_copies)
    if functional and program is None:
        from sim.program import DecodeProgram  # NumPy: a timing run never imports it

        program = DecodeProgram(point.workload)
    gfn = graphs or graphs_for
    if steady_plan is not None:
        host = steady.decode(checker, point, steady_plan)
    else:
        host = run_decode(checker, point, program if functional else None, graphs=gfn)
    _, stats = machine.run(host)
    first = next(iter(gfn(point)))
    result = RunResult(point, stats, machine.timeline() if trace else [], first.window_rows, time.perf_counter() - t)
    result.extra["hazards"] = checker.hazard_count
    if checker.hazard_count:
        result.extra["hazard_examples"] = checker.report()
    if functional and program is not None:
        result.extra["output_hash"] = program.output_hash()
    return Checked(result, checker, program if functional else None)


def _placed(point: Point) -> Point:
    """The point with its weights placed on its devices, as ``sim.simulate.simulate`` does it."""
    return replace(point, hardware=placed_hardware(point))


def run_checked(point: Point, trace: bool = False, functional: bool = False, exact: bool = True,
                plan: PointPlan | None = None) -> RunResult:
    """Simulate ``point`` with the race checker on; functional mode runs the scaled functional workload.

    Blocks for the simulation's wall time. The result's ``extra`` carries
    ``hazards`` (and ``hazard_examples``), plus ``output_hash`` when functional.
    The resident arm's first graph loads the whole cache onto the device, once,
    as a model load does: it runs one graph more and leaves that one out, so
    every command's row (simulate, sweep, plan) is a steady token. Not ``exact``:
    the fast path of ``sim.steady`` where it applies (``plan``: the point's plan,
    made here if not given); a fast run that finds a hazard is run again exact,
    so every hazard of every token is counted.
    """
    if functional:
        from sim import functional as fn

        fpoint = fn.functional_point(point)
        result = check(fpoint, trace=trace, functional=True, graphs=fn.functional_graphs).result
        result.extra["scaled_from"] = {"model": point.workload.model.name, "contexts": list(point.workload.contexts)}
        return result
    fast = not exact and steady.applies(point, trace, functional)
    loaded = replace(point, workload=replace(point.workload, tokens=point.workload.tokens + 1))
    run = loaded if point.transport.arm == "resident" else point
    if fast:
        plan = plan if plan is not None and run is point else plan_point(run)
        fast = plan.fits  # a point that does not fit runs exact, which raises what the scheduler raises
    result = check(run, trace=trace, steady_plan=plan if fast else None).result
    if run is loaded:
        result.graphs = result.graphs[1:]
        result.point = point
    if fast and result.extra["hazards"]:
        return run_checked(point, trace=trace)
    return result


def member_result(result: RunResult, member: Member, simulated: Point) -> RunResult:
    """The result of ``member`` from the run of ``simulated``: its own point and labels (the run's own point where
    the member is the point simulated: a functional run reports its scaled point), and its plan's ring fields per
    token where its depth differs from the run's (a declined point over the ordered run). Pure."""
    graphs = result.graphs
    if member.point.transport.depth != simulated.transport.depth and member.plan.fits:
        graphs = [replace(g, **t.fields()) for g, t in zip(graphs, member.plan.tokens, strict=True)]
    extra = {**result.extra, "simulated_as": dict(member.simulated_as), "shared_with_n": member.shared_with_n}
    return replace(result, point=result.point if member.point is simulated else member.point, graphs=graphs, extra=extra)


def run_task(task: Task, trace: bool = False, functional: bool = False) -> list[RunResult]:
    """Simulate ``task`` once under the race checker (``run_checked``; the fast path unless the task is
    exact) and return one result per member. Blocks for the simulation. Raises what the simulation raises."""
    result = run_checked(task.point, trace=trace, functional=functional, exact=task.exact, plan=task.plan)
    result.extra["tokens_simulated"] = sum(1 for g in result.graphs if g.extrapolated_from < 0)
    return [member_result(result, m, task.point) for m in task.members]
