"""The per-sequence terms measured on kvpipe's own decode program (``kvpipe calibrate --batch``).

Several sequences decoding together read the weights once, but each further
sequence adds its share of the matrix products and its attention's fixed
cost to a GPU split, and its row store to a CPU split
(``backends.profile.ComputeModel``: ``layer_seq_s``, ``attn_seq_s``,
``cpu_row_s``). Here the decode program runs ordered at several batch sizes
on a machine, and every GPU split's kernel span, less what the one-sequence
model gives it, is regressed on (B - 1) x its layers and (B - 1) x
[attention]; the CPU split's host time against B - 1 gives the row store.
(Whole-token rates of another engine, such as llama-batched-bench's, are
fitted by ``validate.batch_fit`` instead.)

Units: seconds inside; the profile file's us only in the returned terms.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from backends.base import Backend
from backends.profile import HardwareProfile, for_workload, workload_key
from sim.graph import decode_graph
from sim.program import WeightStore, gpu_program
from sim.transport.scheduler import TransportConfig
from sim.workload import CacheType, ModelShape, Workload
from validate.calibrate import nnls
from validate.gpu_run import run_group


def batch_samples(workload: Workload, hardware: HardwareProfile, spans: Sequence[Any], tokens: int,
                  warmup: int) -> tuple[list[tuple[int, bool, float, float]], list[float]]:
    """GPU split samples ``(layers, attention?, seconds the one-sequence model gives, span_s)`` and CPU split seconds
    of an ordered run of several sequences (``workload.n_parallel``)."""
    samples: list[tuple[int, bool, float, float]] = []
    one = replace(hardware.devices[0].compute, layer_seq_s=0.0, attn_seq_s=0.0, cpu_row_s=0.0)  # the one-sequence model
    for i in range(tokens):
        g = decode_graph(workload, one, step=warmup + i)
        for s in (x for x in g.splits if x.kind == "gpu"):
            found = [sp for sp in spans if sp.track == f"consumer{s.device}" and sp.name == s.name]
            if len(found) < tokens:
                continue
            sp = found[len(found) - tokens + i]
            samples.append((len(s.layers), s.attn_layer >= 0, s.compute_s, sp.end_s - sp.start_s))
    cpu = [sp.end_s - sp.start_s for sp in spans if sp.track == "host" and sp.name.startswith("cpu_rows_")]
    return samples, cpu


def fit_batch(by_batch: dict[int, tuple[list[tuple[int, bool, float, float]], list[float]]]) -> dict[str, float]:
    """The per-sequence terms from runs at several batch sizes: ``layer_seq_us``, ``attn_seq_us``, ``cpu_row_us``.

    Each GPU split's measured span less what the one-sequence model gives for
    it (weights once, the attention over every sequence's cells) is regressed,
    by non-negative least squares, on (B - 1) x its layers and (B - 1) x
    [attention]; the CPU split's median host time against B - 1 gives the
    cost of storing one more sequence's rows.
    """
    rows, t = [], []
    for b, (samples, _) in by_batch.items():
        for n, att, model_s, span in samples:
            rows.append([(b - 1) * n, (b - 1) * float(att), 1.0])
            t.append(span - model_s)
    coef = nnls(np.array(rows, dtype=float), np.array(t, dtype=float)) if rows else np.zeros(3)
    cpu = {b: statistics.median(c) for b, (_, c) in by_batch.items() if c}
    xs = [b - 1 for b in cpu]
    if len(cpu) >= 2 and any(xs):
        slope = max(0.0, float(np.polyfit(np.array(xs, float), np.array(list(cpu.values()), float), 1)[0]))
    else:
        slope = 0.0
    return {"layer_seq_us": float(coef[0]) * 1e6, "attn_seq_us": float(coef[1]) * 1e6, "cpu_row_us": slope * 1e6,
            "split_offset_us": float(coef[2]) * 1e6}


def calibrate_batches(
    be: Backend, model: ModelShape, ctype: CacheType, hardware: HardwareProfile, xp: Any, store: WeightStore,
    windows: Sequence[int], batches: Sequence[int] = (1, 2, 4, 8), tokens: int = 3, warmup: int = 1, scale: float = 1.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the decode program ordered at each batch size (unified cache, every sequence at the window) and fit the
    per-sequence terms (:func:`fit_batch`) against ``hardware``'s one-sequence compute for ``model``. Blocks."""
    hw = for_workload(hardware, model.name, ctype.name)
    by_batch: dict[int, tuple[list[tuple[int, bool, float, float]], list[float]]] = {}
    measured: dict[str, float] = {}
    for b in batches:
        samples: list[tuple[int, bool, float, float]] = []
        cpu: list[float] = []
        for ctx in windows:
            wl = Workload(model, ctype, ctype, (ctx,) * b, tokens=tokens, n_parallel=b)
            prog = gpu_program(wl, xp, store, scale=scale)
            ordered = TransportConfig(depth=0, budget_mib=0.0)
            run = run_group(be, wl, hw, [ordered], prog, reps=1, warmup=warmup, progress=progress).arm(ordered)[0]
            s, c = batch_samples(wl, hw, run.spans, tokens, warmup)
            samples += s
            cpu += c
            measured[f"{b}x{ctx}"] = statistics.fmean(x.total_s for x in run.stats) * 1e3
        by_batch[b] = (samples, cpu)
    terms = fit_batch(by_batch)
    return {**terms, "batches": list(batches), "windows": list(windows), "token_ms_measured": measured,
            "samples": {str(b): len(v[0]) for b, v in by_batch.items()}}


BATCH_TERMS = ("layer_seq_us", "attn_seq_us", "cpu_row_us")


def add_batch_terms(data: dict[str, Any], be: Backend, xp: Any, hardware: HardwareProfile, models: Sequence[ModelShape],
                    ctypes: Sequence[CacheType], windows: Sequence[int], batches: Sequence[int],
                    scale: float = 1.0) -> list[tuple[str, dict[str, Any]]]:
    """Extend the profile dict ``data`` (of ``hardware``) with the per-sequence terms of each (model, cache type).

    Each ``workloads`` entry (made from the device's compute where missing) gets
    the fitted terms in its ``compute`` and the fit under ``batch``; the device's
    compute takes the first entry's. Returns (entry key, terms) in order. Blocks
    for the runs (:func:`calibrate_batches`).
    """
    store = WeightStore()
    entries = data.setdefault("workloads", {})
    out = []
    for m in models:
        for c in ctypes:
            key = workload_key(m.name, c.name)
            entry = entries.setdefault(key, {"compute": copy.deepcopy(data["devices"][0]["compute"]), "cache_type": c.name})
            terms = calibrate_batches(be, m, c, hardware, xp, store, windows, batches, scale=scale)
            entry["compute"].update({k: terms[k] for k in BATCH_TERMS})
            entry["batch"] = terms
            out.append((key, terms))
    first = next(iter(entries.values()))["compute"]
    for dev in data["devices"]:
        dev["compute"].update({k: first.get(k, 0.0) for k in BATCH_TERMS})
    return out
