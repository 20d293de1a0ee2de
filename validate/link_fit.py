"""The host->device link of ``-nkvo 1`` runs: the pinned rate, or the pageable staging a user's machine pays.

With the compute known from resident runs, the ordered runs (``-nkvo 1``: every
attention layer's K and V windows copied to the GPU each token) fix the link
their deliveries used. A pinned cache (the fork's ``--kv-cpu-pinned``) is one
flat rate (:func:`fit_h2d`). Upstream's ``-nkvo`` cache is pageable: each copy
is staged by the host through the driver's pinned buffers, a property of the
host (its memcpy, its driver) more than of the link. :func:`fit_pageable`
fits that as a flat rate, or a curve (a fixed cost per copy plus a rate; two
regimes of copy size) where the runs' copies span sizes and the curve predicts
the runs it is not fitted to better (leave one out), and reports the spread:
the rate each run alone implies.

Units: seconds and bytes inside; GB/s and us in the profile dict. Blocks for
the simulations it runs.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.errors import InputError
from sim.workload import CacheType, ModelShape, Workload
from validate.token_sim import TokenRun, gauss_newton, golden_log, simulated_s, workload_of


def with_points(profile: dict[str, Any], key: str, points: Sequence[Sequence[float]]) -> dict[str, Any]:
    """A copy of the profile dict whose link ``key`` has the curve ``points`` ((MiB a copy, GB/s), ascending) on every
    device, its latency kept. Pure."""
    d = copy.deepcopy(profile)
    for dev in d["devices"]:
        dev["links"][key]["points"] = [[float(b), float(g)] for b, g in points]
    return d


def with_h2d(profile: dict[str, Any], h2d_GBps: float, key: str = "h2d_pinned") -> dict[str, Any]:
    """A copy of the profile dict whose H2D link ``key`` (pinned or pageable) is flat at ``h2d_GBps`` (latency kept)."""
    return with_points(profile, key, [(1.0, h2d_GBps)])


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
#: A two-parameter curve replaces the flat rate only when its leave-one-out squared error is at most this share of the
#: flat rate's.
CURVE_GAIN = 0.75
#: How far the staging rate moved with the copy size on the H200 hosts measured (run 5: 8.4-9.5 GB/s below 3.5 MiB a
#: copy, 7.0-7.3 above 4.5 MiB; run 4: 8.1-8.9 and 6.9-7.6): the band of a flat rate fitted at one copy size.
UNDETERMINED_BAND = 0.25


def curve_points(rec: dict[str, Any]) -> list[list[float]]:
    """The ``points`` ([MiB, GB/s], ascending: a profile's link points) of a :func:`fit_pageable` record's curve. Pure."""
    return [[float(b), float(g)] for b, g in rec.get("points", [[1.0, rec["GBps"]]])]


def with_curve(profile: dict[str, Any], key: str, rec: dict[str, Any]) -> dict[str, Any]:
    """A copy of the profile dict whose link ``key`` is the curve of a :func:`fit_pageable` record (its points and,
    unless flat, its latency). Pure."""
    return with_points(with_link(profile, key, rec["GBps"], rec["latency_us"] if rec["curve"] != "flat" else None), key,
                       curve_points(rec))


def _regimes(sizes: Sequence[int], each: Sequence[float]) -> tuple[float, float] | None:
    """The copy sizes (bytes) between which the runs' implied rates change most: the split of the sorted sizes that
    leaves the least squared log-rate spread within the two sides (None when the sizes do not differ). Pure."""
    order = sorted(range(len(sizes)), key=lambda k: sizes[k])
    best: tuple[float, float, float] | None = None
    for cut in range(1, len(order)):
        lo, hi = order[:cut], order[cut:]
        if sizes[lo[-1]] == sizes[hi[0]]:
            continue
        sse = sum(_spread([math.log(each[k]) for k in side]) for side in (lo, hi))
        if best is None or sse < best[0]:
            best = (sse, float(sizes[lo[-1]]), float(sizes[hi[0]]))
    return None if best is None else best[1:]


def _spread(xs: Sequence[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs)


def fit_pageable(items: Sequence[OrderedRun]) -> dict[str, Any]:
    """The pageable staging of a user's host from its ordered runs (``-nkvo 1``, upstream's pageable cache): a record
    with ``curve``, its ``points`` ([MiB, GB/s]), ``latency_us`` (a fixed cost per copy), ``GBps`` (the one flat rate
    over every run), each run's residual, and the spread: the rate each run alone implies (beside the curve's latency).

    Where the copies span SIZE_SPAN in size and there are three runs or more, two curves of two parameters are tried
    beside the flat rate: ``latency + rate`` (a fixed cost per copy, ``backends.profile_types.LinkCurve``) and
    ``two regimes`` (one rate for the copies up to a size, another from a larger size on, interpolated between: the
    host's staging changes regime with the copy size). Each is judged by what it predicts for a run it did not see
    (:func:`_best_curve`: leave one out); the better curve replaces the flat rate when its leave-one-out squared error
    is at most CURVE_GAIN of the flat rate's (``choice`` records every candidate's). With too few runs or sizes to try
    a curve, the curve is ``flat`` and ``undetermined`` says what the file cannot tell (the rate at other copy sizes,
    band UNDETERMINED_BAND). Raises InputError with no run. Blocks.
    """
    if not items:
        raise InputError("no -nkvo 1 run to fit the pageable staging to; allowed: llama-bench -nkvo 1 at one depth or more")
    key = "h2d_pageable"
    base_latency = float(items[0].profile["devices"][0]["links"][key].get("latency_us", 0.0))
    sizes = [i.copy_bytes() for i in items]
    span = max(sizes) / min(sizes)
    flat = flat_rate(items, key)
    rec: dict[str, Any] = {"curve": "flat", "latency_us": base_latency, "GBps": flat, "points": [[1.0, flat]]}
    each = [flat_rate([i], key, iterations=30) for i in items]
    if span >= SIZE_SPAN and len(items) >= 3:
        rec = _best_curve(items, key, base_latency, flat, each)
    if rec["curve"] == "flat" and "choice" not in rec:  # too few runs or sizes to try a curve: the file cannot tell
        rec["undetermined"] = (f"one copy size ({min(sizes) / 2**20:.2f} MiB)" if span < SIZE_SPAN else
                               f"copies of {min(sizes) / 2**20:.2f}-{max(sizes) / 2**20:.2f} MiB in {len(items)} runs") + \
            (": the staging rate at other copy sizes is not determined by this file (the H200 hosts measured changed "
             f"it by up to {UNDETERMINED_BAND:.0%} past ~3.5 MiB a copy); band +-{UNDETERMINED_BAND:.0%}")
        rec["band"] = UNDETERMINED_BAND
    if rec["curve"] == "latency + rate":  # the rate each run alone implies beside the fitted fixed cost
        each = [flat_rate([i], key, iterations=30, latency_us=rec["latency_us"]) for i in items]
    fitted = [i.error(with_curve(i.profile, key, rec)) for i in items]
    return rec | {
        "copy_bytes": sizes, "size_span": span,
        "runs": [{"label": i.run.label, "context": i.run.context, "cache": f"{i.workload.cache_k.name}/{i.workload.cache_v.name}",
                  "copy_mib": s / 2**20, "implied_GBps": g, "error": e} for i, s, g, e in zip(items, sizes, each, fitted, strict=True)],
        "spread_GBps": {"min": min(each), "median": statistics.median(each), "max": max(each)},
    }


def _candidates(items: Sequence[OrderedRun], key: str, base_latency: float, each: Sequence[float],
                flat: float | None = None) -> list[dict[str, Any]]:
    """The flat rate (``flat`` when known), then the two-parameter curves ``items`` can carry (latency + rate; two
    regimes), each fitted to ``items`` (``each``: the rate each run alone implies). Blocks."""
    flat = flat_rate(items, key) if flat is None else flat
    out: list[dict[str, Any]] = [{"curve": "flat", "latency_us": base_latency, "GBps": flat, "points": [[1.0, flat]]}]
    sizes = [i.copy_bytes() for i in items]
    if len(items) < 2 or max(sizes) / min(sizes) < SIZE_SPAN:
        return out

    def residuals(p: Sequence[float]) -> np.ndarray:
        return np.array(_relative(items, lambda d: with_link(d, key, p[1], p[0])))

    latency, rate = gauss_newton(residuals, [max(base_latency, 1.0), flat])
    if latency >= 0.05 and rate > 0:  # no fixed cost to speak of: the flat rate is the curve
        out.append({"curve": "latency + rate", "latency_us": latency, "GBps": rate, "points": [[1.0, rate]]})
    knee = _regimes(sizes, each)
    if knee is not None:
        lo = [i for i, s in zip(items, sizes, strict=True) if s <= knee[0]]
        hi = [i for i, s in zip(items, sizes, strict=True) if s >= knee[1]]
        r_lo, r_hi = flat_rate(lo, key), flat_rate(hi, key)
        out.append({"curve": "two regimes", "latency_us": base_latency, "GBps": flat,
                    "points": [[knee[0] / 2**20, r_lo], [knee[1] / 2**20, r_hi]],
                    "regimes": [{"up_to_mib": knee[0] / 2**20, "GBps": r_lo, "runs": len(lo)},
                                {"from_mib": knee[1] / 2**20, "GBps": r_hi, "runs": len(hi)}]})
    return out


def _best_curve(items: Sequence[OrderedRun], key: str, base_latency: float, flat: float, each: Sequence[float]) -> dict[str, Any]:
    """fit_pageable's choice among the flat rate, latency + rate and two regimes, by what each predicts for a run it
    did not see: every candidate is refitted without each run in turn and predicts it; a two-parameter curve replaces
    the flat rate only when its leave-one-out squared error is at most CURVE_GAIN of the flat rate's (run 5: the two
    regimes chosen by their in-sample error read the call-to-call scatter as a size effect and did not hold out).
    The record gets ``choice``: each candidate's in-sample and leave-one-out root-mean-square error. Blocks."""
    full = _candidates(items, key, base_latency, each, flat)
    loo: dict[str, list[float]] = {c["curve"]: [] for c in full}
    for k, left in enumerate(items):
        rest = [i for j, i in enumerate(items) if j != k]
        for c in _candidates(rest, key, base_latency, [e for j, e in enumerate(each) if j != k]):
            if c["curve"] in loo:
                loo[c["curve"]].append(left.error(with_curve(left.profile, key, c)))
    rms = {name: math.sqrt(sum(e * e for e in errs) / len(errs)) if len(errs) == len(items) else math.inf
           for name, errs in loo.items()}
    fitted = {c["curve"]: math.sqrt(sum(i.error(with_curve(i.profile, key, c)) ** 2 for i in items) / len(items)) for c in full}
    choice = {name: {"in_sample_rms": fitted[name], "leave_one_out_rms": rms[name] if math.isfinite(rms[name]) else None,
                     "errors": loo[name]} for name in rms}
    best = min(full[1:], key=lambda c: rms[c["curve"]], default=None)
    won = best is not None and rms[best["curve"]] ** 2 <= CURVE_GAIN * rms["flat"] ** 2
    return dict(best if won and best is not None else full[0], choice=choice)


def pageable_held_out(items: Sequence[OrderedRun], rec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each ordered run predicted by the staging fitted on the others (the band of the link), as token_fit's held-out
    records. ``rec``: :func:`fit_pageable`'s record of ``items``; where it chose its curve by leave-one-out, its
    curve's leave-one-out errors are these (the curve kind kept, refitted without each run); else :func:`fit_pageable`
    on the others. Blocks (simulations)."""
    out = []
    loo = (rec or {}).get("choice", {}).get((rec or {}).get("curve", ""), {}).get("errors")
    for k, left in enumerate(items):
        rest = [i for j, i in enumerate(items) if j != k]
        if not rest:
            continue
        err = loo[k] if loo else left.error(with_curve(left.profile, "h2d_pageable", fit_pageable(rest)))
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
