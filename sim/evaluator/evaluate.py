"""Evaluate points with the compiled token program: lanes grouped by shape and ring decision, rows as the simulator's.

Each point is planned by the scheduler's own planning replay (``sim.distinct.plan_point``: per token whether the
ring runs, its slots, declines); each of its tokens becomes one *lane*: its graph's numbers
(``sim.evaluator.costs``) and its ring decision (``token.Setup``: ordered or depth N, the slots already used since
the ring was last allocated, the boundary wait after a token that delivered). Lanes with the same graph shape,
decision and machine run together as one matrix (``token.run_token``); each token's stats land in a
``GraphStats``, and ``sim.simulate.row`` makes the row, so every field is computed as the simulator's row is.

Units: seconds and bytes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from backends.base import OutOfDeviceMemory
from sim.distinct import PointPlan, plan_point
from sim.evaluator.costs import point_costs
from sim.evaluator.envelope import in_envelope
from sim.evaluator.token import Setup, run_token
from sim.simulate import Point, RunResult, placed_hardware, row
from sim.transport.config import GraphStats

TIME_FIELDS = ("total_s", "blocked_ordered_s", "consumer_wait_s", "issue_s", "boundary_wait_s")
BYTE_FIELDS = ("early_bytes", "late_bytes", "ordered_bytes")
COUNT_FIELDS = ("ordered_copies", "depth_stops", "recycle_waits", "deliveries")
BATCH_POINTS = 4096  # points whose cost matrices are held at once (qwen3.8-27b, 8 tokens: ~60 MB)


def setups(point: Point, plan: PointPlan, staged: Sequence[int]) -> list[Setup]:
    """Each token's ring decision from the plan: ordered, or depth N with the slots used since the ring was (re)allocated
    (``Ring.ensure_slots`` clears them) and the boundary wait after a token that delivered. ``staged``: each token's
    staged splits (its deliveries). Pure."""
    cfg = point.transport
    n_slots = cfg.n_slots
    used = [False] * n_slots
    out: list[Setup] = []
    prev_alloc, prev_active = 0, False
    for k, tp in enumerate(plan.tokens):
        active = bool(tp.active)
        alloc = tp.rings[0][2] if tp.rings else 0
        if active:
            if k == 0 or alloc != prev_alloc:
                used = [False] * n_slots
            out.append(Setup(cfg.depth, n_slots, tuple(used), prev_active))
            for o in range(min(staged[k], n_slots)):
                used[o] = True
        else:
            out.append(Setup(boundary=prev_active))
        prev_alloc, prev_active = alloc, active
    return out


def evaluate_stats(points: Sequence[Point], plans: Sequence[PointPlan] | None = None) -> list[list[GraphStats]]:
    """Every token's GraphStats of every point (each inside the envelope: ``in_envelope``), as the simulator would
    report them. Raises ValueError for a point outside the envelope and OutOfDeviceMemory for one that does not fit
    (as the simulator does). Blocks for the evaluation (CPU); holds one cost matrix of ``BATCH_POINTS`` points at a
    time."""
    return [stats for stats, _ in _evaluated(points, plans)]


def _evaluated(points: Sequence[Point], plans: Sequence[PointPlan] | None) -> list[tuple[list[GraphStats], int]]:
    """(stats, the first token's window rows) of every point."""
    out: list[tuple[list[GraphStats], int]] = []
    for lo in range(0, len(points), BATCH_POINTS):
        batch = points[lo : lo + BATCH_POINTS]
        out += _batch(batch, plans[lo : lo + BATCH_POINTS] if plans is not None else None, lo)
    return out


def _batch(points: Sequence[Point], plans: Sequence[PointPlan] | None, first: int) -> list[tuple[list[GraphStats], int]]:
    groups: dict[Any, list[tuple[int, int, np.ndarray]]] = {}
    machines: dict[int, tuple[int, Any]] = {}  # id(profile) -> (its index, the profile, kept alive while its id is a key)
    planned: list[PointPlan] = []
    rows: list[int] = []
    last: tuple[Any, ...] = ()
    for i, p in enumerate(points):
        # the envelope: the same verdict as the point before when only depth and budget differ (a grid's inner axes)
        here = (p.workload, p.hardware, replace(p.transport, depth=0, budget_mib=0.0))
        if here != last:
            reason = in_envelope(p)  # first: its graph is then kept for the plan and the costs
            if reason:
                raise ValueError(f"point {first + i} is outside the evaluator's envelope: {reason}")
            last = here
        plan = plans[i] if plans is not None else plan_point(p)
        if not plan.fits:
            raise OutOfDeviceMemory(plan.reason)
        planned.append(plan)
        costs = point_costs(p)
        rows.append(costs[0].window_rows)
        m = machines.setdefault(id(p.hardware), (len(machines), p.hardware))[0]
        for k, (c, s) in enumerate(zip(costs, setups(p, plan, [c.layout.staged for c in costs]), strict=True)):
            groups.setdefault((c.layout, s, m), []).append((i, k, c.values))
    fields: list[list[dict[str, Any]]] = [[{} for _ in range(p.workload.tokens)] for p in points]
    profiles = {m: hw for m, hw in machines.values()}
    for (layout, setup, m), lanes in groups.items():
        hw = profiles[m]
        st = run_token(layout, np.stack([v for _, _, v in lanes]), setup, hw.host, hw.devices[0])
        times = list(zip(*(st[f].tolist() for f in TIME_FIELDS), strict=True))  # type: ignore[union-attr]
        nbytes = list(zip(*(st[f].astype(np.int64).tolist() for f in BYTE_FIELDS), strict=True))  # type: ignore[union-attr]
        counts = {f: int(st[f]) for f in COUNT_FIELDS}  # type: ignore[arg-type]
        for (i, k, _), t, b in zip(lanes, times, nbytes, strict=True):
            fields[i][k] = {**dict(zip(TIME_FIELDS, t, strict=True)), **dict(zip(BYTE_FIELDS, b, strict=True)), **counts}
    out = []
    for plan, per_token, window_rows in zip(planned, fields, rows, strict=True):
        out.append(([GraphStats(token=k, **f, **tp.fields()) for k, (f, tp) in enumerate(zip(per_token, plan.tokens, strict=True))],
                    window_rows))
    return out


def evaluate(points: Sequence[Point], plans: Sequence[PointPlan] | None = None) -> list[dict[str, Any]]:
    """The row of every point (``sim.simulate.row``'s fields, plus ``engine: evaluator``, ``tokens_simulated: 0``,
    ``simulated_as`` its own depth and budget, ``shared_with_n: 1``). See :func:`evaluate_stats` for what it raises.
    Blocks for the evaluation (CPU)."""
    t = time.perf_counter()
    evaluated = _evaluated(points, plans)
    wall = (time.perf_counter() - t) / max(1, len(points))
    rows = []
    for p, (graphs, window_rows) in zip(points, evaluated, strict=True):
        placed = p if len(p.hardware.devices) == 1 else replace(p, hardware=placed_hardware(p))
        result = RunResult(placed, graphs, [], window_rows, wall)
        result.extra.update(tokens_simulated=0, simulated_as={"depth": p.transport.depth, "budget_mib": p.transport.budget_mib},
                            shared_with_n=1, engine="evaluator")
        rows.append(row(result))
    return rows
