"""Hold the evaluator's rows to the simulator's: compare two rows, and re-simulate a sample of a sweep.

:func:`row_disagreement` is the one comparison the tests and :func:`check_sample` use: the largest relative
difference over every numeric field (nested dicts and lists included), infinite where a flag, a string or a count
differs. Fields that say which engine made the row or how (``engine``, ``hazards``, ``tokens_simulated``,
``simulated_as``, ``shared_with_n``, wall times) are left out.

:func:`check_sample` re-simulates (exact, every token: ``sim.checks.run_checked``) at least ``n`` of the
evaluator's points, drawn with ``seed``, plus every point where a neighbour along the context axis (the same
model, hardware, cache and budget at the next context asked for) has another best depth or another decline, and
raises :class:`EvaluatorDisagreement` when any row differs by more than ``TOLERANCE``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from sim.simulate import Point, row

TOLERANCE = 1e-9
IGNORED = frozenset({"engine", "hazards", "hazard_examples", "tokens_simulated", "simulated_as", "shared_with_n", "wall_s",
                     "sim_wall_s"})
#: Row fields that name a point's line (everything but context, depth and budget).
LINE_FIELDS = ("model", "hardware", "cache_type", "cache_type_v", "parallel", "unified", "split_mode", "tokens", "arm")


class EvaluatorDisagreement(AssertionError):
    """The evaluator and the simulator disagree on a point by more than the tolerance."""


def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))


def row_disagreement(got: Any, want: Any, ignore: frozenset[str] = IGNORED) -> float:
    """The largest relative difference between two rows (or values in them); ``inf`` where anything but a number
    differs, or a field is missing on one side. Pure."""
    if isinstance(got, dict) and isinstance(want, dict):
        keys = (set(got) | set(want)) - ignore
        return max((row_disagreement(got.get(k), want.get(k), ignore) if k in got and k in want else math.inf
                    for k in keys), default=0.0)
    if isinstance(got, list | tuple) and isinstance(want, list | tuple):
        if len(got) != len(want):
            return math.inf
        return max((row_disagreement(a, b, ignore) for a, b in zip(got, want, strict=True)), default=0.0)
    if isinstance(got, bool) or isinstance(want, bool) or not isinstance(got, int | float) or not isinstance(want, int | float):
        return 0.0 if got == want else math.inf
    return _rel(float(got), float(want))


def boundary_points(rows: Sequence[dict[str, Any]]) -> set[int]:
    """Indices of the rows where the best depth (highest t/s at a budget) or a decline changes from one context to
    the next asked for on the same line (model, hardware, cache, ...; ``LINE_FIELDS``). Pure."""
    lines: dict[Any, dict[int, dict[tuple[int, float], int]]] = {}
    for i, r in enumerate(rows):
        line = tuple(str(r.get(f)) for f in LINE_FIELDS)
        lines.setdefault(line, {}).setdefault(int(r["context"]), {})[(int(r["depth"]), float(r["budget_mib"]))] = i
    out: set[int] = set()
    for by_ctx in lines.values():
        ctxs = sorted(by_ctx)
        for a, b in zip(ctxs, ctxs[1:], strict=False):
            pa, pb = by_ctx[a], by_ctx[b]
            for budget in {bud for _, bud in pa} & {bud for _, bud in pb}:
                best_a, best_b = (_best(rows, pts, budget) for pts in (pa, pb))
                if best_a is not None and best_b is not None and rows[best_a]["depth"] != rows[best_b]["depth"]:
                    out |= {best_a, best_b}
            for key in set(pa) & set(pb):
                if bool(rows[pa[key]]["declined"]) != bool(rows[pb[key]]["declined"]):
                    out |= {pa[key], pb[key]}
    return out


def _simulated(points: list[Point]) -> list[dict[str, Any]]:
    from sim.checks import run_checked

    return [row(run_checked(p, exact=True)) for p in points]


def _best(rows: Sequence[dict[str, Any]], pts: dict[tuple[int, float], int], budget: float) -> int | None:
    here = [i for (_, b), i in sorted(pts.items()) if b == budget]
    return max(here, key=lambda i: rows[i]["tokens_per_s"]) if here else None


def check_sample(points: Sequence[Point], rows: Sequence[dict[str, Any]], n: int = 32, seed: int = 0,
                 tolerance: float = TOLERANCE, resimulate: Callable[[list[Point]], list[dict[str, Any]]] | None = None) -> float:
    """Re-simulate (exact) ``n`` of the evaluator's rows drawn with ``seed`` (all if fewer) and every row at a change
    of best depth or decline between neighbouring contexts (:func:`boundary_points`); return the largest relative
    disagreement (0.0 with nothing to check). Rows not made by the evaluator (``engine`` other than ``evaluator``)
    are not drawn. Raises EvaluatorDisagreement above ``tolerance``. ``resimulate``: the simulator's rows of a list
    of points (default: one after another here; ``kvpipe sweep`` maps them over its workers). Blocks for the
    simulations (tens of ms each)."""
    mine = [i for i, r in enumerate(rows) if r.get("engine", "evaluator") == "evaluator"]
    if not mine:
        return 0.0
    chosen = set(random.Random(seed).sample(mine, min(n, len(mine))))
    chosen |= {mine[j] for j in boundary_points([rows[i] for i in mine])}
    order = sorted(chosen)
    wanted = (resimulate or _simulated)([points[i] for i in order])
    worst = 0.0
    for i, want in zip(order, wanted, strict=True):
        d = row_disagreement(rows[i], want)
        if d > tolerance:
            raise EvaluatorDisagreement(f"point {i} (context {points[i].context}, depth {points[i].transport.depth}, budget "
                                        f"{points[i].transport.budget_mib:g} MiB): the evaluator's row differs from the "
                                        f"simulator's by {d:.3g} relative (tolerance {tolerance:g})")
        worst = max(worst, d)
    return worst
