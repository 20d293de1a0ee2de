"""A window's numbers at any size, from one graph of its family: the evaluator's numbers without a graph per window.

Within a *family* (``sim.evaluator.costs``: the same workload at any context, one sequence, one device, the same
machine and slot layout) two windows' graphs have the same splits, inputs and launches; they differ only where a
byte count is the window's rows times a per-row size: each staged split's attention (``ComputeModel.
attention_seconds`` of its K+V window bytes) and the resident layers' inside a split, the KQ mask's small input, a
staged input's blocking copy on the ordered path, and the deliveries' early and late copies (which :class:`costs.
_Block` already scales by the row). A :class:`Template` reads, from the first window of a family built from its
graph, which column is which of these and the per-row bytes, and gives any other window's numbers with the graph
builder's own arithmetic in the builder's order (``sim.graph``: ``len(run) x layer_s``, then the attention, then the
resident layers' sum, then the head), so that the numbers are the graph path's bit for bit.

It is trusted only after it has reproduced its own window exactly and then a second window of the family built from
that window's graph (:func:`costs.point_costs` builds both and compares; a family whose second window differs keeps
the graph path). ``tests/sim/test_window_templates.py`` holds template and graph equal over dense grids of windows.
Outside this shape (several sequences or streams, a tensor or layer split, host attention, ``-ngl`` CPU layers, the
resident arm, a strided or multi-piece window) there is no template and every window is built from its graph.

Units: seconds and bytes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.base import CopyRange, copy_calls
from backends.profile import ComputeModel, LinkCurve
from backends.simpy_copy import calls_seconds
from sim.graph import DecodeGraph
from sim.workload import Workload

#: A GPU split's compute as the graph builder sums it: (column, layers, per-row K+V bytes of its staged window (0:
#: none), per-row K+V bytes of each resident layer's window, whether it carries resident layers, the head).
Compute = tuple[int, int, int, tuple[int, ...], bool, bool]


@dataclass(frozen=True)
class Template:
    """How a family's window numbers depend on its rows (see the module). ``values``: the reference window's vector;
    ``rows0``: its rows; ``computes``, ``masks`` ((seconds column, bytes column, bytes per row) of each KQ-mask-like
    input), ``windows`` (the same for each staged input's blocking copy): the columns that move with the rows."""

    values: np.ndarray
    rows0: int
    compute: ComputeModel
    layer_s: float
    h2d: LinkCurve
    computes: tuple[Compute, ...]
    masks: tuple[tuple[int, int, int], ...]
    windows: tuple[tuple[int, int, int], ...]

    def values_at(self, rows: int) -> np.ndarray:
        """The vector of the window of ``rows`` rows, but its early and late columns (``costs._scaled`` sets those
        for the step's row). Splits alike (the same layers, staged and resident bytes per row) are computed once, in
        the same order of operations. Pure."""
        vals = self.values.copy()
        c = self.compute
        done: dict[tuple[object, ...], float] = {}
        for col, n_layers, staged, resident, has_resident, head in self.computes:
            key = (n_layers, staged, resident, has_resident, head)
            secs = done.get(key)
            if secs is None:
                secs = n_layers * self.layer_s
                if staged:
                    secs += c.attention_seconds(rows * staged)
                if has_resident:
                    secs += sum(c.attention_seconds(rows * b) + c.batch_seconds(1, 0, True) for b in resident) if resident else 0.0
                if head:
                    secs += c.head_s
                done[key] = secs
            vals[col] = secs
        for per_row, s_cols, b_cols in self._moving:  # the copies alike (bytes per row) at once
            n = rows * per_row
            vals[s_cols], vals[b_cols] = one_call_seconds(self.h2d, n), n
        return vals

    @functools.cached_property
    def _moving(self) -> tuple[tuple[int, np.ndarray, np.ndarray], ...]:
        """The masks' and windows' (bytes per row, seconds columns, bytes columns), one entry per bytes per row in order
        of first appearance; one per input, in order, should a column appear twice (the later one wins, as written)."""
        each = (*self.masks, *self.windows)
        if len({c for s_col, b_col, _ in each for c in (s_col, b_col)}) != 2 * len(each):
            return tuple((per_row, np.array([s_col], dtype=np.intp), np.array([b_col], dtype=np.intp)) for s_col, b_col, per_row in each)
        by: dict[int, tuple[list[int], list[int]]] = {}
        for s_col, b_col, per_row in each:
            cols = by.setdefault(per_row, ([], []))
            cols[0].append(s_col)
            cols[1].append(b_col)
        return tuple((per_row, np.array(sc, dtype=np.intp), np.array(bc, dtype=np.intp)) for per_row, (sc, bc) in by.items())


def one_call_seconds(link: LinkCurve, n: int) -> float:
    """Engine seconds of one 1D copy of ``n`` bytes on ``link`` (``copy_calls``' one call, ``calls_seconds``' cost),
    kept by link and bytes in ``ONE_CALL_SECONDS`` (a graph's small inputs and many of its windows' copies are the same
    sizes). Pure."""
    got = ONE_CALL_SECONDS.get((id(link), n))
    if got is None or got[0] is not link:
        if len(ONE_CALL_SECONDS) > 1 << 16:
            ONE_CALL_SECONDS.clear()
        got = ONE_CALL_SECONDS[id(link), n] = (link, float(calls_seconds(link, copy_calls((CopyRange(0, 0, n),)))))
    return got[1]


def engine_seconds(link: LinkCurve, ranges: Any) -> float:
    """Engine seconds of a copy of ``ranges`` on ``link`` (``copy_calls``' shape, ``calls_seconds``' cost, the SimPy
    machine's rule): one 1D range is :func:`one_call_seconds` of its bytes. Pure."""
    if len(ranges) == 1 and ranges[0].rows == 1:
        return one_call_seconds(link, ranges[0].nbytes)
    return float(calls_seconds(link, copy_calls(ranges)))


#: :func:`one_call_seconds`' kept answers: (id of the link, bytes) -> (the link, seconds).
ONE_CALL_SECONDS: dict[tuple[int, int], tuple[LinkCurve, float]] = {}


def template_of(wl: Workload, graph: DecodeGraph, layout: object, values: np.ndarray, compute: ComputeModel,
                h2d: LinkCurve) -> Template | None:
    """The template of ``graph``'s family (``layout``: its ``costs.Layout``, ``values``: its numbers as
    ``costs._build`` made them), or None where the family is outside the template's shape or the template does not
    give ``values`` back exactly. Pure."""
    rows0 = graph.window_rows
    if (wl.n_parallel != 1 or wl.n_streams != 1 or wl.gpu_layer_start or wl.split_mode != "none" or len(graph.positions) != 1
            or rows0 < 1):
        return None
    layer_s = compute.layer_seconds(wl.model.layer_weight_bytes)
    computes: list[Compute] = []
    masks: list[tuple[int, int, int]] = []
    wins: list[tuple[int, int, int]] = []
    last = len(graph.splits) - 1
    for k, (s, cols) in enumerate(zip(graph.splits, layout.splits, strict=True)):  # type: ignore[attr-defined]
        if s.kind != "gpu":
            if s.staged or s.resident or not s.stores_rows:
                return None
            continue
        staged = _per_row(s.staged, rows0)
        resident = _per_row(s.resident, rows0)
        if staged is None or resident is None or len(staged) not in (0, 2) or len(resident) % 2:
            return None
        computes.append((cols.compute, len(s.layers), sum(staged), tuple(a + b for a, b in zip(resident[::2], resident[1::2],
                                                                                                strict=True)),
                         bool(s.resident), k == last))
        for small, (s_col, b_col) in zip(s.ordered, cols.ordered, strict=True):
            if small.name == "kq_mask":
                if small.nbytes % rows0:
                    return None
                masks.append((s_col, b_col, small.nbytes // rows0))
        for per_row, (s_col, b_col) in zip(staged, cols.windows, strict=True):
            wins.append((s_col, b_col, per_row))
    t = Template(values.copy(), rows0, compute, layer_s, h2d, tuple(computes), tuple(masks), tuple(wins))
    return t if np.array_equal(_with_deliveries(t.values_at(rows0), values, layout), values) else None


def _per_row(inputs: tuple[object, ...], rows: int) -> list[int] | None:
    """Each input's bytes per window row (one contiguous piece of whole rows each), or None."""
    out = []
    for inp in inputs:
        pieces = inp.pieces  # type: ignore[attr-defined]
        if len(pieces) != 1 or pieces[0].rows != 1 or inp.nbytes % rows:  # type: ignore[attr-defined]
            return None
        out.append(inp.nbytes // rows)  # type: ignore[attr-defined]
    return out


def _with_deliveries(vals: np.ndarray, ref: np.ndarray, layout: object) -> np.ndarray:
    """``vals`` with ``ref``'s early and late columns (what the template leaves to ``costs._scaled``)."""
    out = vals.copy()
    for c in layout.splits:  # type: ignore[attr-defined]
        for col in (*c.early, *c.late):
            if col >= 0:
                out[col] = ref[col]
    return out
