"""Which points the compiled evaluator answers, and why not the others.

Inside: one device, the host cache in pinned memory, the ``transport`` arm at any depth (0 = ordered, 1..14
pipelined) and budget, no mutation, no functional run, a machine with one FIFO copy engine per direction that drains
a stream's queued copies first (every preset), a ring margin of 2..32 slots, and the decode graph the evaluator's
token program is written for: the -ngl CPU layers' split (if any), split 0 on the GPU with the small inputs, then per
host-cache attention layer a CPU split (the new rows come back) and a GPU split that reads the layer's window. Any
number of sequences (unified or split cache), ``--kv-gpu-layers`` and ``-ngl`` are inside, each held to the
simulator by ``tests/sim/test_evaluator.py``. The ``resident`` arm (the whole cache on the device, no ``-nkvo``) is
inside too, pinned or not (only its warm-up graph, the cache's load, reads the host cache): the same program with the
windows already on the device, no row stores, the -ngl CPU layers' split and the small inputs. Outside (the transport
arm's pageable host cache, several devices, the copy-only and host-attention arms), callers use the simulator.
Pure; builds at most the point's first graph (kept per workload at any context).
"""

from __future__ import annotations

from typing import Any

from sim.graph import DecodeGraph
from sim.replay_keys import compute_number, free_number
from sim.run.point import Point, graph_at


def in_envelope(point: Point) -> str | None:
    """None if the evaluator answers ``point``; else why not (one line)."""
    wl, hw, cfg = point.workload, point.hardware, point.transport
    checks = (  # each reason formatted only where it applies
        (cfg.arm not in ("transport", "resident"), lambda: f"arm {cfg.arm} (the evaluator runs the transport and resident arms)"),
        (bool(cfg.mutations), lambda: f"mutated ({', '.join(sorted(cfg.mutations))})"),
        (cfg.schedule.active, lambda: f"schedule {cfg.schedule.name} (the evaluator models the reference schedule)"),
        (len(hw.devices) != 1 or wl.split_mode != "none", lambda: f"{len(hw.devices)} devices, split mode {wl.split_mode}"),
        (not wl.pinned and cfg.arm != "resident", lambda: "pageable host cache"),  # resident: only its warm-up reads the cache
        (wl.copy_span and wl.n_streams > 1 and cfg.arm != "resident",
         lambda: "kv-copy span (upstream llama.cpp's ordered copy of a split cache: the simulator's)"),
        (not 2 <= cfg.margin_slots <= 32, lambda: f"ring margin {cfg.margin_slots} (the evaluator needs 2..32)"),
    )
    for bad, why in checks:
        if bad:
            return why()
    dev = hw.devices[0]
    if dev.h2d_engines != 1 or dev.d2h_engines != 1 or not dev.copy_engine_drains_stream:
        return "copy engines other than one FIFO engine per direction that drains a stream"
    return _graph_reason(point)


_REASONS: dict[Any, str | None] = {}


def clear_reasons() -> None:
    """Forget the graph verdicts kept (a timing that must build them)."""
    _REASONS.clear()


def _graph_reason(point: Point) -> str | None:
    """Why the point's decode graph is not the shape the evaluator's program runs (None: it is). Kept for the points
    whose graphs share their shape (``sim.replay.context_free``: the same workload at any context)."""
    key = (free_number(point.workload, False), compute_number(point.hardware), point.transport.arm)
    if key not in _REASONS:
        if len(_REASONS) > 4096:
            _REASONS.clear()
        _REASONS[key] = _reason(graph_at(point, 0), point.transport.arm == "resident")
    return _REASONS[key]


def _reason(g: DecodeGraph, resident: bool = False) -> str | None:
    if g.host_writes_at_start or not g.reads_output:
        return "the graph writes host cells at its start or its output is not read"
    if resident:  # the windows on the device and no row stores: each split's own inputs, from and to this device
        for s in g.splits:
            if any(i.src_device >= 0 or i.to_device != (s.kind == "gpu") for i in s.ordered):
                return f"split {s.name}: inputs from another device or the wrong way"
        return None
    splits = g.splits
    if splits[0].kind == "cpu" and not splits[0].ordered and not splits[0].stores_rows:  # -ngl: the CPU layers first
        splits = splits[1:]
    first, rest = splits[0], splits[1:]
    if first.kind != "gpu" or first.staged or len(rest) % 2:
        return "the graph does not open with a GPU split of small inputs (after the -ngl CPU layers)"
    for cpu, gpu in zip(rest[::2], rest[1::2], strict=True):
        if cpu.kind != "cpu" or gpu.kind != "gpu" or not gpu.staged or gpu.ordered:
            return f"split {gpu.name}: not a CPU split followed by a GPU split that reads a window"
        if any(i.to_device for i in cpu.ordered) or any(i.src_device >= 0 for s in (cpu, gpu) for i in s.ordered):
            return f"split {cpu.name}: inputs other than new rows coming back"
    return None
