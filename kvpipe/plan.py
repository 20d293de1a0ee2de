"""Capacity planning: which depth and ring budget to give each context size.

For one model on one machine the pipeline's gain over the ordered path rises
with the context while the token is compute-bound (each extra window row adds
copy time the ring hides), peaks where copy ~ compute, and falls once the
copies dominate (the ring can only hide the compute). The ring it needs grows
linearly with the window: ``n_slots x rows x b`` for ``b`` bytes of K+V per
row of one attention layer, so a fixed budget declines past
``budget / (n_slots x b)`` rows and the gain drops to zero there.

The plan answers, per context, the ordered path and depths 1..max uncapped
(the budget that keeps the ring is the ring it reports) and at each budget
asked, then the best depth at the default budget, and places three peaks side
by side (``kvpipe.plan_peak``):

* the closed form ``rows* = compute x BW / (n_attn x b)`` with ``compute``
  the per-token GPU compute of the decode graph (it grows with the window, so
  rows* is solved as a fixed point) and ``BW`` the pinned H2D bandwidth of a
  delivery of that size; the ring there is ``(n_slots / n_attn) x compute x BW``;
* the simulated peak, from a scan of windows (256-row steps near the top);
* the best of the contexts asked for.

The closed form balances bare copy time against bare compute. The simulation
also charges the GPU side for the late rows copied on the consumer stream and
the host's round trip at every CPU split, and the copy side for link latency
and the small blocking copies that queue FIFO behind deliveries; whichever
side carries more moves the balance, and the plan says by how much.

The points are answered by ``kvpipe.plan_run.Runner`` -- the compiled evaluator's figures as arrays where its
envelope allows, the simulator elsewhere -- and the analysis reads them as arrays over (budget, context, depth):
half a million points make no row. The table is ``kvpipe.plan_report.render``.

Units: seconds and bytes inside; MiB, ms and rows in the report.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from kvpipe.plan_peak import ClosedForm, apply_peak, closed_form, copy_s, gpu_compute_s, gpu_computes_s, peak_ring_bytes, peak_rows
from kvpipe.plan_report import render
from kvpipe.plan_run import CHECK_N, DEFAULT_BUDGET_MIB, Figures, PlanRequest, Runner, points
from kvpipe.plan_run import grid as grid_points
from sim.errors import InputError
from sim.points import PointGrid, new_point
from sim.run.point import Point
from sim.transport.config import MIB

__all__ = ["CHECK_N", "DEFAULT_BUDGET_MIB", "TIE_GAIN", "ClosedForm", "ContextPlan", "PlanRequest", "Runner", "closed_form",
           "copy_s", "decline_rows", "gpu_compute_s", "peak_ring_bytes", "peak_rows", "plan", "points", "render"]

#: Gains closer than this are a tie: two depths that run the same schedule differ by float noise (~1e-14), which
#: must not pick the depth (nor let the fast path's extrapolation pick another one than every token simulated would).
TIE_GAIN = 1e-9


@dataclass
class ContextPlan:
    """One context's answer (the JSON object ``kvpipe plan --json`` prints)."""

    context: int
    window_rows: int
    best_depth: int
    uncapped_gain: float
    budget_mib_for_full_gain: float
    gain_at_default_budget: float
    default_budget_mib: float
    default_declines: bool
    default_decline_rows: int | None
    gain_per_mib: float | None
    copy_ms: float
    compute_ms: float
    gain_by_depth: dict[int, float]
    ring_mib_by_depth: dict[int, float]
    peak_depth: int = 1
    peak_slots: int = 3  # the ring's slots at the peak depth (TransportConfig.n_slots)
    peak_rows_closed_form: float = 0.0
    peak_ring_mib_closed_form: float = 0.0
    peak_rows_simulated: int = 0
    peak_context_simulated: int = 0
    peak_gain_simulated: float = 0.0
    peak_ring_mib_simulated: float = 0.0
    peak_note: str = ""
    budget_for_gain: float | None = None
    budget_mib_for_gain: float | None = None
    depth_for_gain: int | None = None
    best_by_budget: dict[float, tuple[int, float]] = field(default_factory=dict)  # budget MiB -> (best depth, its gain)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        d["gain_by_depth"] = {str(k): v for k, v in self.gain_by_depth.items()}
        d["ring_mib_by_depth"] = {str(k): v for k, v in self.ring_mib_by_depth.items()}
        d["best_by_budget"] = {f"{b:g}": {"depth": dd, "gain": g} for b, (dd, g) in self.best_by_budget.items()}
        return d


def decline_rows(ring_mib: float, window_rows: int, budget_mib: float) -> int | None:
    """Largest window the budget still holds: budget / (ring bytes per window row). None without a cap."""
    if not budget_mib or not window_rows or not ring_mib:
        return None
    per_row = ring_mib * MIB / window_rows
    return int(budget_mib * MIB // per_row)


def _answered(runner: Runner, pts: list[Any], known: Figures | None = None) -> Figures:
    """The figures of ``pts`` (``known``: theirs already, from the plan's grid: ``Runner.known``); InputError naming
    the first that does not fit."""
    f = runner.run(pts) if known is None else runner.known(pts, known)
    bad = np.flatnonzero(~f.fits)
    if bad.size:
        p = pts[int(bad[0])]
        raise InputError(f"the point at context {p.context:,}, depth {p.transport.depth}, budget {p.transport.budget_mib:g} MiB "
                         "does not fit the device")
    return f


def _gains(tps: np.ndarray, declined: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """Each point's gain over its ordered path (``sim.rows.gains``' rule); 0 where its ring is declined."""
    return np.where(declined, 0.0, tps / ordered - 1.0)


# ------------------------------------------------------------------- plan


def plan(req: PlanRequest, runner: Runner | None = None, then: Callable[[dict[int, dict[int, float]]], None] | None = None,
         meanwhile: Callable[[], None] | None = None) -> list[ContextPlan]:
    """Plan every context of ``req`` whose graph fits the device (``runner``: the plan's, whose evaluated points are
    checked at its end); a context that does not fit even on the ordered path has no plan (the memory plan,
    ``kvpipe.capacity``, says why). ``then``: given each planned context's ring (MiB) by depth 1..max (its plan's
    ``ring_mib_by_depth``) as soon as the grid's figures are known, before the plans are made and the budgets' runs
    (the memory plan starts there); ``meanwhile``: called while the grid is
    answered (on the workers: the memory plan's work that needs no figure). Blocks for the evaluation and any
    simulations (about a second for a few contexts on two cores)."""
    runner = runner or Runner(req)
    depths = list(range(req.max_depth + 1))
    budgets = [0.0, *(b for b in req.budgets_mib if b)]  # uncapped first; the asked budgets in the same run
    pts = grid_points(req, list(req.contexts), depths, budgets)  # arrays: a Point made only where one is read
    collect = runner.start(pts, grid=True)
    if meanwhile is not None:
        meanwhile()
    f = collect()

    def grid(a: np.ndarray) -> np.ndarray:  # (budget, context, depth), from the grid's (context, depth, budget)
        return a.reshape(len(req.contexts), len(depths), len(budgets)).transpose(2, 0, 1)

    tps = grid(f.tokens_per_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = _gains(tps, grid(f.declined), tps[0, :, 0][None, :, None])
    ring, window = grid(f.ring_mib)[0], grid(f.window_rows)[0]
    first = len(depths) * len(budgets)  # each context's depth-0, budget-0 point
    fits = np.asarray(grid(f.fits).all(axis=(0, 2)))  # a context whose graph does not fit the device even ordered is left out
    asked = [c for c in range(len(req.contexts)) if fits[c]]  # (the memory plan says why it does not fit)
    if then is not None:  # (a context asked twice: its last, equal to its first)
        then({req.contexts[c]: dict(zip(depths[1:], ring[c, 1:].tolist(), strict=True)) for c in asked})
    best = _best_depths(gain[:, asked, 1:])  # each budget's and context's best depth and its gain, as arrays
    at = list(zip(asked, best[0][0].tolist(), strict=True))
    computes = gpu_computes_s([(pts[c * first], int(window[c, d])) for c, d in at])  # each context's at its best depth
    out = [_uncapped(req, pts[c * first], gain[0, c], ring[c], window[c], tps[0, c], d, s)
           for (c, d), s in zip(at, computes, strict=True)]
    if not out:
        return out
    known = _Grid(pts, f, list(req.contexts), len(depths), budgets)  # the budgets' runs take what the grid answered
    _at_budget(req, runner, out, known)
    peak_depth = Counter(p.best_depth for p in out if p.best_depth).most_common(1)
    apply_peak(req, runner, out, peak_depth[0][0] if peak_depth else 1)
    if req.budget_for_gain is not None:
        _budget_for_gain(req, runner, out, known)
    for budget in req.budgets_mib:
        b = budgets.index(float(budget)) if budget else 0
        for p, d, g in zip(out, best[0][b].tolist(), best[1][b].tolist(), strict=True):
            p.best_by_budget[budget] = (d, g)
    return out


def _best_depth(gains: dict[int, float]) -> tuple[int, float]:
    """The depth with the highest gain (ties, within TIE_GAIN, to the shallower) and its gain; none positive: (0, 0)."""
    top = max(gains.values())
    best = min(d for d, g in gains.items() if g >= top - TIE_GAIN)
    return (best, gains[best]) if gains[best] > 0 else (0, 0.0)


def _best_depths(gains: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_best_depth` along the last axis of ``gains`` (depths 1..max; any leading axes): (best depth, its gain) as
    arrays, the same numbers (a row with a NaN, which has no maximum, goes through :func:`_best_depth` itself). Pure."""
    if not gains.size:
        return np.zeros(gains.shape[:-1], dtype=np.int64), np.zeros(gains.shape[:-1])
    if np.isnan(gains).any():
        flat = gains.reshape(-1, gains.shape[-1])
        got = [_best_depth(dict(zip(range(1, flat.shape[1] + 1), row, strict=True))) for row in flat.tolist()]
        return (np.array([d for d, _ in got], dtype=np.int64).reshape(gains.shape[:-1]),
                np.array([g for _, g in got], dtype=np.float64).reshape(gains.shape[:-1]))
    top = gains.max(axis=-1, keepdims=True)
    first = np.argmax(gains >= top - TIE_GAIN, axis=-1)  # the shallowest depth within TIE_GAIN of the top
    g = np.take_along_axis(gains, first[..., None], axis=-1)[..., 0]
    return np.where(g > 0, first + 1, 0), np.where(g > 0, g, 0.0)


def _uncapped(req: PlanRequest, pt: Any, gain: np.ndarray, ring: np.ndarray, window: np.ndarray, tps: np.ndarray,
              best: int, compute_s: float) -> ContextPlan:
    """One context's plan from its uncapped points (arrays over depth 0..max), its best depth (:func:`_best_depths`) and
    the GPU compute of its window there (``gpu_compute_s(pt, window[best])``, seconds)."""
    context = pt.context
    gains = dict(zip(range(1, len(gain)), gain[1:].tolist(), strict=True))
    rings = dict(zip(range(1, len(ring)), ring[1:].tolist(), strict=True))
    w = int(window[best])
    last_w = pt.workload.window_rows(context + req.tokens - 1)  # the ring the row reports is the last graph's
    uncapped, ring_best = gains.get(best, 0.0), rings.get(best, 0.0)
    return ContextPlan(
        context=context, window_rows=w, best_depth=best, uncapped_gain=uncapped,
        budget_mib_for_full_gain=float(math.ceil(ring_best)) if best else 0.0,
        gain_at_default_budget=0.0, default_budget_mib=req.default_budget_mib, default_declines=False,
        default_decline_rows=decline_rows(rings.get(best or 1, 0.0), last_w, req.default_budget_mib),
        gain_per_mib=uncapped / ring_best if best and ring_best else None,
        copy_ms=copy_s(pt, w) * 1e3, compute_ms=compute_s * 1e3,
        gain_by_depth=gains, ring_mib_by_depth=rings,
        extra={"uncapped_tokens_per_s": float(tps[best]), "ordered_tokens_per_s": float(tps[0])},
    )


@dataclass(frozen=True)
class _Grid:
    """The plan's grid (contexts x depths x budgets) and its figures, which a later run of some of its points takes
    instead of running them again: the evaluator answers a point the same whatever else its batch holds."""

    pts: PointGrid
    figs: Figures
    contexts: list[int]
    n_depths: int
    budgets: list[float]

    def pairs(self, todo: list[tuple[int, int, float]]) -> tuple[list[Point], Figures] | None:
        """:func:`_pairs`' points of ``todo`` (each context ordered and at its depth, at its budget), made anew from the
        grid's objects (equal to those :func:`_pairs` makes), and the grid's figures of them; None unless the grid has
        every one and the evaluator answered it. Pure."""
        at: dict[int, int] = {}
        for k, c in enumerate(self.contexts):
            at.setdefault(c, k)
        nb, idx = len(self.budgets), []
        for c, d, b in todo:
            if c not in at or float(b) not in self.budgets or not 0 <= d < self.n_depths:
                return None
            first = at[c] * self.n_depths * nb + self.budgets.index(float(b))
            idx += [first, first + d * nb]
        figs = self.figs.take(idx)
        if not figs.evaluated.all():
            return None
        (ws, w), (hs, h), (cs, cc) = self.pts.parts
        return [new_point(ws[w[i]], hs[h[i]], cs[cc[i]]) for i in idx], figs


def _pairs(req: PlanRequest, runner: Runner, todo: list[tuple[int, int, float]], grid: _Grid | None = None
           ) -> list[tuple[float, bool]]:
    """(gain, declined) of (context, depth, budget) each, against the ordered path at that budget (``grid``: taken from
    the plan's grid where it has them all, :meth:`_Grid.pairs`)."""
    got = grid.pairs(todo) if grid is not None and todo else None
    pts, known = got if got is not None else ([], None)
    if got is None:
        for p, (_, d, b) in zip(points(req, [c for c, _, _ in todo], [0], 0.0) if todo else [], todo, strict=True):
            ordered = replace(p, transport=replace(p.transport, budget_mib=b))
            pts += [ordered, replace(ordered, transport=replace(ordered.transport, depth=d))]
    if not pts:
        return []
    f = _answered(runner, pts, known)
    tps, declined = f.tokens_per_s.reshape(-1, 2), f.declined.reshape(-1, 2)
    gain = _gains(tps[:, 1], declined[:, 1], tps[:, 0])
    return [(float(g), bool(d)) for g, d in zip(gain, declined[:, 1], strict=True)]


def _at_budget(req: PlanRequest, runner: Runner, out: list[ContextPlan], grid: _Grid | None = None) -> None:
    """Each context's best depth at the default budget (the gain the default actually buys; ``grid``: see :func:`_pairs`)."""
    todo = [p for p in out if p.best_depth]
    for p, (g, declined) in zip(todo, _pairs(req, runner, [(p.context, p.best_depth, req.default_budget_mib) for p in todo],
                                             grid), strict=True):
        p.gain_at_default_budget, p.default_declines = g, declined


def _budget_for_gain(req: PlanRequest, runner: Runner, out: list[ContextPlan], grid: _Grid | None = None) -> None:
    """Smallest budget (whole MiB) at which some depth keeps >= fraction x the uncapped gain; confirmed by its run."""
    frac = req.budget_for_gain or 1.0
    todo = []
    for p in out:
        p.budget_for_gain = frac
        if p.uncapped_gain <= 0:
            continue
        ok = [d for d, g in p.gain_by_depth.items() if g >= frac * p.uncapped_gain - 1e-12]
        d = min(ok, key=lambda d: (p.ring_mib_by_depth[d], d))
        p.depth_for_gain, p.budget_mib_for_gain = d, float(math.ceil(p.ring_mib_by_depth[d]))
        todo.append(p)
    got = _pairs(req, runner, [(p.context, p.depth_for_gain or 1, p.budget_mib_for_gain or 0.0) for p in todo], grid)
    for p, (g, _) in zip(todo, got, strict=True):
        p.extra["gain_at_budget_for_gain"] = g
