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
  H2D link (``validate.link_fit``): the pinned rate, or a pageable cache's
  staging (upstream's ``-nkvo``).

:func:`fit_runs` chooses: compute from the resident runs when they span two
depths, else from the ordered runs (the base profile's link kept, as the
reference derivation does); then the link from the ordered runs when the
compute came from resident ones. Every fitted point's residual is kept, and
with three depths or more, the leave-one-out residuals: what the fit predicts
for a depth it did not see. The error bars of a prediction come from those.

The measured token and its simulation are ``validate.token_sim``'s; upstream's
``-fa 0`` CPU attention is fitted by ``validate.host_attention_fit``; several
cache types with one resident run each, by ``validate.type_fit``.

Runs with layers on the CPU (llama.cpp's ``-ngl`` below the layer count) take
no part in the above: with the GPU's terms fitted from the all-GPU runs, they
give the host cost of a CPU layer (``validate.cpu_layers``).

Units: seconds and bytes inside; the profile file's units (GB/s, us) only where
a profile dict is written. Blocks for the simulations it runs (tens of ms each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.errors import InputError
from sim.workload import CacheType, ModelShape
from validate.host_attention_fit import fit_host_attention, host_launch_of, with_host_attention, with_launch
from validate.link_fit import fit_h2d, h2d_key, peak_GBps, with_h2d
from validate.token_sim import (
    FIT_TOKENS,
    REFINE_ABOVE,
    TokenRun,
    free_kernels,
    line,
    refined,
    rest_against_window,
    simulated_s,
    with_compute,
    workload_at,
    workload_of,
)

__all__ = ["Fit", "TokenRun", "choose_compute_source", "fit_compute", "fit_runs", "relative_band", "simulated_s", "workload_at",
           "workload_of"]


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
    xs, ys, rest = rest_against_window(free_kernels(profile), model, cache_k, cache_v, runs, tokens)
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
    (w, at), worst = refined(lambda p: with_compute(profile, p[0], p[1]), [out["weight_GBps"], out["attn_GBps"]],
                              model, cache_k, cache_v, runs, tokens)
    out.update({"weight_GBps": w, "attn_GBps": at, "refined": worst > REFINE_ABOVE, "line_worst_error": worst})
    return out


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
