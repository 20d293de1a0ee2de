"""Functional mode: exact output across depths, zero hazards unmutated, the events of the default workload, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from backends.base import OutOfDeviceMemory
from backends.profile import load_profile
from backends.simpy_machine import SimMachine
from kvpipe.cli import main
from sim import functional as fn
from sim.run.point import Point
from sim.run.run import check, run_point
from sim.transport.scheduler import TransportConfig
from tests.conftest import reference_workload

DEPTHS = (0, 1, 2, 4)


def fpoint(context: int = 4096, depth: int = 0, cache: str = "q8_0", **transport: object) -> Point:
    from sim.workload import cache_type

    wl = reference_workload(context, tokens=8)
    ct = cache_type(cache)
    wl = replace(wl, cache_k=ct, cache_v=ct)
    return fn.functional_point(Point(wl, load_profile("rtx4070-gen4x16"), TransportConfig(depth=depth, **transport)))  # type: ignore[arg-type]


def run(point: Point, machine: SimMachine | None = None):  # type: ignore[no-untyped-def]
    return check(point, functional=True, graphs=fn.functional_graphs, machine=machine)


@pytest.mark.parametrize("cache", ["f32", "f16", "q8_0"])
def test_depths_0_1_2_4_give_the_ordered_path_s_hashes(cache: str) -> None:
    runs = {d: run(fpoint(depth=d, cache=cache)) for d in DEPTHS}
    ordered = runs[0].program.step_hashes()
    assert len(ordered) == len(fn.events(fpoint())) and len(set(ordered)) == len(ordered)
    for d, r in runs.items():
        assert r.checker.hazard_count == 0, r.checker.report()
        assert r.program.step_hashes() == ordered, f"depth {d}"
        if d:
            assert sum(g.deliveries for g in r.result.graphs) > 0  # the ring was used, not declined


def test_the_default_schedule_has_an_unsynced_ubatch_then_a_shift_below_the_windows() -> None:
    p = fpoint()
    graphs = list(fn.functional_graphs(p))
    kinds = [e for e, _ in fn.events(p)]
    assert kinds[:4] == ["decode", "decode", "ubatch", "shift"]
    ubatch, shift = graphs[2], graphs[3]
    assert not ubatch.reads_output and all(g.reads_output for i, g in enumerate(graphs) if i != 2)
    assert shift.host_writes_at_start and not any(g.host_writes_at_start for i, g in enumerate(graphs) if i != 3)
    assert shift.positions[0] < graphs[0].positions[0]  # the write position drops below the first stable prefix
    # The shift rewrites the row the ubatch's last late copy reads (its own new row), in every layer.
    k_row = p.workload.k_row_bytes
    from sim.graph import layout_of

    last = layout_of(p.workload).k_offset(p.workload.model.n_attn - 1, 0, ubatch.positions[0])
    assert any(o <= last and last + k_row <= o + n for o, n in shift.host_writes_at_start)


@pytest.mark.parametrize(
    ("context", "budget"),
    [(2048, 0.5), (16384, 4.0), (4096, 0.0)],
    ids=["declined", "declined-then-accepted", "no-cap"],
)
def test_unmutated_has_no_hazard_and_the_ordered_output_at_every_budget(context: int, budget: float) -> None:
    ordered = run(fpoint(context, 0)).program.output_hash()
    runs = {depth: run(fpoint(context, depth, budget_mib=budget)) for depth in (1, 3)}
    for r in runs.values():
        assert r.checker.hazard_count == 0, r.checker.report()
        assert r.program.output_hash() == ordered
    graphs = runs[1].result.graphs
    if context == 2048:
        assert all(g.declined and g.deliveries == 0 for g in graphs)
    if context == 16384:  # the window shrinks at the shift: the 3-slot ring fits from then on
        assert graphs[0].declined and not graphs[0].deliveries and graphs[-1].deliveries and not graphs[-1].declined


def test_reservation_failure_falls_back_ordered_with_the_same_output() -> None:
    class GraphFailsOnce(SimMachine):
        failed = False

        def _alloc(self, device: int, nbytes: int, name: str):  # type: ignore[no-untyped-def]
            if name.startswith("graph") and not self.failed:
                self.failed = True
                raise OutOfDeviceMemory(f"{name}: injected")
            return super()._alloc(device, nbytes, name)

    p = fpoint(depth=1, budget_mib=0)
    machine = GraphFailsOnce(p.hardware, functional=True, trace=False)
    r = run(p, machine=machine)
    assert machine.failed and "reservation failed" in r.result.graphs[0].decline_reason
    assert all(g.deliveries == 0 for g in r.result.graphs)
    assert r.checker.hazard_count == 0
    assert r.program.output_hash() == run(fpoint(depth=0)).program.output_hash()


def test_cli_functional_rows_carry_hazards_and_output_hash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--functional", "--context", "4096", "--depth", "0,1,2,4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["depth"] for r in rows] == list(DEPTHS)
    assert all(r["hazards"] == 0 and "hazard_examples" not in r for r in rows)
    assert len({r["output_hash"] for r in rows}) == 1 and len(rows[0]["output_hash"]) == 64
    assert rows[0]["context"] == 128 and rows[0]["model"].endswith("-functional")


def test_plain_rows_say_no_hazards_and_have_no_output_hash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--context", "4096,16384", "--tokens", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["hazards"] == 0 and "output_hash" not in r for r in rows)


def test_functional_refuses_a_cache_type_the_program_cannot_encode(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--functional", "--cache-type", "q5_0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "q4_0" in err and "Traceback" not in err


def test_run_checked_scales_the_point() -> None:
    point = Point(reference_workload(16384, tokens=2), load_profile("rtx4070-gen4x16"), TransportConfig(depth=1))
    r = run_point(point, functional=True)
    assert r.point.context == 512 and r.point.workload.model.n_attn == fn.FUNCTIONAL_ATTN
    assert len(r.graphs) == fn.MIN_GRAPHS and r.extra["hazards"] == 0 and "output_hash" in r.extra
