"""What one GPU split of the decode program computes, as plain data both executors run.

``DecodeProgram.gpu_run`` turns a split and its bindings into a
:class:`SplitPlan`; the NumPy executor computes it, the CUDA executor captures
its kernels once as a graph keyed by the device addresses the plan's
bindings ``(buffer, byte offset, nbytes)`` resolve to, and replays it: two
plans with the same addresses read and write the same bytes.

The *graph inputs* (:func:`encode_inputs`) are what llama.cpp calls the KQ
mask: for each sequence, which cells of its stream it attends this token. The
scheduler copies them host->device with the split-0 inputs (``kq_mask``); every
attention kernel of the token reads them there, so a growing or shifted
window needs no new graph. Per sequence, ``PARAM_INTS`` int32:
``start0, len0, start1, len1, step1, stream, row, 0`` -- the prompt block
(cells ``start0 .. start0 + len0``) and the interleaved rows (``len1`` cells
from ``start1``, ``step1`` apart) of ``sim.sequences.SequenceCells.cells_of``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.sequences import CellSlice, SequenceCells

PARAM_INTS = 8
INPUT_NAME = "kq_mask"
Binding = tuple[Any, int, int]  # (backends.base.Buffer, byte offset, nbytes)


@dataclass(frozen=True)
class SplitPlan:
    """One GPU split: embed?, attention of attention layer ``attn`` over ``windows``, FFN layers, then K/V or logits.

    ``windows``: per sequence, the (K, V) bindings its cells live in (one
    stream's window). ``inputs``: the graph-input binding (``small:kq_mask``),
    or None when the split has none of its own (it reads split 0's, on the
    same device). ``next_kv``: the attention index whose new K/V rows this
    split writes to ``io`` (-1: it computes the logits instead). ``store``:
    with a resident cache (the scheduler's ``resident`` arm), the K and V
    blocks of layer ``next_kv`` in it, where the new rows also go (each at the
    cell its sequence attends last: the graph inputs name it).
    """

    index: int
    embed: bool
    attn: int
    windows: tuple[tuple[Binding, Binding], ...]
    ffn_layers: tuple[int, ...]
    next_kv: int
    io: Binding
    inputs: Binding | None
    store: tuple[Binding, Binding] | None = None


def encode_inputs(seqs: SequenceCells, rows: dict[int, int]) -> np.ndarray:
    """The graph-input block (uint8) for sequence -> row written this token: each attends rows 0..row."""
    out = np.zeros((seqs.n, PARAM_INTS), np.int32)
    for seq in range(seqs.n):
        row = rows[seq]
        slices: tuple[CellSlice, ...] = seqs.cells_of(seq, row + 1)
        a = slices[0]
        out[seq, :3] = (a.start, len(a), a.start)
        if len(slices) > 1:
            b = slices[1]
            out[seq, 2:5] = (b.start, len(b), b.step)
        else:
            out[seq, 4] = 1
        out[seq, 5:7] = (a.stream, row)
    return out.view(np.uint8).reshape(-1)


def new_cell(params: np.ndarray, seq: int) -> tuple[int, int]:
    """(stream, cell) of the row sequence ``seq`` writes this token: the last cell it attends."""
    start0, len0, start1, len1, step1, stream = (int(v) for v in params[seq, :6])
    return stream, (start1 + (len1 - 1) * step1 if len1 else start0 + len0 - 1)


def decode_inputs(raw: Any) -> np.ndarray:
    """(sequences, PARAM_INTS) int32 from the graph-input bytes (a host copy)."""
    return np.asarray(raw).view(np.int32).reshape(-1, PARAM_INTS)
