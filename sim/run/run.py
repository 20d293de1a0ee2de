"""Run one point: the one entry every command, check and prediction goes through.

:func:`run_point` owns what a point needs before and after the machine runs it: the functional scaling
(``sim.functional``), the warm-up graphs (the resident arm's first graph loads the whole cache onto the device,
once, as a model load does; ``validate`` drops its own warm-up graphs), and the choice of the exact run or the
fast path (``sim.run.steady``, from the point's plan). The run itself, placed on the devices and under the race
checker, is ``sim.run.checked.check``. ``kvpipe simulate`` and ``sweep`` reach it through the point planner's tasks
(``sim.run.tasks.run_task``); ``plot``, ``schedules``, ``bench``, the evaluator's check and ``validate``'s
prediction call it directly.

Units: seconds and bytes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sim.replay import PointPlan, plan_point
from sim.run import steady
from sim.run.checked import check
from sim.run.point import Point, RunResult

if TYPE_CHECKING:
    from backends.simpy_machine import SimMachine


def run_point(point: Point, *, exact: bool = True, checked: bool = True, trace: bool = False, functional: bool = False,
              warmup: int | None = None, plan: PointPlan | None = None, machine: SimMachine | None = None) -> RunResult:
    """Simulate ``point``'s ``tokens`` graphs on a SimPy machine; the result has one stats entry per token.

    Blocks the host for the simulation's wall time (seconds of wall clock, not simulated time); raises what the
    scheduler raises (OutOfDeviceMemory for a point that does not fit). ``warmup``: graphs simulated first and
    left out (default: one for the resident arm, the cache's load, else none); the result's point is ``point``.
    Not ``exact``: the fast path where it applies (``plan``: the point's plan, made here if not given); a fast run
    that finds a hazard runs again exact, so every hazard of every token is counted. ``checked`` (default): under
    the race checker, ``extra["hazards"]`` and its examples. ``functional``: the scaled functional workload with
    real bytes (``extra``: ``output_hash``, ``scaled_from``), never warmed up. ``machine``: a machine to run on (one
    that counts its events, as ``kvpipe bench`` times).
    """
    if functional:
        from sim import functional as fn

        fpoint = fn.functional_point(point)
        result = check(fpoint, trace=trace, functional=True, graphs=fn.functional_graphs, machine=machine,
                       checked=checked).result
        result.extra["scaled_from"] = {"model": point.workload.model.name, "contexts": list(point.workload.contexts)}
        return result
    n_warm = (1 if point.transport.arm == "resident" else 0) if warmup is None else warmup
    run = replace(point, workload=replace(point.workload, tokens=point.workload.tokens + n_warm)) if n_warm else point
    fast = not exact and steady.applies(point, trace, functional)
    if fast:
        plan = plan if plan is not None and run is point else plan_point(run)
        fast = plan.fits  # a point that does not fit runs exact, which raises what the scheduler raises
    result = check(run, trace=trace, steady_plan=plan if fast else None, machine=machine, checked=checked).result
    if n_warm:
        result.graphs = result.graphs[n_warm:]
        result.point = point
    if fast and result.extra.get("hazards"):
        return run_point(point, checked=checked, trace=trace, warmup=warmup)
    return result
