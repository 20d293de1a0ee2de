"""The fast paths keep results: graphs kept across points, the bench's environment, memoized link times, the copy engine."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import simpy

from backends.base import Buffer, CopyRange, Event, Span, Stream
from backends.profile import load_profile
from backends.simpy_machine import SimMachine, _Engine, copy_seconds
from kvpipe.bench import CountingEnvironment, bare_loop, run_bench
from sim.graph import decode_graph
from sim.rows import row
from sim.run.decode import run_decode
from sim.run.point import GRAPH_CACHE_SIZE, Point, clear_graph_cache, graphs_for
from sim.run.run import run_point
from sim.transport.scheduler import TransportConfig
from tests.conftest import reference_workload


def point(depth: int = 1, tokens: int = 3, context: int = 4096, **kw: object) -> Point:
    return Point(reference_workload(context, tokens=tokens, **kw), load_profile("rtx4070-gen4x16"), TransportConfig(depth=depth))


def test_points_that_differ_in_transport_share_their_graphs_and_they_equal_fresh_ones() -> None:
    clear_graph_cache()
    a, b = point(depth=0), point(depth=2)
    ga, gb = list(graphs_for(a)), list(graphs_for(b))
    assert all(x is y for x, y in zip(ga, gb, strict=True))
    computes = tuple(d.compute for d in a.hardware.devices)
    assert ga == [decode_graph(a.workload, computes, step=i, token=i, n_devices=1) for i in range(3)]


def test_a_stopped_iteration_leaves_a_prefix_the_next_one_continues() -> None:
    clear_graph_cache()
    p = point()
    first = next(iter(graphs_for(p)))
    assert list(graphs_for(p))[0] is first and len(list(graphs_for(p))) == 3


def test_a_point_too_large_keeps_only_the_graphs_that_fit() -> None:
    clear_graph_cache()
    wl = reference_workload(4096, tokens=2)
    fit = GRAPH_CACHE_SIZE // len(wl.model.attn_layers)
    big = point(tokens=fit + 1)
    first, again = list(graphs_for(big)), list(graphs_for(big))
    assert all(a is b for a, b in zip(first[:fit], again[:fit], strict=True))  # the first ones asked for are kept
    assert first[fit] is not again[fit] and first[fit] == again[fit]  # the one past the size is built afresh


def test_rows_are_the_same_with_kept_graphs() -> None:
    clear_graph_cache()
    cold = [row(run_point(point(depth=d), checked=False, warmup=0)) for d in (0, 1, 2)]
    warm = [row(run_point(point(depth=d), checked=False, warmup=0)) for d in (0, 1, 2)]
    assert cold == warm


class _SteppingEnvironment(simpy.Environment):
    """A plain SimPy environment that counts one increment per ``step`` (the machine takes no wait in place on it)."""

    def __init__(self) -> None:
        super().__init__()
        self.stepped = 0

    def step(self) -> None:
        self.stepped += 1
        super().step()


def test_the_bench_counts_every_event_a_plain_simpy_run_processes_without_a_hook_per_event() -> None:
    plain, env = _SteppingEnvironment(), CountingEnvironment()
    for e in (plain, env):
        m = SimMachine(load_profile("rtx4070-gen4x16"), trace=False, env=e)
        m.run(run_decode(m, point(tokens=2)))
    first, second = env.steps, env.steps  # each read takes an event id, which the count must not include
    assert first == second == plain.stepped > 0
    assert env.advanced > 0  # waits taken in place are counted as the timeouts a plain run processes
    env.run(until=env.timeout(1e-6))  # what the first run left queued, and one more
    assert env.steps > first


def test_the_bench_environment_counts_a_bare_loops_events() -> None:
    events, _ = bare_loop(80)
    assert 80 <= events <= 80 + 2 * 8 + 1  # the timeouts, each process's start and end


def test_bench_compares_with_a_bare_loop_of_as_many_events() -> None:
    r = run_bench(point(tokens=2), repeats=2)
    assert r.machine_events > 0 and abs(r.bare_events - r.machine_events) <= 2 * 8 + 8 and r.tokens == 2


def test_memoized_link_times_equal_the_curve() -> None:
    # Each set of ranges copied twice through the machine's public calls: the first copy's time is computed, the
    # second comes from the machine's memo; both must be the link curve's time for those ranges.
    hw = load_profile("rtx4070-gen4x16")
    m = SimMachine(hw, trace=True)
    link = hw.devices[0].link(True, True)
    sets = ([CopyRange(0, 0, 1088)], [CopyRange(0, 0, 4096), CopyRange(8192, 4096, 4096)],
            [CopyRange(0, 0, 100), CopyRange(500, 100, 300)])

    def program() -> Any:
        s, dev, host = m.create_stream(0, "t"), m.alloc(0, 1 << 20, "d"), m.alloc_host(1 << 20, "h")
        for ranges in sets:
            for _ in range(2):
                yield from m.copy(s, dev, host, ranges, "x")
                yield from m.synchronize(s)

    m.run(program())
    took = [sp.end_s - sp.start_s for sp in m.timeline() if sp.track == "h2d0"]
    want = [copy_seconds(link, r) for r in sets for _ in range(2)]
    assert took == pytest.approx(want, rel=1e-12, abs=0)


def test_host_spans_are_recorded_when_the_host_resumes() -> None:
    spans = run_point(point(tokens=1), trace=True, checked=False, warmup=0).spans
    host = [s for s in spans if s.track == "host"]
    assert host and all(a.end_s <= b.end_s for a, b in zip(host, host[1:], strict=False))
    assert all(s.end_s >= s.start_s for s in spans)


def _engine_timeline(make: Any, capacity: int, seed: int) -> list[tuple[float, int, str]]:
    """Processes that request, hold and release an engine at random (often tied) times; what each saw when."""
    rng = random.Random(seed)
    env = simpy.Environment()
    engine = make(env, capacity)
    log: list[tuple[float, int, str]] = []

    def user(i: int, plan: list[tuple[float, float]]) -> Any:
        for wait, hold in plan:
            yield env.timeout(wait)
            req = engine.request()
            log.append((env.now, i, "asks"))
            yield req
            log.append((env.now, i, f"gets {len(engine.users)} {len(engine.queue)}"))
            yield env.timeout(hold)
            engine.release(req)
            log.append((env.now, i, "lets go"))

    for i in range(8):
        env.process(user(i, [(rng.choice([0, 0, 1, 2]), rng.choice([0, 1, 1, 3])) for _ in range(20)]))
    env.run()
    return log


@pytest.mark.parametrize("capacity", [1, 2, 3])
def test_the_copy_engine_grants_exactly_as_a_simpy_resource(capacity: int) -> None:
    for seed in range(40):
        assert _engine_timeline(_Engine, capacity, seed) == _engine_timeline(simpy.Resource, capacity, seed)


class _NullBackend:
    """The host program's backend calls, doing nothing: what the scheduler and the graphs cost alone."""

    name = "null"

    def __init__(self, machine: SimMachine) -> None:
        self.m = machine

    def now_s(self) -> float:
        return 0.0

    def device_count(self) -> int:
        return self.m.device_count()

    def create_stream(self, device: int, name: str) -> Stream:
        return Stream(name, device)

    def create_event(self, device: int, name: str) -> Event:
        return Event(name, device)

    def _nothing(self, *args: Any, **kwargs: Any) -> Any:
        return
        yield  # pragma: no cover - makes this a generator

    record = wait_event = copy = launch = run_host = synchronize = wait_host = _nothing

    def alloc(self, device: int, nbytes: int, name: str) -> Buffer:
        return self.m.alloc(device, nbytes, name)

    def alloc_host(self, nbytes: int, name: str, pinned: bool = True) -> Buffer:
        return self.m.alloc_host(nbytes, name, pinned)

    def free(self, buffer: Buffer) -> None:
        self.m.free(buffer)

    def free_bytes(self, device: int) -> int:
        return self.m.free_bytes(device)

    def timeline(self) -> list[Span]:
        return []


@pytest.mark.benchmark
def test_what_caps_the_event_rate_ratio() -> None:
    """The bench point's wall time split: the whole simulation, the host program on a null backend (scheduler and
    graphs), the graphs alone, and bare SimPy for as many events (prints figures; best of 7 interleaved, graphs cold).

    A benchmark: it asserts nothing (the figures it prints are read by a person, not held to a threshold)."""
    p = point(tokens=64, context=16384)
    best = {"simulation": float("inf"), "host program": float("inf"), "graphs": float("inf"), "bare SimPy": float("inf")}
    events = 0

    def timed(label: str, fn: Any) -> None:
        clear_graph_cache()
        t = time.perf_counter()
        fn()
        best[label] = min(best[label], time.perf_counter() - t)

    for _ in range(7):
        env = CountingEnvironment()
        m = SimMachine(p.hardware, trace=False, env=env)
        timed("simulation", lambda: m.run(run_decode(m, p)))  # noqa: B023 - called at once
        events = env.steps
        timed("host program", lambda: list(run_decode(_NullBackend(SimMachine(p.hardware, trace=False)), p)))
        timed("graphs", lambda: list(graphs_for(p)))
        timed("bare SimPy", lambda: bare_loop(events))  # noqa: B023 - called at once
    print(", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in best.items()) + f" ({events:,} events)")
    ceiling = best["bare SimPy"] / (best["bare SimPy"] + best["host program"])
    print(f"ratio if the machine cost nothing beyond SimPy: {ceiling:.1%}")
