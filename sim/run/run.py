"""Run one point: the one entry every command, check and prediction goes through, and the machine run under it.

:func:`run_point` owns what a point needs before and after the machine runs it: the functional scaling
(``sim.functional``), the warm-up graphs (the resident arm's first graph loads the whole cache onto the device,
once, as a model load does; ``validate`` drops its own warm-up graphs), and the choice of the exact run or the
fast path (``sim.run.decode``, from the point's plan). ``kvpipe simulate`` and ``sweep`` reach it through the point
planner's tasks (``sim.run.tasks.run_task``); ``plot``, ``schedules``, ``bench``, the evaluator's check and
``validate``'s prediction call it directly.

:func:`check` is the run itself: it places the point on its devices, builds the SimPy machine (or takes a test's,
with faults injected), wraps it in ``backends.checked.CheckedBackend`` unless the run is unchecked, and runs the
host program: the decode loop (``sim.run.decode``) or, given the point's plan, the fast path. A checked row says how
many happens-before hazards the schedule had (``hazards``; with examples when there are any). In functional mode
(:mod:`sim.functional`) the machine moves real bytes, the decode program computes real logits, and the row gains
``output_hash``.

Units: seconds and bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from backends.checked import CheckedBackend
from backends.simpy_machine import SimMachine
from sim.graph import DecodeGraph
from sim.replay import PointPlan, plan_point
from sim.run.decode import applies, run_decode, run_steady
from sim.run.point import Point, RunResult, graphs_for, placed_hardware

if TYPE_CHECKING:
    from sim.program import DecodeProgram


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
    fast = not exact and applies(point, trace, functional)
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


GraphsFn = Callable[[Point], Iterator[DecodeGraph]]


@dataclass
class Checked:
    """A run: the result row's source, the checker (None: unchecked), and the program (functional mode)."""

    result: RunResult
    checker: CheckedBackend | None
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
    checked: bool = True,
) -> Checked:
    """Simulate ``point`` as given (no scaling, no warm-up), placed on its devices. Blocks for the simulation's wall
    time (not simulated time).

    ``graphs`` defaults to the plain decode graphs; ``program`` (functional mode) defaults to a
    :class:`DecodeProgram` of the point's workload; ``machine`` (a fresh SimPy machine by default) lets a test inject
    faults or ``kvpipe bench`` count events. With ``steady_plan`` (the point's plan, ``sim.replay.plan_point``) the
    run takes the fast path of ``sim.run.decode``. Not ``checked``: no race checker (no ``hazards`` in ``extra``).
    """
    t = time.perf_counter()
    point = replace(point, hardware=placed_hardware(point))
    if machine is None:
        machine = SimMachine(point.hardware, functional=functional, trace=trace)
    checker = CheckedBackend(machine, record_copies=record_copies) if checked else None
    backend = checker if checker is not None else machine
    if functional and program is None:
        from sim.program import DecodeProgram  # NumPy: a timing run never imports it

        program = DecodeProgram(point.workload)
    gfn = graphs or graphs_for
    if steady_plan is not None:
        host = run_steady(backend, point, steady_plan)
    else:
        host = run_decode(backend, point, program if functional else None, graphs=gfn)
    _, stats = machine.run(host)
    first = next(iter(gfn(point)))
    result = RunResult(point, stats, machine.timeline() if trace else [], first.window_rows, time.perf_counter() - t)
    if checker is not None:
        result.extra["hazards"] = checker.hazard_count
        if checker.hazard_count:
            result.extra["hazard_examples"] = checker.report()
    if functional and program is not None:
        result.extra["output_hash"] = program.output_hash()
    return Checked(result, checker, program if functional else None)
