"""``kvpipe calibrate --from-llama-bench FILE``: a hardware profile fitted to llama-bench runs, no GPU needed here.

Every llama.cpp user has ``llama-bench``. Given its output for one model on
one card -- ordered runs (``-nkvo 1``) at several ``-d``, and resident runs
(``-nkvo 0``) when present -- this fits the profile's compute (and, with both
arms, the pinned H2D link) by ``validate.token_fit``, on a *base* profile that
supplies what llama-bench cannot measure (host call costs, copy latency,
device memory): ``--hardware``, or the preset whose device name llama-bench's
``gpu_info`` names. The result is a profile file like any other, with

* ``workloads["model@cache"]``: the fitted compute of each cache type the file
  ran (``backends.profile.for_workload`` picks it per point);
* ``calibration``: the file, its build, every run with its fitted t/s and
  relative error, and the leave-one-out errors (the error band);
* ``provenance``: where every group of fields came from.

Runs with ``-ngl`` below the layer count (the first layers on the CPU) are
left out of the GPU's fit and then fit the host cost of a CPU layer
(``host_layer_us``, ``host_weight_GBps``: ``validate.cpu_layers``); a file
without them leaves that cost uncalibrated, and says so.

Refuses, with one line: a file that is not llama-bench output, mixed builds,
models or GPUs, no run with every layer on the GPU, a model whose size differs
from the one llama-bench ran, fewer than two depths for the arm the compute
comes from.
"""

from __future__ import annotations

import copy
import datetime
import math
from dataclasses import dataclass, replace
from typing import Any

from backends.profile import PRESET_DIR, preset_names, read_profile_dict, workload_key
from sim.errors import InputError
from sim.workload import ALL_LAYERS, CacheType, ModelShape, cache_type
from validate.cpu_layers import fit_cpu_layers, partial_residuals, workload_gpu_layers
from validate.llama_bench import BenchFile, BenchRun
from validate.token_fit import Fit, TokenRun, fit_runs, relative_band
from validate.type_fit import ROTATION_KERNELS, SMALL_KERNEL_US, TypesFit, fit_types

#: The provenance of the machine a profile was fitted on (llama-bench's cpu_info and gpu_info).
MACHINE_NOTE = ("fitted on the machine llama-bench calls cpu_info {cpu_info!r}, gpu_info {gpu_info!r}: the host side of -nkvo 1 "
                "(the pageable staging) is that host's; predictions for runs of another machine say so (machine_differs)")
#: How far llama-bench's ``model_size`` may lie from the model's weight bytes (presets round their sizes).
MODEL_SIZE_TOLERANCE = 0.05
SCHEMA = "kvpipe.profile/1"


def base_for(bench: BenchFile, hardware: str) -> tuple[dict[str, Any], str]:
    """The base profile dict and its name: ``hardware`` if given, else the preset whose device ``gpu_info`` names (not one
    itself fitted from llama-bench: a base supplies what llama-bench cannot measure)."""
    if hardware:
        try:
            return read_profile_dict(hardware)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    gpu = bench.gpu_info.strip()
    matches = []
    for name in preset_names():
        data, where = read_profile_dict(str(PRESET_DIR / f"{name}.json"))
        fitted = str((data.get("provenance") or {}).get("kind", "")).startswith("fitted from llama-bench")
        if gpu and not data.get("estimate") and not fitted and all(d.get("name", "") and d["name"] in gpu for d in data["devices"]):
            matches.append((len(data["devices"][0]["name"]), name, data, where))
    if not matches:
        raise InputError(f"--from-llama-bench: gpu_info {gpu!r} names no preset's device; allowed: give --hardware "
                         f"(a preset: {', '.join(preset_names())}, or a profile .json) for the host and link costs")
    matches.sort(reverse=True)
    return matches[0][2], matches[0][3]


def check_model(bench: BenchFile, model: ModelShape) -> None:
    """Refuse a model whose weights differ from what llama-bench loaded, or a file with no run of every layer on the GPU."""
    have, want = model.weight_bytes, bench.model_size_bytes
    if want > 0 and abs(have / want - 1) > MODEL_SIZE_TOLERANCE:
        raise InputError(f"--model {model.name}: {have / 2**30:.2f} GiB of weights, but llama-bench ran {bench.model_type!r} "
                         f"of {want / 2**30:.2f} GiB; allowed: the model llama-bench ran (its GGUF, or a preset within "
                         f"{MODEL_SIZE_TOLERANCE:.0%})")
    if bench.n_gpu_layers <= model.n_layers:  # llama.cpp's -ngl counts the output layer: n_layers + 1 is every layer
        raise InputError(f"--from-llama-bench {bench.path!r}: n_gpu_layers {bench.n_gpu_layers} of {model.n_layers} layers "
                         f"(and the output layer) at most; allowed: runs with every layer on the GPU (llama-bench -ngl 99), "
                         "beside any with -ngl below")
    for r in bench.runs:
        workload_gpu_layers(r.n_gpu_layers, model, f"--from-llama-bench {bench.path!r}: ")


def token_runs(runs: list[BenchRun], pinned: bool = True, model: ModelShape | None = None) -> list[TokenRun]:
    """llama-bench runs as fit points: the context is the depth plus half the generated tokens (the run's mean); with
    ``model``, a run's -ngl below the layer count puts its first layers on the CPU (its label then names -ngl)."""
    out = []
    for r in runs:
        ngl = workload_gpu_layers(r.n_gpu_layers, model) if model is not None else ALL_LAYERS
        label = f"-nkvo {int(r.kv_offload_host)} -d {r.depth}"
        out.append(TokenRun(r.depth + r.n_gen // 2, r.seconds_per_token, r.arm,
                            label if ngl >= ALL_LAYERS else f"-ngl {r.n_gpu_layers} {label}", pinned, ngl))
    return out


@dataclass(frozen=True)
class BenchFit:
    """The fitted profile dict and the per-cache-type fits behind it."""

    profile: dict[str, Any]
    fits: dict[str, Fit]


def _compute_fields(fit: Fit) -> dict[str, float]:
    out = {"layer_us": 0.0, "weight_GBps": round(fit.compute["weight_GBps"], 3), "attn_us": 0.0,
           "attn_GBps": round(fit.compute["attn_GBps"], 3), "head_us": 0.0,
           "cpu_split_us": float(fit.profile["devices"][0]["compute"].get("cpu_split_us", 0.0))}
    if fit.host_attention:
        out["host_attn_us"] = round(fit.host_attention["host_attn_us"], 3)
        out["host_attn_GBps"] = round(fit.host_attention["host_attn_GBps"], 3)
    if fit.cpu_layers:
        out["host_layer_us"] = round(fit.cpu_layers["host_layer_us"], 3)
        out["host_weight_GBps"] = round(fit.cpu_layers["host_weight_GBps"], 3)
        if fit.cpu_layers["host_attn_GBps"] is not None:
            out["host_attn_us"] = 0.0
            out["host_attn_GBps"] = round(fit.cpu_layers["host_attn_GBps"], 3)
    return out


def _entry(fit: Fit, ck: str, cv: str) -> dict[str, Any]:
    band = relative_band(fit)
    return {
        "compute": _compute_fields(fit), "cache_type": ck, "cache_type_v": cv, "compute_from": fit.compute_from,
        "h2d_GBps": round(fit.h2d_GBps, 3) if fit.h2d_GBps else None,
        "residuals": [_round(r) for r in fit.residuals], "held_out": [_round(r) for r in fit.held_out],
        "band": round(band, 5) if band is not None else None,
    }


def _round(r: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()}


def fit_bench(bench: BenchFile, model: ModelShape, base: dict[str, Any], base_where: str, compute_from: str = "auto",
              command: str = "", nkvo_attention: str = "device", pinned: bool = True) -> BenchFit:
    """The profile fitted to ``bench`` for ``model`` on ``base``. Raises InputError. Blocks (simulations).

    ``nkvo_attention`` says what the llama.cpp build does under ``-nkvo``: ``device`` (the fork this project models:
    windows delivered to the GPU) or ``host`` (upstream llama.cpp: attention on the CPU over the host cache).
    ``pinned`` says whether the run's host cache was pinned (the fork's ``--kv-cpu-pinned``); upstream's ``-nkvo``
    cache is pageable, and the ordered runs then fit the pageable curve (the driver's staging rate).
    """
    check_model(bench, model)
    base = dict(base, nkvo_attention=nkvo_attention)
    if len(bench.cache_types()) > 1:
        return _fit_types_bench(bench, model, base, base_where, compute_from, command, nkvo_attention, pinned)
    fits: dict[str, Fit] = {}
    entries: dict[str, Any] = {}
    for ck_name, cv_name in bench.cache_types():
        ck, cv = cache_type(ck_name), cache_type(cv_name)
        runs = token_runs([r for r in bench.runs if (r.type_k, r.type_v) == (ck_name, cv_name)], pinned, model)
        try:
            fit = _fit_with_cpu_layers(base, model, ck, cv, runs, compute_from)
        except InputError as exc:
            raise InputError(f"--from-llama-bench {bench.path!r}, -ctk {ck_name} -ctv {cv_name}: {exc}") from None
        key = workload_key(model.name, ck_name) if ck_name == cv_name else f"{model.name}@{ck_name}/{cv_name}"
        fits[key] = fit
        entries[key] = _entry(fit, ck_name, cv_name)
    first = next(iter(fits.values()))
    linked = next((f for f in fits.values() if f.h2d_GBps), None)
    out = copy.deepcopy(base)
    out.pop("derivation", None)
    base_name = str(base.get("name", base_where))
    out["name"] = f"{base_name}-llama-bench"
    out["schema"] = SCHEMA
    out["estimate"] = False
    link_key = "h2d_pinned" if pinned else "h2d_pageable"
    for dev, fitted_dev in zip(out["devices"], (linked or first).profile["devices"], strict=True):
        dev["compute"] = _compute_fields(first)
        if linked is not None:
            dev["links"][link_key]["points"] = [[p[0], round(p[1], 3)] for p in fitted_dev["links"][link_key]["points"]]
    out["workloads"] = entries
    launched = next((f for f in fits.values() if f.host_attention and "launch_us" in f.host_attention), None)
    if launched is not None:  # the engine's launch time per GPU split, fitted beside its CPU attention
        out["host"]["launch_us"] = round(float(launched.profile["host"]["launch_us"]), 3)
    runs_text = ", ".join(r.label for r in token_runs(list(bench.runs), pinned, model))
    cpu_fit = next((f.cpu_layers for f in fits.values() if f.cpu_layers), None)
    out["source"] = (f"Fitted by kvpipe calibrate --from-llama-bench to {bench.path} (llama.cpp build {bench.build_commit}, "
                     f"{bench.gpu_info or 'no gpu_info'}, {bench.model_type}); host costs, copy latency and memory from "
                     f"{base_where}.")
    out["calibration"] = {
        "from": "llama-bench", "file": bench.path, "build_commit": bench.build_commit, "build_number": bench.build_number,
        "gpu_info": bench.gpu_info, "model_type": bench.model_type, "model": model.name, "runs": runs_text,
        "command": command, "date": datetime.date.today().isoformat(), "host_cache": "pinned" if pinned else "pageable",
        "machine": bench.machine,
    }
    fitted = f"fitted from llama-bench ({bench.path})"
    fitted_launch = out["host"]["launch_us"] if launched is not None else None
    out["provenance"] = {
        "host": f"base profile {base_name} ({base_where}): {_base_kind(base)}" + (
            f"; launch_us {fitted_launch} fitted from the -nkvo 1 runs (the base's {base.get('host', {}).get('launch_us')} left "
            "less than nothing for the CPU attention's fixed part)" if fitted_launch else ""),
        "devices.memory": f"base profile {base_name}: {_base_kind(base)}",
        "devices.compute": f"{fitted}: the {first.compute_from} runs, a line over the window bytes",
        f"devices.links.{link_key}": (f"{fitted}: the ordered runs, given the compute of the resident runs" if linked is not None
                                      else f"base profile {base_name}: {_base_kind(base)}"),
        "nkvo_attention": (f"given (--nkvo-attention {nkvo_attention}): " + ("upstream llama.cpp, -nkvo runs attention on the "
                           "CPU; devices.compute.host_attn_* fitted from the ordered runs" if nkvo_attention == "host" else
                           "the fork's -nkvo delivers each attention layer's window to the GPU")),
        "devices.links (other)": f"base profile {base_name}: {_base_kind(base)}",
        "workloads": f"{fitted}: one entry per cache type",
        "machine": MACHINE_NOTE.format(**bench.machine),
        "devices.compute.host_layer": (
            f"{fitted}: the -nkvo 0 runs with -ngl below the layer count, host time per CPU layer against its "
            f"{cpu_fit['layer_weight_bytes'] / 2**20:.1f} MiB of weights (layer_weight_bytes); host_layer_us 0 (every layer "
            f"weighs the same, so a fixed part cannot be told from the rate); CPU layers' attention {cpu_fit['attention']}"
            if cpu_fit else "not calibrated: the file has no run with -ngl below the layer count (a layer on the CPU is "
            "not priced by this profile)"),
    }
    return BenchFit(out, fits)


def _fit_types_bench(bench: BenchFile, model: ModelShape, base: dict[str, Any], base_where: str, compute_from: str,
                     command: str, nkvo_attention: str, pinned: bool) -> BenchFit:
    """A file with several cache types: the weights, each type's attention and the link fitted together
    (``validate.type_fit``). Raises InputError (one line). Blocks."""
    where = f"--from-llama-bench {bench.path!r}"
    if nkvo_attention == "host" or compute_from == "ordered":
        raise InputError(f"{where}: several cache types are fitted from their -nkvo 0 runs with attention on the GPU; allowed: "
                         "--nkvo-attention device and --compute-from auto or resident (or one cache type a file)")
    if any(r.n_gpu_layers <= model.n_layers for r in bench.runs):
        raise InputError(f"{where}: several cache types and runs with -ngl below the layer count; allowed: one cache type "
                         "a file when some layers run on the CPU")
    groups = {(ck, cv): token_runs([r for r in bench.runs if (r.type_k, r.type_v) == (ck, cv)], pinned, model)
              for ck, cv in bench.cache_types()}
    try:
        fit = fit_types(base, model, groups)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    link = fit.link
    out = copy.deepcopy(fit.profile)
    out.pop("derivation", None)
    base_name = str(base.get("name", base_where))
    out.update(name=f"{base_name}-llama-bench", schema=SCHEMA, estimate=False)
    split_us = float(base["devices"][0]["compute"].get("cpu_split_us", 0.0))
    for dev in out["devices"]:
        dev["compute"] = {k: round(float(v), 3) for k, v in dev["compute"].items()} | {"cpu_split_us": split_us}
    out["workloads"] = {workload_key(model.name, p[0], p[1]): _type_entry(fit, p, split_us) for p in fit.terms}
    out["uncalibrated_cache"] = {"band": round(fit.uncalibrated["band"], 5), "source": fit.uncalibrated["source"]}
    fitted = f"fitted from llama-bench ({bench.path})"
    spread = link.get("spread_GBps")
    link_text = ("base profile's (no -nkvo 1 run)" if link.get("GBps") is None else
                 f"{fitted}: every cache type's -nkvo 1 runs, each under its type's compute; {link['curve']}"
                 + (f" ({link['latency_us']:.1f} us a copy + {link['GBps']:.2f} GB/s)" if link["curve"] == "latency + rate" else
                    " (" + ", ".join(f"{b:.2f} MiB a copy: {g:.2f} GB/s" for b, g in link["points"]) + ", log-interpolated "
                    "between)" if link["curve"] == "two regimes" else f" ({link['GBps']:.2f} GB/s)")
                 + (f"; {link['undetermined']}" if link.get("undetermined") else "")
                 + ("; chosen by leave-one-out, rms " + ", ".join(f"{k} {v['leave_one_out_rms']:.1%}" for k, v in link["choice"].items()
                                                                if v["leave_one_out_rms"] is not None) if link.get("choice") else "")
                 + (f"; each run alone implies {spread['min']:.2f}-{spread['max']:.2f} GB/s (median {spread['median']:.2f})"
                    if spread else ""))
    out["source"] = (f"Fitted by kvpipe calibrate --from-llama-bench to {bench.path} (llama.cpp build {bench.build_commit}, "
                     f"{bench.gpu_info or 'no gpu_info'}, {bench.model_type}), cache types "
                     f"{', '.join('/'.join(p) for p in groups)}; host costs, copy latency and memory from {base_where}.")
    out["calibration"] = {
        "from": "llama-bench", "file": bench.path, "build_commit": bench.build_commit, "build_number": bench.build_number,
        "gpu_info": bench.gpu_info, "model_type": bench.model_type, "model": model.name,
        "runs": ", ".join(f"{'/'.join(p)} {r.label}" for p, rs in groups.items() for r in rs), "command": command,
        "date": datetime.date.today().isoformat(), "host_cache": "pinned" if pinned else "pageable", "machine": bench.machine,
        "link": {k: v for k, v in link.items() if k != "runs"}, "link_runs": link.get("runs", []),
    }
    out["provenance"] = {
        "host": f"base profile {base_name} ({base_where}): {_base_kind(base)}",
        "devices.memory": f"base profile {base_name}: {_base_kind(base)}",
        "devices.compute": (f"{fitted}: weight_GBps from the reference cache type {'/'.join(fit.reference)} (its -nkvo 0 line "
                            f"less the K/V rotation rule: {ROTATION_KERNELS} small products of {SMALL_KERNEL_US} us, an "
                            "estimate); attention a stand-in for a cache type the file does not cover (uncalibrated_cache)"),
        "workloads": f"{fitted}: one entry per cache type, and per K/V pair of two calibrated types (a mixed pair: f16's "
                     "attention plus a conversion to f16, its rate fitted to the pair's -nkvo 0 run, else uncalibrated)",
        f"devices.links.{link.get('key', 'h2d_pageable')}": link_text,
        "devices.links (other)": f"base profile {base_name}: {_base_kind(base)}",
        "nkvo_attention": "given (--nkvo-attention device): -nkvo delivers each attention layer's window to the GPU",
        "machine": MACHINE_NOTE.format(**bench.machine),
        "uncovered": (f"runs of {', '.join('/'.join(p) for p in fit.uncovered)} have no -nkvo 0 run: uncalibrated"
                      if fit.uncovered else "every cache type of the file has a -nkvo 0 run"),
        "devices.compute.host_layer": "not calibrated: several cache types are fitted with every layer on the GPU",
    }
    return BenchFit(out, {})


def _type_entry(fit: TypesFit, p: tuple[str, str], split_us: float) -> dict[str, Any]:
    t = fit.terms[p]
    band, band_source = fit.bands[p]
    return {
        "compute": {"layer_us": 0.0, "weight_GBps": round(fit.weight_GBps, 3), "attn_us": round(t.attn_us, 3),
                    "attn_GBps": round(t.attn_GBps, 3), "head_us": 0.0, "cpu_split_us": split_us},
        "cache_type": p[0], "cache_type_v": p[1], "compute_from": "resident", "attention": t.how,
        "h2d_GBps": round(fit.link["GBps"], 3) if fit.link.get("GBps") else None,
        "residuals": [_round(r) for r in fit.residuals.get(p, ())], "held_out": [_round(r) for r in fit.held_out.get(p, ())],
        "band": round(band, 5), "band_source": band_source,
    }


def _fit_with_cpu_layers(base: dict[str, Any], model: ModelShape, ck: CacheType, cv: CacheType, runs: list[TokenRun],
                         compute_from: str) -> Fit:
    """``fit_runs`` on the all-GPU runs; then, when there are runs with layers on the CPU, their host cost on it."""
    partial = [r for r in runs if r.n_gpu_layers < model.n_layers]
    fit = fit_runs(base, model, ck, cv, [r for r in runs if r.n_gpu_layers >= model.n_layers], compute_from)
    if not partial:
        return fit
    cpu = fit_cpu_layers(fit.profile, model, ck, cv, partial)
    return replace(fit, profile=cpu["profile"], cpu_layers={k: v for k, v in cpu.items() if k != "profile"},
                   residuals=fit.residuals + tuple(partial_residuals(cpu["profile"], model, ck, cv, partial)))


def _base_kind(base: dict[str, Any]) -> str:
    """What a base profile's numbers are: measured, fitted from published numbers, or an estimate."""
    if base.get("estimate"):
        return "a specification estimate"
    prov = base.get("provenance")
    if isinstance(prov, dict) and prov.get("kind"):
        return str(prov["kind"])
    if "measurements" in base or "cupy_version" in base:
        return "measured on a device (kvpipe calibrate)"
    src = str(base.get("source", ""))
    if "published" in src:
        return "fitted from published numbers"
    if "probe" in src:
        return "measured on a device (the H200 probe)"
    return "as the base profile says"


def machine_differs(profile: dict[str, Any], machine: dict[str, str]) -> str:
    """"" when ``machine`` (llama-bench's cpu_info and gpu_info of the runs being predicted) is the one ``profile`` was
    fitted on, else one line saying what differs (or that the profile does not record its machine). Pure."""
    fitted = (profile.get("calibration") or {}).get("machine")
    if not isinstance(fitted, dict):
        return "the profile does not record the machine it was fitted on: its host side may not be this machine's"
    diff = [f"{k} {fitted.get(k, '')!r} there, {v!r} here" for k, v in machine.items() if fitted.get(k, "") != v]
    return ("fitted on another machine (" + "; ".join(diff) + "): its pageable staging is that host's") if diff else ""


def type_lines(profile: dict[str, Any]) -> list[str]:
    """A profile fitted per cache type (``uncalibrated_cache``) as table lines: each K/V pair's attention, residuals
    and band, the link and its spread; [] for any other profile. Pure."""
    if "uncalibrated_cache" not in profile:
        return []
    out = ["| cache | attention | attn us | attn GB/s | band | run | measured t/s | fitted t/s | error |",
           "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for key, e in profile["workloads"].items():
        c = e["compute"]
        runs = e["residuals"] or [{"label": "(no run)", "measured_tps": math.nan, "fitted_tps": math.nan, "error": math.nan}]
        for r in runs:
            out.append(f"| {key.split('@', 1)[1]} | {e['attention'].split(' (')[0]} | {c['attn_us']:.1f} | {c['attn_GBps']:.1f} | "
                       f"±{e['band']:.1%} | {r['label']} | {r['measured_tps']:.2f} | {r['fitted_tps']:.2f} | {r['error']:+.2%} |")
    link = profile["calibration"]["link"]
    out.append(f"weights {profile['devices'][0]['compute']['weight_GBps']:.1f} GB/s; link: "
               + profile["provenance"].get(f"devices.links.{link.get('key', 'h2d_pageable')}", "base"))
    out.append(f"a cache type the file does not cover: uncalibrated, ±{profile['uncalibrated_cache']['band']:.1%}")
    return out
