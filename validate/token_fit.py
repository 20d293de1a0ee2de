"""Fit a profile's compute and link to measured seconds per token: one code path for published tables and llama-bench.

What a user can measure without kvpipe's GPU program is the whole token:
``llama-bench -p 0 -n N -d D`` gives t/s behind D cached tokens, with the cache
on the device (``-nkvo 0``, kvpipe's *resident* arm) or in host memory
(``-nkvo 1``, the *ordered* path). This module turns such runs into the
numbers a profile needs, by the method ``tools/reference_derivation.py``
introduced for the reference's published ordered table:

* **compute.** The GPU time of a token is ``weights / weight_GBps + window /
  attn_GBps``, where ``window`` is the K+V bytes every attention layer reads.
  Simulate each run's point with every kernel made free: what is left is the
  host and copy part the profile already models. The measured time minus that
  part, against the window bytes, is a straight line whose intercept and slope
  are the two bandwidths (least squares; at least two depths).
* **link.** With the compute known from resident runs, the ordered runs fix the
  pinned H2D bandwidth: the one value whose simulated ordered times best match
  the measured ones (least squares of the relative error, golden-section search
  on a log scale; the simulation is monotone in it).

:func:`fit_runs` chooses: compute from the resident runs when they span two
depths, else from the ordered runs (the base profile's link kept, as the
reference derivation does); then the link from the ordered runs when the
compute came from resident ones. Every fitted point's residual is kept, and
with three depths or more, the leave-one-out residuals: what the fit predicts
for a depth it did not see. The error bars of a prediction come from those.

Runs with layers on the CPU (llama.cpp's ``-ngl`` below the layer count) take
no part in the above: with the GPU's terms fitted from the all-GPU runs, they
give the host cost of a CPU layer (``validate.cpu_layers``).

Units: seconds and bytes inside; the profile file's units (GB/s, us) only where
a profile dict is written. Blocks for the simulations it runs (tens of ms each).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from backends.profile import ComputeModel, profile_from_dict
from sim.checks import run_checked
from sim.errors import InputError
from sim.graph import decode_graph
from sim.simulate import Point
from sim.transport.config import TransportConfig
from sim.workload import ALL_LAYERS, CacheType, ModelShape, Workload

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

    def __post_init__(self) -> None:
        if self.sequences < 1:
            raise ValueError(f"sequences {self.sequences!r}; allowed: >= 1")
        if self.arm not in ("ordered", "resident"):
            raise ValueError(f"arm {self.arm!r}; allowed: ordered, resident")
        if not self.seconds_per_token > 0 or not math.isfinite(self.seconds_per_token):
            raise ValueError(f"seconds per token {self.seconds_per_token!r}; allowed: > 0")


def workload_at(model: ModelShape, cache_k: CacheType, cache_v: CacheType, context: int, tokens: int = FIT_TOKENS,
                pinned: bool = True, n_gpu_layers: int = ALL_LAYERS, sequences: int = 1, unified: bool = True) -> Workload:
    """``sequences`` sequences of ``model`` decoding ``tokens`` tokens behind ``context`` cached ones each (the last
    ``n_gpu_layers`` layers on the GPU)."""
    return Workload(model, cache_k, cache_v, (context,), tokens=tokens, pinned=pinned, n_gpu_layers=n_gpu_layers,
                    n_parallel=sequences, unified=unified)


def workload_of(model: ModelShape, cache_k: CacheType, cache_v: CacheType, run: TokenRun, tokens: int = FIT_TOKENS) -> Workload:
    """The workload a measured run decoded."""
    return workload_at(model, cache_k, cache_v, run.context, tokens, run.pinned, run.n_gpu_layers, run.sequences, run.unified)


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
    result = run_checked(Point(wl, hw, _transport(arm, profile)))
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


def with_host_attention(profile: dict[str, Any], host_attn_us: float, host_attn_GBps: float) -> dict[str, Any]:
    """A copy of the profile dict whose CPU attention (upstream -nkvo) costs ``host_attn_us`` + window / ``host_attn_GBps``."""
    d = copy.deepcopy(profile)
    for dev in d["devices"]:
        dev["compute"]["host_attn_us"] = host_attn_us
        dev["compute"]["host_attn_GBps"] = host_attn_GBps
    return d


def fit_host_attention(profile: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType,
                       runs: Sequence[TokenRun], tokens: int = FIT_TOKENS) -> dict[str, Any]:
    """Upstream llama.cpp's CPU attention from its ``-nkvo 1`` runs, the GPU compute of ``profile`` kept.

    Each run simulated with the CPU attention free leaves the rest of the token;
    the measured time less that, against the window bytes, is a line:
    intercept = n_attn x ``host_attn_us``, slope = 1 / ``host_attn_GBps``.
    Raises InputError on fewer than two windows or a non-positive term.
    """
    free = free_kernels(profile, HOST_ATTENTION_KEYS)
    free["workloads"] = profile.get("workloads", {})
    xs, ys, rest = _rest_against_window(free, model, cache_k, cache_v, runs, tokens)
    a, b = line(xs, ys)
    if not b > 0:
        raise InputError(f"the -nkvo 1 runs do not fit attention on the CPU: {b * 1e12:.3f} ms per GB of window; "
                         "allowed: runs where a token takes longer behind a longer context")
    if a < 0:  # the base profile's host costs leave less than nothing for the CPU's fixed part: its launches are slower
        return _fit_host_attention_and_launch(profile, model, cache_k, cache_v, runs, tokens, xs, ys, rest, a, b)
    out: dict[str, Any] = {"contexts": [r.context for r in runs], "window_bytes": xs, "host_s": ys, "non_host_attention_ms": rest,
           "host_attn_us": a / model.n_attn * 1e6, "host_attn_GBps": 1.0 / b / 1e9, "refined": False}
    (us, gbps), worst = _refined(lambda p: with_host_attention(profile, p[0], p[1]),
                                 [out["host_attn_us"], out["host_attn_GBps"]], model, cache_k, cache_v, runs, tokens)
    out.update({"host_attn_us": us, "host_attn_GBps": gbps, "refined": worst > REFINE_ABOVE, "line_worst_error": worst})
    return out


def host_launch_of(profile: dict[str, Any]) -> float:
    """The profile's launch time per GPU split, us."""
    return float(profile["host"].get("launch_us", 0.0))


def with_launch(profile: dict[str, Any], launch_us: float) -> dict[str, Any]:
    """A copy of the profile dict whose host launches a GPU split in ``launch_us``."""
    d = copy.deepcopy(profile)
    d["host"]["launch_us"] = launch_us
    return d


def _fit_host_attention_and_launch(profile: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType,
                                   runs: Sequence[TokenRun], tokens: int, xs: list[float], ys: list[float], rest: list[float],
                                   a: float, b: float) -> dict[str, Any]:
    """The CPU attention's rate and the engine's launch time per GPU split, where the base's launches are too slow.

    The line's intercept ``a`` < 0 says the base profile's host time, at
    every one of the token's GPU splits, exceeds what the runs leave beside
    the attention. Its fixed part is then taken as 0 and the launch time per
    GPU split fitted instead: from the base's, less ``-a`` spread over the
    splits, Gauss-Newton on both (two ordered depths determine them).
    """
    n_gpu = sum(1 for s in decode_graph(workload_of(model, cache_k, cache_v, runs[0], tokens), ComputeModel(),
                                        host_attention=True, position=runs[0].context).splits if s.kind == "gpu")
    base_launch = float(profile["host"].get("launch_us", 0.0))
    start = [max(base_launch + a * 1e6 / n_gpu, 0.5), 1.0 / b / 1e9]

    def make(p: Sequence[float]) -> dict[str, Any]:
        return with_host_attention(with_launch(profile, p[0]), 0.0, p[1])

    (launch_us, gbps), worst = _refined(make, start, model, cache_k, cache_v, runs, tokens)
    return {"contexts": [r.context for r in runs], "window_bytes": xs, "host_s": ys, "non_host_attention_ms": rest,
            "host_attn_us": 0.0, "host_attn_GBps": gbps, "launch_us": launch_us, "base_launch_us": base_launch,
            "line_intercept_ms": a * 1e3, "refined": worst > REFINE_ABOVE, "line_worst_error": worst}


def with_h2d(profile: dict[str, Any], h2d_GBps: float, key: str = "h2d_pinned") -> dict[str, Any]:
    """A copy of the profile dict whose H2D link ``key`` (pinned or pageable) is flat at ``h2d_GBps`` (latency kept)."""
    d = copy.deepcopy(profile)
    for dev in d["devices"]:
        dev["links"][key]["points"] = [[1.0, h2d_GBps]]
    return d


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b x. Needs two distinct x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def _rest_against_window(free: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType,
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


def _refined(make: Callable[[Sequence[float]], dict[str, Any]], start: Sequence[float], model: ModelShape,
             cache_k: CacheType, cache_v: CacheType, runs: Sequence[TokenRun], tokens: int) -> tuple[list[float], float]:
    """The line's parameters, or :func:`refine`'s when the line misses a run by more than REFINE_ABOVE; and the line's
    worst relative miss."""
    prof = make(start)
    worst = max(abs(simulated_s(prof, workload_of(model, cache_k, cache_v, r, tokens), r.arm) / r.seconds_per_token - 1)
                for r in runs)
    if worst > REFINE_ABOVE:  # from a positive start: the search runs on the parameters' logarithms
        return refine(make, [max(v, 1e-3) for v in start], model, cache_k, cache_v, runs), worst
    return list(start), worst


def fit_compute(profile: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType,
                runs: Sequence[TokenRun], tokens: int = FIT_TOKENS) -> dict[str, Any]:
    """weight_GBps and attn_GBps from runs of one arm, the profile's host and link kept.

    Returns the line and its inputs: ``window_bytes``, ``gpu_s`` (measured less
    the simulated non-kernel part), ``non_compute_ms``, ``weights_s``,
    ``s_per_window_byte``, ``weight_GBps``, ``attn_GBps``. Raises InputError
    when the runs span fewer than two windows or give a non-positive term.
    """
    arms = {r.arm for r in runs}
    if len(arms) != 1:
        raise ValueError(f"fit_compute takes one arm, got {sorted(arms)}")
    xs, ys, rest = _rest_against_window(free_kernels(profile), model, cache_k, cache_v, runs, tokens)
    a, b = line(xs, ys)
    if not (a > 0 and b > 0):
        raise InputError(f"the {runs[0].arm} runs do not fit a GPU time of weights + window: intercept {a * 1e3:.3f} ms, "
                         f"{b * 1e12:.3f} ms per GB of window; allowed: runs where a token takes longer behind a longer "
                         "context, on a profile whose host and link costs leave time for the kernels")
    out: dict[str, Any] = {
        "arm": runs[0].arm, "contexts": [r.context for r in runs], "window_bytes": xs, "gpu_s": ys, "non_compute_ms": rest,
        "weights_s": a, "s_per_window_byte": b, "weight_GBps": model.weight_bytes / a / 1e9, "attn_GBps": 1.0 / b / 1e9,
        "refined": False,
    }
    (w, at), worst = _refined(lambda p: with_compute(profile, p[0], p[1]), [out["weight_GBps"], out["attn_GBps"]],
                              model, cache_k, cache_v, runs, tokens)
    out.update({"weight_GBps": w, "attn_GBps": at, "refined": worst > REFINE_ABOVE, "line_worst_error": worst})
    return out


#: A line whose worst fitted point is off by more than this is refined by a search on the simulation itself.
REFINE_ABOVE = 0.005


def refine(make: Callable[[Sequence[float]], dict[str, Any]], start: Sequence[float], model: ModelShape, cache_k: CacheType,
           cache_v: CacheType, runs: Sequence[TokenRun], iterations: int = 12) -> list[float]:
    """Positive parameters whose profile ``make(params)`` best fits ``runs`` (least squares of the relative error).

    The straight-line fits assume a token is the sum of its parts, which holds
    while the host waits on every copy (the ordered path). Where the host's
    launches overlap the GPU (a resident run on a launch-heavy profile) the
    simulated time is not additive and the line misses; Gauss-Newton on the
    logarithms of the parameters, with a numerical Jacobian and a halving line
    search, finishes the fit from the line's values. Blocks (simulations).
    """
    wls = [workload_of(model, cache_k, cache_v, r) for r in runs]

    def residuals(logp: np.ndarray) -> np.ndarray:
        prof = make([float(math.exp(v)) for v in logp])
        return np.array([simulated_s(prof, wl, r.arm) / r.seconds_per_token - 1.0 for wl, r in zip(wls, runs, strict=True)])

    x = np.log(np.maximum(np.asarray(start, dtype=float), 1e-12))
    res = residuals(x)
    for _ in range(iterations):
        jac = np.empty((len(runs), len(x)))
        for k in range(len(x)):
            step = np.zeros_like(x)
            step[k] = 1e-3
            jac[:, k] = (residuals(x + step) - res) / 1e-3
        delta, *_ = np.linalg.lstsq(jac, -res, rcond=None)
        cost, t = float(res @ res), 1.0
        while t > 1e-3:
            trial = x + t * np.clip(delta, -3.0, 3.0)
            rt = residuals(trial)
            if float(rt @ rt) < cost:
                x, res = trial, rt
                break
            t /= 2
        else:
            break
        if float(np.max(np.abs(t * delta))) < 1e-6:
            break
    return [float(math.exp(v)) for v in x]


def fit_h2d(profile: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType,
            runs: Sequence[TokenRun], lo_GBps: float = 0.05, hi_GBps: float = 2000.0, iterations: int = 48) -> float:
    """The flat H2D bandwidth (GB/s) whose simulated ordered times best fit ``runs`` (least squares, relative).

    The curve is the pinned link's, or the pageable one's when the runs' cache
    was pageable (the driver's staging rate). One number, which two ordered
    depths determine and more over-determine. (Scaling the base curve's shape
    instead was tried on the H200 llama-bench runs: the shape the probe measured
    on that host did not carry over, docs/validation.md.)
    """
    wls = [workload_of(model, cache_k, cache_v, r) for r in runs]
    key = h2d_key(runs)

    def cost(log_bw: float) -> float:
        d = with_h2d(profile, math.exp(log_bw), key)
        return sum((simulated_s(d, wl, "ordered") / r.seconds_per_token - 1.0) ** 2 for wl, r in zip(wls, runs, strict=True))

    a, b = math.log(lo_GBps), math.log(hi_GBps)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = cost(c), cost(d)
    for _ in range(iterations):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = cost(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = cost(d)
    return math.exp((a + b) / 2)


def h2d_key(runs: Sequence[TokenRun]) -> str:
    """The link the ordered runs' deliveries used: ``h2d_pinned``, or ``h2d_pageable`` for a pageable cache."""
    return "h2d_pinned" if all(r.pinned for r in runs) else "h2d_pageable"


def peak_GBps(profile: dict[str, Any], key: str) -> float:
    """The highest bandwidth of the first device's ``key`` curve, GB/s."""
    return max(float(p[1]) for p in profile["devices"][0]["links"][key]["points"])


@dataclass(frozen=True)
class Fit:
    """What :func:`fit_runs` chose and found, for one (model, cache type)."""

    profile: dict[str, Any]  # the base profile with the fitted compute (and link)
    compute: dict[str, Any]  # fit_compute's record
    compute_from: str  # the arm the compute came from
    h2d_GBps: float | None  # the fitted H2D curve's peak (pinned, or pageable), None when the base's was kept
    host_attention: dict[str, Any] | None = None  # fit_host_attention's record (upstream -nkvo), else None
    residuals: tuple[dict[str, Any], ...] = ()  # every run: measured and fitted t/s, relative error
    held_out: tuple[dict[str, Any], ...] = ()  # leave-one-out: the fit without a depth, predicting it
    cpu_layers: dict[str, Any] | None = None  # validate.cpu_layers.fit_cpu_layers' record (runs with -ngl below), else None


def _residuals(profile: dict[str, Any], model: ModelShape, ck: CacheType, cv: CacheType,
               runs: Sequence[TokenRun]) -> list[dict[str, Any]]:
    out = []
    for r in runs:
        s = simulated_s(profile, workload_of(model, ck, cv, r), r.arm)
        out.append({"context": r.context, "arm": r.arm, "label": r.label, "measured_tps": 1.0 / r.seconds_per_token,
                    "fitted_tps": 1.0 / s, "error": r.seconds_per_token / s - 1.0})
    return out


def _fit(base: dict[str, Any], model: ModelShape, ck: CacheType, cv: CacheType, ordered: Sequence[TokenRun],
         resident: Sequence[TokenRun], compute_from: str) -> tuple[dict[str, Any], dict[str, Any], float | None, dict[str, Any] | None]:
    source = resident if compute_from == "resident" else ordered
    comp = fit_compute(base, model, ck, cv, source)
    prof = with_compute(base, comp["weight_GBps"], comp["attn_GBps"])
    bw, host = None, None
    if base.get("nkvo_attention") == "host":  # upstream: -nkvo 1 is attention on the CPU, no window crosses the link
        if ordered:
            host = fit_host_attention(prof, model, ck, cv, ordered)
            prof = with_host_attention(prof, host["host_attn_us"], host["host_attn_GBps"])
            if "launch_us" in host:  # the launch moved: the compute once more on it, then the CPU attention again
                relaunched = with_launch(base, host["launch_us"])
                comp = fit_compute(relaunched, model, ck, cv, source)
                prof = with_compute(relaunched, comp["weight_GBps"], comp["attn_GBps"])
                host = fit_host_attention(prof, model, ck, cv, ordered)
                prof = with_launch(with_host_attention(prof, host["host_attn_us"], host["host_attn_GBps"]),
                                   host.get("launch_us", host_launch_of(prof)))
    elif compute_from == "resident" and ordered:
        key = h2d_key(ordered)
        prof = with_h2d(prof, fit_h2d(prof, model, ck, cv, ordered), key)
        bw = peak_GBps(prof, key)
    return prof, comp, bw, host


def choose_compute_source(ordered: Sequence[TokenRun], resident: Sequence[TokenRun], want: str = "auto") -> str:
    """``resident`` when its runs span two contexts (or asked), else ``ordered``. Raises InputError when neither can."""
    spans = {arm: len({r.context for r in runs}) for arm, runs in (("ordered", ordered), ("resident", resident))}
    if want == "auto":
        want = "resident" if spans["resident"] >= 2 else "ordered"
    if spans[want] < 2:
        have = ", ".join(f"{a}: {n} depth(s)" for a, n in spans.items())
        raise InputError(f"compute from the {want} runs needs two depths or more ({have}); allowed: llama-bench -d A,B "
                         f"with -nkvo {'0' if want == 'resident' else '1'}")
    return want


def fit_runs(base: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType, runs: Sequence[TokenRun],
             compute_from: str = "auto") -> Fit:
    """Fit compute (and the link) of ``base`` to ``runs`` of one model and cache type; see the module doc. Blocks."""
    ordered = [r for r in runs if r.arm == "ordered"]
    resident = [r for r in runs if r.arm == "resident"]
    if base.get("nkvo_attention") == "host" and compute_from == "ordered":
        raise InputError("--compute-from ordered with -nkvo attention on the CPU: the ordered runs hold no GPU attention; "
                         "allowed: the resident runs (-nkvo 0 at two depths or more)")
    src = choose_compute_source(ordered, resident, "resident" if base.get("nkvo_attention") == "host" else compute_from)
    prof, comp, bw, host = _fit(base, model, cache_k, cache_v, ordered, resident, src)
    held: list[dict[str, Any]] = []
    for r in runs:  # leave one depth out where the remaining runs still determine the fit
        rest_o = [x for x in ordered if x is not r]
        rest_r = [x for x in resident if x is not r]
        pool = rest_r if src == "resident" else rest_o
        if len({x.context for x in pool}) < 2:
            continue  # the line needs two depths of its arm besides the one left out
        if src == "resident" and r.arm == "ordered" and len({x.context for x in rest_o}) < (2 if host else 1):
            continue  # the link (one run) or the CPU attention line (two depths) would have too few ordered runs left
        try:
            p, _, _, _ = _fit(base, model, cache_k, cache_v, rest_o, rest_r, src)
        except InputError:
            continue
        held.extend(_residuals(p, model, cache_k, cache_v, [r]))
    return Fit(profile=prof, compute=comp, compute_from=src, h2d_GBps=bw, host_attention=host,
               residuals=tuple(_residuals(prof, model, cache_k, cache_v, runs)), held_out=tuple(held))


def relative_band(fit_or_entry: Fit | dict[str, Any]) -> float | None:
    """The error band of predictions from a fit: the largest held-out |error|, None when no depth was held out."""
    held = fit_or_entry.held_out if isinstance(fit_or_entry, Fit) else fit_or_entry.get("held_out", ())
    errs = [abs(float(h["error"])) for h in held]
    return max(errs) if errs else None

