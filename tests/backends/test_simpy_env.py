"""The machine's environment (``backends.simpy_env``): waits taken in place leave every time and order SimPy's own."""

from __future__ import annotations

import random
from typing import Any

import pytest
import simpy

from backends.simpy_copy import _Engine
from backends.simpy_env import FastEnvironment
from backends.simpy_machine import SimMachine
from sim.points import GridSpec, points
from sim.run.point import Point, placed_hardware
from sim.run.run import run_point


def _world(env: simpy.Environment, fast: bool, seed: int) -> list[tuple[float, int, int, str]]:
    """Eight processes that wait fixed times (tied often), join a shared event (one event, several waiters) or fire
    it; ``fast``: each fixed wait tried in place first. What each saw when, in the order it saw it."""
    rng = random.Random(seed)
    log: list[tuple[float, int, int, str]] = []
    shared = [env.event()]

    def user(i: int, plan: list[tuple[str, float]]) -> Any:
        for k, (kind, x) in enumerate(plan):
            if kind == "wait":
                if not (fast and env.advance(x)):  # type: ignore[attr-defined]
                    yield env.timeout(x)
            elif kind == "join":
                yield shared[0]
            else:  # fire: the shared event succeeds now, its waiters resume at this time
                ev, shared[0] = shared[0], env.event()
                ev.succeed()
            log.append((env.now, i, k, kind))

    def ticker() -> Any:  # every joiner is released within a time unit
        while True:
            yield env.timeout(1)
            ev, shared[0] = shared[0], env.event()
            ev.succeed()

    kinds = ["wait"] * 6 + ["join", "fire"]
    users = [env.process(user(i, [(rng.choice(kinds), rng.choice([0.25, 0.5, 1, 1, 2, 0.1, 0.3])) for _ in range(30)]))
             for i in range(8)]
    env.process(ticker())
    done = env.all_of(users)
    if fast:
        env.run_until(done)  # type: ignore[attr-defined]
    else:
        env.run(until=done)
    return log


def _same_as_simpy(world, seeds: int, *args) -> int:  # type: ignore[no-untyped-def]
    """``world`` run on a FastEnvironment and on plain SimPy logs the same for every seed; the waits taken in place."""
    advanced = 0
    for seed in range(seeds):
        env = FastEnvironment()
        assert world(env, *args, seed) == world(simpy.Environment(), *args, seed)
        advanced += env.advanced
    return advanced


def test_waits_in_place_see_every_time_and_order_a_plain_simpy_run_sees() -> None:
    assert _same_as_simpy(lambda env, seed: _world(env, isinstance(env, FastEnvironment), seed), 60) > 0


def test_a_wait_is_not_taken_in_place_past_a_tie_or_beside_another_waiter() -> None:
    env = FastEnvironment()
    seen: list[tuple[str, float, bool]] = []
    gate = env.event()

    def tied() -> Any:
        yield env.timeout(0.5)  # (the other processes started)
        env.timeout(0.5)  # another event at exactly the end of the wait: SimPy processes it first
        seen.append(("tied", env.now, env.advance(0.5)))
        took = env.advance(0.25)  # nothing queued before its end: the clock moves in place
        seen.append(("untied", env.now, took))
        yield gate

    def waiter(name: str) -> Any:
        yield gate
        seen.append((name, env.now, env.advance(5.0)))  # gate has two waiters: the second resumes at the old time

    env.process(tied())
    env.process(waiter("a"))
    env.process(waiter("b"))
    def open_gate(_: simpy.Event) -> None:
        gate.succeed()

    env.timeout(3.0).callbacks.append(open_gate)  # type: ignore[union-attr]
    env.run_until(env.timeout(10.0))
    assert seen == [("tied", 0.5, False), ("untied", 0.75, True), ("a", 3.0, False), ("b", 3.0, False)]
    assert not env.advance(1.0)  # outside an event being processed: never in place


def _points() -> list[Point]:
    specs = [
        GridSpec(contexts=((6000,),), depths=(0, 2), budgets_mib=(0, 128), tokens=4),
        GridSpec(contexts=((5000,),), depths=(1,), tokens=3, pinned=False),  # pageable: staged chunks, host waits
        GridSpec(contexts=((5000,),), kv_offload=(False,), depths=(0,), tokens=3),  # the resident arm
        GridSpec(contexts=((3000,),), parallels=(3,), unified=False, depths=(2,), tokens=3),
        GridSpec(contexts=((12000,),), hardware=("rtx4070-gen4x16+rtx3060-gen3x4",), split_mode="layer", depths=(0, 1),
                 tokens=3),
        GridSpec(contexts=((50000,),), kv_gpu_layers=(4,), depths=(1,), tokens=3),
    ]
    return [p for spec in specs for p in points(spec)]


def test_the_machine_on_its_environment_gives_every_token_a_plain_simpy_environment_gives() -> None:
    advanced = 0
    for p in _points():
        for exact, checked in ((True, True), (False, False)):
            env = FastEnvironment()
            fast = run_point(p, exact=exact, checked=checked, warmup=0,
                             machine=SimMachine(placed_hardware(p), trace=False, env=env))
            plain = run_point(p, exact=exact, checked=checked, warmup=0,
                              machine=SimMachine(placed_hardware(p), trace=False, env=simpy.Environment()))
            assert fast.graphs == plain.graphs  # every field of every token, bit for bit
            assert fast.extra.get("hazards") == plain.extra.get("hazards")
            advanced += env.advanced
    assert advanced > 0


def test_a_traced_run_records_the_plain_timeline() -> None:
    p = _points()[1]
    fast = run_point(p, trace=True, checked=False, warmup=0,
                     machine=SimMachine(placed_hardware(p), trace=True, env=FastEnvironment()))
    plain = run_point(p, trace=True, checked=False, warmup=0,
                      machine=SimMachine(placed_hardware(p), trace=True, env=simpy.Environment()))
    assert fast.spans and fast.spans == plain.spans and fast.graphs == plain.graphs


def _engine_world(env: simpy.Environment, capacity: int, seed: int) -> list[tuple[float, int, str]]:
    """Processes that take or request an engine, hold it and let go at random (often tied) times; on a
    ``FastEnvironment`` each first tries the engine in place (``_Engine.take``). What each saw when."""
    rng = random.Random(seed)
    engine = _Engine(env, capacity)
    fast = isinstance(env, FastEnvironment)
    log: list[tuple[float, int, str]] = []

    def user(i: int, plan: list[tuple[float, float]]) -> Any:
        for wait, hold in plan:
            if wait:
                yield env.timeout(wait)
            req = engine.take() if fast else None
            if req is None:
                req = engine.request()
                yield req
            log.append((env.now, i, f"gets {len(engine.users)} {len(engine.queue)}"))
            yield env.timeout(hold)
            engine.release(req)
            log.append((env.now, i, "lets go"))

    users = [env.process(user(i, [(rng.choice([0, 0, 1, 2]), rng.choice([0, 1, 1, 3, 0.5])) for _ in range(20)]))
             for i in range(rng.choice([1, 2, 5, 8]))]
    done = env.all_of(users)
    env.run_until(done) if fast else env.run(until=done)  # type: ignore[attr-defined]
    return log


@pytest.mark.parametrize("capacity", [1, 2])
def test_an_engine_taken_in_place_or_let_go_without_an_event_grants_as_simpy_does(capacity: int) -> None:
    assert _same_as_simpy(_engine_world, 200, capacity) > 0


def _stream_world(env: simpy.Environment, costs: bool, seed: int) -> list[tuple[float, int, str]]:
    """A random host program on the machine: kernels of tied lengths on three streams, events recorded on them,
    streams waiting on events recorded on others (often before the record is reached: a waiter already there),
    the host waiting on events and streams; ``costs``: the profile's host call costs, else none (more ties). When
    each host step ended."""
    from dataclasses import replace

    from backends.base import Work
    from backends.profile import load_profile
    from backends.profile_types import HostCosts

    rng = random.Random(seed)
    profile = load_profile("rtx4070-gen4x16")
    if not costs:
        profile = replace(profile, host=HostCosts(launch_s=0.0, copy_issue_s=0.0, event_s=0.0, host_wait_s=0.0))
    m = SimMachine(profile, trace=False, env=env)
    log: list[tuple[float, int, str]] = []

    def program() -> Any:
        streams = [m.create_stream(0, f"s{k}") for k in range(3)]
        events: list[Any] = []
        for step in range(60):
            op, s = rng.choice(["kernel"] * 4 + ["record"] * 3 + ["wait"] * 3 + ["host", "sync"]), rng.choice(streams)
            if op == "kernel":
                yield from m.launch(s, Work(f"k{step}", rng.choice([0.0, 0.25, 0.5, 1.0])))
            elif op == "record":
                events.append(m.create_event(0, f"e{step}"))
                yield from m.record(events[-1], s)
            elif op == "wait" and events:
                yield from m.wait_event(s, rng.choice(events))
            elif op == "host" and events:
                yield from m.wait_host(rng.choice(events))
            elif op == "sync":
                yield from m.synchronize(s)
            log.append((m.now_s(), step, op))
        for s in streams:
            yield from m.synchronize(s)
        log.append((m.now_s(), -1, "end"))

    m.run(program())
    return log


@pytest.mark.parametrize("costs", [True, False])
def test_a_record_is_processed_in_place_only_where_no_one_waits_and_nothing_else_is_due(costs: bool) -> None:
    """Random programs of kernels, records and waits across streams see every time a plain SimPy environment gives:
    a record a stream already waits on (a waiter there before the record is reached) is processed by SimPy, which
    resumes the waiter (taken in place, the waiter would never resume)."""
    assert _same_as_simpy(_stream_world, 150, costs) > 0
