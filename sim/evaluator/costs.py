"""What one token's program costs, as numbers: the compiled evaluator's input, read off the real decode graph.

A token's host program (``sim.transport.scheduler``) is a fixed sequence of operations once the graph and the ring
decision are known; its timing depends on the graph only through a few numbers per split: a kernel's seconds and
launches, the engine seconds and bytes of each blocking copy (small inputs H2D, new rows D2H, an ordered window),
and a delivery's early and late copies. :func:`token_costs` reads them from the graph the simulator runs
(``sim.run.point.graph_at``), shaping every copy by the machines' own rule (``backends.base.copy_calls``) and
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

from backends.base import copy_calls
from backends.profile import LinkCurve
from sim.evaluator.window_costs import ONE_CALL_SECONDS, Template, engine_seconds, one_call_seconds, template_of
from sim.graph import DecodeGraph
from sim.replay_keys import free_number, interned, number
from sim.replay_shapes import steps_of
from sim.run.point import Point, graph_at
from sim.transport import planning
from sim.transport.deliveries import Delivery, SpanFn, ordered_copy, plan_deliveries, slot_entries, span_fn

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


def _nbytes(ranges: Any) -> int:
    return sum(r.nbytes for r in ranges)


def build(point: Point, graph: DecodeGraph) -> TokenCosts:
    """The numbers of ``graph`` run by ``point``'s scheduler on its (single) device. Pure."""
    h2d, d2h, span = _links(point)
    if point.transport.arm == "resident":
        return _build(graph, h2d, d2h, span, {}, resident=True)
    deliveries = _deliveries(graph, span)
    return _build(graph, h2d, d2h, span, deliveries)


def _build(graph: DecodeGraph, h2d: LinkCurve, d2h: LinkCurve, span: SpanFn, deliveries: dict[int, Delivery],
           resident: bool = False) -> TokenCosts:
    """The numbers of ``graph``; ``resident``: as the resident arm runs it -- the windows already on the device (no
    delivery, no window copy) and no CPU split that stores rows (the kernels store them), the -ngl CPU layers kept."""
    shape: list[SplitShape] = []
    vals: list[float] = []
    for s in graph.splits:
        if resident and s.kind == "cpu" and s.stores_rows:
            continue
        staged = () if resident else s.staged
        shape.append((s.kind, len(s.ordered), len(staged), s.n_launches))
        vals.append(s.compute_s)
        link = h2d if s.kind == "gpu" else d2h
        for small in s.ordered:
            vals += [one_call_seconds(link, small.nbytes), small.nbytes]
        if staged:
            d = deliveries[s.index]
            vals += [engine_seconds(h2d, d.early), d.early_bytes, engine_seconds(h2d, d.late), d.late_bytes]
            off = 0
            for inp in s.staged:
                ranges, spanned = ordered_copy(inp, off, span)
                off += spanned
                vals += [engine_seconds(h2d, ranges), _nbytes(ranges)]
    return TokenCosts(layout_of(tuple(shape)), np.array(vals, dtype=np.float64), graph.window_rows)


def _links(point: Point) -> tuple[LinkCurve, LinkCurve, SpanFn]:
    dev = point.hardware.devices[0]
    cfg = point.transport
    # the io buffers are pinned, and so is the envelope's host cache
    return dev.link(True, True), dev.link(False, True), span_fn(cfg.pack_streams, max(dev.alignment_bytes, cfg.min_alignment_bytes))


def _deliveries(graph: DecodeGraph, span: SpanFn, slot_key: Any = None) -> dict[int, Delivery]:
    """The graph's deliveries by split (one slot at 0: a slot's place moves no copy's shape). Pure. ``slot_key``: the
    point planner's name of ``span`` on device 0 (``sim.replay``'s ``(pack_streams, (alignment,))``); given, and every
    staged split on device 0 (the envelope's one device), the slot's entries are the planner's, kept with the graph
    (``planning.slot_needs``: the point planner asked them of the same graph)."""
    staged = list(graph.staged_splits)
    if slot_key is not None and staged and all(s.device == 0 for s in staged):
        entries = planning.slot_needs(graph, [span], slot_key)[0][3]
    else:
        _, entries = slot_entries(staged, span)
    return {d.split: d for d in plan_deliveries(staged, entries, 1, lambda slot: 0, span)}


@dataclass(frozen=True)
class _Block:
    """The numbers of the first step built of one window size, and how its deliveries scale with the new row.

    One sequence writes row ``r`` of a window of ``rows``: each window's stable prefix is its rows below ``r``
    (``sim.graph``), so a delivery's early copy is the same calls with ``r`` rows each and its late copy the same
    calls with ``rows - r``: ``early``/``late`` hold each staged split's (columns, bytes per row of each call).
    ``None`` when the built step did not scale that way (then every step is built)."""

    costs: TokenCosts
    link: LinkCurve
    scaled: tuple[tuple[int, int, int, int, tuple[int, ...], tuple[int, ...]], ...] | None
    early: tuple[_Group, ...] = ()  # ``scaled``'s early copies grouped by their calls (every attention layer's are alike)
    late: tuple[_Group, ...] = ()


#: Staged splits whose early (or late) copies are the same calls: (bytes per row of each call, the splits' seconds
#: columns, their bytes columns).
_Group = tuple[tuple[int, ...], np.ndarray, np.ndarray]


def _groups(scaled: tuple[tuple[int, int, int, int, tuple[int, ...], tuple[int, ...]], ...], late: bool) -> tuple[_Group, ...]:
    by: dict[tuple[int, ...], tuple[list[int], list[int]]] = {}
    for es, eb, ls, lb, early_calls, late_calls in scaled:
        cols = by.setdefault(late_calls if late else early_calls, ([], []))
        cols[0].append(ls if late else es)
        cols[1].append(lb if late else eb)
    return tuple((calls, np.array(sc, dtype=np.intp), np.array(bc, dtype=np.intp)) for calls, (sc, bc) in by.items())


def _block(graph: DecodeGraph, costs: TokenCosts, h2d: LinkCurve, deliveries: dict[int, Delivery], resident: bool = False) -> _Block:
    if resident:  # no delivery: every step of a window (one sequence) is the first one's numbers
        return _Block(costs, h2d, () if len(graph.positions) == 1 else None)
    row = graph.positions[0]
    late_rows = graph.window_rows - row
    out = []
    for s, c in zip(graph.splits, costs.layout.splits, strict=True):
        if not s.staged:
            continue
        d = deliveries[s.index]
        early = [call.width * call.height for call in copy_calls(d.early)]
        late = [call.width * call.height for call in copy_calls(d.late)]
        if len(graph.positions) != 1 or row <= 0 or late_rows <= 0 or any(n % row for n in early) or any(n % late_rows for n in late):
            return _Block(costs, h2d, None)
        out.append((*c.early, *c.late, tuple(n // row for n in early), tuple(n // late_rows for n in late)))
    scaled = tuple(out)
    return _Block(costs, h2d, scaled, _groups(scaled, False), _groups(scaled, True))


def _scaled(block: _Block, row: int) -> TokenCosts:
    """The step of ``block``'s window whose sequence writes row ``row``: each group of alike deliveries' numbers computed
    once (the same calls, summed in the same order) and written to every split of the group. Pure."""
    assert block.scaled is not None
    vals = block.costs.values.copy()
    seconds = block.link.seconds
    for groups, rows in ((block.early, row), (block.late, block.costs.window_rows - row)):
        for calls, s_cols, b_cols in groups:
            vals[s_cols] = sum([seconds(n * rows) for n in calls])
            vals[b_cols] = sum(calls) * rows
    return TokenCosts(block.costs.layout, vals, block.costs.window_rows)


_KEPT: OrderedDict[Any, dict[int, TokenCosts]] = OrderedDict()  # per workload and machine: step -> numbers
_BLOCKS: OrderedDict[Any, _Block] = OrderedDict()
KEPT_POINTS = 1 << 9  # lines whose step numbers are kept (a batch reads each line once, in order)
KEPT_BLOCKS = 1 << 14  # windows whose first step's numbers are kept (every context of a workload shares them)


def token_costs(point: Point, step: int) -> TokenCosts:
    """The numbers of ``point``'s decode step ``step`` (see :func:`point_costs`)."""
    return point_costs(point)[step]


def point_costs(point: Point) -> list[TokenCosts]:
    """The numbers of every decode step of ``point`` (kept for the points that differ only in depth and budget).

    The first step of each window size is built from its graph (``sim.run.point.graph_at``); a later step of the same
    window -- of this point, or of another context of the same workload (``sim.replay.context_free``: a copy's
    seconds depend on its calls' bytes, not on where the cache's blocks start) -- differs from it only in the row its
    sequence writes, which splits each window into early and late bytes, so its deliveries are the first step's calls
    scaled to the new row (:class:`_Block`; ``tests/sim/test_evaluator.py`` holds every step to its own graph). The
    resident arm's numbers have no delivery: a later step of a window is its first step's."""
    cfg, hw, wl = point.transport, point.hardware, point.workload
    resident = cfg.arm == "resident"
    base = (number(wl), number(hw.devices[0]), cfg.pack_streams, cfg.min_alignment_bytes, resident)  # (values as numbers)
    family = cost_family(point)  # a window's numbers do not depend on the context otherwise
    kept = _KEPT.get(base)
    if kept is None:
        kept = {}
        _keep(_KEPT, base, kept)
    out = []
    window, row_of = steps_of(wl)
    for step in range(wl.tokens):
        got = kept.get(step)
        if got is None:
            rows = window[step]
            block = _BLOCKS.get((family, rows))
            if block is None and not resident:  # another window of a family whose template is trusted: no graph
                block = _from_template(family, rows, row_of[step])
                if block is not None:
                    _keep(_BLOCKS, (family, rows), block, KEPT_BLOCKS)
            if block is None or block.scaled is None:
                graph = graph_at(point, step)
                h2d, d2h, span = _links(point)
                align = max(point.hardware.devices[0].alignment_bytes, cfg.min_alignment_bytes)
                deliveries = {} if resident else _deliveries(graph, span, (cfg.pack_streams, (align,)))
                got = _build(graph, h2d, d2h, span, deliveries, resident)
                if block is None:
                    made = _block(graph, got, h2d, deliveries, resident)
                    _keep(_BLOCKS, (family, rows), made, KEPT_BLOCKS)
                    if not resident and made.scaled:
                        _learn(family, point, graph, got, made)
            else:
                got = _scaled(block, row_of[step])
            kept[step] = got
        out.append(got)
    return out


def cost_family(point: Point) -> int:
    """The number of ``point``'s family, under which :func:`point_costs` keeps a window's numbers and template: the
    workload at any context (``free_number``), device 0, the slot layout and the arm. Kept per object."""
    cfg = point.transport
    return interned((free_number(point.workload, False), number(point.hardware.devices[0]), cfg.pack_streams,
                     cfg.min_alignment_bytes, cfg.arm == "resident"))


#: Per family (``point_costs``' key): its window template and the reference block it was read from, and whether a
#: second window built from its graph confirmed it; ``None``: the family keeps the graph path.
_TEMPLATES: dict[int, tuple[Template, _Block, bool] | None] = {}


def _learn(family: int, point: Point, graph: DecodeGraph, got: TokenCosts, made: _Block) -> None:
    """Read a template off the family's first window built from its graph; confirm it on the second (its numbers,
    scaled to that step's row, equal to the graph's bit for bit), or give the family up."""
    if family in _TEMPLATES and _TEMPLATES[family] is None:
        return
    kept = _TEMPLATES.get(family)
    if kept is None:
        t = template_of(point.workload, graph, got.layout, got.values, point.hardware.devices[0].compute, made.link)
        if len(_TEMPLATES) > KEPT_BLOCKS:
            _TEMPLATES.clear()
        _TEMPLATES[family] = None if t is None else (t, made, False)
        return
    t, ref, _ = kept
    mine = _template_block(t, ref, graph.window_rows)
    same = (mine.costs.layout is got.layout and mine.scaled == made.scaled
            and np.array_equal(_scaled(mine, graph.positions[0]).values, got.values))
    _TEMPLATES[family] = (t, ref, True) if same else None


def _template_block(t: Template, ref: _Block, rows: int) -> _Block:
    return _Block(TokenCosts(ref.costs.layout, t.values_at(rows), rows), ref.link, ref.scaled, ref.early, ref.late)


def _from_template(family: int, rows: int, row: int) -> _Block | None:
    """The block of the family's window of ``rows`` rows from its confirmed template; None without one, or where the
    step's row leaves no early or no late rows (``_block`` builds such a step from its graph)."""
    kept = _TEMPLATES.get(family)
    if kept is None or not kept[2] or row <= 0 or rows - row <= 0:
        return None
    return _template_block(kept[0], kept[1], rows)


def clear_costs() -> None:
    """Forget every kept token's numbers (a timing that must build them, as ``kvpipe bench`` does)."""
    _KEPT.clear()
    _BLOCKS.clear()
    ONE_CALL_SECONDS.clear()
    _TEMPLATES.clear()


def _keep(cache: OrderedDict[Any, Any], key: Any, value: Any, most: int = KEPT_POINTS) -> None:
    cache[key] = value
    while len(cache) > most:
        cache.popitem(last=False)
