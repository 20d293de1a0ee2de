"""What a plan reads of its points as arrays, and where along a grid's contexts its answer changes.

:class:`Figures` holds, per point asked, the figures a plan reads (``kvpipe.plan_run.Runner`` makes them);
:func:`boundaries` finds the points where the answer changes along the contexts (the sample check re-simulates them
whatever it draws); :func:`same_as_rows` holds the figures to the rows the check compares.

Units: the figures' own (t/s, MiB, ms, rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from sim.run.point import Point


@dataclass(frozen=True)
class Figures:
    """What a plan reads of each point asked, as arrays (one element per point): t/s, declined, the ring it needs and
    the ring it holds (MiB), the first token's window rows, the late bytes (MiB) and blocking copies (ms) per token,
    whether it fits, whether the evaluator answered it."""

    tokens_per_s: np.ndarray
    declined: np.ndarray
    ring_mib: np.ndarray
    ring_alloc_mib: np.ndarray
    window_rows: np.ndarray
    late_mib: np.ndarray
    blocked_ms: np.ndarray
    fits: np.ndarray
    evaluated: np.ndarray

    @staticmethod
    def of_rows(rows: Sequence[dict[str, Any] | None]) -> Figures:
        """The figures of simulated rows (None: the point does not fit, or failed)."""
        def col(get: Any, dtype: Any = float) -> np.ndarray:
            return np.array([get(r) if r is not None else 0 for r in rows], dtype=dtype)

        return Figures(col(lambda r: r["tokens_per_s"]), col(lambda r: r["declined"], bool), col(lambda r: r["ring_mib"]),
                       col(lambda r: r["ring_alloc_mib"]), col(lambda r: r["window_rows"], np.int64),
                       col(lambda r: r["late_mib"]), col(lambda r: r["breakdown_ms"]["blocked_in_ordered_copies"]),
                       col(lambda r: r.get("fits", True) and r["tokens_per_s"] > 0, bool), np.zeros(len(rows), dtype=bool))

    @staticmethod
    def merge(n: int, parts: Sequence[tuple[np.ndarray, Figures]]) -> Figures:
        """Figures of ``n`` points from parts that each answered the points at its indices."""
        out = {f.name: np.zeros(n, dtype=getattr(parts[0][1], f.name).dtype if parts else float) for f in fields(Figures)}
        for idx, part in parts:
            for name, arr in out.items():
                arr[idx] = getattr(part, name)
        return Figures(**out)

    def take(self, idx: np.ndarray | Sequence[int]) -> Figures:
        return Figures(**{f.name: getattr(self, f.name)[np.asarray(idx, dtype=np.intp)] for f in fields(Figures)})


def same_as_rows(figs: Figures, rows: Sequence[dict[str, Any] | None]) -> None:
    """The figures the plan read are its rows' (the same lanes, summed as ``sim.rows.row`` sums them): raises
    EvaluatorDisagreement where one differs, so that holding the rows to the simulator holds the figures too."""
    from sim.evaluator import EvaluatorDisagreement

    for i, r in enumerate(rows):
        if r is None:
            continue
        got = (float(figs.tokens_per_s[i]), bool(figs.declined[i]), float(figs.ring_mib[i]), float(figs.ring_alloc_mib[i]),
               int(figs.window_rows[i]), float(figs.late_mib[i]), float(figs.blocked_ms[i]))
        want = (r["tokens_per_s"], r["declined"], r["ring_mib"], r["ring_alloc_mib"], r["window_rows"], r["late_mib"],
                r["breakdown_ms"]["blocked_in_ordered_copies"])
        if got != want:
            raise EvaluatorDisagreement(f"the plan's figures of a point differ from its row: {got} != {want}")


def boundaries(pts: Sequence[Point], figs: Figures, parts: Any = None) -> set[int]:
    """Indices of the points where, along the contexts asked of one line (the same model, machine, cache, sequences,
    tokens, arm and placement: ``sim.points.line_arrays``, given ``parts`` if known), the best depth at a budget or a
    point's decline changes from one context to the next (``sim.evaluator.check.boundaries``, the sweep's rule). Pure."""
    from sim.evaluator.check import boundaries as changes
    from sim.points import line_arrays

    if not len(pts):
        return set()
    line, context, depth, budget = line_arrays(pts, parts)
    return changes(line, context, depth, budget, figs.tokens_per_s, figs.declined)
