"""What planning reads of a window's graph, at any window size, from one graph of its family.

The point planner (``sim.replay``) reads of each token's graph its *shape*: per device that stages windows the slot
need, the need at full context and the staged split count, the devices that run GPU splits, the host cache's bytes
and the ``--kv-gpu-layers`` prefix. For one sequence on one device (one stream, every staged input one contiguous
piece of whole rows) the graphs of one workload at any context (``sim.replay.context_free`` without the cache's size)
have the same staged splits; a slot need is then each input's rows x bytes per row through the slot layout's span
(``sim.transport.deliveries.slot_entries``), the full-context need the same at the cache's rows
(``deliveries.full_need``'s arithmetic), and the rest a function of the workload's cache layout
(``sim.graph_parts.layout_of``) -- so no graph need be built for a window whose family has a :class:`ShapeTemplate`.

A template is read off the family's first graph, must give that graph's shape back, and is trusted once it gives a
second window's shape exactly as that window's graph does (``sim.replay._shape`` builds both and compares); a family
outside this shape keeps the graph path. ``tests/sim/test_window_templates.py`` holds the two equal over dense grids.

Units: bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.graph import DecodeGraph
from sim.graph_parts import layout_of
from sim.memory import held_before_ring
from sim.run.point import Point, placed_hardware
from sim.transport.deliveries import SpanFn
from sim.workload import Workload

#: A shape's fields: (staged: ((device, slot need, full need, staged splits), ...), GPU devices, host cache bytes,
#: devices keeping the --kv-gpu-layers prefix, its bytes) -- ``sim.replay._Shape``'s.
ShapeFields = tuple[tuple[tuple[int, int, int, int], ...], tuple[int, ...], int, tuple[int, ...], int]


@dataclass(frozen=True)
class ShapeTemplate:
    """A family's staged splits as bytes per row of each input (``per_row``), on ``device``; the GPU devices and the
    devices that keep the resident prefix (the same at every window)."""

    device: int
    per_row: tuple[tuple[int, ...], ...]
    gpu_devices: tuple[int, ...]
    device_kv: tuple[int, ...]

    def fields(self, wl: Workload, rows: int, span: SpanFn) -> ShapeFields:
        """The shape of ``wl``'s graph whose window has ``rows`` rows, on the slot layout ``span``. Pure."""
        layout = layout_of(wl)
        full_rows = wl.cells_per_stream
        scale = full_rows / max(1, rows)
        need = full = 0
        for inputs in self.per_row:
            off = f = 0
            for b in inputs:
                reserve = full_rows * b
                off += span(rows * b, reserve)
                f += span(int(rows * b * scale), reserve)
            need, full = max(need, off), max(full, f)
        kv = wl.kv_gpu_layers
        return (((self.device, need, full, len(self.per_row)),), self.gpu_devices, layout.nbytes - layout.k_offset(0),
                self.device_kv, layout.k_offset(kv) if kv else 0)


def shape_template(wl: Workload, graph: DecodeGraph, needs: list[Any], spans: list[SpanFn],
                   got: ShapeFields) -> ShapeTemplate | None:
    """The template of ``graph``'s family (``needs``: ``planning.slot_needs`` of it; ``got``: the shape read off it),
    or None where the family is outside the template's shape or the template does not give ``got`` back. Pure."""
    rows = graph.window_rows
    if (wl.n_parallel != 1 or wl.n_streams != 1 or wl.gpu_layer_start or wl.split_mode != "none" or len(needs) != 1
            or len(graph.positions) != 1 or rows < 1 or graph.full_window_rows != wl.cells_per_stream):
        return None
    dev, splits = needs[0][0], needs[0][1]
    per_row: list[tuple[int, ...]] = []
    for s in splits:
        one = []
        for inp in s.staged:
            (p,) = inp.pieces if len(inp.pieces) == 1 else (None,)
            if p is None or p.rows != 1 or p.nbytes % rows or p.cell_bytes != p.nbytes // rows or p.reserve_bytes != (
                    wl.cells_per_stream * p.cell_bytes):
                return None
            one.append(p.nbytes // rows)
        per_row.append(tuple(one))
    t = ShapeTemplate(dev, tuple(per_row), got[1], got[3])
    return t if t.fields(wl, rows, spans[dev]) == got else None


TEMPLATES_KEPT = 1 << 14
#: Per (family without the cache's size, slot layout): its shape template and whether a second window's graph
#: confirmed it (``sim.replay_shapes``); ``None``: the family keeps the graph path.
TEMPLATES: dict[Any, tuple[ShapeTemplate, bool] | None] = {}


def learn(tkey: Any, kept: tuple[ShapeTemplate, bool] | None, wl: Workload, graph: Any, needs: Any, spans: list[Any],
          got: Any) -> None:
    """Read a template off a family's first graph; confirm it with the second (the same shape), or give it up."""
    if kept is None and tkey in TEMPLATES:
        return
    if kept is None:
        if len(TEMPLATES) > TEMPLATES_KEPT:
            TEMPLATES.clear()
        t = shape_template(wl, graph, needs, spans, got)
        TEMPLATES[tkey] = None if t is None else (t, False)
    elif graph.window_rows >= 1 and kept[0].fields(wl, graph.window_rows, spans[kept[0].device]) == got:
        TEMPLATES[tkey] = (kept[0], True)
    else:
        TEMPLATES[tkey] = None


_STEPS: dict[int, tuple[Workload, tuple[int, ...], tuple[int, ...]]] = {}
STEPS_KEPT = 1 << 14  # workloads whose steps are kept: a batch's lines, each read by the planner, then by the evaluator


def steps_of(wl: Workload) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each decode step's window rows (the window of the highest row any sequence writes: ``sim.replay.window_rows_at``)
    and the row the first sequence writes, from one ``wl.writes`` per step, kept per workload object (the point
    planner and the evaluator's numbers both read them of each line; no workload is hashed). Pure."""
    got = _STEPS.get(id(wl))
    if got is None or got[0] is not wl:
        if len(_STEPS) >= STEPS_KEPT:
            _STEPS.clear()
        got = _STEPS[id(wl)] = (wl, *_steps(wl))
    return got[1], got[2]


def _steps(wl: Workload) -> tuple[tuple[int, ...], tuple[int, ...]]:
    contexts = wl.contexts
    if len(contexts) == 1:  # one sequence writes row context + k at step k (``Workload.writes``)
        rows = tuple(range(contexts[0], contexts[0] + wl.tokens))
        return tuple(map(wl.window_rows, rows)), rows
    writes = [wl.writes(k) for k in range(wl.tokens)]
    return tuple(wl.window_rows(max(r for _, r in w)) for w in writes), tuple(w[0][1] for w in writes)


_PLACED: dict[tuple[int, tuple[int, ...]], tuple[Any, tuple[Any, ...]]] = {}


def placed_devices(point: Point) -> tuple[Any, ...]:
    """``sim.run.point.placed_hardware(point).devices``, kept per profile object and the bytes each device holds
    before the ring (``sim.memory.held_before_ring``: all that profile reads of the workload), so the lines of a plan
    that hold the same bytes (every context of one ``--kv-gpu-layers`` count) share one placed profile. Pure."""
    hw = point.hardware
    key = (id(hw), held_before_ring(point.workload, tuple(d.memory_reserved_bytes for d in hw.devices)))
    got = _PLACED.get(key)
    if got is None or got[0] is not hw:
        if len(_PLACED) >= STEPS_KEPT:
            _PLACED.clear()
        got = _PLACED[key] = (hw, placed_hardware(point).devices)
    return got[1]


def placed_memory(point: Point) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each device's total and used bytes in ``sim.run.point.placed_hardware(point)``, without making the profile (a
    family's lines, read at once, read only these, once per cache size): a one-device profile with its memory use set
    keeps it; else each device holds ``sim.memory.held_before_ring``, at most its total. Pure."""
    devs = point.hardware.devices
    if len(devs) == 1 and devs[0].memory_used_bytes > 0:
        return (devs[0].memory_total_bytes,), (devs[0].memory_used_bytes,)
    held = held_before_ring(point.workload, tuple(d.memory_reserved_bytes for d in devs))
    return tuple(d.memory_total_bytes for d in devs), tuple(min(d.memory_total_bytes, h) for d, h in zip(devs, held, strict=True))


class ShapeArrays:
    """One token's graph shapes of every line (``sim.replay._Shape``s by line number), as arrays over the points
    (``line_of``: each point's line). Each distinct shape object is read once (the lines of one window share theirs);
    a line without a shape at this token has zeros."""

    def __init__(self, shapes: dict[int, Any], n_lines: int, n_dev: int, line_of: np.ndarray) -> None:
        ids: dict[int, int] = {}
        distinct: list[Any] = []
        sid = np.empty(n_lines, dtype=np.intp)
        sid.fill(-1)
        for li, sh in shapes.items():
            j = ids.get(id(sh))
            if j is None:
                j = ids[id(sh)] = len(distinct)
                distinct.append(sh)
            sid[li] = j
        sid[sid < 0] = len(distinct)  # the last row: zeros
        z = np.zeros((len(distinct) + 1, n_dev), dtype=np.int64)
        staged, need, full, n_splits, rank = z.astype(bool), z.copy(), z.copy(), z.copy(), z.copy()
        gpu, kv = z.astype(bool), z.astype(bool)
        kv_bytes, host_cache = np.zeros(len(distinct) + 1, dtype=np.int64), np.zeros(len(distinct) + 1, dtype=np.int64)
        cells: list[tuple[int, int, int, int, int, int]] = []  # (shape, device, need, full, splits, rank): filled at once
        on_gpu: list[tuple[int, int]] = []
        on_kv: list[tuple[int, int]] = []
        for j, sh in enumerate(distinct):
            cells += [(j, d, nd, fl, ns, r) for r, (d, nd, fl, ns) in enumerate(sh.staged)]
            on_gpu += [(j, d) for d in sh.gpu_devices]
            on_kv += [(j, d) for d in sh.device_kv]
        if cells:
            j, d, nd, fl, ns, r = np.array(cells, dtype=np.int64).T
            staged[j, d], need[j, d], full[j, d], n_splits[j, d], rank[j, d] = True, nd, fl, ns, r
        for flag, at in ((gpu, on_gpu), (kv, on_kv)):
            if at:
                flag[tuple(np.array(at, dtype=np.intp).T)] = True
        kv_bytes[: len(distinct)] = [sh.device_kv_bytes for sh in distinct]
        host_cache[: len(distinct)] = [sh.host_cache_bytes for sh in distinct]
        at = sid[line_of]
        self.staged, self.need, self.full, self.n_splits, self.rank = (a[at] for a in (staged, need, full, n_splits, rank))
        self.gpu, self.kv, self.kv_bytes, self.host_cache = gpu[at], kv[at], kv_bytes[at], host_cache[at]
