"""What each further sequence costs, fitted to whole decode steps at several sequence counts.

A batch of ``B`` sequences reads the weights once per step, and each sequence
past the first adds a per-sequence term (``backends.profile.ComputeModel``:
``layer_seq_s`` a layer, ``attn_seq_s`` an attention layer, ``cpu_row_s`` a
CPU split). A user who cannot run kvpipe's program measures whole steps:
llama-batched-bench's ``S_TG`` at ``-npl 1,2,4,8`` (``validate.batched_bench``),
or a published table of t/s over all sequences. This module fits the term to
such rows by the method of ``validate.token_fit``: simulate each row's point
(``token_fit.workload_of``: its sequences, context and cache layout) with the
term made free; what the measured step leaves over the simulated one is,
against the simulated step's response to the term, a line, and its slope is
the term. The simulated step is exactly linear in the term (every row is one
ordered or resident step of fixed splits), so the line is the fit.

Two choices, stated once:

* **Whole steps fix one number.** On the ordered path a step's parts run one
  after another, so a GPU layer's per-sequence cost, an attention layer's and
  a CPU split's add up alike: the rows fix their sum per step and no split of
  it. ``term`` says where it goes; the default is ``layer_seq_us`` (a
  further sequence is one more column in every layer's matrix products, the
  cost llama.cpp's decode kernels pay per column). Pipelined predictions
  depend on the choice (GPU time hides copies, host time does not);
  docs/reproduction.md gives both.
* **Each point keeps its own constant.** Rows at one (arm, context, cache
  layout, host memory) share an offset: what the one-sequence profile misses
  there (the ``B = 1`` row's error) is not charged to the further sequences.
  The offsets are reported, not written into the profile.
* **The staging rate of the call, optionally** (``staging="all"``). On the
  ordered path each further sequence adds its window copy, priced at the
  one-sequence profile's host->device rate; a host whose rate moved ~10%
  between calls (the H200's pageable staging, docs/validation.md) moves that
  copy by more than the term itself, and the term then clamps at 0. With rows
  at two contexts or more the two are told apart (a copy grows with the
  context, the term does not): a factor on the link's rate is fitted with the
  term (:func:`staging_factor`) and goes into the profile. Or (``staging="one"``)
  the factor is fitted to the one-sequence rows alone (:func:`validate.staging_fit.staging_one`:
  a one-sequence step holds no per-sequence term, so its miss is the call's
  staging and the profile's compute), kept, and the term fitted after it.
  Or (``staging="sizes"``) the link's curve itself is refitted from the
  one-sequence rows (:func:`validate.staging_fit.staging_sizes`): one rate per copy size those rows
  ran, the base's curve shape between them not used (run 13, docs/validation.md:
  the base's knee between 1.33 and 1.50 MiB a copy, placed by llama-bench runs
  of other cache types, priced a held-out size 10% fast).

Units: seconds inside; the profile file's us and ms only in the records.
Blocks for the simulations (tens of ms each).
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from backends.profile import workload_key
from sim.errors import InputError
from sim.workload import CacheType, ModelShape
from validate.link_fit import with_points
from validate.staging_fit import staging_one, staging_sizes, with_staging
from validate.token_fit import TokenRun, simulated_s, workload_of

#: Where the per-sequence cost of a step goes, by name: the profile compute key and what it prices.
TERMS = {"layer": "layer_seq_us", "attention": "attn_seq_us", "cpu": "cpu_row_us"}
#: The term's value (us) at which each row's response is simulated; the step is linear in it.
UNIT_US = 100.0


@dataclass(frozen=True)
class BatchFit:
    """What :func:`fit_per_sequence` found: the term, the fitted profile dict, and every row held to it."""

    term: str  # the compute key fitted: layer_seq_us, attn_seq_us or cpu_row_us
    value_us: float  # the fitted term, us (0 when the rows grow slower than the profile does without it)
    profile: dict[str, Any]  # the base profile with the term
    clamped: bool  # the least-squares slope was negative and the term is 0
    residuals: tuple[dict[str, Any], ...]  # every row: measured and fitted t/s over all sequences, error
    held_out: tuple[dict[str, Any], ...]  # each row with a further sequence, left out of the fit and predicted
    offsets: tuple[dict[str, Any], ...]  # per point: measured less fitted ms per step (weighted mean), the profile's miss
    staging: float = 1.0  # the factor fitted on the link's rate (1: the one-sequence profile's rate kept)
    link_key: str = ""  # the link the factor applies to ("" when none was fitted)
    staging_from: str = ""  # "all": beside the term, every row; "one": the one-sequence rows alone; "sizes": one rate
    # per copy size of the one-sequence rows ("" none fitted)
    staging_points: tuple[tuple[float, float], ...] = ()  # "sizes": the link's fitted curve, (MiB a copy, GB/s) ascending


def with_term(profile: dict[str, Any], key: str, value_us: float, entry: str = "") -> dict[str, Any]:
    """A copy of the profile dict with compute ``key`` = ``value_us`` on every device (and in workloads entry ``entry``)."""
    d = copy.deepcopy(profile)
    for dev in d["devices"]:
        dev["compute"][key] = value_us
    if entry and entry in d.get("workloads", {}):
        d["workloads"][entry]["compute"][key] = value_us
    return d


def _point(r: TokenRun) -> tuple[Any, ...]:
    return (r.arm, r.context, r.unified, r.pinned, r.n_gpu_layers)



def _design(base: dict[str, Any], key: str, entry: str, model: ModelShape, cache_k: CacheType, cache_v: CacheType,
            runs: Sequence[TokenRun]) -> tuple[list[float], list[tuple[tuple[Any, ...], float, float, float]]]:
    """Each run's simulated step with the term free, and its (point, response to the term, measured less simulated,
    weight) row. Blocks (2 simulations a run)."""
    free, unit = with_term(base, key, 0.0, entry), with_term(base, key, UNIT_US, entry)
    wls = [workload_of(model, cache_k, cache_v, r) for r in runs]
    rest = [simulated_s(free, wl, r.arm) for wl, r in zip(wls, runs, strict=True)]
    xs = [(simulated_s(unit, wl, r.arm) - s0) / UNIT_US for wl, r, s0 in zip(wls, runs, rest, strict=True)]
    return rest, [(_point(r), x, r.seconds_per_token - s0, 1.0 / r.seconds_per_token ** 2)
                  for r, x, s0 in zip(runs, xs, rest, strict=True)]


def _sse(rows: Sequence[tuple[tuple[Any, ...], float, float, float]], k: float) -> float:
    """The weighted squared residual of rows under slope ``k`` and each point's own constant. Pure."""
    out = 0.0
    for g in {p for p, *_ in rows}:
        mine = [(y - k * x, w) for p, x, y, w in rows if p == g]
        mean = sum(r * w for r, w in mine) / sum(w for _, w in mine)
        out += sum(w * (r - mean) ** 2 for r, w in mine)
    return out


def staging_factor(base: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType, runs: Sequence[TokenRun],
                   term: str = "layer", lo: float = 0.25, hi: float = 4.0) -> float:
    """The factor on the ordered runs' link rate that, with the per-sequence ``term`` fitted beside it (not clamped),
    leaves the least squared relative error; needs ordered rows with further sequences at two contexts or more.
    Raises InputError otherwise. Blocks (a golden-section search, 2 simulations a run a step)."""
    from validate.link_fit import h2d_key
    from validate.token_sim import golden_log

    ordered = [r for r in runs if r.arm == "ordered"]
    if len({r.context for r in ordered if r.sequences > 1}) < 2:
        raise InputError("the staging rate beside the per-sequence term needs -nkvo rows at two -npp values or more "
                         f"(got {', '.join(str(c) for c in sorted({r.context for r in ordered})) or 'none'}); allowed: "
                         "llama-batched-bench files at two -npp values")
    key, entry = h2d_key(ordered), _entry(model, cache_k, cache_v)

    def cost(f: float) -> float:
        _, rows = _design(with_staging(base, key, f), TERMS[term], entry, model, cache_k, cache_v, runs)
        k = _slope(rows)
        return _sse(rows, 0.0 if k is None else k)

    return golden_log(cost, lo, hi, 30)



def _entry(model: ModelShape, cache_k: CacheType, cache_v: CacheType) -> str:
    return workload_key(model.name, cache_k.name) if cache_k == cache_v else f"{model.name}@{cache_k.name}/{cache_v.name}"


def _slope(rows: Sequence[tuple[tuple[Any, ...], float, float, float]]) -> float | None:
    """Weighted least-squares slope of y on x with one intercept per point: rows ``(point, x, y, weight)``. None when no
    point holds two different x."""
    means: dict[tuple[Any, ...], tuple[float, float]] = {}
    for g in {p for p, *_ in rows}:
        mine = [(x, y, w) for p, x, y, w in rows if p == g]
        sw = sum(w for *_, w in mine)
        means[g] = (sum(x * w for x, _, w in mine) / sw, sum(y * w for _, y, w in mine) / sw)
    sxx = sum(w * (x - means[p][0]) ** 2 for p, x, _, w in rows)
    sxy = sum(w * (x - means[p][0]) * (y - means[p][1]) for p, x, y, w in rows)
    return sxy / sxx if sxx > 1e-30 * max(1.0, sum(w * x * x for _, x, _, w in rows)) else None


def outlying(values: Sequence[float], spread: float) -> list[bool]:
    """Which of one configuration's repeated measurements (t/s or seconds, positive) lie outside its calls' spread:
    more than ``spread`` (a fraction, 0 < spread < 1) below the median of ``values``, or as far above it in log
    (1 / (1 - spread) times it). None where ``spread`` is 0 or there are fewer than three values (no median to hold
    them to). A slow spell of the machine slows every row a call runs while it lasts (docs/validation.md "Run 12");
    a plain call's scatter (sd ~10-12% of log t/s on the H200) passes a spread of 0.25 about 99% of the time. Pure."""
    if not 0.0 <= spread < 1.0:
        raise InputError(f"outlier spread {spread!r}; allowed: a fraction from 0 (keep every call) to below 1")
    if spread == 0.0 or len(values) < 3:
        return [False] * len(values)
    mid = statistics.median(values)
    limit = -math.log1p(-spread)
    return [abs(math.log(v / mid)) > limit for v in values]


def pooled(runs: Sequence[TokenRun], spread: float = 0.0) -> list[TokenRun]:
    """Repeated calls of one configuration as one fit point: runs alike in everything but their time (the same arm,
    -npp, -ntg, -npl, layout, streams and host memory) become one run at the **geometric mean** of their seconds per
    step, labelled with the number of calls; the others are kept; order of first appearance. The fit minimises each
    point's squared relative error, which over single calls scattering by sd s lands ~2 s^2 below their geometric
    mean (s = 9.3% on the H200's pageable copies: ~1.7% fast; docs/validation.md "Run 11"), while predictions are held
    to the geometric mean: pooling first makes the fit and the comparison one statistic. ``spread`` > 0: a call
    :func:`outlying` among its configuration's is left out first (the label counts it). Pure."""
    groups: dict[TokenRun, list[TokenRun]] = {}
    for r in runs:
        groups.setdefault(replace(r, seconds_per_token=1.0), []).append(r)
    out = []
    for key, rs in groups.items():
        if len(rs) == 1:
            out.append(rs[0])
            continue
        out_of = outlying([r.seconds_per_token for r in rs], spread)
        kept = [r for r, o in zip(rs, out_of, strict=True) if not o]
        mean_s = math.exp(sum(math.log(r.seconds_per_token) for r in kept) / len(kept))
        dropped = f", {len(rs) - len(kept)} left out as outlying" if len(kept) < len(rs) else ""
        out.append(replace(key, seconds_per_token=mean_s,
                           label=f"{key.label} (geometric mean of {len(kept)} calls{dropped})"))
    return out


def fit_per_sequence(base: dict[str, Any], model: ModelShape, cache_k: CacheType, cache_v: CacheType,
                     runs: Sequence[TokenRun], term: str = "layer", staging: str = "", spread: float = 0.0) -> BatchFit:
    """The per-sequence ``term`` (a key of :data:`TERMS`) of ``base`` fitted to ``runs``; see the module doc.
    ``staging``: the ordered runs' link rate refitted, the profile then carries it: ``"all"`` beside the term
    (:func:`staging_factor`), ``"one"`` from the one-sequence rows alone before the term (:func:`validate.staging_fit.staging_one`),
    ``"sizes"`` the link's curve from the one-sequence rows, a rate per copy size (:func:`validate.staging_fit.staging_sizes`).
    ``spread``: :func:`pooled`'s (0: every call kept).

    Each run is one step of ``run.sequences`` sequences (``seconds_per_token``: the step's seconds, all sequences).
    The slope minimises the squared relative error, over :func:`pooled` runs (repeated calls of a configuration at
    their geometric mean). Raises InputError when no point has runs at two sequence counts.
    Blocks (2 simulations a run, then one a run for the residuals and one for each held-out run).
    """
    if term not in TERMS:
        raise InputError(f"per-sequence term {term!r}; allowed: {', '.join(TERMS)}")
    runs = pooled(runs, spread)  # repeated calls of a configuration: one point at their geometric mean
    key, entry = TERMS[term], _entry(model, cache_k, cache_v)
    factor, link_key = 1.0, ""
    points: tuple[tuple[float, float], ...] = ()
    if staging not in ("", "all", "one", "sizes"):
        raise InputError(f"staging {staging!r}; allowed: all (beside the term), one (the one-sequence rows alone), "
                         "sizes (a rate per copy size of the one-sequence rows)")
    if staging:
        from validate.link_fit import h2d_key

        link_key = h2d_key([r for r in runs if r.arm == "ordered"])
        if staging == "sizes":
            points = staging_sizes(base, model, cache_k, cache_v, runs)
            base = with_points(base, link_key, points)
        else:
            factor = (staging_one(base, model, cache_k, cache_v, runs) if staging == "one"
                      else staging_factor(base, model, cache_k, cache_v, runs, term))
            base = with_staging(base, link_key, factor)
    wls = [workload_of(model, cache_k, cache_v, r) for r in runs]
    _, rows = _design(base, key, entry, model, cache_k, cache_v, runs)
    xs = [x for _, x, _, _ in rows]
    k = _slope(rows)
    if k is None:
        counts = sorted({r.sequences for r in runs})
        raise InputError(f"no point has runs at two sequence counts (sequences {', '.join(map(str, counts))} at contexts "
                         f"{', '.join(str(c) for c in sorted({r.context for r in runs}))}); allowed: rows at 1, 2, 4, 8 "
                         "sequences at one context and cache layout (llama-batched-bench -npl 1,2,4,8)")
    value = max(0.0, k)
    fitted = with_term(base, key, value, entry)
    residuals = tuple(_row(r, simulated_s(fitted, wl, r.arm)) for wl, r in zip(wls, runs, strict=True))
    held = []
    for i, (wl, r) in enumerate(zip(wls, runs, strict=True)):
        k_out = _slope(rows[:i] + rows[i + 1:])
        if xs[i] <= 0 or k_out is None:
            continue  # one sequence (nothing of the term), or the rest no longer determines the slope
        held.append(_row(r, simulated_s(with_term(base, key, max(0.0, k_out), entry), wl, r.arm), term_us=max(0.0, k_out)))
    offsets = []
    for g in dict.fromkeys(_point(r) for r in runs):
        mine = [(row, res) for row, res in zip(rows, residuals, strict=True) if row[0] == g]
        sw = sum(w for (_, _, _, w), _ in mine)
        miss = sum(w * (res["measured_s"] - res["fitted_s"]) for (_, _, _, w), res in mine) / sw
        offsets.append({"arm": g[0], "context": g[1], "unified": g[2], "pinned": g[3], "rows": len(mine),
                        "offset_ms": miss * 1e3})
    return BatchFit(term=key, value_us=value, profile=fitted, clamped=k < 0, residuals=residuals, held_out=tuple(held),
                    offsets=tuple(offsets), staging=factor, link_key=link_key, staging_from=staging, staging_points=points)


def _row(r: TokenRun, fitted_s: float, **extra: float) -> dict[str, Any]:
    """A run held to a simulated step: t/s over all sequences, and the error (fitted rate / measured rate - 1)."""
    return {"label": r.label, "arm": r.arm, "context": r.context, "sequences": r.sequences, "unified": r.unified,
            "measured_s": r.seconds_per_token, "fitted_s": fitted_s, "measured_tps": r.sequences / r.seconds_per_token,
            "fitted_tps": r.sequences / fitted_s, "error": r.seconds_per_token / fitted_s - 1.0, **extra}


def record(fit: BatchFit, source: str) -> dict[str, Any]:
    """The fit as a profile's ``batch`` record (file units, rounded to 6 significant digits)."""
    staging = {"staging_factor": fit.staging, "staging_link": fit.link_key, "staging_from": fit.staging_from} if fit.link_key else {}
    if fit.staging_points:
        staging["staging_points"] = [list(p) for p in fit.staging_points]
    return rounded({"from": source, "term": fit.term, "value_us": fit.value_us, "clamped": fit.clamped, **staging,
                    "residuals": list(fit.residuals), "held_out": list(fit.held_out), "offsets": list(fit.offsets)})


def rounded(value: Any) -> Any:
    """Floats to 6 significant digits, recursively (a committed record stays stable across platforms). Pure."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def apply(profile: dict[str, Any], fit: BatchFit, model: ModelShape, cache_k: CacheType, cache_v: CacheType,
          source: str) -> dict[str, Any]:
    """A copy of the profile dict with the fitted term on every device and in the model's workloads entry (made from
    the device's compute where missing), the fit under that entry's ``batch``, and the provenance. Pure."""
    d = (with_points(profile, fit.link_key, fit.staging_points) if fit.staging_points else
         with_staging(profile, fit.link_key, fit.staging) if fit.link_key else copy.deepcopy(profile))
    value = round(fit.value_us, 3)
    for dev in d["devices"]:
        dev["compute"][fit.term] = value
    key = workload_key(model.name, cache_k.name) if cache_k == cache_v else f"{model.name}@{cache_k.name}/{cache_v.name}"
    if d.get("workloads"):
        entry = d["workloads"].setdefault(key, {"compute": copy.deepcopy(d["devices"][0]["compute"]),
                                                "cache_type": cache_k.name})
        entry["compute"][fit.term] = value
        entry["batch"] = record(fit, source)
    else:
        d["batch"] = record(fit, source)
    prov = d.setdefault("provenance", {})
    if isinstance(prov, dict):
        prov[f"devices.compute.{fit.term}"] = (
            f"fitted from whole decode steps at several sequence counts ({source}): what each sequence past the first adds "
            f"to a step, one constant per point for the one-sequence profile's miss (validate.batch_fit); the other "
            f"per-sequence terms as the base has them")
        if fit.link_key:
            how = ("to the one-sequence rows alone, before the per-sequence term (validate.staging_fit.staging_one)"
                   if fit.staging_from == "one" else
                   "beside the per-sequence term to the same rows (validate.batch_fit.staging_factor)")
            each = ", ".join(f"{b:.3f} MiB: {g:.3f} GB/s" for b, g in fit.staging_points)
            curve = (f"one rate per copy size of the one-sequence rows ({each}"
                     "; between them interpolated in log size, flat outside), fitted to those rows "
                     "(validate.staging_fit.staging_sizes)" if fit.staging_points else
                     f"the base's curve at {fit.staging:.4f} times its rate: fitted {how}")
            prov[f"devices.links.{fit.link_key}"] = (
                f"{curve} ({source}). Base: {prov.get(f'devices.links.{fit.link_key}', 'as given')}")
    return d


def fit_files(paths: Sequence[str], unified: Sequence[bool], arm: str, pinned: bool, base: dict[str, Any], base_where: str,
              model: ModelShape, cache_k: CacheType, cache_v: CacheType, term: str = "layer",
              command: str = "", staging: str = "", copy_span: bool = False,
              spread: float = 0.0) -> tuple[dict[str, Any], BatchFit]:
    """The per-sequence ``term`` of ``base`` fitted to llama-batched-bench files (``unified[i]``: file i ran -kvu;
    ``copy_span``: the build copied split caches as upstream llama.cpp does), and the profile dict with it
    (:func:`apply`). Repeated calls of one configuration are fitted as one point at their geometric mean
    (:func:`pooled`, in :func:`fit_per_sequence`; ``spread``: its outlier rule). Raises InputError (a bad file, too few
    sequence counts). Blocks."""
    from validate import batched_bench

    runs: list[TokenRun] = []
    for path, uni in zip(paths, unified, strict=True):
        bench = batched_bench.load(path)
        batched_bench.check_layers(bench, model.n_layers)
        runs += batched_bench.token_runs(bench, arm, uni, pinned, copy_span)
    fit = fit_per_sequence(base, model, cache_k, cache_v, runs, term, staging, spread)
    source = f"llama-batched-bench {', '.join(paths)}" + (f" ({command})" if command else "")
    out = apply(base, fit, model, cache_k, cache_v, source)
    out["source"] = f"{base.get('source', base_where)} Per-sequence term fitted by kvpipe calibrate --from-batched-bench."
    return out, fit


def span_notes(paths: Sequence[str], unified: Sequence[bool]) -> list[str]:
    """One note per split-cache file whose rows upstream llama.cpp copies more of than kvpipe models
    (:func:`validate.batched_bench.span_ratios`): its largest ratio. Reads the files."""
    from validate import batched_bench

    out = []
    for path, uni in zip(paths, unified, strict=True):
        spans = batched_bench.span_ratios(batched_bench.load(path), uni)
        if spans:
            r, stream, window, ratio = max(spans, key=lambda s: s[3])
            out.append(f"note: {path}: -npp {r.prompt_tokens} -npl {r.sequences} over a split cache of {stream}-cell streams: "
                       f"upstream llama.cpp copies (ns - 1) x {stream} + {window} rows of each layer's K and V, {ratio:.3f}x "
                       f"the ns x {window} kvpipe models by default, so the fit reads these rows as slower sequences "
                       f"(docs/validation.md, \"Run 9's largest miss\"): give --kv-copy span if the file comes from upstream "
                       f"llama.cpp (the fork copies each stream's window), or a -c that makes each stream {window} cells")
    return out


def table(fit: BatchFit) -> list[str]:
    """Markdown lines: every row, measured and fitted t/s over all sequences, its error and its held-out error."""
    held = {(h["label"], h["context"]): h["error"] for h in fit.held_out}
    out = ["| run | context | sequences | measured t/s | fitted t/s | error | held out |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in fit.residuals:
        h = held.get((r["label"], r["context"]))
        out.append(f"| {r['label']} | {r['context']} | {r['sequences']} | {r['measured_tps']:.2f} | {r['fitted_tps']:.2f} "
                   f"| {r['error']:+.2%} | {'' if h is None else f'{h:+.2%}'} |")
    return out
