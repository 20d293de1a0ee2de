"""Workload shapes: which model, which cache type, how deep the context is.

A decode token reads, in every full-attention layer, that layer's K and V
rows 0..n_kv of the cache (the *window*). How many bytes that is follows from
the model shape (KV heads x head dims, which layers attend) and the cache
type's exact block size: q8_0 stores 32 elements in 34 bytes, so one K row of
the reference model (4 KV heads x 256) is 1,088 B and a layer's K+V row is
2,176 B. ``context`` means what llama-bench's ``-d`` means: tokens already in
the cache when decoding starts; the window of the first decode token is that
plus the new row, padded to 256 rows.

Model shapes and the files they come from (presets, a GGUF header, a Hugging
Face ``config.json``) live in ``sim.model_files``; this module re-exports them,
so ``from sim.workload import ModelShape, load_model`` keeps working.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.model_files import ModelShape, load_model, model_preset_names
from sim.sequences import SequenceCells

__all__ = [
    "ALL_LAYERS", "CACHE_TYPES", "MAX_CONTEXT", "SPLIT_MODES", "WINDOW_PAD_ROWS", "CacheType", "ModelShape", "Workload", "cache_type",
    "layers_of_ngl", "load_model", "model_preset_names", "ngl_of", "pad_rows",
]

WINDOW_PAD_ROWS = 256
MAX_CONTEXT = 1 << 24
ALL_LAYERS = 999  # -ngl 999: every layer on the GPU, as llama.cpp users write -ngl 99


@dataclass(frozen=True)
class CacheType:
    """A KV cache element type: ``block_bytes`` bytes per ``block_elems`` elements."""

    name: str
    block_elems: int
    block_bytes: int

    def row_bytes(self, elems: int) -> int:
        """Bytes of one row of ``elems`` elements. Raises ValueError if not whole blocks."""
        if elems % self.block_elems:
            raise ValueError(f"cache type {self.name} needs rows of whole {self.block_elems}-element blocks, got {elems}")
        return elems // self.block_elems * self.block_bytes


CACHE_TYPES: dict[str, CacheType] = {
    c.name: c
    for c in (
        CacheType("f32", 1, 4),
        CacheType("f16", 1, 2),
        CacheType("bf16", 1, 2),
        CacheType("q8_0", 32, 34),
        CacheType("q4_0", 32, 18),
        CacheType("q4_1", 32, 20),
        CacheType("q5_0", 32, 22),
        CacheType("q5_1", 32, 24),
    )
}


def cache_type(name: str) -> CacheType:
    try:
        return CACHE_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown cache type {name!r}; allowed: {', '.join(CACHE_TYPES)}") from None


SPLIT_MODES = ("none", "layer", "tensor")


@dataclass(frozen=True)
class Workload:
    """One decode run: a model, cache types, where decoding starts, how long it runs.

    ``context`` holds the tokens already cached per sequence (one value for
    all, or one per sequence). ``n_parallel`` sequences decode together, one
    new row each per step (llama.cpp ``--parallel``). A *unified* cache is one
    stream of cells shared by all sequences (prompts laid end to end, decode
    rows interleaved after them); otherwise the cache is split into one stream
    per sequence, each ``cells_per_stream`` cells. ``ctx_size`` is the total
    number of cells (``-c``; default: just enough, padded). ``pinned`` says
    whether the host cache is in pinned memory. ``split_mode`` places layers
    (``layer``) or attention heads (``tensor``) on several devices in the
    proportions ``tensor_split``. ``flat_prefix`` reproduces the old
    behaviour that treated a multi-stream window as one flat byte range with
    one stable prefix (for comparison only).

    ``n_gpu_layers`` is llama.cpp's ``-ngl``: the *last* ``n_gpu_layers``
    layers run on the GPU, the layers before them on the CPU with their weights
    and KV in host memory (any value >= the layer count: every layer on the
    GPU; ``gpu_layer_start`` is the first GPU layer). ``kv_gpu_layers`` is the
    fork's ``--kv-gpu-layers`` (GenerelSchwerz/llama.cpp): the first
    ``kv_gpu_layers`` attention layers keep their K and V on the device under
    ``-nkvo``; the rest are delivered from host memory.

    ``copy_span`` is upstream llama.cpp's ordered copy of a split cache (up to at least 0c1e570; the fork
    GenerelSchwerz/llama.cpp fixed it, kv-transport.md "Parallel sequences"): each attention layer's K and V view
    of the streams is copied as one extent whose stride is the whole stream, ``(n_streams - 1) x cells_per_stream
    + window`` rows, gaps included; otherwise (the default, the fork's) each stream's window is copied. It has no
    pipelined form (upstream has no pipeline): only the ordered path (depth 0) and the resident arm run it.
    """

    model: ModelShape
    cache_k: CacheType
    cache_v: CacheType
    context: tuple[int, ...] = (4096,)
    tokens: int = 4
    ctx_size: int = 0
    pinned: bool = True
    n_parallel: int = 1
    unified: bool = True
    split_mode: str = "none"
    tensor_split: tuple[float, ...] = ()
    flat_prefix: bool = False
    n_gpu_layers: int = ALL_LAYERS
    kv_gpu_layers: int = 0
    copy_span: bool = False

    def __post_init__(self) -> None:
        if not self.context:
            raise ValueError("context: need at least one value")
        for c in self.context:
            if not 1 <= c <= MAX_CONTEXT:
                raise ValueError(f"context {c} out of range; allowed: 1..{MAX_CONTEXT}")
        if self.tokens < 1:
            raise ValueError(f"tokens {self.tokens} out of range; allowed: >= 1")
        if not 1 <= self.n_parallel <= 256:
            raise ValueError(f"parallel {self.n_parallel} out of range; allowed: 1..256")
        if len(self.context) not in (1, self.n_parallel):
            raise ValueError(f"context has {len(self.context)} values; allowed: one, or one per sequence ({self.n_parallel})")
        if self.split_mode not in SPLIT_MODES:
            raise ValueError(f"split-mode {self.split_mode!r} unknown; allowed: {', '.join(SPLIT_MODES)}")
        total = sum(self.tensor_split)
        if any(not math.isfinite(p) or p < 0 for p in self.tensor_split) or (self.tensor_split and not 0 < total < math.inf):
            raise ValueError(f"tensor-split {list(self.tensor_split)} must be non-negative proportions with a positive, finite sum")
        m = self.model
        for which, ct, head_dim in (("K", self.cache_k, m.head_dim_k), ("V", self.cache_v, m.head_dim_v)):
            if (m.n_head_kv * head_dim) % ct.block_elems:
                named = f"{m.name} ({m.source})" if m.source else m.name
                raise ValueError(f"{named}: a {which} row is {m.n_head_kv} KV heads x head dim {head_dim} = "
                                 f"{m.n_head_kv * head_dim} elements, not whole {ct.block_elems}-element blocks of cache type "
                                 f"{ct.name}; allowed: a cache type whose blocks divide it (f16, f32)")
        if self.n_gpu_layers < 0:
            raise ValueError(f"n-gpu-layers {self.n_gpu_layers} out of range; allowed: >= 0 (>= {self.model.n_layers}: every layer)")
        if not 0 <= self.kv_gpu_layers <= self.model.n_attn:
            raise ValueError(f"kv-gpu-layers {self.kv_gpu_layers} out of range; allowed: 0..{self.model.n_attn} "
                             f"(the attention layers of {self.model.name})")
        if self.kv_gpu_layers and self.split_mode == "tensor":
            raise ValueError(f"kv-gpu-layers {self.kv_gpu_layers} under split-mode tensor is not modelled; allowed: "
                             "kv-gpu-layers 0, or split-mode none/layer")
        if self.kv_gpu_layers and self.gpu_layer_start:
            raise ValueError(f"kv-gpu-layers {self.kv_gpu_layers} with n-gpu-layers {self.n_gpu_layers} < "
                             f"{self.model.n_layers} layers is not modelled; allowed: one of the two")
        if self.copy_span and self.split_mode == "tensor":
            raise ValueError("kv-copy span under split-mode tensor is not modelled (upstream's copy of a head slice); "
                             "allowed: kv-copy streams, or split-mode none/layer")
        if self.copy_span and self.kv_gpu_layers:
            raise ValueError(f"kv-copy span with kv-gpu-layers {self.kv_gpu_layers}: the span copy is upstream llama.cpp's, "
                             "--kv-gpu-layers the fork's; allowed: one of the two")
        if self.ctx_size and self.ctx_size < self._cells_needed():
            raise ValueError(f"ctx-size {self.ctx_size} cannot hold context {max(self.context)} + {self.tokens} tokens "
                             f"for {self.n_parallel} sequence(s)")

    @property
    def contexts(self) -> tuple[int, ...]:
        """Tokens already cached, one entry per sequence."""
        return self.context * self.n_parallel if len(self.context) == 1 else self.context

    @property
    def gpu_layer_start(self) -> int:
        """The first layer on the GPU (llama.cpp puts the last ``-ngl`` layers there); 0: every layer on the GPU."""
        return max(0, self.model.n_layers - self.n_gpu_layers)

    @property
    def n_streams(self) -> int:
        return 1 if self.unified else self.n_parallel

    def _cells_needed(self) -> int:
        if self.unified:
            return sum(self.contexts) + self.tokens * self.n_parallel
        return (max(self.contexts) + self.tokens) * self.n_parallel

    @property
    def k_row_bytes(self) -> int:
        return self.cache_k.row_bytes(self.model.k_elems)

    @property
    def v_row_bytes(self) -> int:
        return self.cache_v.row_bytes(self.model.v_elems)

    @property
    def row_bytes(self) -> int:
        """K + V bytes of one cache row of one attention layer (``b`` in the reference)."""
        return self.k_row_bytes + self.v_row_bytes

    @property
    def cells_per_stream(self) -> int:
        """Cache rows per stream, padded to the window padding."""
        if self.ctx_size:
            return pad_rows(self.ctx_size // self.n_streams) if self.unified else self.ctx_size // self.n_streams
        return pad_rows(self._cells_needed() // self.n_streams)

    @property
    def cells(self) -> int:
        """Cache rows per layer in all streams (llama.cpp's -c)."""
        return self.cells_per_stream * self.n_streams

    def window_rows(self, position: int) -> int:
        """Rows the attention reads when the highest new row of a stream is written at ``position``."""
        return min(pad_rows(position + 1), self.cells_per_stream)

    @property
    def sequence_cells(self) -> SequenceCells:
        """Which cell holds which sequence's row (``sim.sequences``)."""
        return SequenceCells(self.contexts, self.unified, self.cells_per_stream)

    def writes(self, step: int) -> tuple[tuple[int, int], ...]:
        """(stream, row) each sequence writes at decode step ``step`` (0 = the first decode token)."""
        cells = self.sequence_cells
        return tuple(cells.cell(s, c + step) for s, c in enumerate(self.contexts))

    def devices_of_layers(self, n_devices: int) -> tuple[int, ...]:
        """Device of each layer under ``split_mode layer`` (contiguous blocks by proportion); all on 0 otherwise."""
        n = self.model.n_layers
        if self.split_mode != "layer" or n_devices < 2:
            return (0,) * n
        props = list(self.tensor_split[:n_devices]) or [1.0] * n_devices
        props += [0.0] * (n_devices - len(props))
        total = sum(props)
        bounds, acc = [], 0.0
        for p in props:
            acc += p
            bounds.append(round(acc / total * n))
        return tuple(next(d for d, b in enumerate(bounds) if layer < b) for layer in range(n))


def layers_of_ngl(ngl: int, n_layers: int) -> int:
    """``Workload.n_gpu_layers`` (repeating layers on the GPU) of llama.cpp's ``-ngl ngl``, which counts the output
    layer as the last of ``n_layers + 1``: more than ``n_layers`` puts every layer on the GPU, ``-ngl N`` the last
    ``N - 1`` (measured: ``-ngl 25`` of a 32-layer model left layers 0-7 on the CPU, docs/validation.md). Raises
    ValueError for ``-ngl`` < 1 (the output layer on the CPU, which kvpipe does not model)."""
    if ngl > n_layers:
        return ALL_LAYERS
    if ngl < 1:
        raise ValueError(f"-ngl {ngl} out of range; allowed: 1..{n_layers} (the first layers on the CPU; llama.cpp counts "
                         f"the output layer) or more (every layer on the GPU)")
    return ngl - 1


def ngl_of(wl: Workload) -> int:
    """llama.cpp's ``-ngl`` for ``wl``'s placement: its GPU layers plus the output layer (``99`` for every layer)."""
    return 99 if wl.gpu_layer_start == 0 else wl.model.n_layers - wl.gpu_layer_start + 1


def pad_rows(rows: int, pad: int = WINDOW_PAD_ROWS) -> int:
    return -(-rows // pad) * pad
