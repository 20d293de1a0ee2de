"""``kvpipe calibrate``: measure a machine and write the hardware profile the simulation reads.

A profile (``backends.profile`` file format) needs the link curves, the copy
engines, the host costs and a compute model. The first three come from
``validate.micro``. The compute model comes from the workload itself: for
each model the decode program runs on the ordered path through the same
scheduler at a few *calibration windows* (not the validation contexts), and
every GPU split's kernel span (CUDA events) is fitted to the graph's model of
a split,

    t = layers x layer_s + [attention] (attn_s + window_bytes / attn_bytes_per_s) + [last] head_s,

by non-negative least squares; the CPU split time is the median of the host's
CPU-split spans. What the graph does not model -- the scheduler's own Python
between backend calls -- is measured the same way: the simulated token time
of those calibration runs against the measured one, divided by the GPU splits
of a token and charged as extra launch time. Per-model compute and launch
costs go under ``workloads`` in the file, one entry per (model, cache type)
keyed ``model@cache``; the device's ``compute`` holds the first entry's, and
``backends.profile.for_workload`` picks the entry of a point's model and cache
type (``kvpipe simulate``, ``sweep``, ``plan`` and ``validate`` all do).

Units: seconds and bytes inside; the file's units (us, GB/s, MiB) only in
:func:`build_profile` and :func:`compute_fields`.
"""

from __future__ import annotations

import copy
import datetime
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from backends.base import Backend, SpanKind
from backends.profile import MIB, ComputeModel, HardwareProfile, compute_model_of, profile_from_dict, workload_key
from sim.graph import decode_graph
from sim.program import WeightStore, gpu_program
from sim.run.point import Point
from sim.run.run import run_point
from sim.transport.scheduler import TransportConfig
from sim.workload import CacheType, ModelShape, Workload, cache_type
from validate import contention, micro
from validate.gpu_run import run_group

CALIBRATION_WINDOWS = (2048, 12288, 32768, 98304)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares ``a x ~ b`` with ``x >= 0`` (active set: drop negative coefficients and refit)."""
    free = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while free:
        sol, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        if (sol >= 0).all():
            x[free] = sol
            break
        free = [f for f, v in zip(free, sol, strict=True) if v > 0]
    return x


def fit_compute(samples: Sequence[tuple[int, bool, float, bool, float]], cpu_split_s: float) -> ComputeModel:
    """A ComputeModel from GPU split samples ``(layers, attention?, window_bytes, last?, seconds)``.

    The attention part is ``max(floor, attn_s + window_bytes / attn_bytes_per_s)``:
    flat where launching the split's kernels takes longer than running them,
    linear in the window beyond. Every split point between the sampled windows
    is tried (the windows below it fit the floor, those above it the line, all
    by non-negative least squares); the one with the least squared error wins.
    """
    wins = sorted({wb for _, att, wb, _, _ in samples if att})
    cuts = [-1.0] + [(a + b) / 2 for a, b in zip(wins, wins[1:], strict=False)] + [float("inf")]
    t = np.array([x[-1] for x in samples], dtype=float)
    best: tuple[float, ComputeModel] | None = None
    for cut in cuts:
        a = np.array([[n, float(att and wb < cut), float(att and wb >= cut), (wb / 1e9) * float(att and wb >= cut), float(last)]
                      for n, att, wb, last, _ in samples], dtype=float)
        ls, floor, base, s_per_gb, head = nnls(a, t)
        model = ComputeModel(layer_s=float(ls), attn_s=float(base), attn_bytes_per_s=1e9 / s_per_gb if s_per_gb > 0 else 0.0,
                             head_s=float(head), cpu_split_s=float(cpu_split_s), attn_floor_s=float(floor))
        pred = np.array([n * model.layer_s + (model.attention_seconds(wb) if att else 0.0) + (model.head_s if last else 0.0)
                         for n, att, wb, last, _ in samples])
        sse = float(((pred - t) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, model)
    assert best is not None
    return best[1]


def compute_fields(c: ComputeModel) -> dict[str, float]:
    """A ComputeModel in the file's units."""
    return {
        "layer_us": c.layer_s * 1e6,
        "weight_GBps": c.weight_bytes_per_s / 1e9,
        "attn_us": c.attn_s * 1e6,
        "attn_GBps": c.attn_bytes_per_s / 1e9,
        "head_us": c.head_s * 1e6,
        "cpu_split_us": c.cpu_split_s * 1e6,
        "attn_floor_us": c.attn_floor_s * 1e6,
    }


# ------------------------------------------------------------ workload


def split_samples(workload: Workload, hardware: HardwareProfile, spans: Sequence[Any], tokens: int,
                  warmup: int) -> tuple[list, list[float]]:
    """GPU split samples ``(layers, attention?, window_bytes, last?, span_s, host_launch_s)`` and CPU split seconds of one run.

    ``span_s`` is the split's kernel span on its consumer stream (on a GPU it
    starts when the host starts launching, since the stream is idle on the
    ordered path); ``host_launch_s`` the host's time inside ``launch``.
    """
    samples: list[tuple[int, bool, float, bool, float, float]] = []
    ctx = max(workload.context)
    for i in range(tokens):
        g = decode_graph(workload, hardware.devices[0].compute, position=ctx + warmup + i)
        gpu = [s for s in g.splits if s.kind == "gpu"]
        last = gpu[-1].index
        for s in gpu:
            found = [sp for sp in spans if sp.track == f"consumer{s.device}" and sp.name == s.name]
            host = [sp for sp in spans if sp.kind is SpanKind.LAUNCH and sp.name == f"launch {s.name}"]
            if len(found) < tokens:
                continue
            sp = found[len(found) - tokens + i]
            hl = host[len(host) - tokens + i].end_s - host[len(host) - tokens + i].start_s if len(host) >= tokens else 0.0
            wb = g.window_rows * workload.row_bytes
            samples.append((len(s.layers), s.attn_layer >= 0, float(wb), s.index == last, sp.end_s - sp.start_s, hl))
    cpu = [sp.end_s - sp.start_s for sp in spans if sp.track == "host" and sp.name.startswith("cpu_rows_")]
    return samples, cpu


def _residual(runs: Sequence[tuple[Workload, int, float, int]], hw: HardwareProfile, warmup: int) -> list[float]:
    """(measured - simulated) seconds per unit for each ``(workload, depth, measured token s, units)``."""
    out = []
    for wl, depth, total_s, units in runs:
        sim = run_point(Point(wl, hw, TransportConfig(depth=depth, budget_mib=0.0)), checked=False, warmup=warmup)
        out.append((total_s - statistics.fmean(g.total_s for g in sim.graphs)) / max(units, 1))
    return out


Sample = tuple[int, bool, float, bool, float, float]


def _fastest_samples(rounds: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Element-wise minimum of the same split samples measured in several rounds (the shortest round's length).

    Interference on the host (another process, a slow stretch of the
    machine) only ever adds time, so the fastest round is the estimate of
    the program's own cost.
    """
    out = []
    for same in zip(*rounds, strict=False):
        n, att, wb, last = same[0][:4]
        out.append((n, att, wb, last, min(x[4] for x in same), min(x[5] for x in same)))
    return out


def calibrate_workload(
    be: Backend,
    model: ModelShape,
    ctype: CacheType,
    hardware: HardwareProfile,
    xp: Any,
    store: WeightStore,
    windows: Sequence[int] = CALIBRATION_WINDOWS,
    tokens: int = 3,
    warmup: int = 1,
    scale: float = 1.0,
    progress: Callable[[str], None] | None = None,
    rounds: int = 2,
) -> dict[str, Any]:
    """Fit the compute model and the host costs of ``model``'s decode program. Blocks for the runs.

    Each calibration window runs ordered (depth 0) and pipelined (depth 1),
    ``rounds`` times, the windows interleaved (round 1 over every window,
    then round 2 ...), each run after one unrecorded warm run. This program
    is launch-bound at small windows, and on the H200 machine the host's
    launch time moved by 1.8x between windows of one calibration and its
    micro-costs by 2x between two machines' calibrations: every sample is
    the fastest of the rounds (interference only adds time), so a slow
    stretch of the host inflates no window.
    A split's compute is its kernel span on the idle consumer stream of the
    ordered path: from the first launch to the last kernel's end, so it holds
    the host's launching where that is the slower part (:func:`fit_compute`).
    What remains of the ordered token, per GPU split, is added to
    ``launch_us``; what remains of the pipelined token (at the windows where
    copies do not bound it), per staged split, is spread over its four event
    calls (``event_us``), the calls only the pipelined path makes. Returns the
    ``workloads[model]`` entry of the profile file.
    """
    per_window: dict[int, list[tuple[list, list[float], float, float]]] = {w: [] for w in windows}
    for _ in range(max(1, rounds)):
        for ctx in windows:
            wl = Workload(model, ctype, ctype, (ctx,), tokens=tokens)
            prog = gpu_program(wl, xp, store, scale=scale)
            ordered, piped = TransportConfig(depth=0, budget_mib=0.0), TransportConfig(depth=1, budget_mib=0.0)
            group = run_group(be, wl, hardware, [ordered, piped], prog, reps=1, warmup=warmup, progress=progress)
            run0, run1 = group.arm(ordered)[0], group.arm(piped)[0]
            s, c = split_samples(wl, hardware, run0.spans, tokens, warmup)
            t0, t1 = (statistics.fmean(x.total_s for x in r.stats) for r in (run0, run1))
            per_window[ctx].append((s, c, t0, t1))
    samples: list[tuple[int, bool, float, bool, float, float]] = []
    cpu: list[float] = []
    ordered_s: list[float] = []
    piped_s: list[float] = []
    for rs in per_window.values():
        samples += _fastest_samples([r[0] for r in rs])
        cpu += [min(x) for x in zip(*[r[1] for r in rs], strict=False)]
        ordered_s.append(min(r[2] for r in rs))
        piped_s.append(min(r[3] for r in rs))
    host_launch_s = statistics.fmean(x[5] for x in samples) if samples else 0.0
    compute = fit_compute([(n, a, wb, la, t) for n, a, wb, la, t, _ in samples], statistics.median(cpu) if cpu else 0.0)
    host = fit_host(model, ctype, hardware, compute, host_launch_s, windows, ordered_s, piped_s, tokens, warmup)
    return {
        "compute": compute_fields(compute),
        **host,
        "host_launch_us_mean": host_launch_s * 1e6,
        "windows": list(windows),
        "rounds": max(1, rounds),
        "tokens": tokens,
        "warmup": warmup,
        "cache_type": ctype.name,
        "scale": scale,
        "samples": [{"layers": n, "attention": a, "window_bytes": wb, "last": la, "span_us": t * 1e6, "host_launch_us": hl * 1e6}
                    for n, a, wb, la, t, hl in samples],
        "cpu_split_us_samples": len(cpu),
        "token_ms_measured": {"ordered": [x * 1e3 for x in ordered_s], "pipelined": [x * 1e3 for x in piped_s]},
    }


def fit_host(model: ModelShape, ctype: CacheType, hardware: HardwareProfile, compute: ComputeModel, host_launch_s: float,
             windows: Sequence[int], ordered_s: Sequence[float], piped_s: Sequence[float], tokens: int, warmup: int) -> dict[str, float]:
    """The program's host costs in the file's units: ``split_launch_us``, ``launch_us``, ``event_us`` and the glue.

    ``split_launch_us`` is the measured host time of launching one GPU split
    (``host_launch_s``, mean over the samples). Then, with that and the fitted
    compute model, what remains of the measured ordered token per GPU split is
    added to ``launch_us``, and what remains of the pipelined token (every
    window but the largest, where copies bound it) per staged split is spread
    over its four event calls (``event_us``). Blocks for the simulations.
    """
    ordered, piped = [], []
    for ctx, t0, t1 in zip(windows, ordered_s, piped_s, strict=True):
        wl = Workload(model, ctype, ctype, (ctx,), tokens=tokens)
        g = decode_graph(wl, hardware.devices[0].compute, ctx)
        ordered.append((wl, 0, t0, sum(1 for sp in g.splits if sp.kind == "gpu")))
        piped.append((wl, 1, t1, 4 * len(g.staged_splits)))
    launch_s = hardware.host.launch_s
    fitted = replace(hardware, devices=tuple(replace(d, compute=compute) for d in hardware.devices),
                     host=replace(hardware.host, launch_s=launch_s, split_launch_s=host_launch_s))
    glue0 = statistics.median(_residual(ordered, fitted, warmup))
    fitted = replace(fitted, host=replace(fitted.host, launch_s=max(0.0, launch_s + glue0)))
    glue1 = statistics.median(_residual(piped[: max(1, len(piped) - 1)], fitted, warmup))
    return {
        "split_launch_us": host_launch_s * 1e6,
        "launch_us": fitted.host.launch_s * 1e6,
        "event_us": max(0.0, hardware.host.event_s + glue1) * 1e6,
        "glue_us_per_gpu_split": glue0 * 1e6,
        "glue_us_per_event_call": glue1 * 1e6,
    }


def refit(data: dict[str, Any], models: dict[str, ModelShape]) -> dict[str, Any]:
    """A profile file's dict with every workload entry's host costs fitted again by the current simulator.

    Uses only what the calibration stored (its compute model, host launch
    time, windows and measured token times), so a model change can be held
    to earlier measurements without touching a GPU. Returns a new dict; blocks
    for the simulations.
    """
    out = copy.deepcopy(data)
    hardware = profile_from_dict(out, "calibration")
    for key, w in out.get("workloads", {}).items():
        model = models[key.split("@")[0]]
        ctype = cache_type(w.get("cache_type", "q8_0"))
        tm = w["token_ms_measured"]
        host = fit_host(model, ctype, hardware, compute_model_of(w["compute"]), w.get("host_launch_us_mean", 0.0) * 1e-6,
                        w["windows"], [x * 1e-3 for x in tm["ordered"]], [x * 1e-3 for x in tm["pipelined"]],
                        int(w.get("tokens", 3)), int(w.get("warmup", 1)))
        w.update(host)
    return out


# ------------------------------------------------------------ profile


def build_profile(info: dict[str, Any], host: dict[str, float], links: dict[tuple[str, bool], dict[int, float]],
                  eng: dict[str, Any], command: str = "", waits: dict[tuple[str, int], float] | None = None) -> dict[str, Any]:
    """The profile file's dict from the micro-measurements (no compute model yet)."""
    total = info.get("memory_total_bytes", 0)
    used = total - info.get("memory_free_bytes", 0)
    name = info.get("device", "device")
    return {
        "name": f"calibrated-{name.replace(' ', '-').lower()}",
        "source": f"kvpipe calibrate on {name} (driver {info.get('driver_version')}, CuPy {info.get('cupy_version')}), "
                  f"{info.get('date', '')}: every number measured through the CuPy backend",
        "estimate": False,
        "schema": "kvpipe.profile/1",
        "provenance": {"kind": "measured on a device (kvpipe calibrate)",
                       "all": "measured on a device by kvpipe calibrate (see command and measurements)"},
        "device": name,
        "driver_version": info.get("driver_version"),
        "runtime_version": info.get("runtime_version"),
        "cupy_version": info.get("cupy_version"),
        "date": info.get("date", ""),
        "command": command,
        "host": {
            "launch_us": host["launch_s"] * 1e6,
            "copy_issue_us": host["copy_issue_s"] * 1e6,
            "event_us": host["event_s"] * 1e6,
            "host_wait_us": host["host_wait_s"] * 1e6,
            "graph_us": 0.0,
        },
        "devices": [
            {
                "name": name,
                "memory_total_mib": total / MIB,
                "memory_used_mib": used / MIB,
                "h2d_engines": 1 if eng.get("h2d_fifo", True) else 2,
                "d2h_engines": 1 if eng.get("d2h_fifo", True) else 2,
                "duplex_slowdown": eng.get("duplex_slowdown", 1.0),
                "copy_engine_drains_stream": bool(eng.get("drain", {}).get("drains", False)),
                "dram_GBps": eng.get("dram", {}).get("dram_bytes_per_s", 0.0) / 1e9,
                "alignment_bytes": 256,
                "links": {
                    f"{d}_{'pinned' if p else 'pageable'}": micro.curve_points(t) for (d, p), t in sorted(links.items())
                },
                "compute": {},
            }
        ],
        "measurements": {
            "host_costs_us": {k: v * 1e6 for k, v in host.items()},
            "copy_times_us": {f"{d}_{'pinned' if p else 'pageable'}": {str(n): s * 1e6 for n, s in t.items()}
                              for (d, p), t in links.items()},
            "peak_GBps": {f"{d}_{'pinned' if p else 'pageable'}": micro.peak_bytes_per_s(t) / 1e9 for (d, p), t in links.items()},
            "engines": eng,
            "host_wake_after_copy_us": {f"{d}_{n}": w * 1e6 for (d, n), w in (waits or {}).items()},
        },
        "workloads": {},
    }


def calibrate(
    be: Backend,
    models: Sequence[ModelShape],
    ctypes: CacheType | Sequence[CacheType],
    xp: Any,
    info: dict[str, Any] | None = None,
    sizes: Sequence[int] = micro.LINK_SIZES,
    reps: int = 5,
    windows: Sequence[int] = CALIBRATION_WINDOWS,
    scale: float = 1.0,
    command: str = "",
    progress: Callable[[str], None] | None = None,
    rounds: int = 2,
    contention_sizes: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Measure ``be`` and the decode program of each model with each cache type; return the profile file's dict.

    The copy engines' drain rule and the device's DRAM contention are measured
    (``validate.contention``) and written into the device whenever measurable
    (``contention_sizes``: the kernel and copy sizes of that measurement).

    Blocks for minutes on a GPU.
    """
    say = progress or (lambda _msg: None)
    info = dict(info or {})
    info.setdefault("date", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    say("host costs")
    host = micro.run_on(be, micro.host_costs(be))
    say("link curves")
    links, waits = micro.run_on(be, micro.copy_times(be, sizes, reps, host["host_wait_s"], host["copy_issue_s"]))
    long_waits = [w for (_, n), w in waits.items() if 1 << 20 <= n <= 64 << 20]
    if long_waits:  # the scheduler's waits are mostly long (windows, kernels): their wake-up, not a tiny copy's
        host["host_wait_s"] = max(host["host_wait_s"], statistics.median(long_waits))
    say("copy engines")
    eng = micro.run_on(be, micro.engines(be))
    eng["two_d_over_one_d"] = micro.run_on(be, micro.two_d_ratio(be))
    say("drain rule and DRAM contention")
    eng["drain"] = micro.run_on(be, contention.drain_rule(be))
    big = min(max(sizes), be.free_bytes(0) // 8)  # the contention copy is 4x the kernel's buffers: half the free memory at most
    eng["dram"] = micro.run_on(be, contention.dram_contention(be, **(contention_sizes or {"kernel_bytes": big, "copy_bytes": 4 * big})))
    data = build_profile(info, host, links, eng, command, waits)
    store = WeightStore()
    caches = [ctypes] if isinstance(ctypes, CacheType) else list(ctypes)
    for model in models:
        for ctype in caches:
            say(f"workload {model.name} {ctype.name}")
            hw = profile_from_dict(data, "calibration")
            entry = calibrate_workload(be, model, ctype, hw, xp, store, windows, scale=scale, progress=progress, rounds=rounds)
            if not data["workloads"]:
                data["devices"][0]["compute"] = entry["compute"]
            data["workloads"][workload_key(model.name, ctype.name)] = entry
    store.release(be)
    return data
