"""The host->device link of ``-nkvo 1`` runs: the pinned rate, or the pageable staging a user's machine pays.

With the compute known from resident runs, the ordered runs (``-nkvo 1``: every
attention layer's K and V windows copied to the GPU each token) fix the link
their deliveries used. A pinned cache (the fork's ``--kv-cpu-pinned``) is one
flat rate (:func:`fit_h2d`). Upstream's ``-nkvo`` cache is pageable: each copy
is staged by the host through the driver's pinned buffers, a property of the
host (its memcpy, its driver) more than of the link. :func:`fit_pageable`
fits that as a curve, a fixed cost per copy (the driver's sync and set-up,
``latency_us``) plus a staging rate, when the runs' copies span sizes that tell
the two apart, and reports the spread: the rate each run alone implies.

Units: seconds and bytes inside; GB/s and us in the profile dict. Blocks for
the simulations it runs.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from sim.workload import CacheType, ModelShape
from validate.token_sim import TokenRun, simulated_s, workload_of


def with_h2d(profile: dict[str, Any], h2d_GBps: float, key: str = "h2d_pinned") -> dict[str, Any]:
    """A copy of the profile dict whose H2D link ``key`` (pinned or pageable) is flat at ``h2d_GBps`` (latency kept)."""
    d = copy.deepcopy(profile)
    for dev in d["devices"]:
        dev["links"][key]["points"] = [[1.0, h2d_GBps]]
    return d


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
