"""Where the pipeline's gain peaks, two ways: the closed form (copy = compute) and a scan of simulated windows.

The gain of a depth over the ordered path rises with the window while a token is compute-bound (each extra row adds
copy time the ring hides), peaks where copy ~ compute, and falls once the copies dominate. The closed form solves
``rows* = compute x BW / (n_attn x b)`` (``compute``: the token's GPU compute at that window, so a fixed point;
``BW``: the pinned H2D bandwidth of a delivery that size); the ring there is ``(n_slots / n_attn) x compute x BW``.
The simulated peak is the best window of a log scan, then 256-row steps near the top (:func:`simulated_peak`), each
window answered by the plan's runner (the evaluator where it can). :func:`peak_note` says, in numbers from the
simulated peak's row, why the two differ.

Units: seconds and bytes inside; ms, MiB, GB/s and rows in what the plan reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvpipe.plan_run import PlanRequest, Runner, points
from sim.errors import InputError
from sim.graph import decode_graph
from sim.rows import with_gains
from sim.run.point import Point
from sim.transport.config import MIB, TransportConfig
from sim.workload import MAX_CONTEXT, WINDOW_PAD_ROWS, Workload


@dataclass(frozen=True)
class ClosedForm:
    """The copy = compute balance: window rows, ring MiB, and the compute (ms) and bandwidth (GB/s) used."""

    rows: float
    ring_mib: float
    compute_ms: float
    bw_gbps: float
    n_slots: int
    n_attn: int
    row_bytes: int


def gpu_compute_s(point: Point, window_rows: int) -> float:
    """GPU compute of one decode token of ``point``'s model whose window is ``window_rows`` (its GPU splits), seconds.
    Read off the evaluator's numbers of that window (``sim.evaluator.costs``: built from its graph once per window, and
    shared by every context whose window it is); kept per model, caches, pinning, machine, packing and window (all it
    reads: the contexts of a plan that share a window ask it once)."""
    from sim.evaluator.costs import point_costs

    key = (*_compute_key(point), window_rows)
    got = _COMPUTE_S.get(key)
    if got is None:
        costs = point_costs(_window_point(point, window_rows))[0]
        got = sum(float(costs.values[c.compute]) for c in costs.layout.splits if c.kind == "gpu")
        _keep_compute(key, got)
    return got


def gpu_computes_s(asked: list[tuple[Point, int]]) -> list[float]:
    """:func:`gpu_compute_s` of each (point, window rows) of ``asked``, the same numbers and kept the same way: the
    windows not kept yet are answered a key (model, caches, pinning, machine, packing) at a time, in the order asked,
    by ``sim.evaluator.family_costs.first_step_gpu_compute_s`` (the windows a family's template gives, at once). Pure
    but for the caches."""
    from sim.evaluator.family_costs import first_step_gpu_compute_s

    keys = [(*_compute_key(p), w) for p, w in asked]
    todo: dict[tuple[Any, ...], dict[tuple[Any, ...], Point]] = {}  # per key but the window: each new window's point
    for k, (p, w) in zip(keys, asked, strict=True):
        if k not in _COMPUTE_S:
            per_key = todo.setdefault(k[:-1], {})
            if k not in per_key:
                per_key[k] = _window_point(p, w)
    for per_key in todo.values():
        for k, got in zip(per_key, first_step_gpu_compute_s(list(per_key.values())), strict=True):
            _keep_compute(k, got)
    return [_COMPUTE_S[k] if k in _COMPUTE_S else gpu_compute_s(p, w) for k, (p, w) in zip(keys, asked, strict=True)]


def _compute_key(point: Point) -> tuple[Any, ...]:
    """What :func:`gpu_compute_s` reads of ``point`` but the window: model, caches, pinning, machine, packing."""
    from sim.replay_keys import number

    wl = point.workload
    return (number(wl.model), number(wl.cache_k), number(wl.cache_v), wl.pinned, number(point.hardware),
            point.transport.pack_streams)


def _window_point(point: Point, window_rows: int) -> Point:
    """The one-token, ordered point whose first window is ``window_rows`` that :func:`gpu_compute_s` reads."""
    wl = point.workload
    big = Workload(wl.model, wl.cache_k, wl.cache_v, (max(1, window_rows - 1),), tokens=1, pinned=wl.pinned)
    return Point(big, point.hardware, TransportConfig(depth=0, pack_streams=point.transport.pack_streams))


def _keep_compute(key: tuple[Any, ...], got: float) -> None:
    if len(_COMPUTE_S) > 1 << 16:
        _COMPUTE_S.clear()
    _COMPUTE_S[key] = got


_COMPUTE_S: dict[tuple[Any, ...], float] = {}  # gpu_compute_s's answers


def copy_s(point: Point, window_rows: int) -> float:
    """Bare H2D time of one token's windows (every attention layer, K and V), seconds."""
    wl = point.workload
    link = point.hardware.devices[0].link(True, wl.pinned)
    return wl.model.n_attn * sum(link.seconds(window_rows * b) for b in (wl.k_row_bytes, wl.v_row_bytes))


def peak_rows(compute_s: float, bw_bytes_per_s: float, n_attn: int, row_bytes: int) -> float:
    """The closed-form peak ``rows* = compute x BW / (n_attn x b)``: window rows where copy equals compute."""
    return compute_s * bw_bytes_per_s / (n_attn * row_bytes)


def peak_ring_bytes(compute_s: float, bw_bytes_per_s: float, n_attn: int, n_slots: int) -> float:
    """The ring at the closed-form peak, ``(n_slots / n_attn) x compute x BW``, bytes (independent of the cache type)."""
    return n_slots / n_attn * compute_s * bw_bytes_per_s


def closed_form(point: Point, n_slots: int | None = None) -> ClosedForm:
    """Solve rows* = compute(rows*) x BW(rows* x b) / (n_attn x b) by fixed-point iteration; the ring of ``n_slots``
    slots there (default: the slots of the point's depth, ``TransportConfig.n_slots``). Does not block."""
    n_slots = point.transport.n_slots if n_slots is None else n_slots
    wl = point.workload
    b, n_attn = wl.row_bytes, wl.model.n_attn
    link = point.hardware.devices[0].link(True, wl.pinned)
    rows = 4096.0
    for _ in range(200):
        compute = gpu_compute_s(point, min(MAX_CONTEXT, max(1, round(rows))))  # a peak past any context: the largest
        bw = link.bandwidth(rows * b)
        new = peak_rows(compute, bw, n_attn, b)
        done = abs(new - rows) < 0.01
        rows = new
        if done:
            break
    ring = peak_ring_bytes(compute, bw, n_attn, n_slots)
    return ClosedForm(rows, ring / MIB, compute * 1e3, bw / 1e9, n_slots, n_attn, b)


def _context_for_window(window_rows: int) -> int:
    """A context whose first decode window is ``window_rows`` (a multiple of the padding)."""
    return max(1, window_rows - WINDOW_PAD_ROWS)


def simulated_peak(req: PlanRequest, runner: Runner, depth: int, around_rows: float, max_rows: int) -> dict[str, Any]:
    """The window with the largest uncapped gain at ``depth``: a log scan, then 256-row steps near the top. Blocks."""
    hi = min(max(4 * around_rows, max_rows, 4 * WINDOW_PAD_ROWS), MAX_CONTEXT - WINDOW_PAD_ROWS)
    coarse = sorted({_pad(512 * (hi / 512) ** (i / 23)) for i in range(24)})
    best = _best(req, runner, coarse, depth)
    i = coarse.index(best["window_rows"])
    lo_w, hi_w = coarse[max(0, i - 1)], coarse[min(len(coarse) - 1, i + 1)]
    step = max(WINDOW_PAD_ROWS, _pad((hi_w - lo_w) / 64))
    fine = sorted(set(range(lo_w, hi_w + 1, step)) | {best["window_rows"]})
    return _best(req, runner, fine, depth)


def _pad(rows: float) -> int:
    return max(WINDOW_PAD_ROWS, int(math.ceil(rows / WINDOW_PAD_ROWS)) * WINDOW_PAD_ROWS)


def _best(req: PlanRequest, runner: Runner, windows: list[int], depth: int) -> dict[str, Any]:
    """The row of the window with the largest gain at ``depth`` (of the windows whose graph fits the device; the
    smallest if none does). Raises InputError when none fits."""
    got = runner.rows(points(req, [_context_for_window(w) for w in windows], [0, depth], 0, tokens=2))
    pairs = [(a, b) for a, b in zip(got[::2], got[1::2], strict=True) if a is not None and b is not None]
    if not pairs:
        raise InputError(f"no window of {windows[0]:,}..{windows[-1]:,} rows fits the device: no simulated peak")
    rows = with_gains([r for pair in pairs for r in pair])
    piped = [r for r in rows if r["depth"] == depth]
    return max(piped, key=lambda r: (r["gain"] or 0.0, -r["window_rows"]))


def apply_peak(req: PlanRequest, runner: Runner, out: list[Any], depth: int) -> None:
    """Every context's peak fields (``kvpipe.plan.ContextPlan``): the closed form and the simulated peak at ``depth``,
    and the note between them. Blocks for the scan."""
    pt = points(req, [out[0].context], [depth], 0, tokens=1)[0]
    cf = closed_form(pt)
    sim = simulated_peak(req, runner, depth, cf.rows, max(req.contexts))
    asked = max(out, key=lambda p: p.gain_by_depth.get(depth, 0.0))
    note = peak_note(pt, cf, sim, asked, depth)
    for p in out:
        p.peak_depth, p.peak_slots = depth, cf.n_slots
        p.peak_rows_closed_form, p.peak_ring_mib_closed_form = cf.rows, cf.ring_mib
        p.peak_rows_simulated, p.peak_context_simulated = sim["window_rows"], sim["context"]
        p.peak_gain_simulated, p.peak_ring_mib_simulated = sim["gain"] or 0.0, sim["ring_mib"]
        p.peak_note = note
        p.extra.update({"peak_compute_ms_closed_form": cf.compute_ms, "peak_bw_gbps_closed_form": cf.bw_gbps,
                        "peak_context_asked": asked.context})


def peak_note(pt: Point, cf: ClosedForm, sim: dict[str, Any], asked: Any, depth: int) -> str:
    """Why the simulated peak differs from the closed form, in numbers from the simulated peak's row."""
    w, n_attn = sim["window_rows"], pt.workload.model.n_attn
    copy_ms, compute_ms = copy_s(pt, w) * 1e3, gpu_compute_s(pt, w) * 1e3
    g0_ms = first_split_compute_s(pt, w) * 1e3
    late_ms = sim["late_mib"] * MIB / pt.hardware.devices[0].link(True, pt.workload.pinned).bandwidth(sim["late_mib"] * MIB / n_attn) * 1e3
    per_split = (compute_ms - g0_ms) / n_attn
    dram = pt.hardware.devices[0].dram_bytes_per_s
    contention = (
        f" The copies also share the card's memory with the kernels ({dram / 1e9:.1f} GB/s): a delivery under a split "
        f"stretches it by up to {w * pt.workload.row_bytes / dram * 1e3:.3f} ms (its bytes over that bandwidth), "
        f"part of what it carries."
        if dram > 0 else ""
    )
    return (
        f"Simulated peak at {w:,} window rows (context {sim['context']:,}, {sim['gain'] or 0:+.1%}, ring {sim['ring_mib']:.1f} MiB) "
        f"against the closed form's {cf.rows:,.0f} rows ({(w - cf.rows) / cf.rows:+.1%}, ring {cf.ring_mib:.1f} MiB from "
        f"{cf.compute_ms:.2f} ms of compute at {cf.bw_gbps:.2f} GB/s). The closed form balances a token's bare copy against its "
        f"whole GPU compute. The pipeline balances split by split: the first {depth + 1} deliveries land while the GPU waits "
        f"for the first split's small blocking inputs, which queue behind them on the one H2D engine "
        f"(all blocking copies, those inputs and the "
        f"{2 * n_attn} D2H row copies, take {sim['breakdown_ms']['blocked_in_ordered_copies']:.2f} ms a token), and "
        f"the {g0_ms:.2f} ms of compute before the first attention layer overlaps no copy; after that each delivery must fit "
        f"under one split's compute plus the late rows it copies on the consumer stream ({late_ms / n_attn:.3f} ms a split) and "
        f"the host's round trip at the CPU split between them, while the GPU idles. At the simulated peak a delivery takes "
        f"{copy_ms / n_attn:.3f} ms against {per_split:.3f} ms of split compute: the {copy_ms / n_attn - per_split:+.3f} ms is "
        f"what each split carries beside its compute.{contention} Among the contexts asked the best is {asked.context:,} "
        f"({asked.gain_by_depth.get(depth, 0.0):+.1%} at depth {depth}, ring {asked.ring_mib_by_depth.get(depth, 0.0):.1f} MiB)."
    )


def first_split_compute_s(point: Point, window_rows: int) -> float:
    """Compute of the GPU split before the first attention layer (no delivery overlaps it), seconds."""
    wl = point.workload
    big = Workload(wl.model, wl.cache_k, wl.cache_v, (max(1, window_rows - 1),), tokens=1, pinned=wl.pinned)
    g = decode_graph(big, point.hardware.devices[0].compute, position=max(0, window_rows - 1))
    return g.splits[0].compute_s
