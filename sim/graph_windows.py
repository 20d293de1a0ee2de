"""The windows of a decode graph: each attention layer's K and V window at one size, kept in tables.

Everything of a window but its stable prefix -- input name, layout id, each stream's piece (offset, bytes, rows,
pitch, reserve, cell) and the total bytes -- is the same for every token of one window size, so it is worked out
once per (layout, KV heads, attention layers, window rows, head slice, name suffix) and kept (bounded tables);
:mod:`sim.graph` adds each graph's prefix. Layout ids come one block per window size and head slice, two per
attention layer: equal layouts share an id, different ones never do. Nothing here blocks.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from sim.bindings import cache_input
from sim.graph_parts import CacheLayout, StagedInput, WindowPiece, new_staged_input
from sim.workload import Workload

__all__ = ["Window", "layout_id", "prefix_rows", "staged", "windows"]


_ID_BLOCKS: dict[Any, int] = {}  # (layout, KV heads, rows, head slice) -> the first of its windows' layout ids
ID_BLOCKS_KEPT = 1 << 16  # bounded; ids are never reused, so what was derived from an old one stays right
ID_BLOCK, _NEXT_BLOCK = 1 << 20, itertools.count()  # ids a block spans (two per attention layer); next() is atomic


def layout_id(wl: Workload, layout: CacheLayout, j: int, kind: str, rows: int, heads: tuple[int, int] | None) -> int:
    """The id of the layout :func:`windows` gives layer ``j``'s ``kind`` window of ``rows`` rows (``heads``: a tensor
    split's head slice): one block of ids per window size and slice, two per attention layer. Does not block."""
    return _id_block(layout, wl.model.n_head_kv, rows, heads) + 2 * j + (kind == "v")


def _id_block(layout: CacheLayout, n_head_kv: int, rows: int, heads: tuple[int, int] | None) -> int:
    key = (layout, n_head_kv, rows, heads)
    got = _ID_BLOCKS.get(key)
    if got is None:
        if len(_ID_BLOCKS) >= ID_BLOCKS_KEPT:
            _ID_BLOCKS.clear()
        assert 2 * layout.n_attn <= ID_BLOCK, layout.n_attn
        got = _ID_BLOCKS[key] = next(_NEXT_BLOCK) * ID_BLOCK
    return got


#: One window of one attention layer at one size: (input name, layer, layout id, per stream (src_offset, nbytes,
#: rows, src_pitch, reserve_bytes, cell_bytes) -- every field of its piece but the prefix --, total bytes).
Window = tuple[str, int, int, tuple[tuple[int, int, int, int, int, int], ...], int]
_WINDOWS: dict[Any, tuple[tuple[Window, Window], ...]] = {}  # see windows
WINDOWS_KEPT = 512  # window tables (one per window size, head slice and workload shape); a full cache is emptied


def windows(wl: Workload, layout: CacheLayout, rows: int, heads: tuple[int, int] | None,
             suffix: str = "") -> tuple[tuple[Window, Window], ...]:
    """Per attention layer j, its (K, V) windows of ``rows`` rows (``heads``: a tensor split's head slice; ``suffix``:
    its device's name suffix): everything of a window but the stable prefix, the same for every token of a window
    size, so kept (by layout and shape; the layout ids are :func:`layout_id`'s). Does not block."""
    model = wl.model
    key = (layout, model.n_head_kv, model.attn_layers, rows, heads, suffix)
    got = _WINDOWS.get(key)
    if got is None:
        if len(_WINDOWS) >= WINDOWS_KEPT:
            _WINDOWS.clear()
        block = _id_block(layout, model.n_head_kv, rows, heads)
        k, v = _window_bases(layout, "k", rows, heads, model.n_head_kv), _window_bases(layout, "v", rows, heads, model.n_head_kv)
        layer_b = layout.cells * (layout.k_row_bytes + layout.v_row_bytes)  # one attention layer's K and V blocks
        got = _WINDOWS[key] = tuple(
            tuple((cache_input(kind, a, suffix), a, block + 2 * j + i, bases_j, sum(b[1] for b in bases_j))  # type: ignore[misc]
                  for i, (kind, bases) in enumerate((("k", k), ("v", v)))
                  for bases_j in [tuple((o + j * layer_b, *rest) for o, *rest in bases)])
            for j, a in enumerate(model.attn_layers))
    return got


def _window_bases(layout: CacheLayout, kind: str, rows: int, heads: tuple[int, int] | None,
                  n_head_kv: int) -> tuple[tuple[int, int, int, int, int, int], ...]:
    """Attention layer 0's ``kind`` window per stream (layer j's starts ``j`` K+V blocks further)."""
    row_b = layout.k_row_bytes if kind == "k" else layout.v_row_bytes
    offset = layout.k_offset if kind == "k" else layout.v_offset
    cps = layout.cells_per_stream
    if heads:
        h0, h1 = heads
        head_b = row_b // n_head_kv
        width = (h1 - h0) * head_b
        return tuple((offset(0, s, 0) + h0 * head_b, rows * width, rows, row_b, cps * width, width) for s in range(layout.n_streams))
    return tuple((offset(0, s, 0), rows * row_b, 1, 0, cps * row_b, row_b) for s in range(layout.n_streams))


def prefix_rows(wl: Workload, layout: CacheLayout, rows: int, writes: tuple[tuple[int, int], ...],
                 prefix_row: int | None) -> list[int]:
    """Each stream's stable prefix, in rows (the same for every layer and for K and V)."""
    lowest: dict[int, int] = {}  # stream -> the lowest row any of its sequences writes
    for st, r in writes:
        if r < lowest.get(st, r + 1):
            lowest[st] = r
    streams = range(layout.n_streams)
    out = [min(rows, lowest.get(s, rows) if prefix_row is None else prefix_row) for s in streams]
    if wl.flat_prefix and layout.n_streams > 1:
        # Old behaviour: one prefix over the flat window; the lowest-writing stream caps every stream above it.
        flat = min(s * rows + out[s] for s in streams)
        out = [max(0, min(rows, flat - s * rows)) for s in streams]
    return out


_new_piece = functools.partial(tuple.__new__, WindowPiece)  # WindowPiece(*fields) without its checks (see staged)


def staged(win: Window, prefix_rows: list[int], checked: bool, extent: bool = False) -> StagedInput:
    """The staged input of one window with each stream's prefix (``checked``: build the pieces through
    ``WindowPiece``'s checks; needed only where a prefix is negative or the window has no rows; ``extent``: copied as
    one extent, ``CacheLayout.copy_span``)."""
    name, layer, lid, bases, _ = win
    if checked:
        pieces = tuple(WindowPiece(o, n, pr * cell, r, pitch, reserve, cell)
                       for (o, n, r, pitch, reserve, cell), pr in zip(bases, prefix_rows, strict=True))
    elif len(bases) == 1:  # one stream (below: 0 <= prefix <= rows, so prefix_bytes within the piece, whole rows)
        (o, n, r, pitch, reserve, cell), = bases
        pieces = (_new_piece((o, n, prefix_rows[0] * cell, r, pitch, reserve, cell)),)
    else:
        pieces = tuple([_new_piece((o, n, pr * cell, r, pitch, reserve, cell))
                        for (o, n, r, pitch, reserve, cell), pr in zip(bases, prefix_rows, strict=True)])
    return new_staged_input(name=name, layer=layer, pieces=pieces, layout_id=lid, extent=extent)
