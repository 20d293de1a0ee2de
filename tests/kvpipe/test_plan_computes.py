"""A plan's contexts' GPU compute asked at once (``kvpipe.plan_peak.gpu_computes_s``, through
``sim.evaluator.family_costs.first_step_gpu_compute_s``) is, bit for bit, what ``gpu_compute_s`` gives each (point,
window) alone with nothing kept -- the number ``kvpipe plan`` prints as a context's compute."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from kvpipe import plan_peak
from kvpipe.plan_run import PlanRequest, points
from sim.evaluator import clear_caches, family_costs
from sim.evaluator.costs import point_costs
from sim.run.point import Point
from sim.transport.config import TransportConfig
from sim.workload import MAX_CONTEXT, Workload


def _bases() -> list[Any]:
    """Points differing in one thing each that ``gpu_compute_s`` reads: model, machine, K cache, V cache, pinning,
    packing."""
    out = []
    for model, hw, cache in (("qwen3.8-27b", "rtx4070-gen4x16", "q8_0"), ("llama-3.1-8b", "rtx4070-gen4x16", "q8_0"),
                             ("qwen3.8-27b", "rtx3060-gen3x4", "f16"), ("llama-3.1-8b", "h200-gen5x16", "f16")):
        out.append(points(PlanRequest(model=model, hardware=hw, cache_type=cache, contexts=(4096,)), [4096], [0], 0.0)[0])
    p = out[0]
    out.append(points(PlanRequest(hardware="rtx3060-gen3x4", contexts=(4096,)), [4096], [0], 0.0)[0])  # only the machine
    f16 = out[2].workload.cache_k
    out.append(replace(p, workload=replace(p.workload, cache_v=f16)))  # only V differs
    out.append(replace(p, workload=replace(p.workload, cache_k=f16)))  # only K differs
    out.append(replace(p, workload=replace(p.workload, pinned=False)))
    out.append(replace(p, transport=replace(p.transport, pack_streams=not p.transport.pack_streams)))
    return out


def _windows(rng: random.Random, n: int) -> list[int]:
    """Window rows as a plan asks them (multiples of 256) and others, the first few small, repeats among them."""
    out: list[int] = []
    while len(out) < n:
        kind = rng.random()
        if kind < 0.5:
            out.append(256 * rng.randint(1, 2048))
        elif kind < 0.7:
            out.append(rng.randint(1, MAX_CONTEXT))
        elif kind < 0.8:
            out.append(rng.choice((1, 2, 255, 256, 257, 511, 512, MAX_CONTEXT)))
        elif out:
            out.append(rng.choice(out))  # asked again
    return out


def _alone(asked: list[tuple[Any, int]]) -> list[float]:
    """``gpu_compute_s`` of each as it was made at dfa9f37 (its one-token point written out here), with nothing kept."""
    out = []
    for point, window_rows in asked:
        clear_caches()
        wl = point.workload
        big = Workload(wl.model, wl.cache_k, wl.cache_v, (max(1, window_rows - 1),), tokens=1, pinned=wl.pinned)
        one = Point(big, point.hardware, TransportConfig(depth=0, pack_streams=point.transport.pack_streams))
        costs = point_costs(one)[0]
        out.append(sum(float(costs.values[c.compute]) for c in costs.layout.splits if c.kind == "gpu"))
    return out


def _counted(f: Callable[..., Any], seen: list[Any]) -> Callable[..., Any]:
    """``f``, its first argument of each call appended to ``seen``."""
    def g(*args: Any) -> Any:
        seen.append(args[0])
        return f(*args)
    return g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_contexts_computes_asked_at_once_are_each_alone(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random windows of points that differ in each thing read (model, machine, K and V cache, pinning, packing),
    interleaved, some asked twice and some kept from an earlier call: every answer equal to ``gpu_compute_s``'s alone
    (``repr`` too), and most windows answered from the family's template, not one ``point_costs`` each."""
    rng = random.Random(seed)
    bases = _bases()
    asked = [(rng.choice(bases), w) for w in _windows(rng, 150)]
    alone = _alone(asked)
    plan_peak._COMPUTE_S.clear()
    clear_caches()
    early = asked[: len(asked) // 5]
    kept = [plan_peak.gpu_compute_s(p, w) for p, w in early]  # some kept, as the plan's earlier asks would
    calls: list[Any] = []
    one_by_one: list[int] = []
    monkeypatch.setattr(family_costs, "point_costs", _counted(family_costs.point_costs, calls))
    monkeypatch.setattr(plan_peak, "gpu_compute_s", _counted(plan_peak.gpu_compute_s, one_by_one))
    got = plan_peak.gpu_computes_s(asked)
    assert [repr(x) for x in got] == [repr(x) for x in alone]
    assert got == alone and kept == alone[: len(early)]
    assert len(calls) < len({(id(p), w) for p, w in asked}) // 2 and not one_by_one  # the template answered most


def test_a_family_is_answered_as_point_costs_gives_its_first_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """``first_step_gpu_compute_s`` of one family's one-token points: the first windows through ``point_costs`` (no
    template yet), the rest at once, each the sum over ``point_costs``' first step built alone; a window whose block is
    kept already goes through ``point_costs``."""
    rng = random.Random(7)
    base = _bases()[0]
    ws = _windows(rng, 80)
    pts = [plan_peak._window_point(base, w) for w in ws]

    def alone(p: Any) -> float:
        clear_caches()
        c = family_costs.point_costs(p)[0]
        return sum(float(c.values[s.compute]) for s in c.layout.splits if s.kind == "gpu")

    want = [alone(p) for p in pts]
    clear_caches()
    family_costs.point_costs(pts[40])  # a block kept for one window (and the template learnt from it)
    calls: list[Any] = []
    monkeypatch.setattr(family_costs, "point_costs", _counted(family_costs.point_costs, calls))
    assert family_costs.first_step_gpu_compute_s(pts) == want
    assert pts[40] in calls and len(calls) < 10
