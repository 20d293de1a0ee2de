"""What the point planner reads of each line, as arrays over the lines, a *family* of lines at a time.

A line (``sim.replay``) is the points that differ only in depth and budget; a *family* is the lines that differ only
in context (and the cache's size): one sequence on one device, the same machine and config but depth and budget.
Planning reads of a line its devices' memory as the workload places it, the slot alignment, the io buffer, and each
token's window rows and graph shape. Read one line at a time (``sim.replay._Line``) that is a dozen small functions,
each a few microseconds, per line and token. Once a family's shape template is trusted (``sim.replay_shapes``: read
off its first graph, confirmed by a second window's graph), a window's shape is integer arithmetic on its rows, and
a step's window is its row padded: :func:`line_arrays` reads the family's first lines one at a time until the
template is confirmed, then the rest of the family at once -- the same arithmetic, in the same order, over NumPy
arrays of int64 (exact; the one float, the full-context scale, is the same IEEE division and product); what the
lines' workloads decide but their windows (the memory placed, the io buffer, the cache layout) differs within a
family only with the cache's size, so it is read once per size, off the first line of that size. Lines outside
any family (several sequences or devices, no template) are read one at a time. ``tests/sim/test_replay_family.py``
holds the two paths equal field by field.

Units: bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sim.graph_parts import layout_of
from sim.replay_keys import compute_number, config_class, free_number, interned, number
from sim.replay_shapes import TEMPLATES, ShapeArrays, ShapeTemplate, placed_memory
from sim.run.point import Point, io_bytes_for
from sim.workload import Workload, pad_rows

#: One line read one at a time: (total, used, align, io bytes, window rows per token, each token's shape).
OneLine = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int, tuple[int, ...], list[Any]]
#: Called with lines (their numbers and first points) just read: ``family`` True where they are one family's, read
#: at once (their graphs were not built); else one line, read alone.
EachLines = Callable[[list[int], list[Point], bool], None]

SHAPE_FIELDS = ("staged", "need", "full", "n_splits", "rank", "gpu", "kv", "kv_bytes", "host_cache")


@dataclass
class LineArrays:
    """What planning reads of every line: ``total``/``used``/``align`` (line, device), ``io``/``tokens`` (line),
    ``rows`` (line, token), and each token's shape (``sim.replay_shapes.ShapeArrays``' fields) with a token axis
    after the line's. A line has zeros past its tokens."""

    total: np.ndarray
    used: np.ndarray
    align: np.ndarray
    io: np.ndarray
    tokens: np.ndarray
    rows: np.ndarray
    staged: np.ndarray
    need: np.ndarray
    full: np.ndarray
    n_splits: np.ndarray
    rank: np.ndarray
    gpu: np.ndarray
    kv: np.ndarray
    kv_bytes: np.ndarray
    host_cache: np.ndarray

    def at(self, k: int, line_of: np.ndarray) -> Any:
        """Token ``k``'s shapes over the points (``line_of``: each point's line), as ``ShapeArrays`` has them."""
        out = ShapeArrays.__new__(ShapeArrays)
        for f in SHAPE_FIELDS:  # the token's column made contiguous, then taken (a strided fancy index is ~3x dearer)
            setattr(out, f, np.take(np.ascontiguousarray(getattr(self, f)[:, k]), line_of, axis=0))
        return out


def family_key(p: Point) -> Any:
    """The family of ``p``'s line (None: read alone): what every line of it shares but context and cache size."""
    wl, hw = p.workload, p.hardware
    if len(hw.devices) != 1 or wl.n_parallel != 1 or len(wl.contexts) != 1 or wl.n_streams != 1:
        return None
    return free_number(wl, False), number(hw), config_class(p.transport), wl.tokens


def line_arrays(firsts: Sequence[Point], one_line: Callable[[Point], OneLine], each: EachLines | None = None) -> LineArrays:
    """What planning reads of each line (``firsts``: each line's first point; ``one_line``: a line read alone, as
    ``sim.replay`` reads it). ``each``: called as the lines are read, in order of each family's first line (a line
    read alone: a family of its own). Pure."""
    n = len(firsts)
    fams: dict[Any, list[int]] = {}
    order: list[list[int]] = []
    for li, p in enumerate(firsts):
        key = family_key(p)
        if key is None:
            order.append([li])
            continue
        got = fams.get(key)
        if got is None:
            got = fams[key] = []
            order.append(got)
        got.append(li)
    n_tok = max((p.workload.tokens for p in firsts), default=0)
    alone: dict[int, OneLine] = {}
    done: list[tuple[Any, ...]] = []  # each family's lines read at once, as arrays (``_family``)
    sized: dict[Any, tuple[Any, ...]] = {}  # what a cache size decides, shared by the families (``_family``)
    for lis in order:
        i = 0
        while i < len(lis) and not _trusted(firsts[lis[i]]):
            alone[lis[i]] = one_line(firsts[lis[i]])
            if each is not None:
                each([lis[i]], [firsts[lis[i]]], False)
            i += 1
        if i < len(lis):
            done.append(_family(firsts, lis[i:], sized))
            if each is not None:
                each(lis[i:], [firsts[li] for li in lis[i:]], True)
    n_dev = max([len(x[0]) for x in alone.values()] + [1])
    z = np.zeros((n, n_dev), dtype=np.int64)
    la = LineArrays(z, z.copy(), z.copy(), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                    np.zeros((n, n_tok), dtype=np.int64), *_shape_zeros(n, n_tok, n_dev))
    _fill_alone(la, alone, n, n_dev, n_tok)
    for lis, total, used, align, io, rows, (dev, need, full, n_splits, gpu, kv, kv_bytes, host_cache) in done:
        t = rows.shape[1]
        la.total[lis, 0], la.used[lis, 0], la.align[lis, 0], la.io[lis], la.tokens[lis] = total, used, align, io, t
        la.rows[lis, :t] = rows
        la.staged[lis, :t, dev] = True
        la.need[lis, :t, dev], la.full[lis, :t, dev], la.n_splits[lis, :t, dev] = need, full, n_splits
        for d in gpu:
            la.gpu[lis, :t, d] = True
        for d in kv:
            la.kv[lis, :t, d] = True
        la.kv_bytes[lis, :t], la.host_cache[lis, :t] = kv_bytes[:, None], host_cache[:, None]
    return la


def _shape_zeros(n: int, n_tok: int, n_dev: int) -> list[np.ndarray]:
    z = np.zeros((n, n_tok, n_dev), dtype=np.int64)
    return [z.astype(bool), z.copy(), z.copy(), z.copy(), z.copy(), z.astype(bool), z.astype(bool),
            np.zeros((n, n_tok), dtype=np.int64), np.zeros((n, n_tok), dtype=np.int64)]


def _fill_alone(la: LineArrays, alone: dict[int, OneLine], n: int, n_dev: int, n_tok: int) -> None:
    """The lines read one at a time, into ``la``: their shapes through ``ShapeArrays`` (one token at a time)."""
    if not alone:
        return
    ident = np.arange(n)
    for li, (total, used, align, io, rows, _) in alone.items():
        la.total[li, : len(total)], la.used[li, : len(used)], la.align[li, : len(align)] = total, used, align
        la.io[li], la.tokens[li] = io, len(rows)
        la.rows[li, : len(rows)] = rows
    lis = np.fromiter(alone, dtype=np.intp, count=len(alone))
    for k in range(n_tok):
        here = {li: x[5][k] for li, x in alone.items() if len(x[5]) > k}
        arr = ShapeArrays(here, n, n_dev, ident)
        for f in SHAPE_FIELDS:
            getattr(la, f)[lis, k] = getattr(arr, f)[lis]


def family_rows(wls: Sequence[Workload]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of one-sequence workloads of one token count (a family's lines): each one's cells per stream (line), the row
    decode step k writes (line, token) and ``Workload.window_rows`` of it (line, token), as int64 arrays. Pure."""
    ctx = np.array([wl.contexts[0] for wl in wls], dtype=np.int64)
    cps = np.array([wl.cells_per_stream for wl in wls], dtype=np.int64)
    row = ctx[:, None] + np.arange(wls[0].tokens, dtype=np.int64)
    return cps, row, np.minimum(pad_rows(row + 1), cps[:, None])  # type: ignore[arg-type]


def _tkey(p: Point) -> Any:
    """``sim.replay._shape``'s template key of ``p``'s line."""
    cfg = p.transport
    align = tuple(max(d.alignment_bytes, cfg.min_alignment_bytes) for d in p.hardware.devices)
    return interned((free_number(p.workload, False), compute_number(p.hardware), cfg.arm)), (cfg.pack_streams, align)


def _trusted(p: Point) -> bool:
    kept = TEMPLATES.get(_tkey(p))
    return kept is not None and kept[1]


def _span(pack: bool, align: int, nbytes: np.ndarray, reserve: np.ndarray | int) -> np.ndarray:
    """``sim.transport.deliveries.span_fn(pack, align)`` over arrays (``align_up``: -(-n // a) * a)."""
    n = nbytes if pack else np.maximum(nbytes, reserve)
    return -(-n // align) * align


def sizes_key(p: Point) -> tuple[int, int]:
    """What a one-sequence line's placed memory, io buffer and cache layout read of it but the cache's size: its
    workload at any context and ``--kv-gpu-layers`` count (none of the three reads either: ``held_before_ring``,
    ``io_bytes_for``, ``layout_of``) and its machine, as numbers. Pure."""
    wl = p.workload
    return free_number(replace(wl, kv_gpu_layers=0) if wl.kv_gpu_layers else wl, False), number(p.hardware)


def _family(firsts: Sequence[Point], lis: list[int], sized: dict[Any, tuple[Any, ...]]) -> tuple[Any, ...]:
    """The lines ``lis`` of one family whose shape template is trusted, read at once: (their numbers, total, used,
    align, io, window rows (line, token), (device, need, full (line, token), staged splits, GPU devices, resident
    prefix devices, its bytes, host cache bytes)), arrays over the lines where they differ."""
    p0 = firsts[lis[0]]
    cfg, wl0 = p0.transport, p0.workload
    tkey = _tkey(p0)
    t: ShapeTemplate = TEMPLATES[tkey][0]  # type: ignore[index]
    align = tkey[1][1][0]
    wls = [firsts[li].workload for li in lis]
    cps, _, rows = family_rows(wls)
    scale = cps[:, None] / np.maximum(1, rows)
    need = full = np.zeros(rows.shape, dtype=np.int64)
    for inputs in t.per_row:
        off = f = np.zeros(rows.shape, dtype=np.int64)
        for b in inputs:
            reserve = cps[:, None] * b
            off = off + _span(cfg.pack_streams, align, rows * b, reserve)
            f = f + _span(cfg.pack_streams, align, ((rows * b) * scale).astype(np.int64), reserve)
        need, full = np.maximum(need, off), np.maximum(full, f)
    kv = wl0.kv_gpu_layers
    sizes, first, inv = np.unique(cps, return_index=True, return_inverse=True)
    per_size = []  # what a line's cache size decides, read off the first line of that size of any family alike
    base = sizes_key(p0)
    for j, size in zip(first.tolist(), sizes.tolist(), strict=True):
        got = sized.get((base, size))
        if got is None:
            (total0, *_), (used0, *_) = placed_memory(firsts[lis[j]])
            layout = layout_of(wls[j])
            got = sized[base, size] = (total0, used0, io_bytes_for(wls[j]), layout, layout.nbytes - layout.k_offset(0))
        per_size.append((*got[:3], got[3].k_offset(kv) if kv else 0, got[4]))
    total, used, io, kv_bytes, host_cache = np.array(per_size, dtype=np.int64).reshape(len(sizes), 5)[inv.reshape(-1)].T
    return (np.array(lis, dtype=np.intp), total, used, align, io, rows,
            (t.device, need, full, len(t.per_row), t.gpu_devices, t.device_kv, kv_bytes, host_cache))
