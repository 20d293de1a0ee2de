"""Evaluate points with the compiled token program: lanes shared by the points that run the same token, rows as the
simulator's.

The points are planned together by the scheduler's own rules (``sim.replay.plan_points`` over
``sim.transport.planning``: per token whether the ring runs, its slots, declines). A token of a point is then a
*lane*: its graph's numbers (``sim.evaluator.costs``, the same for every depth and budget of a line) and its ring
decision (``token.Setup``: ordered, or depth N with the ring's slots fresh or already used, and the boundary wait
after a token that delivered). Points of one line whose decision at a token is the same run the same lane -- every
budget of an ordered point, every budget that keeps the same ring -- so a lane is evaluated once however many points
share it. Lanes with the same graph shape, depth (slots) and machine run together as one matrix (``token.run_token``),
each with its own slots-used and boundary-wait flags; so do the depths that issue all S deliveries at once (N >= S - 1).

An :class:`Evaluation` keeps, per (point, token), its lane, and per lane the fields ``GraphStats`` has; from them
it makes a point's stats, its row (``sim.rows.row``, so every field is computed as the simulator's row is),
or a :class:`Summary` of every point's figures as arrays, with no row at all.

Units: seconds and bytes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from backends.base import OutOfDeviceMemory
from sim.evaluator.costs import Layout, TokenCosts, point_costs
from sim.evaluator.envelope import in_envelope
from sim.evaluator.family_costs import FamilyRows, family_steps
from sim.evaluator.token import Setup, run_token
from sim.points import PointGrid
from sim.replay import PLAN_FIELDS as _PLAN
from sim.replay import Plans, plan_points
from sim.rows import row
from sim.run.point import Point, RunResult, placed_hardware
from sim.transport.config import MIB, GraphStats

TIME_FIELDS = ("total_s", "blocked_ordered_s", "consumer_wait_s", "issue_s", "boundary_wait_s")
BYTE_FIELDS = ("early_bytes", "late_bytes", "ordered_bytes")
COUNT_FIELDS = ("ordered_copies", "depth_stops", "recycle_waits", "deliveries")
BATCH_POINTS = 1 << 15  # points planned and evaluated at once (their plans, lanes and numbers: ~100 MB at 8 tokens)


@dataclass(frozen=True)
class Summary:
    """Every point's figures as arrays (one element per point): what the rows would say, without the rows.

    ``ms_per_token``, ``tokens_per_s``, ``declined`` (a ring declined and none delivered), ``ring_mib`` (the last
    token's ring need), ``ring_alloc_mib`` (0 where declined), ``late_mib`` and ``blocked_ms`` (means per token),
    ``window_rows`` (the first token's), ``fits`` (False: the scheduler refuses the point; its figures are 0)."""

    ms_per_token: np.ndarray
    tokens_per_s: np.ndarray
    declined: np.ndarray
    ring_mib: np.ndarray
    ring_alloc_mib: np.ndarray
    late_mib: np.ndarray
    blocked_ms: np.ndarray
    window_rows: np.ndarray
    fits: np.ndarray

    @staticmethod
    def concat(parts: Sequence[Summary]) -> Summary:
        return Summary(*(np.concatenate([getattr(s, f) for s in parts]) for f in Summary.__dataclass_fields__))


class Evaluation:
    """The evaluator's answer for a batch of points: their plans, each (point, token)'s lane and each lane's fields.

    ``warm``: each point's warm-up tokens (the resident arm's first graph loads the cache, as ``sim.run.run.run_point``
    runs it): planned and counted as the simulator runs them (``plans`` has them), left out of the stats and rows."""

    def __init__(self, points: Sequence[Point], plans: Plans, lane: np.ndarray, fields: dict[str, np.ndarray],
                 warm: np.ndarray | None = None) -> None:
        self.points, self.plans, self.lane, self.fields = points, plans, lane, fields
        self.warm = np.zeros(len(points), dtype=np.int64) if warm is None else warm

    def stats(self, i: int) -> list[GraphStats]:
        """Point ``i``'s GraphStats, one per token, as the simulator would report them. Raises OutOfDeviceMemory for a
        point that does not fit (as the simulator does)."""
        if not self.plans.fits[i]:
            raise OutOfDeviceMemory(self.plans.reasons.get(i, ""))
        cfg = self.points[i].transport
        out = []
        for k in range(int(self.warm[i]), int(self.plans.tokens[i])):
            lane = int(self.lane[i, k])
            values: dict[str, Any] = {f: (float if f in TIME_FIELDS else int)(self.fields[f][lane]) for f in self.fields}
            out.append(GraphStats(token=k, **values, **dict(zip(_PLAN, self.plans.graphs[k].fields(i, cfg), strict=True))))
        return out

    def row(self, i: int, wall_s: float = 0.0) -> dict[str, Any]:
        """Point ``i``'s row (``sim.rows.row`` of its stats, plus ``engine: evaluator``, ``tokens_simulated: 0``,
        ``simulated_as`` its own depth and budget, ``shared_with_n: 1``). Raises OutOfDeviceMemory as :meth:`stats`."""
        p = self.points[i]
        placed = p if len(p.hardware.devices) == 1 else replace(p, hardware=placed_hardware(p))
        result = RunResult(placed, self.stats(i), [], int(self.plans.rows[0][i]), wall_s)
        result.extra.update(tokens_simulated=0, simulated_as={"depth": p.transport.depth, "budget_mib": p.transport.budget_mib},
                            shared_with_n=1, engine="evaluator")
        return row(result)

    def summary(self) -> Summary:
        """Every point's figures (:class:`Summary`), computed as ``sim.rows.row`` computes them. Pure."""
        n, plans = len(self.points), self.plans
        warm = self.warm
        tokens = plans.tokens - warm  # the tokens a row counts (the warm-up ones are not)
        n_par = np.array([p.workload.n_parallel for p in plans.lines], dtype=np.float64)[plans.line_of]
        sums = {f: np.zeros(n) for f in ("total_s", "late_bytes", "blocked_ordered_s")}
        any_declined, any_delivered = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        last_need, last_alloc = np.zeros(n), np.zeros(n)
        for k in range(self.lane.shape[1]):
            here = (plans.tokens > k) & (warm <= k)
            lane = np.where(here, self.lane[:, k], 0)
            for f, acc in sums.items():
                acc += np.where(here, self.fields[f][lane], 0.0)  # token by token, as Python's sum adds them
            g = plans.graphs[k]
            any_declined |= here & g.declined
            any_delivered |= here & (self.fields["deliveries"][lane] > 0)
            last = plans.tokens == k + 1
            last_need = np.where(last, g.slot_need * g.ring_slots, last_need)
            last_alloc = np.where(last, g.slot_alloc * g.ring_slots, last_alloc)
        ms = sums["total_s"] / np.maximum(tokens, 1) * 1e3
        declined = any_declined & ~any_delivered
        fits = np.asarray(plans.fits, dtype=bool)
        tps = np.where(ms > 0, n_par * 1e3 / np.where(ms > 0, ms, 1.0), 0.0)
        return Summary(np.where(fits, ms, 0.0), np.where(fits, tps, 0.0), declined & fits, last_need / MIB,
                       np.where(declined, 0.0, last_alloc / MIB), sums["late_bytes"] / np.maximum(tokens, 1) / MIB,
                       sums["blocked_ordered_s"] / np.maximum(tokens, 1) * 1e3, plans.rows[0].copy(), fits)


def _as_run(points: Sequence[Point]) -> tuple[Sequence[Point], np.ndarray]:
    """The points as ``sim.run.run.run_point`` runs them, and each one's warm-up tokens: the resident arm's with one
    graph more, first (the cache's load), the others as they are. Points that share a workload share its runs'. A
    ``sim.points.PointGrid`` without the resident arm is given back as it is (no point made)."""
    if isinstance(points, PointGrid):
        warm = points.field(2, lambda c: c.arm == "resident", np.int64)
        if not warm.any():
            return points, warm
    else:
        warm = np.fromiter((p.transport.arm == "resident" for p in points), dtype=np.int64, count=len(points))
    if not warm.any():
        return list(points), warm
    longer: dict[int, Any] = {}

    def run(p: Point) -> Point:
        wl = longer.get(id(p.workload))
        if wl is None:
            wl = longer[id(p.workload)] = replace(p.workload, tokens=p.workload.tokens + 1)
        return replace(p, workload=wl)

    return [run(p) if w else p for p, w in zip(points, warm.tolist(), strict=True)], warm


def evaluate_batch(points: Sequence[Point], first: int = 0) -> Evaluation:
    """Plan and evaluate ``points`` (each inside the envelope: ``in_envelope``). Points that do not fit are kept
    (``plans.fits`` False; their lanes are a placeholder). Raises ValueError for a point outside the envelope
    (``first``: the index the messages count from). Blocks for the evaluation (CPU)."""
    kept: dict[int, list[TokenCosts] | FamilyRows] = {}
    runs, warm = _as_run(points)

    def lines(lis: list[int], pts: list[Point], family: bool) -> None:  # read alone: while its graphs are kept
        reason = in_envelope(pts[0])  # a family's lines are alike in all it reads (``sim.replay_family.family_key``)
        if reason:
            raise ValueError(f"point {first + runs.index(pts[0])} is outside the evaluator's envelope: {reason}")
        kept.update(zip(lis, family_steps(pts) if family else [point_costs(pts[0])], strict=True))

    plans = plan_points(runs, lines)
    costs = [kept[li] for li in range(len(plans.lines))]
    n, n_tok = len(points), int(plans.tokens.max())  # (each point's tokens: its line's workload's)
    depth, n_slots, tokens = plans.policy.depth, plans.policy.n_slots, plans.tokens
    # each (point, token)'s lane key: its line and token, and its ring decision as one number
    keys = np.full((n, n_tok), -1, dtype=np.int64)
    used, before = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    live = plans.fits.copy()
    for k in range(n_tok):
        active = plans.active(k)
        used &= ~plans.graphs[k].fresh.get(0, np.zeros(n, dtype=bool))
        code = np.where(active, 2 + (((depth * 64 + n_slots) * 2 + used) * 2 + before), before)
        keys[:, k] = np.where(live & (tokens > k) & (warm <= k), (plans.line_of * n_tok + k) * (1 << 24) + code, -1)
        used |= active
        before = active
    uniq, inverse = np.unique(keys, return_inverse=True)
    lane = inverse.reshape(n, n_tok) - (1 if uniq.size and uniq[0] < 0 else 0)
    wanted = uniq[uniq >= 0]
    fields = _run_lanes(plans, costs, wanted, n_tok)
    lane[keys < 0] = 0
    if not wanted.size:  # nothing fits: placeholder lanes
        fields = {f: np.zeros(1) for f in (*TIME_FIELDS, *BYTE_FIELDS, *COUNT_FIELDS)}
    return Evaluation(points, plans, lane, fields, warm)


def _run_lanes(plans: Plans, costs_of: list[list[TokenCosts] | FamilyRows], keys: np.ndarray, n_tok: int) -> dict[str, np.ndarray]:
    """Each lane's GraphStats fields: the lanes of one graph shape, depth (slots) and machine run as one matrix, each
    lane with its own slots-used and boundary flags (``run_token``'s ``used``/``boundary``: a line's first token and
    its later ones together); its rows in lane order, the groups in order of their first lane. The lanes are grouped
    as arrays: each lane's layout and machine numbered, one key per lane, one stable sort. Pure."""
    out = {f: np.zeros(len(keys), dtype=np.float64 if f in TIME_FIELDS else np.int64)
           for f in (*TIME_FIELDS, *BYTE_FIELDS, *COUNT_FIELDS)}
    if not len(keys):
        return out
    code, rest = keys % (1 << 24), keys >> 24
    li, k = np.divmod(rest, n_tok)
    src = _Sources(costs_of, li, k)
    lay, layout_of = src.lay, src.layout_of
    machines: dict[int, int] = {}
    hw_of_line = np.array([machines.setdefault(id(p.hardware), len(machines)) for p in plans.lines], dtype=np.int64)
    hardware = list({id(p.hardware): p.hardware for p in plans.lines}.values())
    # a code (``_setup``): 0/1 ordered without/with the boundary wait; else 2 + ((depth * 64 + n_slots) * 2 + used) * 2
    # + before. Its frame: the depth and slots alone (fresh slots, no wait); the flags per lane.
    piped = code >= 2
    frame = np.where(piped, (code - 2) // 4 * 4 + 2, 0)
    # Every depth that issues all S staged deliveries at the start into S slots or more runs one program: its lanes
    # are one matrix, with the shallowest such frame (depth max(S - 1, 1), S slots).
    depth, n_slots = np.divmod((code - 2) // 4, 64)
    staged = np.array([lo.staged for lo in layout_of], dtype=np.int64)[lay]
    first = np.maximum(staged - 1, 1)
    frame = np.where(piped & (depth >= first) & (n_slots >= staged), 2 + (first * 64 + np.maximum(staged, 1)) * 4, frame)
    used = piped & ((code - 2) // 2 % 2 == 1)
    boundary = np.where(piped, (code - 2) % 2 == 1, code == 1)
    group = (lay * (1 << 24) + frame) * len(hardware) + hw_of_line[li]
    order = np.argsort(group, kind="stable")
    bounds = np.flatnonzero(np.diff(group[order])) + 1
    parts = sorted(np.split(order, bounds), key=lambda idx: int(idx[0]))  # groups by their first lane
    for idx in parts:
        j0 = int(idx[0])
        hw, layout = hardware[int(hw_of_line[li[j0]])], layout_of[int(lay[j0])]
        st = run_token(layout, src.values(idx, layout.width), _setup(int(frame[j0]), layout.staged), hw.host, hw.devices[0],
                       used[idx], boundary[idx])
        for f in TIME_FIELDS:
            out[f][idx] = st[f]
        for f in (*BYTE_FIELDS, *COUNT_FIELDS):
            out[f][idx] = np.asarray(st[f]).astype(np.int64)
    return out


class _Sources:
    """Where each lane's numbers are: a row of a family's matrix (its line a ``FamilyRows``: read as arrays, per
    line) or a TokenCosts of its own (read per lane); each lane's layout numbered (``lay``, ``layout_of``)."""

    def __init__(self, costs_of: list[list[TokenCosts] | FamilyRows], li: np.ndarray, k: np.ndarray) -> None:
        layouts: dict[int, int] = {}
        self.layout_of: list[Layout] = []

        def number(layout: Layout) -> int:
            got = layouts.get(id(layout))
            if got is None:
                got = layouts[id(layout)] = len(self.layout_of)
                self.layout_of.append(layout)
            return got

        mats: dict[int, int] = {}
        self.mats: list[np.ndarray] = []
        line = np.full((len(costs_of), 3), -1, dtype=np.int64)  # per line: its matrix, first row, layout (-1: its own)
        for i, c in enumerate(costs_of):
            if isinstance(c, FamilyRows):
                m = mats.get(id(c.values))
                if m is None:
                    m = mats[id(c.values)] = len(self.mats)
                    self.mats.append(c.values)
                line[i] = m, c.first, number(c.layout)
        self.mat, self.row, self.lay = line[li, 0], line[li, 1] + k, line[li, 2]
        alone = np.flatnonzero(self.mat < 0)
        self.own = [costs_of[a][b] for a, b in zip(li[alone].tolist(), k[alone].tolist(), strict=True)]
        self.lay[alone] = np.fromiter((number(c.layout) for c in self.own), dtype=np.int64, count=len(self.own))
        self.own_at = np.full(len(li), -1, dtype=np.int64)
        self.own_at[alone] = np.arange(len(alone))

    def values(self, idx: np.ndarray, width: int) -> np.ndarray:
        """The lanes ``idx``' numbers (one layout, ``width`` columns), a row each, in order: copies of the same values."""
        mat, row = self.mat[idx], self.row[idx]
        ms = np.unique(mat).tolist()
        if len(ms) == 1 and ms[0] >= 0:
            return self.mats[ms[0]][row]
        X = np.empty((len(idx), width))
        for m in ms:
            at = np.flatnonzero(mat == m)
            X[at] = self.mats[m][row[at]] if m >= 0 else np.stack([self.own[j].values for j in self.own_at[idx[at]].tolist()])
        return X


@functools.lru_cache(maxsize=4096)
def _setup(code: int, staged: int) -> Setup:
    """The ring decision a lane key's code names (see ``evaluate_batch``): ordered, or depth N over ``n_slots`` slots,
    fresh or already used by ``staged`` deliveries, with or without the boundary wait."""
    if code < 2:
        return Setup(boundary=bool(code))
    code -= 2
    before, code = code % 2, code // 2
    used, code = code % 2, code // 2
    depth, n_slots = divmod(code, 64)
    return Setup(depth, n_slots, tuple(bool(used) and o < min(staged, n_slots) for o in range(n_slots)), bool(before))


def evaluations(points: Sequence[Point]) -> Iterator[tuple[int, Evaluation]]:
    """``points`` evaluated in batches of ``BATCH_POINTS``, one batch at a time (a batch's plans are dropped once the
    caller moves on): (the batch's first index, its Evaluation). Blocks (CPU)."""
    for lo in range(0, len(points), BATCH_POINTS):
        yield lo, evaluate_batch(_batch(points, lo), lo)


def _batch(points: Sequence[Point], lo: int) -> Sequence[Point]:
    """``points[lo : lo + BATCH_POINTS]``; of a ``sim.points.PointGrid``, a grid (no point made)."""
    hi = min(lo + BATCH_POINTS, len(points))
    return points.take(np.arange(lo, hi)) if isinstance(points, PointGrid) else points[lo:hi]


def evaluate_stats(points: Sequence[Point]) -> list[list[GraphStats]]:
    """Every token's GraphStats of every point (each inside the envelope: ``in_envelope``), as the simulator would
    report them. Raises ValueError for a point outside the envelope and OutOfDeviceMemory for one that does not fit
    (as the simulator does). Blocks for the evaluation (CPU)."""
    return [ev.stats(i) for _, ev in evaluations(points) for i in range(len(ev.points))]


def evaluate(points: Sequence[Point]) -> list[dict[str, Any]]:
    """The row of every point (:meth:`Evaluation.row`; ``wall_s``: its batch's wall time per point). See
    :func:`evaluate_stats` for what it raises. Blocks for the evaluation (CPU)."""
    out: list[dict[str, Any]] = []
    for lo in range(0, len(points), BATCH_POINTS):
        t = time.perf_counter()
        ev = evaluate_batch(points[lo : lo + BATCH_POINTS], lo)
        wall = (time.perf_counter() - t) / len(ev.points)
        out += [ev.row(i, wall) for i in range(len(ev.points))]
    return out


def summarize(points: Sequence[Point]) -> Summary:
    """Every point's figures as arrays (:class:`Summary`), no rows. Raises ValueError for a point outside the
    envelope; a point that does not fit has ``fits`` False. Blocks for the evaluation (CPU); holds one batch of
    ``BATCH_POINTS`` points' plans at a time."""
    if not points:
        return Summary(*(np.zeros(0) for _ in Summary.__dataclass_fields__))
    return Summary.concat([ev.summary() for _, ev in evaluations(points)])
