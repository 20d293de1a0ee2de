"""The ring planning rules (sim.transport.planning): one set, over arrays of points, that the scheduler runs for one
point and the point planner for many.

* planning many points at once decides for each what planning it alone decides (batching changes nothing), on a
  mixed batch: contexts, depths, budgets either side of a decline, --kv-gpu-layers, -ngl, several sequences, two
  devices;
* the decisions and messages of one device's ring over a ledger, step by step;
* ``next_pow2`` over arrays is the scalar rule.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from sim import distinct
from sim.points import GridSpec, points
from sim.simulate import Point
from sim.transport import deliveries, planning
from sim.transport.config import MIB, TransportConfig


def test_next_pow2_over_arrays_is_the_scalar_rule() -> None:
    rng = random.Random(7)
    ns = [*range(0, 5000), *(rng.randrange(1, 1 << 50) for _ in range(2000)), *(1 << k for k in range(50))]
    got = planning.next_pow2(np.array(ns, dtype=np.int64)).tolist()
    assert got == [deliveries.next_pow2(n) for n in ns]


def _mixed() -> list[Point]:
    rng = random.Random(27)
    specs = [
        GridSpec(contexts=((rng.randrange(2000, 90000),), (rng.randrange(2000, 90000),)), depths=(0, 1, 3, 8),
                 budgets_mib=(0, 24, 64, 200), tokens=6),
        GridSpec(contexts=((rng.randrange(40000, 70000),),), kv_gpu_layers=(0, 4, 8), depths=(0, 2), budgets_mib=(0, 128), tokens=5),
        GridSpec(contexts=((30000,),), n_gpu_layers=(40,), depths=(1, 2), budgets_mib=(0, 64), tokens=4),
        GridSpec(contexts=((rng.randrange(500, 8000),),), parallels=(3,), unified=False, depths=(0, 1, 4), tokens=5),
        GridSpec(contexts=((rng.randrange(8000, 40000),),), hardware=("rtx4070-gen4x16+rtx3060-gen3x4",), split_mode="layer",
                 depths=(0, 1, 3), budgets_mib=(0, 64), tokens=7),
        GridSpec(contexts=((80352,),), depths=(3,), budgets_mib=(0,), tokens=8),  # pipelines token 0, declined after
    ]
    pts = [p for spec in specs for p in points(spec)]
    rng.shuffle(pts)
    return pts


def test_planning_many_points_at_once_decides_what_each_alone_decides() -> None:
    pts = _mixed()
    together = distinct.plan_points(pts)
    alone = [distinct.plan_point(p) for p in pts]
    assert [together.point_plan(i) for i in range(len(pts))] == alone
    assert any(pl.pipelined for pl in alone) and any(not pl.pipelined for pl in alone)
    assert any(t.fields()["declined"] for pl in alone for t in pl.tokens)


def _one_device(total_mib: float, used_mib: float) -> planning.Ledger:
    return planning.Ledger(np.array([[int(total_mib * MIB)]]), np.array([[int(used_mib * MIB)]]))


def _plan(ledger: planning.Ledger, ring: planning.RingState, cfg: TransportConfig, need: int, full: int) -> planning.GraphPlan:
    gp = planning.GraphPlan.empty(1)
    here, n_splits, need_a, full_a = planning.one(True, 2, need, full)
    planning.plan_ring(gp, ring, ledger, planning.policy_of(cfg), 0, here, n_splits, need_a, full_a, 256)
    return gp


def test_one_ring_step_by_step() -> None:
    cfg = TransportConfig(depth=1, budget_mib=30.0)  # 3 slots
    ledger, ring = _one_device(2048, 1000), planning.RingState.empty(1)
    gp = _plan(ledger, ring, cfg, 5 * MIB, 20 * MIB)  # 15 MiB: grown to the next power of two, 8 MiB a slot
    assert gp.active[0][0] and gp.fresh[0][0] and ring.alloc[0] == 8 * MIB and ledger.held(0, "ring")[0] == 24 * MIB
    gp = _plan(ledger, ring, cfg, 7 * MIB, 20 * MIB)  # fits the slots it has: kept, not fresh
    assert gp.active[0][0] and not gp.fresh[0][0] and ring.alloc[0] == 8 * MIB
    gp = _plan(ledger, ring, cfg, 11 * MIB, 20 * MIB)  # 33 MiB > 30: declined, the slots kept
    assert not gp.active[0][0] and gp.reason(0, cfg) == "ring needs 33.0 MiB > budget 30 MiB (60.0 MiB at full context)"
    huge = TransportConfig(depth=1, budget_mib=0.0)
    used = ledger.used.copy()  # asking the rule (as the across-tokens schedule does) decides the same, changing nothing
    asked = planning.decline_reason(ring, int(ledger.free_bytes(0)[0]), huge, 0, 200 * MIB, 400 * MIB)
    assert (ledger.used == used).all() and ring.alloc[0] == 8 * MIB
    gp = _plan(ledger, ring, huge, 200 * MIB, 400 * MIB)  # 1,024 MiB free + the 24 it holds - 600: 448 < 512
    assert asked == gp.reason(0, huge)
    assert gp.reason(0, huge) == "ring needs 600.0 MiB but device 0 would keep 448.0 MiB free < headroom 512 MiB"
    for _ in range(5):  # idle past idle_release_graphs: the slots go back
        planning.account_idle(planning.GraphPlan.empty(1), {0: ring}, ledger, planning.policy_of(cfg))
    assert ledger.held(0, "ring")[0] == -1 and ring.alloc[0] == 0 and ledger.used[0, 0] == 1000 * MIB


def test_a_graph_that_does_not_fit_beside_its_ring_runs_ordered_and_one_that_never_fits_is_refused() -> None:
    cfg = TransportConfig(depth=1, budget_mib=0.0, headroom_mib=0.0)
    ledger, ring = _one_device(100, 0), planning.RingState.empty(1)
    pol = planning.policy_of(cfg)
    gp = _plan(ledger, ring, cfg, 20 * MIB, 20 * MIB)  # 60 MiB of ring
    gpu, staged, need = planning.one(True, True, 20 * MIB)
    planning.reserve_graph(gp, {0: ring}, ledger, pol, 0, gpu, staged, need, 50 * MIB, 1 << 20)
    assert not gp.active[0][0] and ring.frozen[0] and ledger.held(0, "ring")[0] == -1
    assert gp.reason(0, cfg) == "graph reservation failed next to the ring on device 0; retried ordered"
    assert ledger.held(0, "graph")[0] == 70 * MIB and ledger.fits[0]
    small = _one_device(10, 0)
    gpu, staged, need = planning.one(True, False, 0)
    planning.reserve_graph(planning.GraphPlan.empty(1), {}, small, pol, 0, gpu, staged, need, 50 * MIB, 1 << 20)
    assert not small.fits[0] and small.reasons[0] == "the graph does not fit device 0"


@pytest.mark.parametrize("margin", [1, 33])
def test_margins_the_evaluator_cannot_encode_are_outside_its_envelope(margin: int) -> None:
    from dataclasses import replace

    from sim.evaluator import in_envelope

    p = points(GridSpec(contexts=((4096,),), depths=(1,)))[0]
    assert "ring margin" in (in_envelope(replace(p, transport=replace(p.transport, margin_slots=margin))) or "")
