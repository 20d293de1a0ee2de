"""The decode graph of one token, cut into splits as llama.cpp's scheduler cuts it.

With the KV cache in host memory, one decode token of a model with full
attention in layers a_0 < a_1 < ... runs as an alternation of GPU and CPU
splits:

* GPU split 0: the layers before a_0 and a_0's Q/K/V projections. Its small
  graph inputs (token id, positions, the KQ mask, rotation inputs) arrive by
  blocking host->device copies: the *ordered inputs*.
* CPU split: writes this ubatch's new K and V rows of layer a_k into the host
  cache. Its inputs (the new rows, computed on the GPU) come back by blocking
  device->host copies, one for K and one for V.
* GPU split k+1: the attention of a_k, which reads that layer's K and V
  *window* (rows 0..n_kv) from the host cache -- the *staged inputs* -- then
  the layers up to a_{k+1}'s projections (the last one ends with the output
  head).

A staged input knows its *stable prefix*: the bytes below the lowest row this
ubatch writes, which no CPU split of this graph touches and can therefore be
sent early; the rest (the rows written this ubatch and the padding above them)
is the *late* part.

Byte layout of the host cache (one buffer): for attention layer j, K of all
cells then V of all cells; each sequence stream owns a contiguous block of
cells within them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from backends.profile import ComputeModel
from sim.workload import Workload


@dataclass(frozen=True)
class WindowPiece:
    """One stream's part of a staged window: ``nbytes`` at ``src_offset``; the first ``prefix_bytes`` are stable."""

    src_offset: int
    nbytes: int
    prefix_bytes: int

    def __post_init__(self) -> None:
        if not 0 <= self.prefix_bytes <= self.nbytes:
            raise ValueError(f"prefix {self.prefix_bytes} outside 0..{self.nbytes}")

    @property
    def late_bytes(self) -> int:
        return self.nbytes - self.prefix_bytes


@dataclass(frozen=True)
class StagedInput:
    """A host-resident window one attention split reads (K or V of one layer)."""

    name: str
    layer: int
    pieces: tuple[WindowPiece, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)

    @property
    def early_bytes(self) -> int:
        return sum(p.prefix_bytes for p in self.pieces)

    @property
    def late_bytes(self) -> int:
        return self.nbytes - self.early_bytes


@dataclass(frozen=True)
class SmallInput:
    """A small tensor copied with a blocking copy (``to_device``: H2D, else D2H)."""

    name: str
    nbytes: int
    to_device: bool
    host_offset: int = 0


@dataclass(frozen=True)
class Split:
    """One split of the graph, run on one backend (``kind``) of one device."""

    index: int
    kind: Literal["gpu", "cpu"]
    device: int
    name: str
    compute_s: float
    layers: tuple[int, ...] = ()
    attn_layer: int = -1
    staged: tuple[StagedInput, ...] = ()
    ordered: tuple[SmallInput, ...] = ()
    row_writes: tuple[tuple[int, int], ...] = ()  # (attention index, host byte offset) of rows written
    n_launches: int = 1


@dataclass(frozen=True)
class DecodeGraph:
    """The splits of one decode token, plus what the plan needs to know."""

    token: int
    splits: tuple[Split, ...]
    window_rows: int
    full_window_rows: int
    host_cache_bytes: int
    positions: tuple[int, ...]
    host_writes_at_start: tuple[tuple[int, int], ...] = field(default=())  # (offset, nbytes) written before split 0

    @property
    def staged_splits(self) -> tuple[Split, ...]:
        return tuple(s for s in self.splits if s.staged)


@dataclass(frozen=True)
class CacheLayout:
    """Where each layer's K and V rows of each stream live in the host cache buffer."""

    n_attn: int
    cells_per_stream: int
    n_streams: int
    k_row_bytes: int
    v_row_bytes: int

    @property
    def cells(self) -> int:
        return self.cells_per_stream * self.n_streams

    def k_offset(self, attn_index: int, stream: int = 0, row: int = 0) -> int:
        base = attn_index * self.cells * (self.k_row_bytes + self.v_row_bytes)
        return base + (stream * self.cells_per_stream + row) * self.k_row_bytes

    def v_offset(self, attn_index: int, stream: int = 0, row: int = 0) -> int:
        base = attn_index * self.cells * (self.k_row_bytes + self.v_row_bytes) + self.cells * self.k_row_bytes
        return base + (stream * self.cells_per_stream + row) * self.v_row_bytes

    @property
    def nbytes(self) -> int:
        return self.n_attn * self.cells * (self.k_row_bytes + self.v_row_bytes)


def layout_of(wl: Workload) -> CacheLayout:
    return CacheLayout(wl.model.n_attn, wl.cells, 1, wl.k_row_bytes, wl.v_row_bytes)


def decode_graph(
    wl: Workload,
    compute: ComputeModel,
    position: int,
    token: int = 0,
    prefix_row: int | None = None,
    device_of_layer: tuple[int, ...] | None = None,
) -> DecodeGraph:
    """The graph of the decode token whose new row is written at ``position``.

    ``prefix_row`` overrides the stable prefix (rows below it go early); by
    default it is ``position``, the lowest row this ubatch writes.
    ``device_of_layer`` assigns layers to devices (default: all on device 0).
    """
    model = wl.model
    layout = layout_of(wl)
    rows = wl.window_rows(position)
    full_rows = wl.cells
    prefix = position if prefix_row is None else max(0, min(prefix_row, rows))
    devs = device_of_layer or (0,) * model.n_layers
    kb, vb = wl.k_row_bytes, wl.v_row_bytes
    layer_s = compute.layer_seconds(model.layer_weight_bytes)

    splits: list[Split] = []

    def add(**kw: object) -> None:
        splits.append(Split(index=len(splits), **kw))  # type: ignore[arg-type]

    small = tuple(SmallInput(f"inp_{i}", n, True) for i, n in enumerate(model.small_inputs_bytes))
    small += (SmallInput("kq_mask", rows * 2, True),)
    bounds = list(model.attn_layers) + [model.n_layers]
    first = bounds[0]
    # GPU split 0: layers before the first attention layer (+ its projections).
    add(
        kind="gpu",
        device=devs[0],
        name="gpu0",
        compute_s=first * layer_s,
        layers=tuple(range(first)),
        ordered=small,
    )
    for j, a in enumerate(model.attn_layers):
        k_off, v_off = layout.k_offset(j, 0, position), layout.v_offset(j, 0, position)
        add(
            kind="cpu",
            device=-1,
            name=f"cpu_rows_l{a}",
            compute_s=compute.cpu_split_s,
            layers=(a,),
            ordered=(SmallInput(f"k_cur_l{a}", kb, False, k_off), SmallInput(f"v_cur_l{a}", vb, False, v_off)),
            row_writes=((j, k_off), (j, v_off)),
        )
        nxt = bounds[j + 1]
        staged = (
            StagedInput(f"cache_k_l{a}", a, (WindowPiece(layout.k_offset(j), rows * kb, prefix * kb),)),
            StagedInput(f"cache_v_l{a}", a, (WindowPiece(layout.v_offset(j), rows * vb, prefix * vb),)),
        )
        last = j == model.n_attn - 1
        add(
            kind="gpu",
            device=devs[a],
            name=f"gpu_attn_l{a}",
            compute_s=compute.attention_seconds(rows * (kb + vb)) + (nxt - a) * layer_s + (compute.head_s if last else 0.0),
            layers=tuple(range(a, nxt)),
            attn_layer=a,
            staged=staged,
        )
    return DecodeGraph(
        token=token,
        splits=tuple(splits),
        window_rows=rows,
        full_window_rows=full_rows,
        host_cache_bytes=layout.nbytes,
        positions=(position,),
    )
