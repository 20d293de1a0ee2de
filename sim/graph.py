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

import functools
import itertools
from typing import Any

from backends.profile import ComputeModel
from sim.bindings import cache_input
from sim.graph_parts import (
    CacheLayout,
    DecodeGraph,
    SmallInput,
    Split,
    StagedInput,
    WindowPiece,
    computed_once,
    head_ranges,
    layout_of,
    new_small_input,
    new_split,
    new_staged_input,
)
from sim.placement import cpu_layers_seconds
from sim.workload import Workload

__all__ = ["CacheLayout", "DecodeGraph", "SmallInput", "Split", "StagedInput", "WindowPiece", "computed_once", "cost_terms_ms",
           "decode_graph", "head_ranges", "layout_id", "layout_of"]


_ID_BLOCKS: dict[Any, int] = {}  # (layout, KV heads, rows, head slice) -> the first of its windows' layout ids
ID_BLOCKS_KEPT = 1 << 16  # bounded; ids are never reused, so what was derived from an old one stays right
ID_BLOCK, _NEXT_BLOCK = 1 << 20, itertools.count()  # ids a block spans (two per attention layer); next() is atomic


def layout_id(wl: Workload, layout: CacheLayout, j: int, kind: str, rows: int, heads: tuple[int, int] | None) -> int:
    """The id of the layout :func:`_windows` gives layer ``j``'s ``kind`` window of ``rows`` rows (``heads``: a tensor
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
_Window = tuple[str, int, int, tuple[tuple[int, int, int, int, int, int], ...], int]
_WINDOWS: dict[Any, tuple[tuple[_Window, _Window], ...]] = {}  # see _windows
WINDOWS_KEPT = 512  # window tables (one per window size, head slice and workload shape); a full cache is emptied


def _windows(wl: Workload, layout: CacheLayout, rows: int, heads: tuple[int, int] | None,
             suffix: str = "") -> tuple[tuple[_Window, _Window], ...]:
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


def _prefix_rows(wl: Workload, layout: CacheLayout, rows: int, writes: tuple[tuple[int, int], ...],
                 prefix_row: int | None) -> list[int]:
    """Each stream's stable prefix, in rows (the same for every layer and for K and V)."""
    lowest: dict[int, int] = {}  # stream -> the lowest row any of its sequences writes
    for st, r in writes:
        if r < lowest.get(st, r + 1):
            lowest[st] = r
    streams = range(layout.n_streams)
    prefix_rows = [min(rows, lowest.get(s, rows) if prefix_row is None else prefix_row) for s in streams]
    if wl.flat_prefix and layout.n_streams > 1:
        # Old behaviour: one prefix over the flat window; the lowest-writing stream caps every stream above it.
        flat = min(s * rows + prefix_rows[s] for s in streams)
        prefix_rows = [max(0, min(rows, flat - s * rows)) for s in streams]
    return prefix_rows


_new_piece = functools.partial(tuple.__new__, WindowPiece)  # WindowPiece(*fields) without its checks (see _staged)


def _staged(win: _Window, prefix_rows: list[int], checked: bool) -> StagedInput:
    """The staged input of one window with each stream's prefix (``checked``: build the pieces through
    ``WindowPiece``'s checks; needed only where a prefix is negative or the window has no rows)."""
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
    return new_staged_input(name=name, layer=layer, pieces=pieces, layout_id=lid)


def decode_graph(
    wl: Workload,
    compute: ComputeModel | tuple[ComputeModel, ...],
    position: int | None = None,
    token: int = 0,
    prefix_row: int | None = None,
    device_of_layer: tuple[int, ...] | None = None,
    step: int | None = None,
    n_devices: int = 1,
    writes: tuple[tuple[int, int], ...] = (),
    host_attention: bool = False,
) -> DecodeGraph:
    """The graph of one decode step.

    Either ``position`` (a single sequence whose new row is written there),
    ``step`` (decode step of every sequence of ``wl``; see
    ``Workload.writes``) or ``writes`` ((stream, row) of each sequence's new
    row, in sequence order; see ``sim.sequences``). ``prefix_row``
    overrides the stable prefix (rows below it go early). Layers go to devices by ``device_of_layer`` (default:
    ``wl.devices_of_layers(n_devices)``); under ``split_mode tensor`` every
    GPU split runs on each of ``n_devices`` devices with its share of the KV
    heads. ``compute`` is one model for all devices or one per device.
    ``host_attention`` builds upstream llama.cpp's ``-nkvo`` graph: each
    attention layer's CPU split also runs the attention over the host cache
    (its window bytes at ``host_attention_seconds``), the GPU splits carry no
    window and no attention, the CPU split takes Q as well as the new K/V rows
    (D2H) and the next GPU split takes the attention output (H2D).

    ``wl.kv_gpu_layers`` (the fork's ``--kv-gpu-layers``): attention layer j <
    N has no CPU split and no window to deliver; its attention runs inside the
    GPU split that reaches it (``Split.resident``: the GPU splits around it are
    one), over the device's copy of the host cache's first
    ``DecodeGraph.device_kv_bytes``, where its new rows go too
    (``Split.resident_rows``). ``wl.gpu_layer_start`` (llama.cpp's ``-ngl``):
    the layers below it run first, in one CPU split (``sim.placement``), and
    their activation goes up with the first GPU split's inputs.
    """
    model = wl.model
    layout = layout_of(wl)
    if not writes:
        writes = ((0, position),) if position is not None else wl.writes(step or 0)
    per_stream_top: dict[int, int] = {}
    for st, r in writes:
        per_stream_top[st] = max(per_stream_top.get(st, 0), r)
    rows = wl.window_rows(max(per_stream_top.values()))
    computes = compute if isinstance(compute, tuple) else (compute,)
    tensor = wl.split_mode == "tensor" and n_devices > 1
    devs = device_of_layer or wl.devices_of_layers(n_devices)
    one_device = devs.count(devs[0]) == len(devs)
    kb, vb = layout.k_row_bytes, layout.v_row_bytes
    n_tok = len(writes)
    attn_layers = model.attn_layers
    layer_s = [c.layer_seconds(model.layer_weight_bytes) for c in computes]  # pure: once per device, not per split
    prefix_rows = _prefix_rows(wl, layout, rows, writes, prefix_row)
    checked = rows < 1 or min(prefix_rows) < 0
    windows = _windows(wl, layout, rows, None)
    if checked:  # raises what WindowPiece raises for such a prefix or window
        _staged(windows[0][0], prefix_rows, True)

    def comp(d: int) -> int:
        return d if d < len(computes) else 0

    head_rs = head_ranges(model.n_head_kv, wl.tensor_split, n_devices) if tensor else []
    shares = [b - a for a, b in head_rs]
    dev_windows = [_windows(wl, layout, rows, hr, f"@{d}") for d, hr in enumerate(head_rs)]

    splits: list[Split] = []
    last_dev = [devs[0]]

    def window_pair(win: tuple[_Window, _Window]) -> tuple[StagedInput, StagedInput]:
        return _staged(win[0], prefix_rows, checked), _staged(win[1], prefix_rows, checked)

    def resident_parts(c: ComputeModel, js: list[int]) -> tuple[float, tuple[StagedInput, ...], tuple[SmallInput, ...]]:
        """(GPU seconds, windows, new rows) of the resident attention layers ``js`` inside one split."""
        if not js:
            return 0.0, (), ()
        wins = tuple(w for j in js for w in window_pair(windows[j]))
        secs = sum(c.attention_seconds(windows[j][0][4] + windows[j][1][4]) + c.batch_seconds(n_tok, 0, True) for j in js)
        return secs, wins, tuple(r for j in js for r in row_inputs(j))

    def gpu(name: str, layers: list[int], attn_j: int = -1, ordered: tuple[SmallInput, ...] = (), head: bool = False,
            resident: tuple[int, ...] = ()) -> None:
        """Add the GPU split(s) of ``layers``: one per device run (layer split) or one per device (tensor split);
        ``resident``: the device-resident attention layers among them (one device only, or a layer split)."""
        attn_layer = attn_layers[attn_j] if attn_j >= 0 else -1
        if tensor:
            for d in range(n_devices):
                frac = shares[d] / model.n_head_kv
                if frac == 0:
                    continue
                staged: tuple[StagedInput, ...] = ()
                if attn_j >= 0 and not host_attention:
                    staged = window_pair(dev_windows[d][attn_j])
                cd = comp(d)
                c = computes[cd]
                secs = len(layers) * layer_s[cd] * frac
                if n_tok > 1:  # as below
                    secs += c.batch_seconds(n_tok, len(layers), bool(staged)) * frac
                if staged:
                    secs += c.attention_seconds(dev_windows[d][attn_j][0][4] + dev_windows[d][attn_j][1][4])
                splits.append(new_split(index=len(splits), kind="gpu", device=d, name=f"{name}@{d}",
                                        compute_s=secs + (c.head_s * frac if head else 0.0), layers=tuple(layers),
                                        attn_layer=attn_layer, staged=staged, ordered=ordered if d == 0 else ()))
            return
        runs: list[list[int]] = [layers] if one_device else []  # runs of layers on one device
        if not one_device:
            for layer in layers:
                if runs and devs[runs[-1][-1]] == devs[layer]:
                    runs[-1].append(layer)
                else:
                    runs.append([layer])
        if not runs:
            runs = [[]]
        for i, run in enumerate(runs):
            d = devs[run[0]] if run else last_dev[0]
            cd = comp(d)
            c = computes[cd]
            secs = len(run) * layer_s[cd]
            staged = ()
            if i == 0 and attn_j >= 0 and not host_attention:
                staged = window_pair(windows[attn_j])
                secs += c.attention_seconds(windows[attn_j][0][4] + windows[attn_j][1][4])
            if n_tok > 1:  # one sequence: the batch term is 0.0, and secs (>= 0) + 0.0 is secs
                secs += c.batch_seconds(n_tok, len(run), i == 0 and attn_j >= 0)
            if resident:
                res_s, res_w, res_rows = resident_parts(c, [j for j in resident if attn_layers[j] in run])
                secs += res_s
            else:
                res_w, res_rows = (), ()
            if head and i == len(runs) - 1:
                secs += c.head_s
            extra: tuple[SmallInput, ...] = ordered if i == 0 else ()
            if d != last_dev[0]:
                extra = (*extra, new_small_input(name=f"act_from{last_dev[0]}", nbytes=model.hidden * 4 * n_tok,
                                                 to_device=True, src_device=last_dev[0]))
            splits.append(new_split(index=len(splits), kind="gpu", device=d, name=name if i == 0 else f"{name}.{i}",
                                    compute_s=secs, layers=tuple(run), attn_layer=attn_layer if i == 0 else -1,
                                    staged=staged, ordered=extra, resident=res_w, resident_rows=res_rows))
            last_dev[0] = d

    cells = [st * layout.cells_per_stream + r for st, r in writes]  # each sequence's new row, as a cell of the cache
    step_cells = cells[1] - cells[0] if n_tok > 1 else 0
    even = n_tok > 1 and step_cells > 0 and all(c == cells[0] + i * step_cells for i, c in enumerate(cells))
    layer_b = layout.cells * (kb + vb)  # one attention layer's K and V blocks (CacheLayout.k_offset / v_offset)
    k_cells, v_cells = [c * kb for c in cells], [layout.cells * kb + c * vb for c in cells]
    n_rows = n_tok if n_tok > 1 else 0

    def row_inputs(j: int) -> tuple[SmallInput, SmallInput]:
        """Attention layer j's new K and V rows of every sequence, as inputs landing in their cache cells."""
        a, base = attn_layers[j], j * layer_b
        if even or n_tok == 1:  # evenly spaced rows (one per stream, or neighbouring cells): no list of offsets
            return (new_small_input(name=f"k_cur_l{a}", nbytes=kb * n_tok, to_device=False, host_offset=base + k_cells[0],
                                    n_rows=n_rows, row_pitch=step_cells * kb),
                    new_small_input(name=f"v_cur_l{a}", nbytes=vb * n_tok, to_device=False, host_offset=base + v_cells[0],
                                    n_rows=n_rows, row_pitch=step_cells * vb))
        k_offs = tuple([base + o for o in k_cells])
        v_offs = tuple([base + o for o in v_cells])
        return (new_small_input(name=f"k_cur_l{a}", nbytes=kb * n_tok, to_device=False, host_offset=k_offs[0], row_offsets=k_offs),
                new_small_input(name=f"v_cur_l{a}", nbytes=vb * n_tok, to_device=False, host_offset=v_offs[0], row_offsets=v_offs))

    def window_bytes(j: int) -> int:
        return windows[j][0][4] + windows[j][1][4]

    start = wl.gpu_layer_start
    c0 = computes[0]
    small = tuple(new_small_input(name=f"inp_{i}", nbytes=n, to_device=True) for i, n in enumerate(model.small_inputs_bytes))
    small += (new_small_input(name="kq_mask", nbytes=rows * 2 * n_tok * layout.n_streams, to_device=True),)
    if start:  # -ngl: the layers below ``start`` on the CPU first; their activation goes up with the GPU's first inputs
        cpu_attn = [j for j, a in enumerate(attn_layers) if a < start]
        splits.append(new_split(index=0, kind="cpu", device=-1, name="cpu_layers", layers=tuple(range(start)),
                                compute_s=cpu_layers_seconds(c0, model.layer_weight_bytes, start,
                                                             [window_bytes(j) for j in cpu_attn], n_tok)))
        small += (new_small_input(name="act_cpu", nbytes=model.hidden * 4 * n_tok, to_device=True),)
    on_gpu = [(j, a) for j, a in enumerate(attn_layers) if a >= start]
    bounds = [a for _, a in on_gpu] + [model.n_layers]
    pending: dict[str, Any] = {"name": "gpu0", "layers": list(range(start, bounds[0])), "ordered": small, "resident": ()}
    cpu_s = c0.cpu_split_s + max(0, n_tok - 1) * c0.cpu_row_s
    for (j, a), end in zip(on_gpu, bounds[1:], strict=True):
        if j < wl.kv_gpu_layers:  # on the device: no CPU split, the same GPU split goes on through it
            pending["layers"] += range(a, end)
            pending["resident"] += (j,)
            continue
        gpu(**pending)
        row_ins: tuple[SmallInput, ...] = row_inputs(j)
        after: tuple[SmallInput, ...] = ()
        split_s = cpu_s
        if host_attention:  # the attention itself on the CPU: Q comes down too (f32), the output goes back up
            split_s += c0.host_attention_seconds(window_bytes(j))
            row_ins = (new_small_input(name=f"q_cur_l{a}", nbytes=model.n_head * model.head_dim_k * 4 * n_tok,
                                       to_device=False, host_offset=row_ins[0].host_offset), *row_ins)
            after = (new_small_input(name=f"attn_out_l{a}", nbytes=model.n_head * model.head_dim_v * 4 * n_tok, to_device=True),)
        splits.append(new_split(index=len(splits), kind="cpu", device=-1, name=f"cpu_rows_l{a}", compute_s=split_s,
                                layers=(a,), ordered=row_ins, stores_rows=True))
        pending = {"name": f"gpu_attn_l{a}", "layers": list(range(a, end)), "attn_j": j, "ordered": after, "resident": ()}
    gpu(**pending, head=True)
    return DecodeGraph(
        token=token,
        splits=tuple(splits),
        window_rows=rows,
        full_window_rows=wl.cells_per_stream,
        host_cache_bytes=layout.nbytes,
        positions=tuple(r for _, r in writes),
        device_kv_bytes=layout.k_offset(wl.kv_gpu_layers) if wl.kv_gpu_layers else 0,
        host_only_kv_bytes=layout.k_offset(sum(1 for a in attn_layers if a < start)),
    )


def cost_terms_ms(wl: Workload, compute: ComputeModel, graph: DecodeGraph) -> dict[str, float]:
    """The compute model's terms of one decode step, ms summed over its splits (one device's model; ``simulate --json``
    shows them as ``batch_ms``): the weights, read once however many sequences; the attention over every sequence's
    cells; what each sequence past the first adds to the GPU splits (``per_sequence_gpu``) and to the CPU splits'
    row stores (``per_sequence_cpu``); the CPU splits' fixed part and, on the host-attention arm, the CPU's attention;
    with -ngl, the CPU split of the layers on the CPU (``cpu_layers``). Device-resident attention layers count in
    ``attention``.
    Pure; does not block.
    """
    key = ("cost_terms_ms", compute, wl.model.layer_weight_bytes)
    kept = graph.memo.get(key)
    if kept is None:
        kept = graph.memo[key] = _cost_terms_ms(wl, compute, graph)
    return dict(kept)


def _cost_terms_ms(wl: Workload, compute: ComputeModel, graph: DecodeGraph) -> dict[str, float]:
    n = len(graph.positions)
    out = {"weights": 0.0, "attention": 0.0, "per_sequence_gpu": 0.0, "cpu_splits": 0.0, "per_sequence_cpu": 0.0,
           "host_attention": 0.0, "sequences": float(n)}
    for s in graph.splits:
        if s.kind == "gpu":
            out["weights"] += len(s.layers) * compute.layer_seconds(wl.model.layer_weight_bytes)
            if s.staged:
                out["attention"] += compute.attention_seconds(sum(i.nbytes for i in s.staged))
            out["per_sequence_gpu"] += compute.batch_seconds(n, len(s.layers), s.attn_layer >= 0 and bool(s.staged))
            for k, v in zip(s.resident[::2], s.resident[1::2], strict=True):  # device-resident attention layers
                out["attention"] += compute.attention_seconds(k.nbytes + v.nbytes)
                out["per_sequence_gpu"] += compute.batch_seconds(n, 0, True)
        elif s.name == "cpu_layers":  # -ngl: the layers on the CPU (only in such rows)
            out["cpu_layers"] = s.compute_s
        else:
            row = max(0, n - 1) * compute.cpu_row_s
            out["cpu_splits"] += compute.cpu_split_s
            out["per_sequence_cpu"] += row
            out["host_attention"] += max(0.0, s.compute_s - compute.cpu_split_s - row)
    return {k: v if k == "sequences" else v * 1e3 for k, v in out.items()}
