"""Upstream llama.cpp's attention on the CPU under ``-nkvo`` (``-fa 0``), fitted from its ordered runs.

Without flash attention upstream pins attention to the CPU when the cache is in
host memory: no window crosses the link, the CPU reads it
(``ComputeModel.host_attn_*``; kvpipe's ``host-attention`` arm). With the GPU's
compute fitted from the resident runs, each ordered run simulated with the CPU
attention free leaves that attention's time; against the window bytes it is a
line (fixed part per attention layer, rate). Where the base profile's own host
costs leave less than nothing for the fixed part, the engine's launch time per
GPU split is fitted instead (:func:`fit_host_attention`).

Units: seconds and bytes inside, the profile dict's us and GB/s where written.
Blocks for the simulations it runs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from backends.profile import ComputeModel
from sim.errors import InputError
from sim.graph import decode_graph
from sim.workload import CacheType, ModelShape
from validate.token_sim import (
    FIT_TOKENS,
    HOST_ATTENTION_KEYS,
    REFINE_ABOVE,
    TokenRun,
    free_kernels,
    line,
    refined,
    rest_against_window,
    workload_of,
)


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
    xs, ys, rest = rest_against_window(free, model, cache_k, cache_v, runs, tokens)
    a, b = line(xs, ys)
    if not b > 0:
        raise InputError(f"the -nkvo 1 runs do not fit attention on the CPU: {b * 1e12:.3f} ms per GB of window; "
                         "allowed: runs where a token takes longer behind a longer context")
    if a < 0:  # the base profile's host costs leave less than nothing for the CPU's fixed part: its launches are slower
        return _fit_host_attention_and_launch(profile, model, cache_k, cache_v, runs, tokens, xs, ys, rest, a, b)
    out: dict[str, Any] = {"contexts": [r.context for r in runs], "window_bytes": xs, "host_s": ys, "non_host_attention_ms": rest,
           "host_attn_us": a / model.n_attn * 1e6, "host_attn_GBps": 1.0 / b / 1e9, "refined": False}
    (us, gbps), worst = refined(lambda p: with_host_attention(profile, p[0], p[1]),
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

    (launch_us, gbps), worst = refined(make, start, model, cache_k, cache_v, runs, tokens)
    return {"contexts": [r.context for r in runs], "window_bytes": xs, "host_s": ys, "non_host_attention_ms": rest,
            "host_attn_us": 0.0, "host_attn_GBps": gbps, "launch_us": launch_us, "base_launch_us": base_launch,
            "line_intercept_ms": a * 1e3, "refined": worst > REFINE_ABOVE, "line_worst_error": worst}
