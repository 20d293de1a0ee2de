"""Hardware profiles: what a machine is, as numbers a backend can run on.

A profile describes one host with one or more devices: for each device the
host<->device link as a bandwidth curve over copy size (pinned and pageable,
each direction), the number of copy engines per direction, the host's cost of
each CUDA call, the device memory, and a GPU compute model. Profiles are data
files (JSON) beside this module (``backends/presets``) or written by
``kvpipe calibrate``; they carry their source so a reader knows whether a
number was measured, derived or estimated.

Units: seconds and bytes inside. The files use GB/s (10^9 B/s), microseconds,
milliseconds and MiB, with the unit in every field name; conversion happens
here, once, in :func:`load_profile`.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from backends.errors import InputError
from backends.files import load_json_object, mapping, number, whole

PRESET_DIR = Path(__file__).with_name("presets")
MIB = 1024 * 1024


@dataclass(frozen=True)
class LinkCurve:
    """Time of one copy as a function of its size.

    ``seconds(n) = latency_s + n / bw(n)``, with ``bw`` interpolated
    log-linearly in size between measured points ``(sizes_bytes[i],
    bytes_per_s[i])`` and held flat outside them. A single point gives the
    plain latency + bytes/bandwidth model.
    """

    sizes_bytes: tuple[float, ...]
    bytes_per_s: tuple[float, ...]
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.sizes_bytes or len(self.sizes_bytes) != len(self.bytes_per_s):
            raise ValueError("LinkCurve needs one bandwidth per size and at least one point")
        if any(not math.isfinite(b) or b <= 0 for b in self.bytes_per_s) or any(not math.isfinite(s) or s <= 0 for s in self.sizes_bytes):
            bad = next(x for x in (*self.sizes_bytes, *self.bytes_per_s) if not math.isfinite(x) or x <= 0)
            raise ValueError(f"link curve point {bad / 1e9 if bad in self.bytes_per_s else bad / MIB:g}: sizes (MiB) and "
                             "bandwidths (GB/s) must be finite numbers > 0")
        if list(self.sizes_bytes) != sorted(self.sizes_bytes):
            raise ValueError("LinkCurve sizes must be ascending")
        if not math.isfinite(self.latency_s) or self.latency_s < 0:
            raise ValueError(f"link latency_us {self.latency_s * 1e6:g}; allowed: a finite number >= 0")

    def bandwidth(self, nbytes: float) -> float:
        """Effective bytes per second of a copy of ``nbytes`` (excluding latency)."""
        xs, ys = self.sizes_bytes, self.bytes_per_s
        if nbytes <= xs[0]:
            return ys[0]
        if nbytes >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, nbytes)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        t = (math.log(nbytes) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return y0 + t * (y1 - y0)

    def seconds(self, nbytes: float) -> float:
        """Seconds one copy of ``nbytes`` occupies its copy engine."""
        if nbytes <= 0:
            return 0.0
        return self.latency_s + nbytes / self.bandwidth(nbytes)

    def peak_bytes_per_s(self) -> float:
        return max(self.bytes_per_s)


@dataclass(frozen=True)
class HostCosts:
    """Host-thread time of each call, in seconds, as the backend pays it.

    ``split_launch_s`` is the host time of launching one GPU split's kernels
    after its first kernel is enqueued: the GPU starts on the split at once
    while the host keeps launching the rest (a Python program's tens of CuPy
    calls; llama.cpp's is ~0). The split's GPU time already spans it (a
    calibrated ``attn_floor_s``); what it adds is that the host can do nothing
    else meanwhile -- issue the next delivery, for one. 0 = not modelled.
    """

    launch_s: float = 4e-6
    copy_issue_s: float = 3e-6
    event_s: float = 2e-6
    host_wait_s: float = 5e-6
    split_launch_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"host.{name[:-2]}_us {value * 1e6:g}; allowed: a finite number >= 0")

    def zero(self) -> HostCosts:
        """Every cost 0 (a host that issues for free)."""
        return HostCosts(**{f.name: 0.0 for f in fields(self)})


@dataclass(frozen=True)
class ComputeModel:
    """GPU time of a split from the layers it holds (decode, one new row).

    A layer costs ``layer_s + layer_weight_bytes / weight_bytes_per_s``; an
    attention layer adds ``attn_s + window_bytes / attn_bytes_per_s`` where
    ``window_bytes`` is the K+V window its attention reads, but no less than
    ``attn_floor_s`` (a split whose launches take longer than its kernels: the
    host-bound floor; 0 = none). A CPU split costs ``cpu_split_s`` of host
    time; on the ``host-attention`` arm (upstream llama.cpp's ``-nkvo``, which
    runs attention on the CPU) it adds ``host_attn_s + window_bytes /
    host_attn_bytes_per_s``. Several sequences (a batch of ``B``) read the
    weights once: each sequence past the first adds ``layer_seq_s`` per layer
    and ``attn_seq_s`` per attention layer to the GPU split (their attention
    reads their own cells, already in ``window_bytes``), and ``cpu_row_s`` to
    the CPU split that stores its rows. ``weight_bytes_per_s`` of 0 ignores weights.
    """

    layer_s: float = 0.0
    weight_bytes_per_s: float = 0.0
    attn_s: float = 0.0
    attn_bytes_per_s: float = 0.0
    head_s: float = 0.0
    cpu_split_s: float = 0.0
    attn_floor_s: float = 0.0
    host_attn_s: float = 0.0
    host_attn_bytes_per_s: float = 0.0
    layer_seq_s: float = 0.0  # each sequence past the first: its share of a layer's matrix products (weights read once)
    attn_seq_s: float = 0.0  # each sequence past the first: its attention's fixed cost in an attention split
    cpu_row_s: float = 0.0  # each sequence past the first: host time of storing its rows in a CPU split
    #: A layer run on the CPU (past llama.cpp's -ngl): ``host_layer_s + layer_weight_bytes / host_weight_bytes_per_s``
    #: of host time (its weights stream from host memory); 0 rate = not known for this host.
    host_layer_s: float = 0.0
    host_weight_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"compute.{name} {value:g}; allowed: a finite number >= 0")

    def layer_seconds(self, weight_bytes: float) -> float:
        w = weight_bytes / self.weight_bytes_per_s if self.weight_bytes_per_s > 0 else 0.0
        return self.layer_s + w

    def batch_seconds(self, n_seq: int, layers: int, attention: bool) -> float:
        """GPU time a split of ``layers`` layers (and an attention layer) adds for sequences past the first."""
        extra = max(0, n_seq - 1)
        return extra * (layers * self.layer_seq_s + (self.attn_seq_s if attention else 0.0))

    def host_layer_seconds(self, weight_bytes: float) -> float:
        """Host time of one layer run on the CPU (a layer below llama.cpp's ``-ngl`` GPU layers), seconds. Pure."""
        w = weight_bytes / self.host_weight_bytes_per_s if self.host_weight_bytes_per_s > 0 else 0.0
        return self.host_layer_s + w

    def host_attention_seconds(self, window_bytes: float) -> float:
        """Host time of one attention layer run on the CPU over ``window_bytes`` of host cache (upstream llama.cpp's -nkvo)."""
        a = window_bytes / self.host_attn_bytes_per_s if self.host_attn_bytes_per_s > 0 else 0.0
        return self.host_attn_s + a

    def attention_seconds(self, window_bytes: float) -> float:
        a = window_bytes / self.attn_bytes_per_s if self.attn_bytes_per_s > 0 else 0.0
        return max(self.attn_floor_s, self.attn_s + a)


@dataclass(frozen=True)
class DeviceProfile:
    """One device and its link to the host.

    ``memory_total_bytes`` is what the card offers and ``memory_reserved_bytes``
    what its driver and runtime keep: properties of the card. What a model
    places on it (weights, compute buffer, KV) is computed per workload
    (``sim.memory``) into ``memory_used_bytes``, what the device holds before
    the scheduler allocates. A profile leaves ``memory_used`` at 0; one
    measured for one program on a device (``kvpipe calibrate`` on a GPU, tests)
    may fix it.
    """

    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    h2d_pinned: LinkCurve
    h2d_pageable: LinkCurve
    d2h_pinned: LinkCurve
    d2h_pageable: LinkCurve
    h2d_engines: int = 1
    d2h_engines: int = 1
    duplex_slowdown: float = 1.0
    alignment_bytes: int = 256
    compute: ComputeModel = field(default_factory=ComputeModel)
    memory_reserved_bytes: int = 600 * MIB
    #: A copy engine that finishes a stream's copy serves that stream's next queued copy in the same
    #: direction before any other stream's waiting copy (observed on an H200: docs/reproduction.md).
    copy_engine_drains_stream: bool = False
    pageable_chunk_bytes: int = 2 * MIB  # the driver's staging chunk for pageable H2D copies (an estimate: undocumented)
    #: Device memory bandwidth (bytes/s) that copies and kernels share: every byte a copy engine moves in or
    #: out of device memory while a kernel runs costs that kernel ``1 / dram_bytes_per_s`` seconds (decode
    #: kernels are memory-bound). 0 = copies never slow kernels.
    dram_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        if self.memory_total_bytes <= 0:
            raise ValueError(f"{self.name}: memory_total must be > 0")
        if not 0 <= self.memory_used_bytes <= self.memory_total_bytes:
            raise ValueError(f"{self.name}: memory_used must be within 0..memory_total")
        if self.h2d_engines < 1 or self.d2h_engines < 1:
            raise ValueError(f"{self.name}: copy engines per direction must be >= 1")
        if self.duplex_slowdown < 1.0:
            raise ValueError(f"{self.name}: duplex_slowdown must be >= 1, got {self.duplex_slowdown}")
        if not math.isfinite(self.dram_bytes_per_s) or self.dram_bytes_per_s < 0:
            raise ValueError(f"{self.name}: dram_GBps must be >= 0 (0 = no contention), got {self.dram_bytes_per_s / 1e9:g}")
        if self.alignment_bytes < 1 or self.alignment_bytes & (self.alignment_bytes - 1):
            raise ValueError(f"{self.name}: alignment_bytes must be a power of two, got {self.alignment_bytes}")

    def link(self, to_device: bool, pinned: bool) -> LinkCurve:
        if to_device:
            return self.h2d_pinned if pinned else self.h2d_pageable
        return self.d2h_pinned if pinned else self.d2h_pageable


@dataclass(frozen=True)
class HardwareProfile:
    """A host thread with its call costs and one or more devices."""

    name: str
    devices: tuple[DeviceProfile, ...]
    host: HostCosts = field(default_factory=HostCosts)
    source: str = ""
    estimate: bool = False
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError(f"hardware {self.name!r} has no device")

    def combined(self, other: HardwareProfile) -> HardwareProfile:
        """This machine's devices followed by ``other``'s (one host: this one's call costs)."""
        return replace(
            self,
            name=f"{self.name}+{other.name}",
            devices=self.devices + other.devices,
            source=f"{self.source} | {other.source}",
            estimate=self.estimate or other.estimate,
        )


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


def workload_key(model: str, cache: str) -> str:
    """The key of a calibrated workload entry in a profile file's ``workloads``."""
    return f"{model}@{cache}"


def workload_entry(profile: HardwareProfile, model: str, cache: str) -> tuple[str, dict[str, Any]] | None:
    """The ``workloads`` entry calibrated for (model, cache type), as (key, entry), or None.

    Looks up ``model@cache`` first; then an entry keyed by the model alone (the
    file format before several cache types), but only if it was calibrated for
    ``cache`` (its ``cache_type``; an entry without one matches any).
    """
    table = profile.meta.get("workloads") or {}
    key = workload_key(model, cache)
    if key in table:
        return key, table[key]
    entry = table.get(model)
    if entry and entry.get("cache_type", cache) == cache:
        return model, entry
    return None


def for_workload(profile: HardwareProfile, model: str, cache: str) -> HardwareProfile:
    """``profile`` with the compute model, launch and event costs calibrated for ``model``'s program with ``cache``.

    A calibrated file (``kvpipe calibrate``) measures each model's decode
    program per cache type: the attention's seconds per window byte depend on
    how the cache is decoded, the launch costs on the model's kernels. Without
    an entry for this (model, cache type) the profile is returned unchanged:
    its device ``compute`` (the first calibrated entry's, or a preset's).
    Pure; does not block.
    """
    found = workload_entry(profile, model, cache)
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


def prediction_band(profile: HardwareProfile, model: str, cache: str) -> Band | None:
    """The band of predictions of (model, cache type) on ``profile``, or None where the profile is uncalibrated for it.

    From the calibrated workload entry's ``band`` (``calibrate --from-llama-bench``:
    the largest leave-one-out error of its fit), else the profile's
    ``calibration`` block when it was fitted on this model and cache type (the
    reference preset: its ordered table). A band is a calibration residual: it
    says how well the fitted terms predict runs of the arm they were fitted on
    that the fit did not see, not how well the pipelined mechanism is modelled
    (docs/validation.md measures that). Pure.
    """
    found = workload_entry(profile, model, cache)
    if found is not None and found[1].get("band") is not None:
        n = len(found[1].get("held_out") or ())
        return Band(float(found[1]["band"]), f"largest held-out error of the fit to {n} runs ({found[0]})")
    cal = profile.meta.get("calibration") or {}
    if cal.get("band") is not None and cal.get("model") == model and cal.get("cache_type") == cache:
        return Band(float(cal["band"]), str(cal.get("band_source", "calibration residuals")))
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
    """The JSON object of one preset (by name) or profile file (by path), and where it came from. Raises ValueError
    (an InputError: one line naming the file) on an unreadable, too large, deeply nested or non-JSON file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise ValueError(f"unknown hardware {name_or_path!r}; presets: {', '.join(preset_names())} or a .json file")
    return load_json_object(path, "hardware profile"), str(path)
