"""The host->device staging of a user's llama-batched-bench calls, fitted to their one-sequence rows.

A one-sequence decode step holds no per-sequence term (``validate.batch_fit``), so what the one-sequence profile
misses there is the call's staging (the H200's pageable copies moved ~10% between calls) and the profile's compute.
Two fits of it, each used by ``validate.batch_fit.fit_per_sequence`` before the per-sequence term:

* :func:`staging_one`: one factor on the profile's link curve, its shape kept (``--fit-staging one``).
* :func:`staging_sizes`: the curve itself, one rate per copy size the one-sequence rows ran (``--fit-staging sizes``):
  run 13 (docs/validation.md) missed at the one window size its calibration rows did not share, where the base's
  shape (run 8's llama-bench knee between 1.33 and 1.50 MiB a copy, placed by runs of other cache types) priced the
  copy ~10% fast.

Units: the profile file's MiB and GB/s in its link points; seconds inside. Blocks for the simulations.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from sim.errors import InputError
from sim.workload import CacheType, ModelShape
from validate.link_fit import h2d_key, with_points
from validate.token_fit import TokenRun, simulated_s, workload_of


def with_staging(profile: dict[str, Any], key: str, factor: float) -> dict[str, Any]:
    """A copy of the profile dict whose link ``key`` runs ``factor`` times its rate at every copy size. Pure."""
    d = copy.deepcopy(profile)
    for dev in d["devices"]:
        dev["links"][key]["points"] = [[b, g * factor] for b, g in dev["links"][key]["points"]]
    return d

def _one_sequence_rows(model: ModelShape, cache_k: CacheType, cache_v: CacheType, runs: Sequence[TokenRun],
                       what: str) -> tuple[list[TokenRun], str, list[Any]]:
    """The ordered one-sequence rows of ``runs``, their link's key and their workloads, for fitting the staging
    ``what`` (rate or curve) to them. Raises InputError without one. Pure."""
    ones = [r for r in runs if r.arm == "ordered" and r.sequences == 1]
    if not ones:
        raise InputError(f"the staging {what} from the one-sequence rows needs -nkvo rows at one sequence (got sequences "
                         f"{', '.join(str(s) for s in sorted({r.sequences for r in runs}))}); allowed: llama-batched-bench "
                         "files with -npl 1 among the -npl values")
    return ones, h2d_key(ones), [workload_of(model, cache_k, cache_v, r) for r in ones]


def staging_one(base: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType, runs: Sequence[TokenRun],
                lo: float = 0.25, hi: float = 4.0) -> float:
    """The factor on the ordered runs' link rate that leaves the least squared relative error over the ordered
    one-sequence rows alone (each row's own simulated step, no constant: a one-sequence step holds no per-sequence term).
    Raises InputError without an ordered one-sequence row. Blocks (a golden-section search, one simulation a row a step)."""
    from validate.token_sim import golden_log

    ones, key, wls = _one_sequence_rows(model, cache_k, cache_v, runs, "rate")

    def cost(f: float) -> float:
        d = with_staging(base, key, f)
        return sum((simulated_s(d, wl, r.arm) / r.seconds_per_token - 1.0) ** 2 for wl, r in zip(wls, ones, strict=True))

    return golden_log(cost, lo, hi, 30)


def one_sequence_copy_bytes(model: ModelShape, cache_k: CacheType, cache_v: CacheType, run: TokenRun) -> int:
    """The largest host->device copy (bytes) a one-sequence ``run``'s decode step makes: one layer's K or V window at
    its context, padded as llama.cpp pads the attended rows. Pure (builds the step's graph)."""
    from backends.profile import ComputeModel
    from sim.graph import decode_graph

    wl = workload_of(model, cache_k, cache_v, run)
    g = decode_graph(wl, ComputeModel(), position=max(wl.contexts))
    return max((i.nbytes for sp in g.splits for i in sp.staged), default=0)


def base_rate(profile: dict[str, Any], key: str, mib: float) -> float:
    """The GB/s of ``profile``'s link ``key`` (device 0) at a copy of ``mib`` MiB, as backends.profile_types.LinkCurve
    interpolates it. Pure."""
    from backends.profile_types import LinkCurve

    pts = profile["devices"][0]["links"][key]["points"]
    return LinkCurve(tuple(b * 2**20 for b, _ in pts), tuple(g * 1e9 for _, g in pts)).bandwidth(mib * 2**20) / 1e9


def staging_sizes(base: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType, runs: Sequence[TokenRun],
                  lo: float = 0.25, hi: float = 4.0, sweeps: int = 2) -> tuple[tuple[float, float], ...]:
    """The link curve fitted to the ordered one-sequence rows: one point per copy size they ran
    (:func:`one_sequence_copy_bytes`), its rate the base's rate at that size times the factor that leaves the least
    squared relative error over that size's rows, the other points held (``sweeps`` passes over the sizes: a row's
    step may hold copies of other sizes). Between the points the rate is interpolated as every link curve is (linear
    in the log of the size), outside them held flat; with one size the curve is flat at it. Returns the points (MiB a
    copy, GB/s), ascending. Raises InputError without an ordered one-sequence row. Blocks (a golden-section search a
    size a sweep, one simulation a row a step)."""
    from validate.token_sim import golden_log

    ones, key, wls = _one_sequence_rows(model, cache_k, cache_v, runs, "curve")
    size = [one_sequence_copy_bytes(model, cache_k, cache_v, r) / 2**20 for r in ones]
    if min(size) <= 0:
        raise InputError("the staging curve from the one-sequence rows needs rows whose step copies a window to the device "
                         "(one copied none); allowed: -nkvo runs with the attention layers on the GPU (-ngl 99)")
    sizes = sorted(set(size))
    rate = {m: base_rate(base, key, m) for m in sizes}
    for _ in range(sweeps):
        for m in sizes:
            mine = [(wl, r) for wl, r, s in zip(wls, ones, size, strict=True) if s == m]

            def cost(f: float, m: float = m, mine: list[tuple[Any, TokenRun]] = mine) -> float:
                d = with_points(base, key, [(b, rate[b] * (f if b == m else 1.0)) for b in sizes])
                return sum((simulated_s(d, wl, r.arm) / r.seconds_per_token - 1.0) ** 2 for wl, r in mine)

            rate[m] *= golden_log(cost, lo, hi, 30)
    return tuple((m, rate[m]) for m in sizes)
