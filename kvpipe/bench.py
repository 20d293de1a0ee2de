"""How fast the SimPy machine simulates, against SimPy itself; and how many points per second each engine answers.

Figures: the machine's event rate (SimPy events processed per wall
second while it simulates the reference preset, the waits it takes in
place counted as the timeouts they stand for: ``CountingEnvironment``), the event rate of a bare
SimPy loop (processes that only yield timeouts) in the same process, their
ratio, and wall milliseconds per simulated decode token; then points per
second of both engines on points like the bench point: the simulator's (one
simulation of the point, every token) and the compiled evaluator's
(``sim.evaluator.evaluate`` on a small sweep around it: 16 contexts x depths
0..7 x two budgets, planning, graphs and rows included, caches cleared first).
Timings, not tests: ``kvpipe bench`` prints them; docs/performance.md records them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import simpy

from backends.simpy_env import FastEnvironment
from sim.run.point import Point, clear_graph_cache
from sim.run.run import run_point


class CountingEnvironment(FastEnvironment):
    """The machine's environment (``backends.simpy_env.FastEnvironment``) that can tell how many events it has
    processed: SimPy's, plus the waits the machine took in place (each one a ``Timeout`` a plain SimPy environment
    processes, at the same time and in the same order), so the count is the model's events either way.

    The count costs nothing per event: every scheduled event takes the next event id, and an event
    leaves the queue only when it is processed, so the events processed are the ids handed out less
    the events still queued. (Counting in an overridden ``step`` cost ~0.27 us a call: a fifth of a
    bare SimPy event, paid on both sides of the ratio, which it lifted.)
    """

    def __init__(self) -> None:
        super().__init__()
        self._first_id = next(self._eid)  # shifts every id by one: the order of events is unchanged
        self._reads = 0

    @property
    def steps(self) -> int:
        """Events processed so far, waits taken in place included (each read takes an id too; they are subtracted)."""
        self._reads += 1
        return next(self._eid) - self._first_id - self._reads - len(self._queue) + self.advanced


@dataclass(frozen=True)
class BenchResult:
    machine_events: int
    machine_wall_s: float
    bare_events: int
    bare_wall_s: float
    tokens: int
    evaluator_points: int = 0
    evaluator_wall_s: float = 0.0

    @property
    def machine_events_per_s(self) -> float:
        return self.machine_events / self.machine_wall_s

    @property
    def bare_events_per_s(self) -> float:
        return self.bare_events / self.bare_wall_s

    @property
    def ratio(self) -> float:
        return self.machine_events_per_s / self.bare_events_per_s

    @property
    def simulator_points_per_s(self) -> float:
        """Points per second of the simulator: one simulation of the point (every token) per point."""
        return 1.0 / self.machine_wall_s

    @property
    def evaluator_points_per_s(self) -> float:
        return self.evaluator_points / self.evaluator_wall_s if self.evaluator_wall_s else 0.0

    @property
    def ms_per_token(self) -> float:
        return self.machine_wall_s / self.tokens * 1e3

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine_events_per_s": self.machine_events_per_s,
            "bare_simpy_events_per_s": self.bare_events_per_s,
            "ratio": self.ratio,
            "wall_ms_per_simulated_token": self.ms_per_token,
            "machine_events": self.machine_events,
            "tokens": self.tokens,
            "simulator_points_per_s": self.simulator_points_per_s,
            "evaluator_points_per_s": self.evaluator_points_per_s,
            "evaluator_points": self.evaluator_points,
        }


def bare_loop(n_events: int, n_procs: int = 8) -> tuple[int, float]:
    """Run ``n_procs`` processes that each yield timeouts until ``n_events`` are processed. Returns (events, wall s)."""
    env = CountingEnvironment()
    per = n_events // n_procs

    def proc(env: simpy.Environment) -> Any:
        for _ in range(per):
            yield env.timeout(1e-6)

    for _ in range(n_procs):
        env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return env.steps, time.perf_counter() - t


def machine_run(point: Point, trace: bool = False) -> tuple[int, float]:
    """Simulate ``point`` once on a fresh SimPy machine, building its graphs. Returns (events processed, wall s)."""
    from backends.simpy_machine import SimMachine

    clear_graph_cache()  # what is timed is one whole simulation, graphs included
    env = CountingEnvironment()
    machine = SimMachine(point.hardware, trace=trace, env=env)
    t = time.perf_counter()
    run_point(point, checked=False, warmup=0, machine=machine)
    return env.steps, time.perf_counter() - t


def evaluator_run(point: Point, n_contexts: int = 16) -> tuple[int, float]:
    """Evaluate a small sweep around ``point``: ``n_contexts`` contexts from its own, 1,024 apart, x depths 0..7 x
    budgets 0 and 128 MiB (planning, graphs and rows included; every cache cleared first). Returns (points, wall s);
    (0, 0.0) if the point is outside the evaluator's envelope."""
    from sim.evaluator import clear_caches, evaluate, in_envelope

    if in_envelope(point) is not None:
        return 0, 0.0
    wl, cfg = point.workload, point.transport
    pts = [replace(point, workload=replace(wl, context=(point.context + 1024 * i,)), transport=replace(cfg, depth=d, budget_mib=b))
           for i in range(n_contexts) for d in range(8) for b in (0.0, 128.0)]
    clear_graph_cache()
    clear_caches()
    t = time.perf_counter()
    evaluate(pts)
    return len(pts), time.perf_counter() - t


def run_bench(point: Point, repeats: int = 3, trace: bool = False) -> BenchResult:
    """Simulate ``point`` ``repeats`` times and run a bare loop of as many events after each; the best wall
    time of each is kept. Interleaved, so a neighbour's load hits both alike. Blocks for both."""
    machine: tuple[int, float] | None = None
    bare: tuple[int, float] | None = None
    for _ in range(repeats):
        run = machine_run(point, trace)
        if machine is None or run[1] < machine[1]:
            machine = run
        loop = bare_loop(run[0])
        if bare is None or loop[1] < bare[1]:
            bare = loop
    assert machine is not None and bare is not None
    n, evaluated = min(evaluator_run(point) for _ in range(repeats))
    return BenchResult(machine[0], machine[1], bare[0], bare[1], point.workload.tokens, n, evaluated)
