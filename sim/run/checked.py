"""One run of a point on one SimPy machine, under the race checker, optionally with real bytes (functional mode).

:func:`check` builds the machine (or takes a test's, with faults injected), wraps it in
``backends.checked.CheckedBackend`` unless the run is unchecked, and runs the host program: the decode loop
(``sim.run.decode``) or, given the point's plan, the fast path (``sim.run.steady``). A checked row says how many
happens-before hazards the schedule had (``hazards``; with examples when there are any). In functional mode
(:mod:`sim.functional`) the machine moves real bytes, the decode program computes real logits, and the row gains
``output_hash``. It runs the point as given: placement on the devices is done here, warm-up and scaling by
``sim.run.run.run_point``.

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
from sim.replay import PointPlan
from sim.run import steady
from sim.run.decode import run_decode
from sim.run.graphs import graphs_for
from sim.run.point import Point, RunResult, placed_hardware

if TYPE_CHECKING:
    from sim.program import DecodeProgram

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
    run takes the fast path of ``sim.run.steady``. Not ``checked``: no race checker (no ``hazards`` in ``extra``).
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
        host = steady.decode(backend, point, steady_plan)
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
