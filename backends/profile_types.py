"""What a machine is, as numbers: the frozen dataclasses a hardware profile is made of.

A profile (:class:`HardwareProfile`) is one host thread with its call costs
(:class:`HostCosts`) and one or more devices (:class:`DeviceProfile`). A device
has four host<->device links, each a copy time over copy size
(:class:`LinkCurve`: pinned and pageable, each direction), copy engines, memory
and a GPU compute model (:class:`ComputeModel`: the seconds of a decode split
from the bytes it reads). ``backends.profile`` reads and writes them as JSON
files and picks the calibrated entry of a workload; this module only says what
the numbers are.

Units: seconds, bytes and bytes per second, everywhere in this module. Pure.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

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
