"""What one token's program costs, as numbers: the compiled evaluator's input, read off the real decode graph.

A token's host program (``sim.transport.scheduler``) is a fixed sequence of operations once the graph and the ring
decision are known; its timing depends on the graph only through a few numbers per split: a kernel's seconds and
launches, the engine seconds and bytes of each blocking copy (small inputs H2D, new rows D2H, an ordered window),
and a delivery's early and late copies. :func:`token_costs` reads them from the graph the simulator runs
(``sim.simulate.graph_at``), shaping every copy by the machines' own rule (``backends.base.copy_calls``) and
costing it by the SimPy machine's (``backends.simpy_copy.calls_seconds``), so nothing about a copy is derived twice.

The numbers of one token are one float vector (:class:`TokenCosts`); its :class:`Layout` says which column is what
and is shared by every token whose graph has the same shape (the same splits, inputs and launches), so the
evaluator stacks the vectors of many points and tokens into one matrix and runs the shape's program once over it.

Units: seconds and bytes.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.base import CopyRange, copy_calls
from backends.profile import LinkCurve
from backends.simpy_copy import calls_seconds
from sim.graph import DecodeGraph
from sim.simulate import Point, graph_at
from sim.transport.deliveries import ordered_copy, plan_deliveries, slot_entries, span_fn

#: A split's shape: (kind, ordered inputs, staged inputs, kernel launches).
SplitShape = tuple[str, int, int, int]


@dataclass(frozen=True)
class SplitCols:
    """Where one split's numbers sit in a token's vector (column indices; -1: none)."""

    kind: str
    compute: int
    ordered: tuple[tuple[int, int], ...]  # (seconds, bytes) of each blocking copy of its ordered inputs
    early: tuple[int, int] = (-1, -1)  # (seconds, bytes) of its delivery's early copy
    late: tuple[int, int] = (-1, -1)  # (seconds, bytes) of its delivery's late copy
    windows: tuple[tuple[int, int], ...] = ()  # (seconds, bytes) of each staged input's blocking copy (ordered path)
    launches: int = 0


class Layout:
    """The columns of a token vector for one graph shape (one per shape, shared: compare with ``is``)."""

    def __init__(self, shape: tuple[SplitShape, ...]) -> None:
        self.shape = shape
        cols: list[SplitCols] = []
        n = 0

        def take(k: int) -> tuple[int, ...]:
            nonlocal n
            n += k
            return tuple(range(n - k, n))

        for kind, n_ordered, n_staged, launches in shape:
            compute = take(1)[0]
            ordered = tuple(take(2) for _ in range(n_ordered))
            if n_staged:
                early, late = take(2), take(2)
                windows = tuple(take(2) for _ in range(n_staged))
                cols.append(SplitCols(kind, compute, ordered, early, late, windows, launches))  # type: ignore[arg-type]
            else:
                cols.append(SplitCols(kind, compute, ordered, launches=launches))  # type: ignore[arg-type]
        self.splits = tuple(cols)
        self.width = n
        self.staged = sum(1 for c in cols if c.windows)


@functools.cache
def layout_of(shape: tuple[SplitShape, ...]) -> Layout:
    """The one Layout of ``shape``."""
    return Layout(shape)


@dataclass(frozen=True)
class TokenCosts:
    """One token's numbers (``values``, laid out by ``layout``) and its window rows."""

    layout: Layout
    values: np.ndarray
    window_rows: int


def _seconds(link: LinkCurve, ranges: Any) -> float:
    return float(calls_seconds(link, copy_calls(ranges)))


def _nbytes(ranges: Any) -> int:
    return sum(r.nbytes for r in ranges)


def build(point: Point, graph: DecodeGraph) -> TokenCosts:
    """The numbers of ``graph`` run by ``point``'s scheduler on its (single) device. Pure."""
    dev = point.hardware.devices[0]
    h2d, d2h = dev.link(True, True), dev.link(False, True)  # the io buffers are pinned; the envelope's host cache too
    cfg = point.transport
    span = span_fn(cfg.pack_streams, max(dev.alignment_bytes, cfg.min_alignment_bytes))
    staged = list(graph.staged_splits)
    _, entries = slot_entries(staged, span)
    deliveries = {d.split: d for d in plan_deliveries(staged, entries, 1, lambda slot: 0, span)}
    shape: list[SplitShape] = []
    vals: list[float] = []
    for s in graph.splits:
        shape.append((s.kind, len(s.ordered), len(s.staged), s.n_launches))
        vals.append(s.compute_s)
        link = h2d if s.kind == "gpu" else d2h
        for small in s.ordered:
            vals += [_seconds(link, (CopyRange(0, 0, small.nbytes),)), small.nbytes]
        if s.staged:
            d = deliveries[s.index]
            vals += [_seconds(h2d, d.early), d.early_bytes, _seconds(h2d, d.late), d.late_bytes]
            off = 0
            for inp in s.staged:
                ranges, spanned = ordered_copy(inp, off, span)
                off += spanned
                vals += [_seconds(h2d, ranges), _nbytes(ranges)]
    return TokenCosts(layout_of(tuple(shape)), np.array(vals, dtype=np.float64), graph.window_rows)


_KEPT: OrderedDict[Any, TokenCosts] = OrderedDict()
KEPT_TOKENS = 1 << 14


def token_costs(point: Point, step: int) -> TokenCosts:
    """The numbers of ``point``'s decode step ``step`` (kept for the points that differ only in depth and budget)."""
    cfg, hw = point.transport, point.hardware
    key = (point.workload, hw.devices[0], cfg.pack_streams, cfg.min_alignment_bytes, step)
    got = _KEPT.get(key)
    if got is None:
        got = _KEPT[key] = build(point, graph_at(point, step))
        while len(_KEPT) > KEPT_TOKENS:
            _KEPT.popitem(last=False)
    return got
