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

from backends.checked import CheckedBackend
from backends.simpy_machine import SimMachine
from sim.graph import DecodeGraph
from sim.program import DecodeProgram
from sim.simulate import Point, RunResult, graphs_for, run_decode

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
) -> Checked:
    """Simulate ``point`` under the checker, as given (no scaling). Blocks for the simulation's wall time.

    ``graphs`` defaults to the plain decode graphs; ``program`` (functional
    mode) defaults to a :class:`DecodeProgram` of the point's workload;
    ``machine`` (a fresh SimPy machine by default) lets a test inject faults.
    """
    t = time.perf_counter()
    point = _placed(point)
    if machine is None:
        machine = SimMachine(point.hardware, functional=functional, trace=trace)
    checker = CheckedBackend(machine, record_copies=record_copies)
    if functional and program is None:
        program = DecodeProgram(point.workload)
    gfn = graphs or graphs_for
    _, stats = machine.run(run_decode(checker, point, program if functional else None, graphs=gfn))
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
    from sim import simulate as sim_simulate

    placed = getattr(sim_simulate, "placed_hardware", None)
    return replace(point, hardware=placed(point)) if placed else point


def run_checked(point: Point, trace: bool = False, functional: bool = False) -> RunResult:
    """Simulate ``point`` with the race checker on; functional mode runs the scaled functional workload.

    Blocks for the simulation's wall time. The result's ``extra`` carries
    ``hazards`` (and ``hazard_examples``), plus ``output_hash`` when functional.
    The resident arm's first graph loads the whole cache onto the device, once,
    as a model load does: it runs one graph more and leaves that one out, so
    every command's row (simulate, sweep, plan) is a steady token.
    """
    if functional:
        from sim import functional as fn

        fpoint = fn.functional_point(point)
        result = check(fpoint, trace=trace, functional=True, graphs=fn.functional_graphs).result
        result.extra["scaled_from"] = {"model": point.workload.model.name, "contexts": list(point.workload.contexts)}
        return result
    if point.transport.arm == "resident":
        loaded = replace(point, workload=replace(point.workload, tokens=point.workload.tokens + 1))
        result = check(loaded, trace=trace).result
        result.graphs = result.graphs[1:]
        result.point = point
        return result
    return check(point, trace=trace).result
