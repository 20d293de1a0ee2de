"""Hold the evaluator's rows to the simulator's: compare two rows, and re-simulate a sample of a sweep.

:func:`row_disagreement` is the one comparison the tests and :func:`check_sample` use: the largest relative
difference over every numeric field (nested dicts and lists included), infinite where a flag, a string or a count
differs. Fields that say which engine made the row or how (``engine``, ``hazards``, ``tokens_simulated``,
``simulated_as``, ``shared_with_n``, wall times) are left out.

**Differences of clock readings.** A row's time fields (``CLOCK_FIELDS``: ``ms_per_token`` and every figure of
``breakdown_ms``, the means of ``GraphStats``' ``*_s`` fields) are differences of two readings of the simulator's
clock (``now_s() - t`` in ``sim.transport``), and the clock stands at the run's time so far: each reading is rounded
to a few 1e-16 of it, not of the difference. A 2.6 us boundary wait read at 53 s of a run carries ~7e-15 s of
rounding, 3e-9 of itself. So a field of ``CLOCK_FIELDS`` is compared on the scale of the token's time: ``|a - b| /
max(|a|, |b|, ms_per_token)`` (the larger ``ms_per_token`` of the two rows). The rounding is at most a few 1e-16 of
the run's time, i.e. of (tokens + the resident arm's warm-up) token times, so ``TOLERANCE`` of the token's time stays
a strict bound, and tighter than 1e-9 of the run's time; the row's other fields (bytes, counts, ``tokens_per_s``,
``batch_ms``: the compute model's terms, not clock readings) are compared on their own magnitude.

:func:`check_sample` re-simulates (``sim.run.run.run_point`` on the simulator's default path, as ``kvpipe simulate``
runs a point: the steady tokens extrapolated, no race checker) at least ``n`` of the evaluator's points, drawn with
``seed``, plus every point where a neighbour along the context axis (the same model, hardware, cache and budget at
the next context asked for) has another best depth or another decline; a row that differs by more than
``TOLERANCE`` is simulated again exact (every token), and :class:`EvaluatorDisagreement` is raised when the exact row
differs too. The exact path stays the ground truth: ``tests/sim/test_fast_path.py`` holds the evaluator to it over
the whole 1,020-point grid, and the default path to it. The changes are found over arrays
(:func:`boundaries`), which a plan of half a million points calls without making rows.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sim.rows import row
from sim.run.point import Point

TOLERANCE = 1e-9
ARM_N = 8  # of each arm the evaluator answered, the check draws at least this many (all if fewer)
TIE_TPS = 1e-9  # t/s within this fraction of the best are a tie (the plan's TIE_GAIN, relative to the best)
IGNORED = frozenset({"engine", "hazards", "hazard_examples", "tokens_simulated", "simulated_as", "shared_with_n", "wall_s",
                     "sim_wall_s"})
#: Row fields that are differences of the simulator's clock readings (per token, in ms): held on the token's time.
CLOCK_FIELDS = frozenset({"ms_per_token", "breakdown_ms"})
#: Row fields that name a point's line (everything but context, depth and budget).
LINE_FIELDS = ("model", "hardware", "cache_type", "cache_type_v", "parallel", "unified", "split_mode", "tokens", "arm")


class EvaluatorDisagreement(AssertionError):
    """The evaluator and the simulator disagree on a point by more than the tolerance."""


def _rel(a: float, b: float, scale: float = 0.0) -> float:
    """``|a - b|`` relative to the larger of ``|a|``, ``|b|`` and ``scale`` (0 where equal). Pure."""
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), scale)


def _token_scale(got: dict[str, Any], want: dict[str, Any]) -> float:
    """The larger ``ms_per_token`` of two rows (0.0 where either is not a row with one). Pure."""
    a, b = got.get("ms_per_token"), want.get("ms_per_token")
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return 0.0
    return max(abs(float(a)), abs(float(b)))


def row_disagreement(got: Any, want: Any, ignore: frozenset[str] = IGNORED) -> float:
    """The largest relative difference between two rows (or values in them); ``inf`` where anything but a number
    differs, or a field is missing on one side. Relative to the larger of the two values, except the fields of
    ``CLOCK_FIELDS`` of a row (differences of clock readings): relative to the larger of them and the token's time
    (the larger ``ms_per_token``). Pure."""
    return _disagreement(got, want, ignore, 0.0)


def _disagreement(got: Any, want: Any, ignore: frozenset[str], scale: float) -> float:
    if isinstance(got, dict) and isinstance(want, dict):
        keys = (set(got) | set(want)) - ignore
        token = _token_scale(got, want)
        return max((_disagreement(got[k], want[k], ignore, token if k in CLOCK_FIELDS else scale)
                    if k in got and k in want else math.inf for k in keys), default=0.0)
    if isinstance(got, list | tuple) and isinstance(want, list | tuple):
        if len(got) != len(want):
            return math.inf
        return max((_disagreement(a, b, ignore, scale) for a, b in zip(got, want, strict=True)), default=0.0)
    if isinstance(got, bool) or isinstance(want, bool) or not isinstance(got, int | float) or not isinstance(want, int | float):
        return 0.0 if got == want else math.inf
    return _rel(float(got), float(want), scale)


def boundary_points(rows: Sequence[dict[str, Any]]) -> set[int]:
    """Indices of the rows where the best depth (highest t/s at a budget) or a decline changes from one context to the
    next asked for on the same line (model, hardware, cache, ...; ``LINE_FIELDS``): :func:`boundaries` of the rows'
    figures. Pure."""
    lines: dict[Any, int] = {}
    line = [lines.setdefault(tuple(str(r.get(f)) for f in LINE_FIELDS), len(lines)) for r in rows]
    return boundaries(np.array(line, dtype=np.int64), np.array([int(r["context"]) for r in rows], dtype=np.int64),
                      np.array([int(r["depth"]) for r in rows], dtype=np.int64),
                      np.array([float(r["budget_mib"]) for r in rows]), np.array([float(r["tokens_per_s"]) for r in rows]),
                      np.array([bool(r["declined"]) for r in rows], dtype=bool))


def boundaries(line: np.ndarray, context: np.ndarray, depth: np.ndarray, budget: np.ndarray, tokens_per_s: np.ndarray,
               declined: np.ndarray) -> set[int]:
    """Indices of the points (one array element each) where, along the contexts of one ``line``, a point's decline
    changes at a (depth, budget), or the best depth at a budget changes: the best as a plan picks it, the shallowest
    within ``TIE_TPS`` of the highest t/s (depths that run the same schedule differ by float noise, which must not
    count as a change). Both points of each change. Pure."""
    n = len(line)
    out: set[int] = set()
    if not n:
        return out
    order = np.lexsort((context, budget, depth, line))
    same = (line[order][1:] == line[order][:-1]) & (depth[order][1:] == depth[order][:-1]) & (budget[order][1:] == budget[order][:-1])
    flip = same & (declined[order][1:] != declined[order][:-1])
    out |= set(order[1:][flip].tolist()) | set(order[:-1][flip].tolist())
    order = np.lexsort((depth, context, budget, line))
    group = np.r_[True, (line[order][1:] != line[order][:-1]) | (budget[order][1:] != budget[order][:-1]) |
                  (context[order][1:] != context[order][:-1])]
    starts = np.flatnonzero(group)
    tps = tokens_per_s[order]
    top = np.maximum.reduceat(tps, starts) * (1 - TIE_TPS)  # each group's highest t/s, less the tie
    at = np.arange(n)
    first = np.minimum.reduceat(np.where(tps >= np.repeat(top, np.diff(np.r_[starts, n])), at, n), starts)  # its shallowest
    best = order[np.where(first < n, first, starts)]  # (none: a NaN; the group's first, as argmax of all-False gives)
    a, b = best[:-1], best[1:]
    change = (line[a] == line[b]) & (budget[a] == budget[b]) & (depth[a] != depth[b])
    out |= set(a[change].tolist()) | set(b[change].tolist())
    return out


def draw(arms: Sequence[str], n: int, seed: int = 0) -> set[int]:
    """Indices to re-simulate of points whose arms are ``arms``: ``n`` drawn with ``seed`` (all if fewer), then, for
    each arm of which fewer than ``min(ARM_N, n)`` were drawn, more of its points drawn with ``seed`` up to that (all if
    fewer): a plan's few resident points are held as surely as its many transport ones. Pure."""
    rng = random.Random(seed)
    chosen = set(rng.sample(range(len(arms)), min(n, len(arms))))
    drawn = Counter(arms[i] for i in chosen)  # each arm's points drawn (what is drawn below is of other arms)
    for arm in sorted(set(arms)):
        short = min(ARM_N, n) - drawn[arm]
        if short <= 0:
            continue
        mine = [i for i in np.flatnonzero(np.asarray(arms, dtype=object) == arm).tolist() if i not in chosen]
        if mine:
            chosen |= set(rng.sample(mine, min(short, len(mine))))
    return chosen


def _simulated(points: list[Point]) -> list[dict[str, Any]]:
    from sim.run.run import run_point

    return [row(run_point(p, exact=False, checked=False)) for p in points]


def _exact(points: list[Point]) -> list[dict[str, Any]]:
    from sim.run.run import run_point

    return [row(run_point(p, exact=True, checked=False)) for p in points]


def sample_indices(rows: Sequence[dict[str, Any]], n: int, seed: int = 0) -> list[int]:
    """The rows :func:`check_sample` re-simulates, in order: ``n`` of the evaluator's rows (``engine`` evaluator, or
    none) drawn with ``seed`` (:func:`draw`) and every one at a change of best depth or decline
    (:func:`boundary_points`). Pure."""
    mine = [i for i, r in enumerate(rows) if r.get("engine", "evaluator") == "evaluator"]
    chosen = {mine[j] for j in draw([str(rows[i].get("arm", "transport")) for i in mine], n, seed)}
    chosen |= {mine[j] for j in boundary_points([rows[i] for i in mine])}
    return sorted(chosen)


Resimulate = Callable[[list[Point]], list[dict[str, Any]]]


def check_sample(points: Sequence[Point], rows: Sequence[dict[str, Any]], n: int = 32, seed: int = 0,
                 tolerance: float = TOLERANCE, resimulate: Resimulate | None = None, exact: Resimulate | None = None) -> float:
    """Re-simulate ``n`` of the evaluator's rows drawn with ``seed`` (all if fewer; at least ``ARM_N`` of each arm,
    :func:`draw`) and every row at a change of best depth or decline between neighbouring contexts
    (:func:`boundary_points`); return the largest relative disagreement (0.0 with nothing to check). Rows not made by
    the evaluator (``engine`` other than ``evaluator``) are not drawn.

    ``resimulate``: the simulator's rows of a list of points on its default path (``kvpipe simulate``'s: the steady
    tokens extrapolated, no race checker; default: one after another here; ``kvpipe sweep`` maps them over its
    workers). A row that differs from the evaluator's by more than ``tolerance`` is simulated again on the exact path
    (``exact``: every token; the same default), the ground truth, and that row decides: raises EvaluatorDisagreement
    where it too differs by more than ``tolerance``. Blocks for the simulations (a few ms to tens of ms each)."""
    order = sample_indices(rows, n, seed)
    if not order:
        return 0.0
    wanted = (resimulate or _simulated)([points[i] for i in order])
    gaps = [row_disagreement(rows[i], want) for i, want in zip(order, wanted, strict=True)]
    again = [j for j, d in enumerate(gaps) if d > tolerance]
    if again:  # the default path's extrapolation is held to exact, not to 1e-9: the exact path decides
        for j, want in zip(again, (exact or _exact)([points[order[j]] for j in again]), strict=True):
            gaps[j] = row_disagreement(rows[order[j]], want)
    for i, d in zip(order, gaps, strict=True):
        if d > tolerance:
            raise EvaluatorDisagreement(f"point {i} (context {points[i].context}, depth {points[i].transport.depth}, budget "
                                        f"{points[i].transport.budget_mib:g} MiB): the evaluator's row differs from the "
                                        f"simulator's (exact) by {d:.3g} relative (tolerance {tolerance:g})")
    return max(gaps, default=0.0)
