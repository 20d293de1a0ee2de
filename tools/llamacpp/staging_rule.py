"""Run 8's staging rule for issue 30 (tools/llamacpp/README-run8.md, fixed before the run): which pageable staging rate
predicts an ordered (``-nkvo 1``) llama-bench process, chosen by leave-one-configuration-out among three candidates.

Each calibration process carries the flat staging rate (GB/s) at which the profile predicts its measured t/s exactly
(``implied_GBps``) and its start (``t_h``, hours since the campaign's first process). The candidates are fitted to the
logarithm of those rates: **flat** (one mean), **per type** (a mean per cache type, the q8_0/q4_0 pair its own), **time
drift** (a line in time). Leave one configuration out: each candidate fitted to the other configurations' processes
predicts the left-out configuration's processes (``tps_at``: a process's t/s at a rate), the configuration's prediction
the mean of its processes', its measurement the median of theirs. Flat is kept unless another candidate's mean squared
error is at most ``MARGIN`` of flat's; then the lowest. Pure (``tps_at`` may block: it simulates). Not installed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CANDIDATES = ("flat", "per type", "time drift")
#: Another candidate replaces flat only at <= this fraction of flat's leave-one-out squared error (link_fit's rule).
MARGIN = 0.75


@dataclass(frozen=True)
class Process:
    """One llama-bench process of an ordered configuration."""

    config: str  # the configuration, e.g. "q8_0@2944" (its processes share it)
    kind: str  # the cache type (the pair "q8_0/q4_0")
    t_h: float  # its start, hours since the campaign's first process
    measured_tps: float  # the median of its samples, t/s
    implied_GBps: float = 0.0  # the flat staging rate that predicts it exactly (calibration processes only)


Rate = Callable[[Process], float]


def fit(candidate: str, procs: Sequence[Process]) -> Rate:
    """The candidate fitted to ``procs``' implied rates: a function giving a process's staging rate, GB/s. Raises
    ValueError for an unknown candidate, and (time drift) when the processes share one start."""
    logs = [math.log(p.implied_GBps) for p in procs]
    if candidate == "flat":
        g = math.exp(statistics.fmean(logs))
        return lambda p: g
    if candidate == "per type":
        by: dict[str, list[float]] = {}
        for p, lg in zip(procs, logs, strict=True):
            by.setdefault(p.kind, []).append(lg)
        means = {k: math.exp(statistics.fmean(v)) for k, v in by.items()}

        def per_type(p: Process) -> float:
            if p.kind not in means:
                raise ValueError(f"no calibration process of cache type {p.kind!r}; fitted: {', '.join(means)}")
            return means[p.kind]

        return per_type
    if candidate == "time drift":
        ts = [p.t_h for p in procs]
        t0, l0 = statistics.fmean(ts), statistics.fmean(logs)
        sxx = sum((t - t0) ** 2 for t in ts)
        if sxx <= 0:
            raise ValueError("time drift needs processes at two starts or more")
        b = sum((t - t0) * (lg - l0) for t, lg in zip(ts, logs, strict=True)) / sxx
        return lambda p: math.exp(l0 + b * (p.t_h - t0))
    raise ValueError(f"staging candidate {candidate!r}; allowed: {', '.join(CANDIDATES)}")


def config_error(rate: Rate, procs: Sequence[Process], tps_at: Callable[[Process, float], float]) -> tuple[float, float]:
    """A configuration's predicted t/s (the mean of its processes' at ``rate``) and its error against the median of
    their measured t/s (predicted / measured - 1)."""
    pred = statistics.fmean(tps_at(p, rate(p)) for p in procs)
    return pred, pred / statistics.median(p.measured_tps for p in procs) - 1.0


def by_config(procs: Sequence[Process]) -> dict[str, list[Process]]:
    out: dict[str, list[Process]] = {}
    for p in procs:
        out.setdefault(p.config, []).append(p)
    return out


def leave_one_out(procs: Sequence[Process], tps_at: Callable[[Process, float], float]) -> dict[str, dict[str, float]]:
    """Per candidate, per calibration configuration: its error when the candidate is fitted without it."""
    groups = by_config(procs)
    out: dict[str, dict[str, float]] = {}
    for cand in CANDIDATES:
        out[cand] = {}
        for cfg, mine in groups.items():
            rest = [p for p in procs if p.config != cfg]
            out[cand][cfg] = config_error(fit(cand, rest), mine, tps_at)[1]
    return out


def scores(loo: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each candidate's mean squared leave-one-out error."""
    return {c: statistics.fmean(e * e for e in errs.values()) for c, errs in loo.items()}


def choose(score: dict[str, float], margin: float = MARGIN) -> str:
    """Flat, unless another candidate's score is <= ``margin`` times flat's: then the lowest of those."""
    better = {c: s for c, s in score.items() if c != "flat" and s <= margin * score["flat"]}
    return min(better, key=lambda c: better[c]) if better else "flat"
