"""Hardware profiles as files, and the calibrated entry a workload runs on.

A profile (``backends.profile_types``: what a machine is, as numbers) is a data
file (JSON) beside this module (``backends/presets``) or written by ``kvpipe
calibrate``; it carries its source and provenance so a reader knows whether a
number was measured, derived or estimated. A calibrated file also holds one
``workloads`` entry per (model, K cache type, V cache type): the decode
program's compute, which :func:`for_workload` puts on the devices for a point,
and the error band of its fit (:func:`prediction_band`). An entry fitted from
one cache type's runs says ``uncalibrated`` for another instead of lending it
its attention rate.

Units: seconds and bytes inside. The files use GB/s (10^9 B/s), microseconds,
milliseconds and MiB, with the unit in every field name; conversion happens
here, once, in :func:`load_profile`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from backends.errors import InputError
from backends.files import load_json_object, mapping, number, whole
from backends.profile_types import MIB, ComputeModel, DeviceProfile, HardwareProfile, HostCosts, LinkCurve

__all__ = ["MIB", "PRESET_DIR", "Band", "ComputeModel", "DeviceProfile", "HardwareProfile", "HostCosts", "LinkCurve",
           "compute_model_of", "for_workload", "load_profile", "prediction_band", "preset_names", "profile_from_dict",
           "read_profile_dict", "workload_entry", "workload_key"]

PRESET_DIR = Path(__file__).with_name("presets")


# ---------------------------------------------------------------- file format


def _curve(d: dict[str, Any], where: str) -> LinkCurve:
    try:
        points = d["points"]  # [[size_mib, GB/s], ...]
        return LinkCurve(
            sizes_bytes=tuple(float(p[0]) * MIB for p in points),
            bytes_per_s=tuple(float(p[1]) * 1e9 for p in points),
            latency_s=float(d.get("latency_us", 0.0)) * 1e-6,
        )
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"{where}: bad link curve ({exc})") from exc


def compute_model_of(c: dict[str, Any]) -> ComputeModel:
    """A ComputeModel from the file's ``compute`` object (microseconds, GB/s)."""
    return ComputeModel(
        layer_s=float(c.get("layer_us", 0.0)) * 1e-6,
        weight_bytes_per_s=float(c.get("weight_GBps", 0.0)) * 1e9,
        attn_s=float(c.get("attn_us", 0.0)) * 1e-6,
        attn_bytes_per_s=float(c.get("attn_GBps", 0.0)) * 1e9,
        head_s=float(c.get("head_us", 0.0)) * 1e-6,
        cpu_split_s=float(c.get("cpu_split_us", 0.0)) * 1e-6,
        attn_floor_s=float(c.get("attn_floor_us", 0.0)) * 1e-6,
        host_attn_s=float(c.get("host_attn_us", 0.0)) * 1e-6,
        host_attn_bytes_per_s=float(c.get("host_attn_GBps", 0.0)) * 1e9,
        layer_seq_s=float(c.get("layer_seq_us", 0.0)) * 1e-6,
        attn_seq_s=float(c.get("attn_seq_us", 0.0)) * 1e-6,
        cpu_row_s=float(c.get("cpu_row_us", 0.0)) * 1e-6,
        host_layer_s=float(c.get("host_layer_us", 0.0)) * 1e-6,
        host_weight_bytes_per_s=float(c.get("host_weight_GBps", 0.0)) * 1e9,
    )


def workload_key(model: str, cache: str, cache_v: str = "") -> str:
    """The key of a calibrated workload entry in a profile file's ``workloads``: ``model@cache`` when the V cache type
    is the K's (or not given), else ``model@cache/cache_v``. Pure."""
    return f"{model}@{cache}" if cache_v in ("", cache) else f"{model}@{cache}/{cache_v}"


def workload_entry(profile: HardwareProfile, model: str, cache: str, cache_v: str = "") -> tuple[str, dict[str, Any]] | None:
    """The ``workloads`` entry calibrated for (model, K cache type, V cache type), as (key, entry), or None.

    Looks up :func:`workload_key` first; then, for one cache type, an entry
    keyed by the model alone (the file format before several cache types), but
    only if it was calibrated for ``cache`` (its ``cache_type``; an entry
    without one matches any). ``cache_v`` "" is ``cache``. Pure.
    """
    table = profile.meta.get("workloads") or {}
    key = workload_key(model, cache, cache_v)
    if key in table:
        return key, table[key]
    entry = table.get(model)
    if cache_v in ("", cache) and entry and entry.get("cache_type", cache) == cache:
        return model, entry
    return None


def for_workload(profile: HardwareProfile, model: str, cache: str, cache_v: str = "") -> HardwareProfile:
    """``profile`` with the compute model, launch and event costs calibrated for ``model``'s program with ``cache``
    (K) and ``cache_v`` (V; "" = the K type).

    A calibrated file (``kvpipe calibrate``) measures each model's decode
    program per cache type: the attention's seconds per window byte depend on
    how the cache is decoded, the launch costs on the model's kernels. Without
    an entry for these types the profile is returned unchanged: its device
    ``compute`` (a preset's; a file fitted per cache type puts there the
    stand-in for a type it did not see, which :func:`prediction_band` calls
    uncalibrated). Pure; does not block.
    """
    found = workload_entry(profile, model, cache, cache_v)
    if found is None:
        return profile
    w = found[1]
    compute = compute_model_of(w["compute"])
    host = replace(profile.host, launch_s=float(w.get("launch_us", profile.host.launch_s * 1e6)) * 1e-6,
                   event_s=float(w.get("event_us", profile.host.event_s * 1e6)) * 1e-6,
                   split_launch_s=float(w.get("split_launch_us", 0.0)) * 1e-6)
    return replace(profile, devices=tuple(replace(d, compute=compute) for d in profile.devices), host=host)


@dataclass(frozen=True)
class Band:
    """The error band of a profile's predictions: +- ``relative`` of the t/s, and where that number comes from."""

    relative: float
    source: str


def prediction_band(profile: HardwareProfile, model: str, cache: str, cache_v: str = "") -> Band | None:
    """The band of predictions of (model, K and V cache types) on ``profile``, or None where it has none.

    From the calibrated workload entry's ``band`` (``calibrate --from-llama-bench``:
    the largest leave-one-out error of its fit), else the profile's
    ``calibration`` block when it was fitted on this model and cache type (the
    reference preset: its ordered table), else, on a profile fitted per cache
    type (``uncalibrated_cache``), that block's wide band, whose source starts
    with "uncalibrated". A band is a calibration residual: it
    says how well the fitted terms predict runs of the arm they were fitted on
    that the fit did not see, not how well the pipelined mechanism is modelled
    (docs/validation.md measures that). Pure.
    """
    found = workload_entry(profile, model, cache, cache_v)
    if found is not None and found[1].get("band") is not None:
        n = len(found[1].get("held_out") or ())
        source = str(found[1].get("band_source") or f"largest held-out error of the fit to {n} runs ({found[0]})")
        return Band(float(found[1]["band"]), source)
    cal = profile.meta.get("calibration") or {}
    if cal.get("band") is not None and cal.get("model") == model and cal.get("cache_type") == cache and cache_v in ("", cache):
        return Band(float(cal["band"]), str(cal.get("band_source", "calibration residuals")))
    wide = profile.meta.get("uncalibrated_cache")
    if found is None and isinstance(wide, dict) and wide.get("band") is not None:
        types = cache if cache_v in ("", cache) else f"{cache}/{cache_v}"
        return Band(float(wide["band"]), f"uncalibrated for {model} with a {types} cache: {wide.get('source', '')}")
    return None


MAX_MEMORY_MIB = float(1 << 30)  # 1 PiB: past it a memory size is a typo, not a device
MAX_ENGINES, MAX_SLOWDOWN, MAX_ALIGNMENT, MAX_HOST_US = 64, 100.0, 1 << 30, 1e9  # likewise


def _mib(d: dict[str, Any], key: str, where: str, default: float | None = None) -> int:
    """Bytes of the MiB field ``key``: a finite number in 0..MAX_MEMORY_MIB, else one line naming it."""
    value = float(d[key] if default is None else d.get(key, default))
    if not math.isfinite(value) or not 0 <= value <= MAX_MEMORY_MIB:
        raise ValueError(f"{where}.{key} {value:g}; allowed: MiB 0..{MAX_MEMORY_MIB:.0f}")
    return int(value * MIB)


def _device(d: dict[str, Any], where: str) -> DeviceProfile:
    compute = compute_model_of(d.get("compute", {}))
    links = d["links"]
    return DeviceProfile(
        name=str(d["name"]),
        memory_total_bytes=_mib(d, "memory_total_mib", where),
        memory_used_bytes=_mib(d, "memory_used_mib", where, 0.0),
        h2d_pinned=_curve(links["h2d_pinned"], f"{where}.h2d_pinned"),
        h2d_pageable=_curve(links["h2d_pageable"], f"{where}.h2d_pageable"),
        d2h_pinned=_curve(links["d2h_pinned"], f"{where}.d2h_pinned"),
        d2h_pageable=_curve(links.get("d2h_pageable", links["d2h_pinned"]), f"{where}.d2h_pageable"),
        h2d_engines=whole(d, "h2d_engines", where, 1, MAX_ENGINES, default=1),
        d2h_engines=whole(d, "d2h_engines", where, 1, MAX_ENGINES, default=1),
        duplex_slowdown=number(d, "duplex_slowdown", where, 1.0, MAX_SLOWDOWN, default=1.0),
        alignment_bytes=whole(d, "alignment_bytes", where, 1, MAX_ALIGNMENT, default=256),
        compute=compute,
        memory_reserved_bytes=_mib(d, "memory_reserved_mib", where, 600.0),
        copy_engine_drains_stream=bool(d.get("copy_engine_drains_stream", False)),
        pageable_chunk_bytes=_mib(d, "pageable_chunk_mib", where, 2.0) or 2 * MIB,
        dram_bytes_per_s=float(d.get("dram_GBps", 0.0)) * 1e9,
    )


def _check_workloads(data: dict[str, Any], where: str) -> None:
    """``workloads`` (the calibrated entries) must be an object of objects, each with a ``compute`` object and
    finite numbers: :func:`for_workload` reads them for every point. Raises InputError naming the entry and key."""
    wide = data.get("uncalibrated_cache")
    if wide is not None:
        number(mapping(data, "uncalibrated_cache", where), "band", f"{where}.uncalibrated_cache", 0.0, 1e6)
    table = data.get("workloads")
    if table is None:
        return
    if not isinstance(table, dict):
        raise InputError(f"{where}: workloads must be an object of model@cache entries, not {type(table).__name__}")
    for key, entry in table.items():
        at = f"{where}.workloads[{key!r}]"
        if not isinstance(entry, dict):
            raise InputError(f"{at} must be an object, not {type(entry).__name__}")
        compute_model_of(mapping(entry, "compute", at))
        for name in ("launch_us", "event_us", "split_launch_us"):
            if name in entry:
                number(entry, name, at, 0.0, MAX_HOST_US)
        if entry.get("band") is not None:
            number(entry, "band", at, 0.0, 1e6)


def profile_from_dict(data: dict[str, Any], where: str = "profile") -> HardwareProfile:
    """Build a profile from the JSON file format. Raises ValueError naming the bad field.

    ``host.graph_us``, which older files carry, is read by nothing and ignored.
    """
    try:
        h = data["host"]
        host = HostCosts(
            launch_s=float(h.get("launch_us", 4.0)) * 1e-6,
            copy_issue_s=float(h.get("copy_issue_us", 3.0)) * 1e-6,
            event_s=float(h.get("event_us", 2.0)) * 1e-6,
            host_wait_s=float(h.get("host_wait_us", 5.0)) * 1e-6,
            split_launch_s=float(h.get("split_launch_us", 0.0)) * 1e-6,
        )
        if not isinstance(data["devices"], list):
            raise InputError(f"{where}: devices must be a list of device objects")
        devices = tuple(_device(d, f"{where}.devices[{i}]") for i, d in enumerate(data["devices"]))
        _check_workloads(data, where)
        return HardwareProfile(
            name=str(data["name"]),
            devices=devices,
            host=host,
            source=str(data.get("source", "")),
            estimate=bool(data.get("estimate", False)),
            meta={k: v for k, v in data.items() if k not in {"name", "devices", "host", "source", "estimate"}},
        )
    except KeyError as exc:
        raise ValueError(f"{where}: missing field {exc}") from exc
    except (TypeError, AttributeError, OverflowError) as exc:
        raise ValueError(f"{where}: malformed ({exc})") from exc
    except ValueError as exc:
        raise ValueError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_profile(name_or_path: str) -> HardwareProfile:
    """Load a preset by name or a profile JSON file by path; ``a+b`` puts b's devices beside a's.

    Raises ValueError with a one-line reason.
    """
    if "+" in name_or_path:
        parts = [load_profile(p) for p in name_or_path.split("+")]
        out = parts[0]
        for p in parts[1:]:
            out = out.combined(p)
        return out
    data, where = read_profile_dict(name_or_path)
    return profile_from_dict(data, where=where)


def read_profile_dict(name_or_path: str) -> tuple[dict[str, Any], str]:
    """The JSON object of one preset (by name) or profile file (by path), and where it came from: a preset as
    ``backends/presets/NAME.json`` (the same on every machine and checkout, so a profile fitted from it records no
    local path), any other file as given. Reads one file; raises ValueError (an InputError: one line naming the file)
    on an unreadable, too large, deeply nested or non-JSON file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise ValueError(f"unknown hardware {name_or_path!r}; presets: {', '.join(preset_names())} or a .json file")
    return load_json_object(path, "hardware profile"), _where(path)


def _where(path: Path) -> str:
    """``path`` as a profile's provenance names it: relative to the package root for a shipped preset, else as given."""
    try:
        return str(path.resolve().relative_to(PRESET_DIR.resolve().parent.parent))
    except ValueError:
        return str(path)
