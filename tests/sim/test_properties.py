"""Property: over random small models, contexts, depths, budgets, links and schedules, the pipeline is exact.

For every example: the checker finds no hazard, every staged byte of every
graph crosses the link exactly once (checked on the copies the backend saw),
and the output hashes equal the ordered path's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.checked import CheckedBackend
from backends.profile import load_profile
from backends.simpy_machine import SimMachine
from sim import functional as fn
from sim.graph import DecodeGraph
from sim.program import DecodeProgram
from sim.run.decode import run_decode
from sim.run.point import Point, graphs_for
from sim.transport.scheduler import TransportConfig
from sim.workload import Workload, cache_type
from tests.conftest import fast_profile, toy_model

RTX4070 = load_profile("rtx4070-gen4x16")


@st.composite
def points(draw: Any) -> tuple[Point, str]:
    n_layers = draw(st.integers(2, 6))
    attn = draw(st.lists(st.integers(0, n_layers - 1), min_size=1, max_size=n_layers, unique=True))
    kv, group = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    head = draw(st.sampled_from([32, 64]))
    model = toy_model(n_layers, n_head=kv * group, n_head_kv=kv, head_dim_k=head, head_dim_v=head)
    model = type(model)(**{**model.__dict__, "attn_layers": tuple(sorted(attn))})
    ct = cache_type(draw(st.sampled_from(["f32", "f16", "q8_0"])))
    schedule = draw(st.sampled_from(["decode", "events"]))
    tokens = draw(st.integers(1, 4)) if schedule == "decode" else fn.MIN_GRAPHS
    wl = Workload(model, ct, ct, (draw(st.integers(4, 300)),), tokens=tokens)
    hw = fast_profile(RTX4070, draw(st.sampled_from([2.0, 24.0, 400.0]))) if draw(st.booleans()) else RTX4070
    tc = TransportConfig(depth=draw(st.integers(1, 5)), budget_mib=draw(st.sampled_from([0.0, 0.05, 0.5, 128.0])))
    return Point(wl, hw, tc), schedule


def run(point: Point, schedule: str) -> tuple[DecodeProgram, CheckedBackend, list[tuple[int, DecodeGraph]]]:
    """Functional run under the checker; returns the program, the checker and (copies seen so far, graph) per graph."""
    machine = SimMachine(point.hardware, functional=True, trace=False)
    checker = CheckedBackend(machine, record_copies=True)
    program = DecodeProgram(point.workload)
    calls: list[list[tuple[int, DecodeGraph]]] = []
    base = graphs_for if schedule == "decode" else fn.functional_graphs

    def graphs(p: Point) -> Iterator[DecodeGraph]:
        marks: list[tuple[int, DecodeGraph]] = []
        calls.append(marks)
        for g in base(p):
            marks.append((len(checker.copies), g))
            yield g

    machine.run(run_decode(checker, point, program, graphs=graphs))
    return program, checker, max(calls, key=len)


def merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def assert_each_staged_byte_delivered_once(checker: CheckedBackend, marks: list[tuple[int, DecodeGraph]]) -> None:
    ends = [m for m, _ in marks[1:]] + [len(checker.copies)]
    for (start, graph), end in zip(marks, ends, strict=True):
        staged = [(p.src_offset, p.src_offset + p.nbytes) for s in graph.staged_splits for i in s.staged for p in i.pieces]
        moved = [
            (o, o + n)
            for c in checker.copies[start:end]
            if c.src.name == "host_kv_cache"
            for r in c.ranges
            for o, n in r.src_rows()
            if n
        ]
        assert sum(hi - lo for lo, hi in moved) == sum(hi - lo for lo, hi in merged(staged)), f"graph {graph.token}"
        assert merged(moved) == merged(staged), f"graph {graph.token}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(points())
def test_pipeline_is_exact_and_race_free(case: tuple[Point, str]) -> None:
    point, schedule = case
    program, checker, marks = run(point, schedule)
    assert checker.hazard_count == 0, checker.report()
    assert_each_staged_byte_delivered_once(checker, marks)
    ordered, _, _ = run(Point(point.workload, point.hardware, TransportConfig(depth=0)), schedule)
    assert program.step_hashes() == ordered.step_hashes()


def test_the_delivery_accounting_catches_a_byte_moved_twice_or_never() -> None:
    wl = Workload(toy_model(4, every=2), cache_type("f16"), cache_type("f16"), (100,), tokens=2)
    _, checker, marks = run(Point(wl, RTX4070, TransportConfig(depth=1)), "decode")
    assert_each_staged_byte_delivered_once(checker, marks)
    late = next(i for i, c in enumerate(checker.copies) if c.tag == "late")
    twice = checker.copies[: late + 1] + checker.copies[late:]
    never = checker.copies[:late] + checker.copies[late + 1 :]
    for copies in (twice, never):
        broken = CheckedBackend(checker.inner, record_copies=True)
        broken.copies = copies
        shift = len(copies) - len(checker.copies)
        moved_marks = [(m + (shift if m > late else 0), g) for m, g in marks]
        try:
            assert_each_staged_byte_delivered_once(broken, moved_marks)
        except AssertionError:
            continue
        raise AssertionError("a wrong delivery passed the accounting")
