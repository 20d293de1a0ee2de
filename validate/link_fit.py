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
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.errors import InputError
from sim.workload import CacheType, ModelShape, Workload
from validate.token_sim import TokenRun, gauss_newton, golden_log, simulated_s, workload_of


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
    on that host did not carry over, docs/validation.md.) Blocks (simulations).
    """
    items = [OrderedRun(profile, workload_of(model, cache_k, cache_v, r), r) for r in runs]
    return flat_rate(items, h2d_key(runs), lo_GBps, hi_GBps, iterations)


@dataclass(frozen=True)
class OrderedRun:
    """An ordered run with the profile dict of its own cache type's compute (several types share one link)."""

    profile: dict[str, Any]
    workload: Workload
    run: TokenRun

    def error(self, d: dict[str, Any] | None = None) -> float:
        """Measured over simulated seconds, less 1, under ``d`` (default: its own profile). Blocks (simulation)."""
        return self.run.seconds_per_token / simulated_s(self.profile if d is None else d, self.workload, "ordered") - 1.0

    def copy_bytes(self) -> int:
        """Bytes of its largest window copy: one attention layer's K or V window (the size the link curve is read at)."""
        rows = self.workload.window_rows(max(self.workload.contexts))
        return rows * max(self.workload.k_row_bytes, self.workload.v_row_bytes)


def _relative(items: Sequence[OrderedRun], make: Callable[[dict[str, Any]], dict[str, Any]]) -> list[float]:
    return [simulated_s(make(i.profile), i.workload, "ordered") / i.run.seconds_per_token - 1.0 for i in items]


def flat_rate(items: Sequence[OrderedRun], key: str, lo_GBps: float = 0.05, hi_GBps: float = 2000.0,
              iterations: int = 48, latency_us: float | None = None) -> float:
    """The flat rate (GB/s) of link ``key`` whose simulated ordered times best fit ``items`` (least squares,
    relative), each under its own profile; ``latency_us`` replaces the curve's latency when given. Blocks."""
    def cost(bw: float) -> float:
        return sum(e * e for e in _relative(items, lambda p: with_link(p, key, bw, latency_us)))

    return golden_log(cost, lo_GBps, hi_GBps, iterations)


def with_link(profile: dict[str, Any], key: str, GBps: float, latency_us: float | None = None) -> dict[str, Any]:
    """A copy of the profile dict whose link ``key`` is flat at ``GBps`` (its latency ``latency_us``, else kept)."""
    d = with_h2d(profile, GBps, key)
    if latency_us is not None:
        for dev in d["devices"]:
            dev["links"][key]["latency_us"] = latency_us
    return d


#: The copy sizes of the ordered runs must span this ratio before a fixed cost per copy is told from the rate.
SIZE_SPAN = 1.5


def fit_pageable(items: Sequence[OrderedRun]) -> dict[str, Any]:
    """The pageable staging of a user's host from its ordered runs (``-nkvo 1``, upstream's pageable cache): a record
    with ``latency_us`` (a fixed cost per copy), ``GBps`` (the staging rate), ``curve`` ("latency + rate", or "flat"
    where the copies span less than SIZE_SPAN in size, or fewer than three runs: the latency is then the profile's),
    each run's residual, and the spread: the rate each run alone implies beside the fitted latency. Blocks.

    A pageable copy's time is ``latency + bytes / rate`` (``backends.profile_types.LinkCurve``): the simulator
    stages it in chunks on the host thread at that time, less one chunk's pinned DMA. Raises InputError with no run.
    """
    if not items:
        raise InputError("no -nkvo 1 run to fit the pageable staging to; allowed: llama-bench -nkvo 1 at one depth or more")
    key = "h2d_pageable"
    base_latency = float(items[0].profile["devices"][0]["links"][key].get("latency_us", 0.0))
    sizes = [i.copy_bytes() for i in items]
    span = max(sizes) / min(sizes)
    flat = flat_rate(items, key)
    latency, rate, curve = base_latency, flat, "flat"
    if span >= SIZE_SPAN and len(items) >= 3:
        def residuals(p: Sequence[float]) -> np.ndarray:
            return np.array(_relative(items, lambda d: with_link(d, key, p[1], p[0])))

        latency, rate = gauss_newton(residuals, [max(base_latency, 1.0), flat])
        curve = "latency + rate"
        if latency < 0.05:  # no fixed cost to speak of: the flat rate is the curve
            latency, rate, curve = base_latency, flat, "flat"
    each = [flat_rate([i], key, iterations=30, latency_us=latency) for i in items]
    return {
        "curve": curve, "latency_us": latency, "GBps": rate, "copy_bytes": sizes, "size_span": span,
        "runs": [{"label": i.run.label, "context": i.run.context, "cache": f"{i.workload.cache_k.name}/{i.workload.cache_v.name}",
                  "copy_mib": s / 2**20, "implied_GBps": g,
                  "error": i.error(with_link(i.profile, key, rate, latency))} for i, s, g in zip(items, sizes, each, strict=True)],
        "spread_GBps": {"min": min(each), "median": statistics.median(each), "max": max(each)},
    }


def pageable_held_out(items: Sequence[OrderedRun]) -> list[dict[str, Any]]:
    """Each ordered run predicted by :func:`fit_pageable` on the others (the band of the link), as token_fit's
    held-out records. Blocks (simulations)."""
    out = []
    for k, left in enumerate(items):
        rest = [i for j, i in enumerate(items) if j != k]
        if not rest:
            continue
        fit = fit_pageable(rest)
        err = left.error(with_link(left.profile, "h2d_pageable", fit["GBps"], fit["latency_us"]))
        out.append({"context": left.run.context, "arm": "ordered", "label": left.run.label,
                    "cache": f"{left.workload.cache_k.name}/{left.workload.cache_v.name}",
                    "measured_tps": 1.0 / left.run.seconds_per_token,
                    "fitted_tps": (1.0 + err) / left.run.seconds_per_token, "error": err})
    return out


def h2d_key(runs: Sequence[TokenRun]) -> str:
    """The link the ordered runs' deliveries used: ``h2d_pinned``, or ``h2d_pageable`` for a pageable cache."""
    return "h2d_pinned" if all(r.pinned for r in runs) else "h2d_pageable"


def peak_GBps(profile: dict[str, Any], key: str) -> float:
    """The highest bandwidth of the first device's ``key`` curve, GB/s."""
    return max(float(p[1]) for p in profile["devices"][0]["links"][key]["points"])
