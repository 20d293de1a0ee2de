"""A measured token and its simulation: the pieces every fit of ``validate`` is built from.

A llama-bench run (or a published table row) is a :class:`TokenRun`: seconds
per token behind a context, on the resident arm (``-nkvo 0``) or the ordered
one (``-nkvo 1``). :func:`simulated_s` simulates the same point under a
profile dict; the fits (``validate.token_fit``: compute, ``validate.link_fit``:
the host->device link, ``validate.host_attention_fit``: upstream's CPU
attention, ``validate.type_fit``: the attention per cache type) each make some
terms free (:func:`free_kernels`), read what is left against the window bytes
as a straight line (:func:`line`, :func:`rest_against_window`), and finish on
the simulation itself where the line misses (:func:`refine`).

Units: seconds and bytes inside; the profile dict's units (GB/s, us) only where
one is written. Blocks for the simulations it runs (tens of ms each).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.profile import ComputeModel, profile_from_dict
from sim.errors import InputError
from sim.graph import decode_graph
from sim.run.point import Point
from sim.run.run import run_point
from sim.transport.config import TransportConfig
from sim.workload import ALL_LAYERS, CacheType, ModelShape, Workload, pad_rows

#: Decode tokens simulated per fitted point (the window grows in 256-row blocks, so two tokens are steady).
FIT_TOKENS = 2


@dataclass(frozen=True)
class TokenRun:
    """One measured point: seconds per token behind ``context`` cached tokens, on one arm."""

    context: int
    seconds_per_token: float
    arm: str  # "ordered" (-nkvo 1) or "resident" (-nkvo 0)
    label: str = ""
    pinned: bool = True  # the host cache in pinned memory (the fork's --kv-cpu-pinned); upstream's -nkvo cache is pageable
    n_gpu_layers: int = ALL_LAYERS  # Workload.n_gpu_layers: the last n repeating layers on the GPU, the rest on the CPU
    sequences: int = 1  # sequences decoding together, ``context`` cached each (seconds_per_token: one step of all of them)
    unified: bool = True  # several sequences: one cache stream (llama.cpp -kvu) or one stream each
    cells_per_stream: int = 0  # a split cache's streams (llama.cpp's -c over its n_seq_max, padded); 0: just enough
    copy_span: bool = False  # the ordered copy was upstream llama.cpp's span of the streams (Workload.copy_span)

    def __post_init__(self) -> None:
        if self.sequences < 1:
            raise ValueError(f"sequences {self.sequences!r}; allowed: >= 1")
        if self.arm not in ("ordered", "resident"):
            raise ValueError(f"arm {self.arm!r}; allowed: ordered, resident")
        if not self.seconds_per_token > 0 or not math.isfinite(self.seconds_per_token):
            raise ValueError(f"seconds per token {self.seconds_per_token!r}; allowed: > 0")


def workload_at(model: ModelShape, cache_k: CacheType, cache_v: CacheType, context: int, tokens: int = FIT_TOKENS,
                pinned: bool = True, n_gpu_layers: int = ALL_LAYERS, sequences: int = 1, unified: bool = True,
                cells_per_stream: int = 0, copy_span: bool = False) -> Workload:
    """``sequences`` sequences of ``model`` decoding ``tokens`` tokens behind ``context`` cached ones each (the last
    ``n_gpu_layers`` layers on the GPU); a split cache's streams ``cells_per_stream`` cells long (0, or shorter than
    the sequences need: just enough) and copied as upstream's span where ``copy_span``."""
    ctx_size = 0
    if cells_per_stream and not unified:
        ctx_size = sequences * max(cells_per_stream, pad_rows(context + tokens))
    return Workload(model, cache_k, cache_v, (context,), tokens=tokens, pinned=pinned, n_gpu_layers=n_gpu_layers,
                    n_parallel=sequences, unified=unified, ctx_size=ctx_size, copy_span=copy_span)


def workload_of(model: ModelShape, cache_k: CacheType, cache_v: CacheType, run: TokenRun, tokens: int = FIT_TOKENS) -> Workload:
    """The workload a measured run decoded."""
    return workload_at(model, cache_k, cache_v, run.context, tokens, run.pinned, run.n_gpu_layers, run.sequences, run.unified,
                       run.cells_per_stream, run.copy_span)


def window_bytes(wl: Workload) -> int:
    """K+V bytes every attention layer of a token reads at the workload's context, over all attention layers."""
    g = decode_graph(wl, ComputeModel(), position=max(wl.contexts))
    return g.window_rows * wl.row_bytes * wl.model.n_attn


def _transport(arm: str, profile: dict[str, Any]) -> TransportConfig:
    """The run of a measured arm: ``resident``, or ``ordered`` as the profile's llama.cpp runs it (-nkvo 1: the windows
    delivered to the GPU, or upstream's attention on the CPU)."""
    if arm == "resident":
        return TransportConfig(depth=0, budget_mib=0.0, arm="resident")
    host = profile.get("nkvo_attention") == "host"
    return TransportConfig(depth=0, budget_mib=0.0, arm="host-attention" if host else "transport")


def simulated_s(profile: dict[str, Any], wl: Workload, arm: str) -> float:
    """Simulated seconds per token of ``wl`` on ``arm`` under the profile dict (its device compute). Blocks (simulation)."""
    hw = profile_from_dict(profile, str(profile.get("name", "profile")))
    result = run_point(Point(wl, hw, _transport(arm, profile)))
    return sum(s.total_s for s in result.graphs) / len(result.graphs)


KERNEL_KEYS = ("weight_GBps", "attn_GBps", "layer_us", "attn_us", "head_us", "attn_floor_us")


HOST_ATTENTION_KEYS = ("host_attn_GBps", "host_attn_us")


def free_kernels(profile: dict[str, Any], keys: Sequence[str] = KERNEL_KEYS) -> dict[str, Any]:
    """A copy of the profile dict whose kernels (``keys`` of compute) cost nothing (0 = ignored), without per-program
    entries."""
    d = copy.deepcopy(profile)
    d.pop("workloads", None)
    for dev in d["devices"]:
        c = dev["compute"]
        for key in keys:
            if key in c or key in HOST_ATTENTION_KEYS:
                c[key] = 0.0
    return d


def with_compute(profile: dict[str, Any], weight_GBps: float, attn_GBps: float) -> dict[str, Any]:
    """A copy of the profile dict with every device's compute the two bandwidths (fixed terms 0), no per-program entries."""
    d = free_kernels(profile)
    for dev in d["devices"]:
        dev["compute"]["weight_GBps"] = weight_GBps
        dev["compute"]["attn_GBps"] = attn_GBps
    return d


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b x. Needs two distinct x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def rest_against_window(free: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType,
                         runs: Sequence[TokenRun], tokens: int) -> tuple[list[float], list[float], list[float]]:
    """Per run: the window bytes, the measured seconds less the simulated rest under ``free`` (the terms being fitted
    made free), and that rest in ms. Raises InputError when the runs span one window."""
    xs, ys, rest = [], [], []
    for r in runs:
        wl = workload_of(model, cache_k, cache_v, r, tokens)
        xs.append(float(window_bytes(wl)))
        non = simulated_s(free, wl, r.arm)
        rest.append(non * 1e3)
        ys.append(r.seconds_per_token - non)
    if len(set(xs)) < 2:
        raise InputError(f"the {runs[0].arm} runs span one window ({', '.join(str(r.context) for r in runs)}); "
                         "allowed: runs at two depths or more whose windows differ (llama-bench -d A,B)")
    return xs, ys, rest


#: A line whose worst fitted point is off by more than this is refined by a search on the simulation itself.
REFINE_ABOVE = 0.005


def refined(make: Callable[[Sequence[float]], dict[str, Any]], start: Sequence[float], model: ModelShape,
             cache_k: CacheType, cache_v: CacheType, runs: Sequence[TokenRun], tokens: int) -> tuple[list[float], float]:
    """The line's parameters, or :func:`refine`'s when the line misses a run by more than REFINE_ABOVE; and the line's
    worst relative miss."""
    prof = make(start)
    worst = max(abs(simulated_s(prof, workload_of(model, cache_k, cache_v, r, tokens), r.arm) / r.seconds_per_token - 1)
                for r in runs)
    if worst > REFINE_ABOVE:  # from a positive start: the search runs on the parameters' logarithms
        return refine(make, [max(v, 1e-3) for v in start], model, cache_k, cache_v, runs), worst
    return list(start), worst


def refine(make: Callable[[Sequence[float]], dict[str, Any]], start: Sequence[float], model: ModelShape, cache_k: CacheType,
           cache_v: CacheType, runs: Sequence[TokenRun], iterations: int = 12) -> list[float]:
    """Positive parameters whose profile ``make(params)`` best fits ``runs`` (least squares of the relative error).

    The straight-line fits assume a token is the sum of its parts, which holds
    while the host waits on every copy (the ordered path). Where the host's
    launches overlap the GPU (a resident run on a launch-heavy profile) the
    simulated time is not additive and the line misses; :func:`gauss_newton`
    finishes the fit from the line's values. Blocks (simulations).
    """
    wls = [workload_of(model, cache_k, cache_v, r) for r in runs]

    def residuals(p: Sequence[float]) -> np.ndarray:
        prof = make(p)
        return np.array([simulated_s(prof, wl, r.arm) / r.seconds_per_token - 1.0 for wl, r in zip(wls, runs, strict=True)])

    return gauss_newton(residuals, start, iterations)


def gauss_newton(residuals: Callable[[Sequence[float]], np.ndarray], start: Sequence[float], iterations: int = 12) -> list[float]:
    """Positive parameters minimising the sum of squared ``residuals(params)``, from ``start`` (> 0).

    Gauss-Newton on the logarithms of the parameters, with a numerical
    Jacobian and a halving line search. Blocks for the calls it makes.
    """

    def at(logp: np.ndarray) -> np.ndarray:
        return np.asarray(residuals([float(math.exp(v)) for v in logp]), dtype=float)

    x = np.log(np.maximum(np.asarray(start, dtype=float), 1e-12))
    res = at(x)
    for _ in range(iterations):
        jac = np.empty((len(res), len(x)))
        for k in range(len(x)):
            step = np.zeros_like(x)
            step[k] = 1e-3
            jac[:, k] = (at(x + step) - res) / 1e-3
        delta, *_ = np.linalg.lstsq(jac, -res, rcond=None)
        cost, t = float(res @ res), 1.0
        while t > 1e-3:
            trial = x + t * np.clip(delta, -3.0, 3.0)
            rt = at(trial)
            if float(rt @ rt) < cost:
                x, res = trial, rt
                break
            t /= 2
        else:
            break
        if float(np.max(np.abs(t * delta))) < 1e-6:
            break
    return [float(math.exp(v)) for v in x]


def golden_log(cost: Callable[[float], float], lo: float, hi: float, iterations: int = 48) -> float:
    """The value in ``lo..hi`` (> 0) minimising ``cost``, by golden-section search on its logarithm (``cost`` unimodal
    there). Blocks for the calls it makes."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = cost(math.exp(c)), cost(math.exp(d))
    for _ in range(iterations):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = cost(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = cost(math.exp(d))
    return math.exp((a + b) / 2)
