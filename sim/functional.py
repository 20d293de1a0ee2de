"""The default functional workload: a CI-sized decode run with the events that reuse cells.

``kvpipe simulate --functional`` runs each grid point *scaled*: the model keeps
its KV geometry (KV heads, head dims, cache types: every staged byte is a real
cache byte) and its attention pattern, cut to the first ``FUNCTIONAL_ATTN``
attention layers, with weights shrunk so the link, not the compute, is the
bottleneck (a delivery is still in flight when the host moves on, which is
where unordered accesses show in the bytes); the context is the point's
divided by 32, clipped to 64..1024 rows. The decode program (``sim.program``)
runs on it with its default (small) sizes.

Events of the schedule, in order (``events(point)`` lists them):

1. ``decode``: two plain decode steps at the context (the first fixes the
   stable prefix the ``stale-prefix`` mutation keeps);
2. ``ubatch``: one step whose output the loop does not read -- an intermediate
   ubatch, with no host sync at its end, so its last deliveries may still be
   in flight when the next graph starts (``no-boundary-wait`` bites here);
3. ``shift``: a context shift (llama.cpp's, with the cells compacted): the host
   rewrites cells K..p of every layer's K and V at the start of the graph
   (``DecodeGraph.host_writes_at_start``; K = a quarter of the context, p the
   ubatch's row) and the write position drops by half the context, below the
   windows delivered so far. The rewrite covers the row the ubatch's last late
   copy reads (``no-boundary-wait``); the lower position makes the first
   graph's stable prefix cover the row this graph writes (``stale-prefix``);
4. ``decode``: plain steps after the reset, up to the point's token count.

Release waits and host-side recycling are not exercised by any of these: see
docs/correctness.md for why and for what does exercise them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from sim.graph import DecodeGraph, decode_graph, layout_of
from sim.grid import UsageError
from sim.program import PROGRAM_CACHE_TYPES
from sim.simulate import Point
from sim.workload import ModelShape, Workload

FUNCTIONAL_ATTN = 6
MIN_CONTEXT, MAX_CONTEXT = 64, 1024
WEIGHT_BYTES_PER_LAYER = 1 << 20
MIN_GRAPHS = 6


def functional_model(model: ModelShape) -> ModelShape:
    """``model`` cut after its ``FUNCTIONAL_ATTN``-th attention layer, with small weights (timing only)."""
    attn = model.attn_layers[:FUNCTIONAL_ATTN]
    n_layers = min(model.n_layers, attn[-1] + 1 + (1 if len(model.attn_layers) > len(attn) else 0))
    return replace(model, name=f"{model.name}-functional", n_layers=n_layers, attn_layers=attn,
                   weight_bytes=WEIGHT_BYTES_PER_LAYER * n_layers)


def functional_point(point: Point) -> Point:
    """The CI-sized version of ``point``: same hardware, cache types and transport, scaled model and context."""
    wl = point.workload
    for ct in (wl.cache_k, wl.cache_v):
        if ct.name not in PROGRAM_CACHE_TYPES:
            raise UsageError(f"--functional supports cache types {', '.join(PROGRAM_CACHE_TYPES)}; got {ct.name}")
    if getattr(wl, "n_parallel", 1) > 1 or getattr(wl, "split_mode", "none") != "none":
        raise UsageError("--functional runs one sequence on one device for now (no --parallel, no split mode)")
    ctx = max(MIN_CONTEXT, min(MAX_CONTEXT, point.context // 32))
    tokens = max(wl.tokens, MIN_GRAPHS)
    fwl = Workload(functional_model(wl.model), wl.cache_k, wl.cache_v, (ctx,), tokens=tokens, pinned=wl.pinned)
    return replace(point, workload=fwl)


def events(point: Point) -> list[tuple[str, int]]:
    """The schedule: (event, position of the new row) per graph. ``point`` is already scaled."""
    ctx, n = point.context, point.workload.tokens
    shifted = ctx + 3 - ctx // 2
    out = [("decode", ctx), ("decode", ctx + 1), ("ubatch", ctx + 2), ("shift", shifted)]
    out += [("decode", shifted + i) for i in range(1, n - 3)]
    return out


def functional_graphs(point: Point) -> Iterator[DecodeGraph]:
    """The graphs of the schedule, in order. ``point`` is already scaled (see :func:`functional_point`)."""
    wl = point.workload
    compute = point.hardware.devices[0].compute
    layout = layout_of(wl)
    keep, top = point.context // 4, point.context + 3
    for token, (event, pos) in enumerate(events(point)):
        g = decode_graph(wl, compute, position=pos, token=token)
        if event == "ubatch":
            g = replace(g, reads_output=False)
        elif event == "shift":
            writes = []
            for j in range(wl.model.n_attn):
                writes.append((layout.k_offset(j, 0, keep), (top - keep) * wl.k_row_bytes))
                writes.append((layout.v_offset(j, 0, keep), (top - keep) * wl.v_row_bytes))
            g = replace(g, host_writes_at_start=tuple(writes))
        yield g
