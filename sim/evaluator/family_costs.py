"""A family's token numbers at once: every step of every line of one family from its window template, as arrays.

``sim.evaluator.costs.point_costs`` gives a line's steps one at a time: per step a template's vector at the window's
rows (``window_costs.Template.values_at``), then the deliveries' early and late copies scaled to the step's row
(``costs._scaled``) -- a few small NumPy calls and a dozen Python ones, ~50 us a step. The lines of one family
(``sim.replay_family``: the same workload but its context, one sequence on one device, one machine and config but
depth and budget) share the template, so :func:`family_costs` computes all their steps as one matrix: the same
operations in the same order, over a column per step instead of a number -- IEEE additions, products and quotients,
``max``, and the link curve's seconds (its one transcendental, the log of an interpolated size, left to
``LinkCurve.bandwidth`` itself per element; a small copy's seconds, ``one_call_seconds``, as one call's, once per
distinct size).
A step's numbers are then the matrix's row, bit for bit those of ``point_costs`` (``tests/sim/test_replay_family.py``).
Lines read before the family's template is trusted, the resident arm's, and lines with a step that leaves no early or
no late rows are given by ``point_costs`` itself.

Units: seconds and bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from backends.profile import LinkCurve
from sim.evaluator import costs as _costs
from sim.evaluator.costs import Layout, TokenCosts, cost_family, point_costs
from sim.evaluator.window_costs import Template
from sim.graph_parts import _filler
from sim.replay_family import family_rows
from sim.run.point import Point


class FamilyRows:
    """One line's steps as rows of its family's matrix (what :func:`family_steps` gives a line the template answers):
    step ``k``'s numbers are ``values[first + k]``, laid out by ``layout``, its window ``window_rows[k]`` rows. Indexing
    gives the step's :class:`TokenCosts` (``values`` a view of the row), as :func:`family_costs` lists them."""

    __slots__ = ("layout", "values", "first", "window_rows")

    def __init__(self, layout: Layout, values: np.ndarray, first: int, window_rows: list[int]) -> None:
        self.layout, self.values, self.first, self.window_rows = layout, values, first, window_rows

    def __len__(self) -> int:
        return len(self.window_rows)

    def __getitem__(self, k: int) -> TokenCosts:
        return _new_costs(layout=self.layout, values=self.values[self.first + k], window_rows=self.window_rows[k])


def family_costs(lines: Sequence[Point]) -> list[list[TokenCosts]]:
    """The numbers of every decode step of each line of one family (``lines``: each line's first point, in order; see
    ``sim.replay_family.family_key``), as :func:`costs.point_costs` gives them. Pure but for ``point_costs``' caches."""
    return [[c[k] for k in range(len(c))] if isinstance(c, FamilyRows) else c for c in family_steps(lines)]


def family_steps(lines: Sequence[Point]) -> list[list[TokenCosts] | FamilyRows]:
    """:func:`family_costs`, each line the template answers as :class:`FamilyRows` (no TokenCosts made): the same
    numbers. Pure but for ``point_costs``' caches."""
    out: list[list[TokenCosts] | FamilyRows | None] = [None] * len(lines)
    fam = cost_family(lines[0]) if lines else 0
    resident = bool(lines) and lines[0].transport.arm == "resident"
    i = 0
    while i < len(lines) and (resident or not _trusted(fam)):
        out[i] = point_costs(lines[i])
        i += 1
    if i < len(lines):
        t, ref = _costs._TEMPLATES[fam][:2]  # type: ignore[index]
        rest = list(range(i, len(lines)))
        wls = [lines[j].workload for j in rest]
        _, row, rows = family_rows(wls)  # the row step k writes, its window rows
        ok = ((row > 0) & (rows - row > 0)).all(axis=1)  # else ``_from_template`` declines a step: the graph path
        for w in np.unique(rows).tolist():
            block = _costs._BLOCKS.get((fam, w))
            if block is not None and block.scaled is None:  # a window kept on the graph path
                ok &= ~(rows == w).any(axis=1)
        at = np.flatnonzero(ok)
        if at.size:
            vals = _values(t, ref, rows[at].reshape(-1), row[at].reshape(-1))
            n_tok = rows.shape[1]
            flat = rows[at].reshape(-1).tolist()
            layout = ref.costs.layout
            for a, j in enumerate(at.tolist()):
                out[rest[j]] = FamilyRows(layout, vals, a * n_tok, flat[a * n_tok : (a + 1) * n_tok])
        for j in np.flatnonzero(~ok).tolist():
            out[rest[j]] = point_costs(lines[rest[j]])
    return out  # type: ignore[return-value]


_new_costs = _filler(TokenCosts)  # a TokenCosts equal to the constructor's, at a fraction of its cost


def _trusted(fam: int) -> bool:
    kept = _costs._TEMPLATES.get(fam)
    return kept is not None and kept[2]


def _values(t: Template, ref: _costs._Block, rows: np.ndarray, row: np.ndarray) -> np.ndarray:
    """``costs._scaled(costs._template_block(t, ref, rows[m]), row[m]).values`` for every m, as rows of one matrix."""
    m = len(rows)
    vals = np.tile(t.values, (m, 1))
    for col, secs in _computes(t, rows):
        vals[:, col] = secs
    for per_row, s_cols, b_cols in t._moving:
        n = rows * per_row
        u, inv = np.unique(n, return_inverse=True)
        vals[:, s_cols] = _seconds(t.h2d, u)[inv.reshape(-1)][:, None]  # ``one_call_seconds`` of each: one call's
        vals[:, b_cols] = n[:, None]
    for groups, r in ((ref.early, row), (ref.late, rows - row)):  # costs._scaled's order
        for calls, s_cols, b_cols in groups:
            acc: float | np.ndarray = 0
            for n_call in calls:
                acc = acc + _seconds(ref.link, n_call * r)
            vals[:, s_cols] = np.broadcast_to(acc, (m,))[:, None]
            vals[:, b_cols] = (sum(calls) * r)[:, None]
    return vals


def _computes(t: Template, rows: np.ndarray) -> list[tuple[int, float | np.ndarray]]:
    """(column, seconds) of each GPU split's compute of the windows of ``rows`` rows, as ``Template.values_at`` sums it
    (its order of operations; a later entry for a column wins, as written there). Pure."""
    c = t.compute
    out: list[tuple[int, float | np.ndarray]] = []
    for col, n_layers, staged, resident, has_resident, head in t.computes:  # Template.values_at's order
        secs: float | np.ndarray = n_layers * t.layer_s
        if staged:
            secs = secs + _attention(c, rows * staged)
        if has_resident:
            if resident:
                acc: float | np.ndarray = 0
                for b in resident:
                    acc = acc + (_attention(c, rows * b) + c.batch_seconds(1, 0, True))
                secs = secs + acc
            else:
                secs = secs + 0.0
        if head:
            secs = secs + c.head_s
        out.append((col, secs))
    return out


def first_step_gpu_compute_s(points: Sequence[Point]) -> list[float]:
    """The GPU splits' compute (seconds, summed in split order) of the first decode step of each of ``points`` -- one
    family's one-token lines (``cost_family`` equal, one sequence) -- as ``sum`` over ``point_costs(p)[0]``'s GPU
    splits gives it. Where ``point_costs`` would answer a window from the family's confirmed template (no block of
    that window kept, the step's row leaving early and late rows), the compute columns of every such window are
    computed at once (:func:`_computes`, the template's arithmetic over arrays) and nothing is kept; every other point
    (the family's template not yet trusted, a window kept, a step outside the template) goes through ``point_costs``
    itself, in order, as it would one at a time. Pure but for ``point_costs``' caches."""
    out: list[float] = [0.0] * len(points)
    if not points:
        return out
    fam = cost_family(points[0])
    resident = points[0].transport.arm == "resident"
    _, row, rows = family_rows([p.workload for p in points])
    row, rows = row[:, 0], rows[:, 0]
    fits = ((row > 0) & (rows - row > 0)).tolist()
    ws = rows.tolist()
    j = 0
    while j < len(points):
        k = j
        if not resident and _trusted(fam):
            while k < len(points) and fits[k] and (fam, ws[k]) not in _costs._BLOCKS:
                k += 1
        if k == j:  # the one-at-a-time path
            costs = point_costs(points[j])[0]
            out[j] = sum(float(costs.values[c.compute]) for c in costs.layout.splits if c.kind == "gpu")
            j += 1
            continue
        t, ref = _costs._TEMPLATES[fam][:2]  # type: ignore[index]
        cols = dict(_computes(t, rows[j:k]))
        acc: float | np.ndarray = 0
        for c in ref.costs.layout.splits:
            if c.kind == "gpu":
                acc = acc + (cols[c.compute] if c.compute in cols else float(t.values[c.compute]))
        out[j:k] = np.broadcast_to(np.asarray(acc, dtype=np.float64), (k - j,)).tolist()
        j = k
    return out


def _attention(c: object, window_bytes: np.ndarray) -> np.ndarray:
    """``ComputeModel.attention_seconds`` over an array of window bytes."""
    bps = c.attn_bytes_per_s  # type: ignore[attr-defined]
    a = window_bytes / bps if bps > 0 else 0.0
    return np.maximum(c.attn_floor_s, c.attn_s + a)  # type: ignore[attr-defined]


def _seconds(link: LinkCurve, nbytes: np.ndarray) -> np.ndarray:
    """``link.seconds(n)`` of each of ``nbytes`` (int64): the flat ends as arrays, an interpolated size as
    ``LinkCurve.bandwidth`` gives it (per element)."""
    if type(link) is not LinkCurve:
        return np.array([link.seconds(x) for x in nbytes.tolist()], dtype=np.float64)
    xs, ys = link.sizes_bytes, link.bytes_per_s
    x = nbytes.astype(np.float64)
    bw = np.where(x <= xs[0], ys[0], ys[-1])
    mid = (x > xs[0]) & (x < xs[-1])
    if mid.any():
        idx = np.flatnonzero(mid)
        bw[idx] = [link.bandwidth(v) for v in nbytes[idx].tolist()]
    return np.where(nbytes <= 0, 0.0, link.latency_s + x / bw)
