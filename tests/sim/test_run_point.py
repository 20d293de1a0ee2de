"""``run_point``, the one way a point is run: its warm-up, the checker on or off, exact or fast, and every caller's
path through it (``sim.run.run``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from backends.profile import load_profile
from sim.rows import row
from sim.run import run as run_module
from sim.run.point import Point
from sim.run.run import run_point
from sim.transport.scheduler import TransportConfig
from tests.conftest import reference_workload

RTX4070 = load_profile("rtx4070-gen4x16")


def _point(context: int = 8192, tokens: int = 3, **transport: Any) -> Point:
    return Point(reference_workload(context, tokens=tokens), RTX4070, TransportConfig(**transport))


def test_warmup_graphs_run_first_and_are_left_out() -> None:
    p = _point(depth=1, budget_mib=0)
    warmed = run_point(p, warmup=2, checked=False)
    whole = run_point(replace(p, workload=replace(p.workload, tokens=5)), warmup=0, checked=False)
    assert warmed.point is p and len(warmed.graphs) == 3
    assert warmed.graphs == whole.graphs[2:] and warmed.graphs != whole.graphs[:3]  # the ring's first sizing is left out


def test_the_resident_arm_leaves_its_cache_load_out_by_default() -> None:
    p = _point(tokens=2, arm="resident", depth=0)
    default, loaded = run_point(p), run_point(p, warmup=0)
    assert default.graphs == run_point(p, warmup=1).graphs
    load = loaded.graphs[0].ordered_bytes
    assert load > 100 * max(g.ordered_bytes for g in default.graphs)  # the one-time load is no token's cost
    assert run_point(_point(tokens=2, depth=1), checked=False).graphs == run_point(_point(tokens=2, depth=1), warmup=0).graphs


def test_checked_and_unchecked_runs_time_alike_and_only_the_checked_one_counts_hazards() -> None:
    p = _point(16384, depth=2)
    checked, plain = run_point(p), run_point(p, checked=False)
    assert [g.total_s for g in checked.graphs] == [g.total_s for g in plain.graphs]
    assert checked.extra["hazards"] == 0 and "hazards" not in plain.extra


def test_the_fast_path_extrapolates_and_agrees_with_the_exact_run() -> None:
    p = _point(16384, tokens=24, depth=1)
    fast, exact = row(run_point(p, exact=False)), row(run_point(p))
    assert sum(g.extrapolated_from >= 0 for g in run_point(p, exact=False).graphs) > 0  # it did not simulate every token
    for f in ("deliveries", "ring_mib", "declined", "window_rows", "tokens", "hazards"):
        assert fast[f] == exact[f], f
    assert fast["ms_per_token"] == pytest.approx(exact["ms_per_token"], rel=1e-3)


def test_every_caller_runs_its_points_through_run_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sim.run.run.check`` is counted where ``run_point`` calls it: a caller that wired its own run would leave
    its simulations uncounted."""
    calls: list[tuple[str, int, bool]] = []
    real = run_module.check

    def counting(point: Point, **kw: Any) -> Any:
        calls.append((point.transport.arm, point.workload.tokens, kw.get("checked", True)))
        return real(point, **kw)

    monkeypatch.setattr(run_module, "check", counting)

    def through(call: Any) -> list[tuple[str, int, bool]]:
        calls.clear()
        call()
        return list(calls)

    from kvpipe.bench import machine_run
    from kvpipe.commands.simulate import run_points
    from kvpipe.schedules import GridPoint, evaluate
    from kvpipe.sweep import run_chunk
    from validate.report import predict_arm

    p = _point(4096, tokens=2, depth=1)
    assert through(lambda: run_points([p, replace(p, transport=replace(p.transport, depth=0))], exact=True)) == [
        ("transport", 2, True)] * 2
    assert through(lambda: run_chunk([p])) == [("transport", 2, True)]
    assert through(lambda: predict_arm(p.workload, 3, p.transport, RTX4070)) == [("transport", 5, False)]
    assert through(lambda: machine_run(p)) == [("transport", 2, False)]
    ran = through(lambda: evaluate(GridPoint("rtx4070-gen4x16", "qwen3.8-27b", "q8_0", 4096), depths=(1,), tokens=2))
    assert ran and all(not checked and tokens == 2 for _, tokens, checked in ran)
