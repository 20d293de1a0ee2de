"""Run a point with whatever checks are available (the race checker hooks in here).

Kept separate so ``simulate``, ``sweep`` and tests share one entry point: a
plain simulation today; the happens-before checker and the functional program
wrap the same call.
"""

from __future__ import annotations

from sim.simulate import Point, RunResult, simulate


def run_checked(point: Point, trace: bool = False, functional: bool = False) -> RunResult:
    """Simulate ``point``; blocks for the simulation's wall time."""
    if functional:
        raise NotImplementedError("functional simulation is not built yet")
    return simulate(point, trace=trace)
