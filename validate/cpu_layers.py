"""The host cost of the layers llama.cpp runs on the CPU (``-ngl`` below the layer count), fitted from llama-bench.

llama.cpp counts the output layer as the last of ``n_layers + 1``: ``-ngl N``
puts the last ``N`` of them on the GPU, so ``N >= n_layers + 1`` (llama-bench's
99) is every layer, and ``1 <= N <= n_layers`` leaves the first ``n_layers + 1
- N`` repeating layers on the CPU, their weights and their K/V in host memory
(``-ngl 0`` puts the output layer there too, which kvpipe does not model).
kvpipe's ``Workload.n_gpu_layers`` counts repeating layers only:
:func:`workload_gpu_layers` converts.

A token with the layers ``C`` on the CPU costs what the all-GPU token costs,
less those layers' GPU time, plus their host time::

    t = t_gpu - sum_C gpu_layer + |C| (host_layer_s + w / host_weight_Bps)
              + sum_(attention layers of C) (host_attn_s + window / host_attn_Bps)

``w`` is the model's ``layer_weight_bytes`` (the bytes the graph prices a layer
by: the weights over the layers), ``gpu_layer`` the profile's GPU time of that
layer (``layer_seconds``, and ``attention_seconds`` of its window for an
attention layer), ``t_gpu`` the simulated all-GPU token. Each ``-nkvo 0`` run
with layers on the CPU is one equation, linear in ``1 / host_weight_Bps`` and
``1 / host_attn_Bps``: least squares over the runs. Every layer weighs the same
``w``, so ``host_layer_s`` cannot be told from the weights' rate (nor
``host_attn_s`` from the attention's rate for a dense model): both are 0, and
the per-layer cost is read as streaming the weights (and the window) from host
memory. A profile whose CPU attention is already fitted (``--nkvo-attention
host``) keeps it; from runs at one depth the attention is folded into the
weights' rate. The ``-nkvo 1`` runs are checks, not fitted.

Until the simulator runs CPU layers (``sim.graph`` reading ``n_gpu_layers``),
the residuals of such runs are the closed form above (``by: closed form``);
once it does, the simulation's (``by: simulation``). Blocks for the
simulations (tens of ms each).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from backends.profile import ComputeModel, profile_from_dict
from sim.errors import InputError
from sim.graph import decode_graph
from sim.workload import ALL_LAYERS, CacheType, ModelShape, Workload, layers_of_ngl
from validate.token_fit import TokenRun, simulated_s, workload_of

__all__ = ["closed_form_s", "fit_cpu_layers", "partial_residuals", "sim_runs_cpu_layers", "workload_gpu_layers"]


def workload_gpu_layers(ngl: int, model: ModelShape, where: str = "") -> int:
    """``Workload.n_gpu_layers`` of llama.cpp's ``-ngl ngl`` (``sim.workload.layers_of_ngl``). Raises InputError on -ngl 0."""
    try:
        return layers_of_ngl(ngl, model.n_layers)
    except ValueError as exc:
        raise InputError(f"{where}n_gpu_layers {ngl} of {model.n_layers} layers: the output layer on the CPU; {exc}") from None

def _compute(profile: dict[str, Any]) -> ComputeModel:
    return profile_from_dict(profile, str(profile.get("name", "profile"))).devices[0].compute


def _layer_window(wl: Workload) -> float:
    """K+V bytes one attention layer reads at the workload's context."""
    g = decode_graph(replace_all_gpu(wl), ComputeModel(), position=max(wl.contexts))
    return float(g.window_rows * wl.row_bytes)


def replace_all_gpu(wl: Workload) -> Workload:
    """The same workload with every layer on the GPU."""
    return replace(wl, n_gpu_layers=ALL_LAYERS)


def _terms(profile: dict[str, Any], model: ModelShape, ck: CacheType, cv: CacheType, run: TokenRun) -> dict[str, float]:
    """A partial run's closed-form parts: the all-GPU token on its arm (and the resident one), the CPU layers' GPU time,
    their count, weight bytes, attention layers and window bytes."""
    wl = workload_of(model, ck, cv, run)
    full = replace_all_gpu(wl)
    c = _compute(profile)
    start = wl.gpu_layer_start
    n_attn_cpu = sum(1 for a in model.attn_layers if a < start)
    window = _layer_window(wl)
    gpu_s = start * c.layer_seconds(model.layer_weight_bytes) + n_attn_cpu * c.attention_seconds(window)
    resident = simulated_s(profile, full, "resident")
    arm = resident if run.arm == "resident" else simulated_s(profile, full, run.arm)
    return {"t_all_gpu_s": arm, "t_resident_s": resident, "cpu_layers_gpu_s": gpu_s, "n_cpu": float(start),
            "cpu_weight_bytes": start * model.layer_weight_bytes, "n_cpu_attn": float(n_attn_cpu),
            "cpu_window_bytes": n_attn_cpu * window, "gpu_attn_share": 1.0 - n_attn_cpu / model.n_attn}


def closed_form_s(profile: dict[str, Any], model: ModelShape, ck: CacheType, cv: CacheType, run: TokenRun) -> float:
    """Seconds per token of a run with layers on the CPU by the module's closed form (on the ``-nkvo 1`` arm the
    deliveries' share of the all-GPU token scales with the attention layers left on the GPU). Blocks (simulations)."""
    t = _terms(profile, model, ck, cv, run)
    c = _compute(profile)
    host = t["n_cpu"] * c.host_layer_seconds(model.layer_weight_bytes)
    if t["n_cpu_attn"]:
        host += t["n_cpu_attn"] * c.host_attention_seconds(t["cpu_window_bytes"] / t["n_cpu_attn"])
    transport = (t["t_all_gpu_s"] - t["t_resident_s"]) * t["gpu_attn_share"]
    return t["t_resident_s"] - t["cpu_layers_gpu_s"] + host + transport


def sim_runs_cpu_layers(profile: dict[str, Any], model: ModelShape, ck: CacheType, cv: CacheType) -> bool:
    """Whether the simulator prices layers on the CPU: a token with every layer there at 1 s a layer takes longer."""
    probe = copy.deepcopy(profile)
    probe.pop("workloads", None)
    for dev in probe["devices"]:
        dev["compute"]["host_layer_us"] = 1e6
    wl = workload_of(model, ck, cv, TokenRun(1024, 1.0, "resident", n_gpu_layers=0))
    return simulated_s(probe, wl, "resident") > simulated_s(probe, replace_all_gpu(wl), "resident") + 0.5


def with_cpu_layers(profile: dict[str, Any], host_weight_GBps: float, host_attn_GBps: float | None) -> dict[str, Any]:
    """A copy of the profile dict whose CPU layers cost ``w / host_weight_GBps`` (and their attention ``window /
    host_attn_GBps`` when given), fixed terms 0."""
    d = copy.deepcopy(profile)
    for dev in d["devices"]:
        c = dev["compute"]
        c["host_layer_us"], c["host_weight_GBps"] = 0.0, host_weight_GBps
        if host_attn_GBps is not None:
            c["host_attn_us"], c["host_attn_GBps"] = 0.0, host_attn_GBps
    return d


def fit_cpu_layers(profile: dict[str, Any], model: ModelShape, ck: CacheType, cv: CacheType,
                   runs: Sequence[TokenRun]) -> dict[str, Any]:
    """``host_weight_GBps`` (and ``host_attn_GBps``) from runs with layers on the CPU, the profile's GPU terms kept.

    Returns the record (``profile``: the profile with them; the line's inputs per run) or raises InputError: no
    ``-nkvo 0`` run with layers on the CPU, or a non-positive rate. Blocks (simulations).
    """
    resident = [r for r in runs if r.arm == "resident" and r.n_gpu_layers < model.n_layers]
    if not resident:
        raise InputError("the runs with layers on the CPU are all -nkvo 1; allowed: -nkvo 0 runs at -ngl below the layer "
                         "count (the CPU layers' cost is fitted from them, the -nkvo 1 ones checked)")
    c = _compute(profile)
    known_attn = c.host_attn_bytes_per_s > 0
    terms = [_terms(profile, model, ck, cv, r) for r in resident]
    ys, cols = [], []
    for r, t in zip(resident, terms, strict=True):
        y = r.seconds_per_token - t["t_resident_s"] + t["cpu_layers_gpu_s"]
        if known_attn and t["n_cpu_attn"]:
            y -= t["n_cpu_attn"] * c.host_attention_seconds(t["cpu_window_bytes"] / t["n_cpu_attn"])
        ys.append(y)
        cols.append([t["cpu_weight_bytes"], t["cpu_window_bytes"]])
    per_byte = {t["cpu_window_bytes"] / t["cpu_weight_bytes"] for t in terms}
    fit_attn = not known_attn and len({round(x, 12) for x in per_byte}) >= 2
    a = np.array(cols if fit_attn else [[row[0]] for row in cols])
    coef, *_ = np.linalg.lstsq(a, np.array(ys), rcond=None)
    if not all(float(k) > 0 for k in coef):
        per_gb = ", ".join(f"{float(k) * 1e12:.3f}" for k in coef)
        raise InputError(f"the runs with layers on the CPU do not fit a host cost per layer ({per_gb} ms per GB); "
                         "allowed: runs where a token takes longer with fewer layers on the GPU")
    weight_GBps = 1.0 / float(coef[0]) / 1e9
    attn_GBps = 1.0 / float(coef[1]) / 1e9 if fit_attn else None
    attention = ("fitted (host_attn_GBps)" if fit_attn else "the profile's CPU attention" if known_attn
                 else "folded into host_weight_GBps (the runs span one window per CPU layer)")
    return {
        "profile": with_cpu_layers(profile, weight_GBps, attn_GBps), "host_layer_us": 0.0, "host_weight_GBps": weight_GBps,
        "host_attn_GBps": attn_GBps, "attention": attention, "layer_weight_bytes": model.layer_weight_bytes,
        "runs": [{"label": r.label, "n_gpu_layers": r.n_gpu_layers, "context": r.context, "host_s": y, **t}
                 for r, t, y in zip(resident, terms, ys, strict=True)],
    }


def partial_residuals(profile: dict[str, Any], model: ModelShape, ck: CacheType, cv: CacheType,
                      runs: Sequence[TokenRun]) -> list[dict[str, Any]]:
    """Measured and fitted t/s of runs with layers on the CPU: by the simulation when it runs CPU layers, else by the
    closed form. Blocks (simulations)."""
    by_sim = sim_runs_cpu_layers(profile, model, ck, cv)
    out = []
    for r in runs:
        s = simulated_s(profile, workload_of(model, ck, cv, r), r.arm) if by_sim else closed_form_s(profile, model, ck, cv, r)
        out.append({"context": r.context, "arm": r.arm, "label": r.label, "n_gpu_layers": r.n_gpu_layers,
                    "measured_tps": 1.0 / r.seconds_per_token, "fitted_tps": 1.0 / s, "error": r.seconds_per_token / s - 1.0,
                    "by": "simulation" if by_sim else "closed form"})
    return out
