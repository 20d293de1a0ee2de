"""The attention of each KV cache type as llama.cpp's kernels pay it, from one resident run per type.

llama.cpp's flash-attention decode kernel reads each attention layer's K and V
window; what a window byte costs depends on the cache type (a quantized type is
dequantized inside the kernel), and a quantized cache adds a fixed cost per
layer: upstream (0c1e570, ``src/llama-kv-cache.cpp`` ``attn_rot_k``/``attn_rot_v``,
``src/llama-graph.cpp`` ``build_attn``) rotates Q and K by a Hadamard matrix when
K is quantized, and V and the attention output when V is, two small products
each. So an attention layer with K type ``a`` and V type ``b`` costs

    rotation(a, b) + K window bytes x s(a) + V window bytes x s(b)

and the weights cost the same whatever the cache. From a llama-bench file with
several cache types (:func:`fit_types`):

* **the weights** from the *reference* type, one with resident runs (``-nkvo 0``)
  at two depths or more: its line over the window bytes (``validate.token_fit``)
  has the weights and its rotation in the intercept; the rotation is the rule
  below, the rest is the weights' time, shared by every type.
* **each type's seconds per window byte** ``s`` from its resident runs: with two
  depths or more, its own line (its fixed part measured: the intercept less the
  weights); with one, the one rate that fits it, the fixed part the rotation rule.
  A quantized type then shares the reference's fixed part exactly when the
  reference is quantized too: the rule's size matters only between a quantized
  and an unquantized type, and the entry's band carries it (+-ROTATION_SPREAD).
* **a mixed K/V pair** (``-ctk q8_0 -ctv q4_0``) as upstream's default CUDA
  build runs it: that build compiles the flash-attention vector kernel for
  same-type pairs only (``GGML_CUDA_FA_QUANTS``), so for a mixed pair
  ``ggml_cuda_flash_attn_ext_vec`` falls back to the f16 kernel and
  ``launch_fattn`` first converts every non-f16 side's whole view to f16
  (``ggml/src/ggml-cuda/fattn*.cu``, one kernel a side, every layer and token).
  Its terms are f16's attention over the f16 rows, the rotation rule of both
  sides, CONVERT_KERNELS small kernels a layer and a conversion rate per byte
  converted (read quantized, written f16): fitted to the pair's resident run
  where the file has one (:func:`converted`), else **uncalibrated**: the
  weights' streaming rate stands in, and the band is how far a conversion
  CONVERT_SPREAD times slower or faster moves the pair's prediction.
* **the host side of ``-nkvo 1``** from every type's ordered runs at once, each
  under its type's compute (``validate.link_fit``): one machine, one link.
* **a type the file does not cover** is uncalibrated: the profile's device
  compute is a stand-in (the calibrated types' rates' geometric mean) with a
  wide band, how far that stand-in misses the calibrated types' own resident
  runs (``uncalibrated_cache``), instead of another type's rate.

Units: seconds and bytes inside; us and GB/s in the profile dict. Blocks for
the simulations it runs (a few hundred, seconds to a minute).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sim.errors import InputError
from sim.workload import CacheType, ModelShape, cache_type
from validate.link_fit import OrderedRun, fit_pageable, flat_rate, pageable_held_out, with_curve, with_link
from validate.token_fit import fit_compute
from validate.token_sim import TokenRun, free_kernels, golden_log, simulated_s, workload_of

#: Small products a quantized K cache adds per attention layer (Q and K rotated), and a quantized V cache (V and the
#: attention output rotated): llama.cpp 0c1e570's build_attn, for heads a multiple of 64 wide.
ROTATION_KERNELS = {"k": 2, "v": 2}
#: GPU time of one such small product inside llama.cpp's CUDA graph, us: an estimate (a few us a small kernel on a
#: current GPU), not fitted: no resident run at one depth tells it from the weights.
SMALL_KERNEL_US = 3.0
#: How far the estimate may be off, relative: the band of a type whose rotation differs from the reference's.
ROTATION_SPREAD = 0.5
#: Conversion kernels a mixed pair adds per attention layer and non-f16 side (the f16 fallback's to_fp16 of K, of V).
CONVERT_KERNELS = 1
#: How far an uncalibrated mixed pair's stand-in conversion rate may be off, a factor either way (its band).
CONVERT_SPREAD = 2.0

Pair = tuple[str, str]


def quantized(ct: CacheType) -> bool:
    """Whether llama.cpp stores the type in blocks it must dequantize (and rotates for): q8_0, q4_0, ... Pure."""
    return ct.block_elems > 1


def rotation_us(ck: CacheType, cv: CacheType, kernel_us: float = SMALL_KERNEL_US) -> float:
    """The rotation rule: fixed GPU time per attention layer, us, of a cache with K type ``ck`` and V type ``cv``."""
    return kernel_us * (ROTATION_KERNELS["k"] * quantized(ck) + ROTATION_KERNELS["v"] * quantized(cv))


@dataclass(frozen=True)
class TypeTerms:
    """One K/V pair's attention: ``attn_us`` fixed per attention layer, ``attn_GBps`` window bytes per second."""

    attn_us: float
    attn_GBps: float
    how: str  # how the file determined them
    convert_GBps: float | None = None  # a mixed pair's conversion to f16, bytes read and written per second


def converted(model: ModelShape, ck: CacheType, cv: CacheType, f16: TypeTerms, convert_GBps: float, how: str,
              kernel_us: float = SMALL_KERNEL_US) -> TypeTerms:
    """The terms of a mixed pair on upstream's default build (the module doc): f16's attention over the window as f16
    rows, every non-f16 side converted at ``convert_GBps`` (its row read, an f16 row written), the rotation rule of
    both sides and CONVERT_KERNELS per converted side; as a fixed part and a rate over the pair's own window bytes. Pure."""
    f = cache_type("f16")
    sides = [(ck, model.k_elems), (cv, model.v_elems)]
    f16_bytes = sum(f.row_bytes(n) for _, n in sides)
    conv = [(c.row_bytes(n), f.row_bytes(n)) for c, n in sides if c.name != "f16"]
    s_row = f16_bytes / (f16.attn_GBps * 1e9) + sum(a + b for a, b in conv) / (convert_GBps * 1e9)
    fixed = f16.attn_us + rotation_us(ck, cv, kernel_us) + CONVERT_KERNELS * len(conv) * kernel_us
    return TypeTerms(fixed, sum(c.row_bytes(n) for c, n in sides) / s_row / 1e9, how, convert_GBps)


def with_terms(base: dict[str, Any], weight_GBps: float, terms: TypeTerms) -> dict[str, Any]:
    """A copy of the profile dict whose devices run the weights at ``weight_GBps`` and attention by ``terms``."""
    d = free_kernels(base)
    for dev in d["devices"]:
        dev["compute"].update(weight_GBps=weight_GBps, attn_us=terms.attn_us, attn_GBps=terms.attn_GBps)
    return d


def compose(model: ModelShape, k: tuple[CacheType, TypeTerms], v: tuple[CacheType, TypeTerms]) -> TypeTerms:
    """The terms of a K type's and a V type's caches together: half of each one's fixed part (the rule's kernels are
    as many on each side), the K window at the K type's seconds per byte and the V window at the V type's. Pure."""
    (ck, tk), (cv, tv) = k, v
    kb, vb = ck.row_bytes(model.k_elems), cv.row_bytes(model.v_elems)
    gbps = (kb + vb) / (kb / tk.attn_GBps + vb / tv.attn_GBps)
    return TypeTerms(tk.attn_us / 2 + tv.attn_us / 2, gbps, f"composed from the K type's ({ck.name}) and the V type's ({cv.name}) terms")


@dataclass(frozen=True)
class TypesFit:
    """What :func:`fit_types` found: the shared weights and link, each pair's terms, residuals and bands."""

    profile: dict[str, Any]  # the base with the weights, the stand-in attention and the fitted link
    weight_GBps: float
    reference: Pair
    terms: dict[Pair, TypeTerms]
    link: dict[str, Any]  # fit_pageable's record, or {"curve": "flat", "GBps": ...} for a pinned cache
    residuals: dict[Pair, list[dict[str, Any]]]
    held_out: dict[Pair, list[dict[str, Any]]]
    bands: dict[Pair, tuple[float, str]]
    uncalibrated: dict[str, Any]  # the stand-in's band and where it comes from
    uncovered: tuple[Pair, ...]  # pairs with runs but no resident run: left uncalibrated


def _pairs(groups: dict[Pair, list[TokenRun]]) -> tuple[Pair, list[Pair], list[Pair]]:
    resident = {p: {r.context for r in runs if r.arm == "resident"} for p, runs in groups.items()}
    lines = [p for p in groups if p[0] == p[1] and len(resident[p]) >= 2]
    if not lines:
        raise InputError(f"several cache types ({', '.join('/'.join(p) for p in groups)}) and none with -nkvo 0 runs at two "
                         "depths or more (the weights' time); allowed: one -ctk/-ctv pair run at -nkvo 0 -d A,B beside the "
                         "others' one depth")
    ref = max(lines, key=lambda p: len(resident[p]))  # max keeps the first of equals: file order
    return ref, [p for p in groups if resident[p]], [p for p in groups if not resident[p]]


def _one_rate(base: dict[str, Any], model: ModelShape, weight_GBps: float, attn_us: float, ck: CacheType, cv: CacheType,
              runs: Sequence[TokenRun]) -> float:
    """The attention rate (GB/s) fitting ``runs`` (resident) with the weights and the fixed part given. Blocks."""
    wls = [workload_of(model, ck, cv, r) for r in runs]

    def cost(gbps: float) -> float:
        d = with_terms(base, weight_GBps, TypeTerms(attn_us, gbps, ""))
        return sum((simulated_s(d, wl, "resident") / r.seconds_per_token - 1) ** 2 for wl, r in zip(wls, runs, strict=True))

    return golden_log(cost, 1.0, 1e5)


def _attention(base: dict[str, Any], model: ModelShape, groups: dict[Pair, list[TokenRun]], ref: Pair, fitted: list[Pair],
               kernel_us: float) -> tuple[float, dict[Pair, TypeTerms]]:
    """The weights' rate and each resident-calibrated pair's terms, with the rotation rule at ``kernel_us``. Blocks."""
    rk, rv = cache_type(ref[0]), cache_type(ref[1])
    res = {p: [r for r in groups[p] if r.arm == "resident"] for p in fitted}
    line = fit_compute(base, model, rk, rv, res[ref])
    weights_s = model.weight_bytes / (line["weight_GBps"] * 1e9) - model.n_attn * rotation_us(rk, rv, kernel_us) * 1e-6
    if weights_s <= 0:
        raise InputError(f"the {'/'.join(ref)} -nkvo 0 runs leave no time for the weights beside the K/V rotation; allowed: "
                         "runs where a token takes longer behind a longer context")
    w = model.weight_bytes / weights_s / 1e9
    depths = len({r.context for r in res[ref]})
    terms = {ref: TypeTerms(rotation_us(rk, rv, kernel_us), line["attn_GBps"], f"a line over {depths} depths (the reference: "
                            "its intercept is the weights and the rotation rule)")}
    for p in sorted(fitted, key=lambda q: q[0] != q[1]):  # the single types first: a mixed pair needs f16's terms
        if p == ref:
            continue
        ck, cv = cache_type(p[0]), cache_type(p[1])
        if p[0] != p[1] and ("f16", "f16") in terms:
            terms[p] = _converted_fit(base, model, w, ck, cv, terms[("f16", "f16")], res[p], kernel_us)
        elif len({r.context for r in res[p]}) >= 2:
            own = fit_compute(base, model, ck, cv, res[p])
            fixed = (model.weight_bytes / (own["weight_GBps"] * 1e9) - weights_s) / model.n_attn * 1e6
            terms[p] = TypeTerms(max(fixed, 0.0), own["attn_GBps"], f"its own line over {len({r.context for r in res[p]})} "
                                 "depths (its fixed part: the intercept less the reference's weights)")
        else:
            rot = rotation_us(ck, cv, kernel_us)
            terms[p] = TypeTerms(rot, _one_rate(base, model, w, rot, ck, cv, res[p]),
                                 f"one -nkvo 0 run (-d {res[p][0].label.rsplit(' ', 1)[-1]}), its fixed part the rotation rule")
    return w, terms


def _converted_fit(base: dict[str, Any], model: ModelShape, weight_GBps: float, ck: CacheType, cv: CacheType,
                   f16: TypeTerms, runs: Sequence[TokenRun], kernel_us: float) -> TypeTerms:
    """A mixed pair's terms with its conversion rate fitted to its resident ``runs`` (f16's terms held). Blocks."""
    wls = [workload_of(model, ck, cv, r) for r in runs]

    def cost(gbps: float) -> float:
        d = with_terms(base, weight_GBps, converted(model, ck, cv, f16, gbps, "", kernel_us))
        return sum((simulated_s(d, wl, "resident") / r.seconds_per_token - 1) ** 2 for wl, r in zip(wls, runs, strict=True))

    gbps = golden_log(cost, 1.0, 1e5)
    depths = ", ".join(str(r.label.rsplit(" ", 1)[-1]) for r in runs)
    return converted(model, ck, cv, f16, gbps, f"f16 attention plus K and V converted to f16 (upstream's default build has "
                     f"no kernel for {ck.name}/{cv.name}), the conversion {gbps:.0f} GB/s fitted to -nkvo 0 -d {depths}", kernel_us)


def _composed(model: ModelShape, terms: dict[Pair, TypeTerms], weight_GBps: float,
              kernel_us: float = SMALL_KERNEL_US) -> dict[Pair, TypeTerms]:
    """Every K/V pair of two calibrated single types that the file did not run itself: uncalibrated, f16's attention
    plus a conversion at the weights' streaming rate (a stand-in); composed from its sides where f16 is not
    calibrated. Pure."""
    singles = {p[0]: t for p, t in terms.items() if p[0] == p[1]}
    out = {}
    for a in singles:
        for b in singles:
            if a == b or (a, b) in terms:
                continue
            ca, cb = cache_type(a), cache_type(b)
            out[(a, b)] = (converted(model, ca, cb, singles["f16"], weight_GBps, "uncalibrated: no run of the pair; f16 "
                                     "attention plus K and V converted to f16, the conversion at the weights' streaming "
                                     f"rate ({weight_GBps:.0f} GB/s, a stand-in)", kernel_us)
                           if "f16" in singles else compose(model, (ca, singles[a]), (cb, singles[b])))
    return out


def _link(base: dict[str, Any], model: ModelShape, groups: dict[Pair, list[TokenRun]], w: float,
          terms: dict[Pair, TypeTerms]) -> tuple[dict[str, Any], list[OrderedRun]]:
    items = [OrderedRun(with_terms(base, w, terms[p]), workload_of(model, cache_type(p[0]), cache_type(p[1]), r), r)
             for p in terms for r in groups.get(p, ()) if r.arm == "ordered"]
    if not items:
        return {"curve": "base", "GBps": None}, items
    if all(i.run.pinned for i in items):  # the fork's pinned cache: the link's one rate
        return {"curve": "flat", "GBps": flat_rate(items, "h2d_pinned"), "key": "h2d_pinned"}, items
    return dict(fit_pageable(items), key="h2d_pageable"), items


def _linked(d: dict[str, Any], link: dict[str, Any]) -> dict[str, Any]:
    if link.get("GBps") is None:
        return d
    if link["key"] == "h2d_pageable":  # the staging curve fit_pageable chose (flat, latency + rate, two regimes)
        return with_curve(d, link["key"], link)
    return with_link(d, link["key"], link["GBps"], link.get("latency_us") if link["curve"] != "flat" else None)


def _record(r: TokenRun, s: float) -> dict[str, Any]:
    return {"context": r.context, "arm": r.arm, "label": r.label, "measured_tps": 1 / r.seconds_per_token,
            "fitted_tps": 1 / s, "error": r.seconds_per_token / s - 1}


def fit_types(base: dict[str, Any], model: ModelShape, groups: dict[Pair, list[TokenRun]]) -> TypesFit:
    """Fit the weights, each cache type's attention and the link of ``base`` to ``groups`` (the runs of each K/V pair,
    every layer on the GPU); see the module doc. Raises InputError (one line). Blocks (simulations)."""
    ref, fitted, uncovered = _pairs(groups)
    w, terms = _attention(base, model, groups, ref, fitted, SMALL_KERNEL_US)
    link, items = _link(base, model, groups, w, terms)
    terms.update(_composed(model, terms, w))
    linked = {p: _linked(with_terms(base, w, t), link) for p, t in terms.items()}
    residuals = {p: [_record(r, simulated_s(linked[p], workload_of(model, cache_type(p[0]), cache_type(p[1]), r), r.arm))
                     for r in groups.get(p, ())] for p in terms}
    held = _held_out(base, model, groups, ref, items, link)
    bands = _bands(base, model, groups, ref, fitted, w, terms, held, link)
    bands.update(_uncalibrated_pairs(base, model, groups, w, terms, bands))
    singles = [t for p, t in terms.items() if p[0] == p[1]]
    standin = TypeTerms(sum(t.attn_us for t in singles) / len(singles),
                        math.exp(sum(math.log(t.attn_GBps) for t in singles) / len(singles)), "stand-in")
    profile = _linked(with_terms(base, w, standin), link)
    misses = [abs(r.seconds_per_token / simulated_s(profile, workload_of(model, cache_type(p[0]), cache_type(p[1]), r), r.arm) - 1)
              for p in fitted for r in groups[p] if r.arm == "resident"]
    uncal = {"band": max(misses), "source": f"the stand-in attention ({standin.attn_GBps:.1f} GB/s, the geometric mean of the "
             f"calibrated types' rates, {standin.attn_us:.2f} us a layer) misses the calibrated types' own -nkvo 0 runs by up to "
             f"{max(misses):.1%}; a type the file does not cover may be anywhere in that range, or outside it"}
    return TypesFit(profile, w, ref, terms, link, residuals, held, bands, uncal, tuple(uncovered))


def _held_out(base: dict[str, Any], model: ModelShape, groups: dict[Pair, list[TokenRun]], ref: Pair,
              items: list[OrderedRun], link: dict[str, Any]) -> dict[Pair, list[dict[str, Any]]]:
    """Leave-one-out records: the reference's resident depths (its line without each, where two remain) and every
    ordered run (the link without it, where the link was fitted to several). Blocks."""
    out: dict[Pair, list[dict[str, Any]]] = {}
    rk, rv = cache_type(ref[0]), cache_type(ref[1])
    res = [r for r in groups[ref] if r.arm == "resident"]
    for r in res:
        rest = [x for x in res if x is not r]
        if len({x.context for x in rest}) < 2:
            continue
        line = fit_compute(base, model, rk, rv, rest)
        d = with_terms(base, line["weight_GBps"], TypeTerms(0.0, line["attn_GBps"], ""))
        out.setdefault(ref, []).append(_record(r, simulated_s(d, workload_of(model, rk, rv, r), "resident")))
    if link.get("key") == "h2d_pageable" and len(items) >= 2:
        for i, rec in zip(items, pageable_held_out(items, link), strict=True):
            out.setdefault((i.workload.cache_k.name, i.workload.cache_v.name), []).append(rec)
    return out


def _bands(base: dict[str, Any], model: ModelShape, groups: dict[Pair, list[TokenRun]], ref: Pair, fitted: list[Pair],
           weight_GBps: float, terms: dict[Pair, TypeTerms], held: dict[Pair, list[dict[str, Any]]],
           link: dict[str, Any]) -> dict[Pair, tuple[float, str]]:
    """Each pair's band and its source: the largest of its own held-out errors, the reference line's (the weights every
    type shares), the link's (every ordered run's), and, for a pair whose rotation the rule sets apart from the
    reference's, how far its resident predictions move with the rule +-ROTATION_SPREAD. Blocks."""
    ref_err = max((abs(h["error"]) for h in held.get(ref, ())), default=0.0)
    link_err = max((abs(h["error"]) for p, hs in held.items() for h in hs if h["arm"] == "ordered"), default=0.0)
    moved = _rotation_moves(base, model, groups, ref, fitted, weight_GBps, terms)
    out = {}
    for p in terms:
        own = max((abs(h["error"]) for h in held.get(p, ())), default=0.0)
        parts = {"its held-out runs": own, f"the reference's ({'/'.join(ref)}) held-out depths": ref_err,
                 "the link's held-out runs": link_err, f"the rotation rule +-{ROTATION_SPREAD:.0%}": moved.get(p, 0.0)}
        if "band" in link:  # one copy size: the staging rate elsewhere is not determined (link_fit.UNDETERMINED_BAND)
            parts["the link at copy sizes the file did not run"] = link["band"]
        top = max(parts, key=lambda k: parts[k])
        out[p] = (parts[top], f"largest of: {', '.join(f'{k} {v:.1%}' for k, v in parts.items())} ({top})")
    return out


def _rotation_moves(base: dict[str, Any], model: ModelShape, groups: dict[Pair, list[TokenRun]], ref: Pair,
                    fitted: list[Pair], weight_GBps: float, terms: dict[Pair, TypeTerms]) -> dict[Pair, float]:
    """For each pair whose rule rotation differs from the reference's: the largest relative change of its resident
    t/s, at the shortest and the longest context of the file's resident runs, when the rule's kernel time is
    +-ROTATION_SPREAD (refitted). Blocks."""
    rk, rv = cache_type(ref[0]), cache_type(ref[1])
    apart = [p for p in terms if rotation_us(cache_type(p[0]), cache_type(p[1])) != rotation_us(rk, rv)]
    if not apart:
        return {}
    variants = []
    for f in (1 - ROTATION_SPREAD, 1 + ROTATION_SPREAD):
        w, t = _attention(base, model, groups, ref, fitted, SMALL_KERNEL_US * f)
        t.update(_composed(model, t, w, SMALL_KERNEL_US * f))
        variants.append((w, t))
    span = [r.context for runs in groups.values() for r in runs if r.arm == "resident"]
    out = {}
    for p in apart:
        ck, cv = cache_type(p[0]), cache_type(p[1])
        contexts = sorted({min(span), max(span)})
        worst = 0.0
        for ctx in contexts:
            wl = workload_of(model, ck, cv, TokenRun(ctx, 1.0, "resident"))
            s0 = simulated_s(with_terms(base, weight_GBps, terms[p]), wl, "resident")
            for w, t in variants:
                worst = max(worst, abs(s0 / simulated_s(with_terms(base, w, t[p]), wl, "resident") - 1))
        out[p] = worst
    return out



def _uncalibrated_pairs(base: dict[str, Any], model: ModelShape, groups: dict[Pair, list[TokenRun]], weight_GBps: float,
                        terms: dict[Pair, TypeTerms], bands: dict[Pair, tuple[float, str]]) -> dict[Pair, tuple[float, str]]:
    """The band of each uncalibrated mixed pair: the largest of its other parts and how far its resident t/s moves, at
    the shortest and the longest context of the file's resident runs, with the conversion CONVERT_SPREAD times slower
    or faster. Blocks."""
    span = [r.context for runs in groups.values() for r in runs if r.arm == "resident"]
    f16 = terms.get(("f16", "f16"))
    out = {}
    for p, t in terms.items():
        if t.convert_GBps is None or not t.how.startswith("uncalibrated") or f16 is None:
            continue
        ck, cv = cache_type(p[0]), cache_type(p[1])
        worst = 0.0
        for ctx in sorted({min(span), max(span)}):
            wl = workload_of(model, ck, cv, TokenRun(ctx, 1.0, "resident"))
            s0 = simulated_s(with_terms(base, weight_GBps, t), wl, "resident")
            for f in (1 / CONVERT_SPREAD, CONVERT_SPREAD):
                moved = converted(model, ck, cv, f16, t.convert_GBps * f, "")
                worst = max(worst, abs(s0 / simulated_s(with_terms(base, weight_GBps, moved), wl, "resident") - 1))
        band, source = bands[p]
        out[p] = (max(band, worst), f"uncalibrated (no run of the pair): the conversion rate x/÷{CONVERT_SPREAD:g} moves it "
                  f"{worst:.1%}; {source}")
    return out
