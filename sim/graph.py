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

from typing import Any

from backends.profile import ComputeModel
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
)
from sim.graph_windows import Window, layout_id, prefix_rows, staged, windows
from sim.placement import cpu_layers_seconds
from sim.workload import Workload

__all__ = ["CacheLayout", "DecodeGraph", "SmallInput", "Split", "StagedInput", "WindowPiece", "computed_once", "cost_terms_ms",
           "decode_graph", "head_ranges", "layout_id", "layout_of"]


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
    if not writes:
        writes = ((0, position),) if position is not None else wl.writes(step or 0)
    computes = compute if isinstance(compute, tuple) else (compute,)
    return _Build(wl, computes, writes, prefix_row, device_of_layer or wl.devices_of_layers(n_devices), n_devices,
                  host_attention).graph(token)


class _Build:
    """One decode graph being built: what its splits share (worked out once per graph, not per split) and the splits
    so far, in order. :meth:`graph` walks the attention layers; the methods before it build one kind of piece each."""

    def __init__(self, wl: Workload, computes: tuple[ComputeModel, ...], writes: tuple[tuple[int, int], ...],
                 prefix_row: int | None, devs: tuple[int, ...], n_devices: int, host_attention: bool) -> None:
        self.wl, self.model, self.layout = wl, wl.model, layout_of(wl)
        self.computes, self.devs, self.n_devices, self.host_attention = computes, devs, n_devices, host_attention
        self.writes, self.n_tok = writes, len(writes)
        per_stream_top: dict[int, int] = {}
        for st, r in writes:
            per_stream_top[st] = max(per_stream_top.get(st, 0), r)
        self.rows = rows = wl.window_rows(max(per_stream_top.values()))
        self.tensor = wl.split_mode == "tensor" and n_devices > 1
        self.one_device = devs.count(devs[0]) == len(devs)
        self.attn_layers = self.model.attn_layers
        self.layer_s = [c.layer_seconds(self.model.layer_weight_bytes) for c in computes]  # once per device
        self.prefix = prefix_rows(wl, self.layout, rows, writes, prefix_row)
        self.checked = rows < 1 or min(self.prefix) < 0
        self.windows = windows(wl, self.layout, rows, None)
        if self.checked:  # raises what WindowPiece raises for such a prefix or window
            staged(self.windows[0][0], self.prefix, True)
        head_rs = head_ranges(self.model.n_head_kv, wl.tensor_split, n_devices) if self.tensor else []
        self.shares = [b - a for a, b in head_rs]
        self.dev_windows = [windows(wl, self.layout, rows, hr, f"@{d}") for d, hr in enumerate(head_rs)]
        self.splits: list[Split] = []
        self.last_dev = devs[0]
        self._rows_layout()

    def _rows_layout(self) -> None:
        """Where each sequence's new row lands: cells, K and V byte offsets within an attention layer's blocks."""
        layout, n_tok = self.layout, self.n_tok
        self.cells = cells = [st * layout.cells_per_stream + r for st, r in self.writes]
        self.step_cells = cells[1] - cells[0] if n_tok > 1 else 0
        self.even = n_tok > 1 and self.step_cells > 0 and all(c == cells[0] + i * self.step_cells
                                                              for i, c in enumerate(cells))
        kb, vb = layout.k_row_bytes, layout.v_row_bytes
        self.layer_b = layout.cells * (kb + vb)  # one attention layer's K and V blocks (CacheLayout.k_offset / v_offset)
        self.k_cells, self.v_cells = [c * kb for c in cells], [layout.cells * kb + c * vb for c in cells]
        self.n_rows = n_tok if n_tok > 1 else 0

    def comp(self, d: int) -> int:
        """The compute model's index for device ``d`` (one model for all: 0)."""
        return d if d < len(self.computes) else 0

    def window_pair(self, win: tuple[Window, Window]) -> tuple[StagedInput, StagedInput]:
        span = self.layout.copy_span
        return staged(win[0], self.prefix, self.checked, span), staged(win[1], self.prefix, self.checked, span)

    def window_bytes(self, j: int) -> int:
        return self.windows[j][0][4] + self.windows[j][1][4]

    def row_inputs(self, j: int) -> tuple[SmallInput, SmallInput]:
        """Attention layer j's new K and V rows of every sequence, as inputs landing in their cache cells."""
        a, base, n_tok = self.attn_layers[j], j * self.layer_b, self.n_tok
        kb, vb = self.layout.k_row_bytes, self.layout.v_row_bytes
        if self.even or n_tok == 1:  # evenly spaced rows (one per stream, or neighbouring cells): no list of offsets
            return (new_small_input(name=f"k_cur_l{a}", nbytes=kb * n_tok, to_device=False,
                                    host_offset=base + self.k_cells[0], n_rows=self.n_rows, row_pitch=self.step_cells * kb),
                    new_small_input(name=f"v_cur_l{a}", nbytes=vb * n_tok, to_device=False,
                                    host_offset=base + self.v_cells[0], n_rows=self.n_rows, row_pitch=self.step_cells * vb))
        k_offs = tuple([base + o for o in self.k_cells])
        v_offs = tuple([base + o for o in self.v_cells])
        return (new_small_input(name=f"k_cur_l{a}", nbytes=kb * n_tok, to_device=False, host_offset=k_offs[0], row_offsets=k_offs),
                new_small_input(name=f"v_cur_l{a}", nbytes=vb * n_tok, to_device=False, host_offset=v_offs[0], row_offsets=v_offs))

    def resident_parts(self, c: ComputeModel, js: list[int]) -> tuple[float, tuple[StagedInput, ...], tuple[SmallInput, ...]]:
        """(GPU seconds, windows, new rows) of the resident attention layers ``js`` inside one split."""
        if not js:
            return 0.0, (), ()
        wins = tuple(w for j in js for w in self.window_pair(self.windows[j]))
        secs = sum(c.attention_seconds(self.windows[j][0][4] + self.windows[j][1][4]) + c.batch_seconds(self.n_tok, 0, True)
                   for j in js)
        return secs, wins, tuple(r for j in js for r in self.row_inputs(j))

    def gpu_tensor(self, name: str, layers: list[int], attn_j: int, ordered: tuple[SmallInput, ...], head: bool) -> None:
        """Tensor split: the GPU split of ``layers`` on each device, with its share of the KV heads."""
        attn_layer = self.attn_layers[attn_j] if attn_j >= 0 else -1
        for d in range(self.n_devices):
            frac = self.shares[d] / self.model.n_head_kv
            if frac == 0:
                continue
            staged_in: tuple[StagedInput, ...] = ()
            if attn_j >= 0 and not self.host_attention:
                staged_in = self.window_pair(self.dev_windows[d][attn_j])
            cd = self.comp(d)
            c = self.computes[cd]
            secs = len(layers) * self.layer_s[cd] * frac
            if self.n_tok > 1:  # as in gpu_runs
                secs += c.batch_seconds(self.n_tok, len(layers), bool(staged_in)) * frac
            if staged_in:
                secs += c.attention_seconds(self.dev_windows[d][attn_j][0][4] + self.dev_windows[d][attn_j][1][4])
            self.splits.append(new_split(index=len(self.splits), kind="gpu", device=d, name=f"{name}@{d}",
                                         compute_s=secs + (c.head_s * frac if head else 0.0), layers=tuple(layers),
                                         attn_layer=attn_layer, staged=staged_in, ordered=ordered if d == 0 else ()))

    def _runs(self, layers: list[int]) -> list[list[int]]:
        """``layers`` cut into runs of layers on one device (one run, maybe empty, on a single device)."""
        if self.one_device:
            return [layers]
        runs: list[list[int]] = []
        for layer in layers:
            if runs and self.devs[runs[-1][-1]] == self.devs[layer]:
                runs[-1].append(layer)
            else:
                runs.append([layer])
        return runs or [[]]

    def gpu_runs(self, name: str, layers: list[int], attn_j: int, ordered: tuple[SmallInput, ...], head: bool,
                 resident: tuple[int, ...]) -> None:
        """One device or a layer split: a GPU split per run of ``layers`` on one device (the first takes the window
        and the ordered inputs, the last the head; ``resident``: the device-resident attention layers among them)."""
        runs = self._runs(layers)
        for i, run in enumerate(runs):
            d = self.devs[run[0]] if run else self.last_dev
            cd = self.comp(d)
            c = self.computes[cd]
            secs = len(run) * self.layer_s[cd]
            staged_in: tuple[StagedInput, ...] = ()
            if i == 0 and attn_j >= 0 and not self.host_attention:
                staged_in = self.window_pair(self.windows[attn_j])
                secs += c.attention_seconds(self.windows[attn_j][0][4] + self.windows[attn_j][1][4])
            if self.n_tok > 1:  # one sequence: the batch term is 0.0, and secs (>= 0) + 0.0 is secs
                secs += c.batch_seconds(self.n_tok, len(run), i == 0 and attn_j >= 0)
            if resident:
                res_s, res_w, res_rows = self.resident_parts(c, [j for j in resident if self.attn_layers[j] in run])
                secs += res_s
            else:
                res_w, res_rows = (), ()
            if head and i == len(runs) - 1:
                secs += c.head_s
            extra: tuple[SmallInput, ...] = ordered if i == 0 else ()
            if d != self.last_dev:
                extra = (*extra, new_small_input(name=f"act_from{self.last_dev}", nbytes=self.model.hidden * 4 * self.n_tok,
                                                 to_device=True, src_device=self.last_dev))
            self.splits.append(new_split(index=len(self.splits), kind="gpu", device=d, name=name if i == 0 else f"{name}.{i}",
                                         compute_s=secs, layers=tuple(run),
                                         attn_layer=self.attn_layers[attn_j] if i == 0 and attn_j >= 0 else -1,
                                         staged=staged_in, ordered=extra, resident=res_w, resident_rows=res_rows))
            self.last_dev = d

    def gpu(self, name: str, layers: list[int], attn_j: int = -1, ordered: tuple[SmallInput, ...] = (),
            head: bool = False, resident: tuple[int, ...] = ()) -> None:
        """Add the GPU split(s) of ``layers``: one per device run (layer split) or one per device (tensor split);
        ``resident``: the device-resident attention layers among them (one device only, or a layer split)."""
        if self.tensor:
            self.gpu_tensor(name, layers, attn_j, ordered, head)
        else:
            self.gpu_runs(name, layers, attn_j, ordered, head, resident)

    def first_inputs(self) -> tuple[SmallInput, ...]:
        """The first GPU split's small inputs (token, positions, the KQ mask); under ``-ngl`` the CPU split of the
        layers below the first GPU layer goes first, and its activation goes up with these."""
        model, n_tok, start, c0 = self.model, self.n_tok, self.wl.gpu_layer_start, self.computes[0]
        small = tuple(new_small_input(name=f"inp_{i}", nbytes=n, to_device=True) for i, n in enumerate(model.small_inputs_bytes))
        small += (new_small_input(name="kq_mask", nbytes=self.rows * 2 * n_tok * self.layout.n_streams, to_device=True),)
        if start:
            cpu_attn = [j for j, a in enumerate(self.attn_layers) if a < start]
            self.splits.append(new_split(index=0, kind="cpu", device=-1, name="cpu_layers", layers=tuple(range(start)),
                                         compute_s=cpu_layers_seconds(c0, model.layer_weight_bytes, start,
                                                                      [self.window_bytes(j) for j in cpu_attn], n_tok)))
            small += (new_small_input(name="act_cpu", nbytes=model.hidden * 4 * n_tok, to_device=True),)
        return small

    def cpu_split(self, j: int, a: int, cpu_s: float) -> tuple[SmallInput, ...]:
        """Attention layer j's (model layer ``a``) CPU split, which stores its new rows; returns what the next GPU
        split takes up first (host attention: its output)."""
        model, n_tok = self.model, self.n_tok
        row_ins: tuple[SmallInput, ...] = self.row_inputs(j)
        after: tuple[SmallInput, ...] = ()
        split_s = cpu_s
        if self.host_attention:  # the attention itself on the CPU: Q comes down too (f32), the output goes back up
            split_s += self.computes[0].host_attention_seconds(self.window_bytes(j))
            row_ins = (new_small_input(name=f"q_cur_l{a}", nbytes=model.n_head * model.head_dim_k * 4 * n_tok,
                                       to_device=False, host_offset=row_ins[0].host_offset), *row_ins)
            after = (new_small_input(name=f"attn_out_l{a}", nbytes=model.n_head * model.head_dim_v * 4 * n_tok,
                                     to_device=True),)
        self.splits.append(new_split(index=len(self.splits), kind="cpu", device=-1, name=f"cpu_rows_l{a}",
                                     compute_s=split_s, layers=(a,), ordered=row_ins, stores_rows=True))
        return after

    def graph(self, token: int) -> DecodeGraph:
        """Walk the layers: GPU splits between the attention layers' CPU splits (a ``--kv-gpu-layers`` layer has none:
        its GPU split goes on through it), the last with the output head."""
        wl, model, c0, start = self.wl, self.model, self.computes[0], self.wl.gpu_layer_start
        small = self.first_inputs()
        on_gpu = [(j, a) for j, a in enumerate(self.attn_layers) if a >= start]
        bounds = [a for _, a in on_gpu] + [model.n_layers]
        pending: dict[str, Any] = {"name": "gpu0", "layers": list(range(start, bounds[0])), "ordered": small, "resident": ()}
        cpu_s = c0.cpu_split_s + max(0, self.n_tok - 1) * c0.cpu_row_s
        for (j, a), end in zip(on_gpu, bounds[1:], strict=True):
            if j < wl.kv_gpu_layers:  # on the device: no CPU split, the same GPU split goes on through it
                pending["layers"] += range(a, end)
                pending["resident"] += (j,)
                continue
            self.gpu(**pending)
            after = self.cpu_split(j, a, cpu_s)
            pending = {"name": f"gpu_attn_l{a}", "layers": list(range(a, end)), "attn_j": j, "ordered": after, "resident": ()}
        self.gpu(**pending, head=True)
        layout = self.layout
        return DecodeGraph(
            token=token,
            splits=tuple(self.splits),
            window_rows=self.rows,
            full_window_rows=wl.cells_per_stream,
            host_cache_bytes=layout.nbytes,
            positions=tuple(r for _, r in self.writes),
            device_kv_bytes=layout.k_offset(wl.kv_gpu_layers) if wl.kv_gpu_layers else 0,
            host_only_kv_bytes=layout.k_offset(sum(1 for a in self.attn_layers if a < start)),
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
