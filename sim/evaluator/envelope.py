"""Which points the compiled evaluator answers (phase 1), and why not the others.

Inside: one device, the host cache in pinned memory, one sequence, the ``transport`` arm at any depth (0 = ordered,
1..14 pipelined) and budget, no mutation, no functional run, a machine with one FIFO copy engine per direction
that drains a stream's queued copies first (every preset), a ring margin of at least two slots, and the decode
graph the evaluator's token program is written for: split 0 on the GPU with the small inputs, then per attention
layer a CPU split (the new rows come back) and a GPU split that reads the layer's window. Outside, callers use the
simulator. Pure; builds at most the point's first graph (kept, see ``sim.simulate.graph_at``).
"""

from __future__ import annotations

from sim.graph import DecodeGraph
from sim.simulate import Point, graph_at


def in_envelope(point: Point) -> str | None:
    """None if the evaluator answers ``point``; else why not (one line)."""
    wl, hw, cfg = point.workload, point.hardware, point.transport
    checks = (
        (cfg.arm != "transport", f"arm {cfg.arm} (the evaluator runs the transport arm)"),
        (bool(cfg.mutations), f"mutated ({', '.join(sorted(cfg.mutations))})"),
        (cfg.schedule.active, f"schedule {cfg.schedule.name} (the evaluator models the reference schedule)"),
        (len(hw.devices) != 1 or wl.split_mode != "none", f"{len(hw.devices)} devices, split mode {wl.split_mode}"),
        (not wl.pinned, "pageable host cache"),
        (wl.n_parallel != 1, f"{wl.n_parallel} sequences"),
        (getattr(wl, "kv_gpu_layers", 0) != 0, "kv_gpu_layers set (KV on the device for some layers)"),
        (getattr(wl, "gpu_layer_start", 0) != 0, "some layers on the CPU (n_gpu_layers)"),
        (cfg.margin_slots < 2, f"ring margin {cfg.margin_slots} (the evaluator needs >= 2)"),
    )
    for bad, why in checks:
        if bad:
            return why
    dev = hw.devices[0]
    if dev.h2d_engines != 1 or dev.d2h_engines != 1 or not dev.copy_engine_drains_stream:
        return "copy engines other than one FIFO engine per direction that drains a stream"
    return _graph_reason(point)


def _graph_reason(point: Point) -> str | None:
    """Why the point's decode graph is not the shape the evaluator's program runs (None: it is). Kept with the graph."""
    g = graph_at(point, 0)
    if "evaluator_reason" not in g.memo:
        g.memo["evaluator_reason"] = _reason(g)
    reason: str | None = g.memo["evaluator_reason"]
    return reason


def _reason(g: DecodeGraph) -> str | None:
    if g.host_writes_at_start or not g.reads_output:
        return "the graph writes host cells at its start or its output is not read"
    first, rest = g.splits[0], g.splits[1:]
    if first.kind != "gpu" or first.staged or len(rest) % 2:
        return "the graph does not open with a GPU split of small inputs"
    for cpu, gpu in zip(rest[::2], rest[1::2], strict=True):
        if cpu.kind != "cpu" or gpu.kind != "gpu" or not gpu.staged or gpu.ordered:
            return f"split {gpu.name}: not a CPU split followed by a GPU split that reads a window"
        if any(i.to_device for i in cpu.ordered) or any(i.src_device >= 0 for s in (cpu, gpu) for i in s.ordered):
            return f"split {cpu.name}: inputs other than new rows coming back"
    return None
