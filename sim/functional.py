"""The default functional workload: a CI-sized decode run with the events that reuse cells.

``kvpipe simulate --functional`` runs each grid point *scaled*: the model keeps
its KV geometry (KV heads, head dims, cache types: every staged byte is a real
cache byte) and its attention pattern, cut to the first ``FUNCTIONAL_ATTN``
attention layers, with weights shrunk so the link, not the compute, is the
bottleneck (a delivery is still in flight when the host moves on, which is
where unordered accesses show in the bytes); each sequence's context is the
point's divided by 32, clipped to 64..1024 rows; ``--kv-gpu-layers`` is clipped to its attention layers, and
``-ngl`` below the layer count is refused (the program models GPU kernels). The decode program
(``sim.program``) runs on it with its default (small) sizes.

With ``--parallel N`` the N sequences decode together over a unified cache or
a cache split into streams (``--no-kv-unified``), each from its own prompt
(the program keys each sequence's rows by its index). The batching schedule
is fixed: every graph decodes one token of every sequence. "Row r" of a
sequence below is its r-th token, in the cell ``sim.sequences`` assigns it.

Events of the schedule, in order (``events(point)`` lists them):

1. ``decode``: two plain decode steps at the context (the first fixes the
   stable prefix the ``stale-prefix`` mutation keeps);
2. ``ubatch``: one step whose output the loop does not read -- an intermediate
   ubatch, with no host sync at its end, so its last deliveries may still be
   in flight when the next graph starts (``no-boundary-wait`` bites here);
3. ``shift``: a context shift of every sequence (llama.cpp's, with the cells
   compacted): the host rewrites rows K..p of every layer's K and V at the
   start of the graph (``DecodeGraph.host_writes_at_start``; K = a quarter of
   the context, p the ubatch's row) and the write position drops by half the
   context, below the windows delivered so far. The rewrite covers the row the
   ubatch's last late copy reads (``no-boundary-wait``); the lower position
   makes the first graph's stable prefix cover the row this graph writes
   (``stale-prefix``);
4. ``reset`` (several sequences only): sequence ``RESET_SEQ`` is reset -- the
   host writes a new prompt into its rows 0..``RESET_ROWS`` at the start of the
   graph and it writes at row ``RESET_ROWS`` while the others go on high up (a
   per-stream stable prefix over a split cache; over a unified cache the one
   stream's prefix drops to that cell and the rows above go late);
5. ``decode``: plain steps after that, up to the point's token count.

Release waits and host-side recycling are not exercised by any of these: see
docs/correctness.md for why and for what does exercise them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from sim.errors import InputError
from sim.graph import DecodeGraph, decode_graph, layout_of
from sim.program import PROGRAM_CACHE_TYPES
from sim.run.point import Point
from sim.workload import ModelShape, Workload, pad_rows

FUNCTIONAL_ATTN = 6
MIN_CONTEXT, MAX_CONTEXT = 64, 1024
WEIGHT_BYTES_PER_LAYER = 1 << 20
MIN_GRAPHS = 6
RESET_SEQ, RESET_ROWS = 1, 8


def functional_model(model: ModelShape) -> ModelShape:
    """``model`` cut after its ``FUNCTIONAL_ATTN``-th attention layer, with small weights (timing only)."""
    attn = model.attn_layers[:FUNCTIONAL_ATTN]
    n_layers = min(model.n_layers, attn[-1] + 1 + (1 if len(model.attn_layers) > len(attn) else 0))
    return replace(model, name=f"{model.name}-functional", n_layers=n_layers, attn_layers=attn,
                   weight_bytes=WEIGHT_BYTES_PER_LAYER * n_layers)


def functional_point(point: Point) -> Point:
    """The CI-sized version of ``point``: same hardware, cache types, sequences and transport, scaled model and contexts."""
    wl = point.workload
    for ct in (wl.cache_k, wl.cache_v):
        if ct.name not in PROGRAM_CACHE_TYPES:
            raise InputError(f"--functional supports cache types {', '.join(PROGRAM_CACHE_TYPES)}; got {ct.name}")
    if wl.split_mode != "none":
        raise InputError("--functional runs on one device for now (no split mode)")
    if wl.gpu_layer_start:
        raise InputError(f"--functional runs every layer on the GPU (the program models GPU kernels); got -ngl "
                         f"{wl.n_gpu_layers} of {wl.model.n_layers} layers")
    contexts = tuple(max(MIN_CONTEXT, min(MAX_CONTEXT, c // 32)) for c in wl.context)
    tokens = max(wl.tokens, MIN_GRAPHS)
    ctx_size = 0  # a split cache's streams scaled with the contexts (no shorter than the scaled window)
    if wl.ctx_size and not wl.unified:
        ctx_size = wl.n_streams * max(pad_rows(max(contexts) + tokens), wl.cells_per_stream // 32)
    fwl = Workload(functional_model(wl.model), wl.cache_k, wl.cache_v, contexts, tokens=tokens, pinned=wl.pinned,
                   n_parallel=wl.n_parallel, unified=wl.unified, flat_prefix=wl.flat_prefix,
                   kv_gpu_layers=min(wl.kv_gpu_layers, FUNCTIONAL_ATTN), ctx_size=ctx_size, copy_span=wl.copy_span)
    return replace(point, workload=fwl)


def events(point: Point) -> list[tuple[str, tuple[int, ...]]]:
    """The schedule: (event, row of each sequence's new token) per graph. ``point`` is already scaled."""
    ctxs = point.workload.contexts
    rows = lambda d: tuple(c + d for c in ctxs)  # noqa: E731
    shifted = tuple(c + 3 - c // 2 for c in ctxs)
    out = [("decode", rows(0)), ("decode", rows(1)), ("ubatch", rows(2)), ("shift", shifted)]
    if len(ctxs) > 1:
        out.append(("reset", tuple(RESET_ROWS if s == RESET_SEQ else r + 1 for s, r in enumerate(shifted))))
    while len(out) < point.workload.tokens:
        out.append(("decode", tuple(r + 1 for r in out[-1][1])))
    return out


def functional_graphs(point: Point) -> Iterator[DecodeGraph]:
    """The graphs of the schedule, in order. ``point`` is already scaled (see :func:`functional_point`)."""
    wl = point.workload
    compute = point.hardware.devices[0].compute
    seqs = wl.sequence_cells
    for token, (event, rows) in enumerate(events(point)):
        g = decode_graph(wl, compute, token=token, writes=tuple(seqs.cell(s, r) for s, r in enumerate(rows)))
        if event == "ubatch":
            g = replace(g, reads_output=False)
        elif event == "shift":
            g = replace(g, host_writes_at_start=host_writes(wl, [(s, c // 4, c + 3) for s, c in enumerate(wl.contexts)]))
        elif event == "reset":
            g = replace(g, host_writes_at_start=host_writes(wl, [(RESET_SEQ, 0, RESET_ROWS)]))
        yield g


def host_writes(wl: Workload, rows: list[tuple[int, int, int]]) -> tuple[tuple[int, int], ...]:
    """(offset, nbytes) of the host-cache K and V cells of rows ``row0..row1`` of each ``(seq, row0, row1)``, every layer."""
    layout = layout_of(wl)
    runs = wl.sequence_cells.runs(rows)
    writes = []
    for j in range(wl.model.n_attn):
        writes += [(layout.k_offset(j, st, c0), (c1 - c0) * wl.k_row_bytes) for st, c0, c1 in runs]
        writes += [(layout.v_offset(j, st, c0), (c1 - c0) * wl.v_row_bytes) for st, c0, c1 in runs]
    return tuple(writes)
