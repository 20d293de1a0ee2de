"""Derive the H200 presets: ``h200-gen5x16-kvpipe`` from the H200 probe, ``h200-gen5x16`` from upstream llama.cpp.

The probe timed one NVIDIA H200 on PCIe gen5 x16 through CuPy: copies of
256 KiB .. 1 GiB pinned and pageable in both directions, two copies racing on
two streams, a copy under a matmul loop, an attention kernel over
4,096 .. 131,072 rows, a weight-streaming matvec, and the host cost of a copy
issue, an event record + wait and a kernel launch. Every number of the preset
follows from those by a rule stated in the function that applies it. The probe
file is not part of the repository: the numbers this needs are embedded below,
and ``--probe FILE`` verifies them against a copy of the file. The probe's
kernels are kvpipe's own CuPy ones (69.5 t/s resident for llama-bench's q8_0
llama-3.1-8b at 8,192, where upstream llama.cpp runs 186), so that preset describes kvpipe's
program: ``h200-gen5x16-kvpipe``.

``h200-gen5x16``, the preset for planning llama.cpp on an H200, is that one
with what upstream llama.cpp's own runs fitted (``kvpipe calibrate
--from-llama-bench`` on them, the probe's preset the base): the GPU compute and
the pageable H2D rate from ``validate/results/h200-llamacpp/prediction`` (five
runs of run 1), the CPU layer's host cost from ``prediction-ngl`` (run 3, -ngl
below the layer count). Host costs, the pinned links, the engines and the
memory stay the probe's: the fits were made on them.

Not part of the installed package: run it from a checkout (it writes the
checkout's ``backends/presets``). ``python tools/h200_preset.py`` rewrites the
presets (and the ``gh200-c2c`` estimate built on the probe's), ``--check``
verifies the committed ones. Units as in the probe: MiB, GB/s, ms, us.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the checkout's backends/ (whose presets this writes), before any installed copy

from preset_files import write_or_check  # noqa: E402

from backends.profile import PRESET_DIR  # noqa: E402

PRESET_PATH = PRESET_DIR / "h200-gen5x16-kvpipe.json"
UPSTREAM_PATH = PRESET_DIR / "h200-gen5x16.json"
#: The upstream llama-bench fits the llama.cpp preset takes its compute from (kvpipe calibrate --from-llama-bench).
FITS = ROOT / "validate" / "results" / "h200-llamacpp"
GPU_FIT = FITS / "prediction" / "profile.json"
CPU_LAYER_FIT = FITS / "prediction-ngl" / "profile.json"
GH200_PATH = PRESET_DIR / "gh200-c2c.json"
MIB = 1024 * 1024

# Embedded from the probe file, under its own key paths (``probe_mismatches`` compares them). Copy sizes in MiB.
PROBE: dict[str, Any] = {
    "totalGlobalMem": 150109880320,
    "bandwidth": {
        "0.25": {"h2d_pinned_GBps": 13.473684808884329, "h2d_pageable_GBps": 6.9838024081263255, "d2h_pinned_GBps": 12.06480136016715},
        "1": {"h2d_pinned_GBps": 33.781443518874674, "h2d_pageable_GBps": 9.525581716575655, "d2h_pinned_GBps": 28.718668917838023},
        "4": {"h2d_pinned_GBps": 47.08045958137084, "h2d_pageable_GBps": 10.016965825503249, "d2h_pinned_GBps": 43.34391568799739},
        "16": {"h2d_pinned_GBps": 51.90456469048318, "h2d_pageable_GBps": 8.841281363838664, "d2h_pinned_GBps": 50.611833093525675},
        "64": {"h2d_pinned_GBps": 54.18157266431513, "h2d_pageable_GBps": 6.582253320127808, "d2h_pinned_GBps": 53.490590655257364},
        "256": {"h2d_pinned_GBps": 53.072637107511525, "h2d_pageable_GBps": 5.958296445285148, "d2h_pinned_GBps": 53.8110709270323},
        "1024": {"h2d_pinned_GBps": 54.07740013295885, "h2d_pageable_GBps": 7.655152784070471, "d2h_pinned_GBps": 55.03442092398318},
    },
    "small_copy_issue_us": 3.484591999999509,
    "two_h2d_streams_ms": {"s1": 19.994176864624023, "s2": 39.733726501464844},
    "fifo_big_h2d_then_small_d2h_ms": {"big_done": 19.46086311340332, "small_done": 0.09721600264310837},
    "h2d_plus_d2h_ms": {"h2d": 23.048032760620117, "d2h": 20.88649559020996},
    "attention": {
        "4096": {"ms": 0.39344000816345215, "kv_bytes": 16777216},
        "16384": {"ms": 0.9084799885749817, "kv_bytes": 67108864},
        "65536": {"ms": 3.1958720684051514, "kv_bytes": 268435456},
        "131072": {"ms": 6.405663967132568, "kv_bytes": 536870912},
    },
    "mlp_matvec_ms": {"ms": 0.16463999450206757, "bytes": 534773760},
    "event_record_wait_us": 2.262932499998982,
    "tiny_kernel_launch_us": 61.40961099999842,
}


#: kvpipe's own schedule on this H200 (docs/figures/reproduction-gpu-schedule.py, results in
#: docs/figures/reproduction-gpu-schedule.json): ms per token at depth 0 (blocked in ordered
#: copies, consumer wait) and depth 1, where copy > compute.
GPU_SCHEDULE_MS = {
    65536: {"blocked": 44.85149520000391, "consumer": 34.020662399994706, "pipelined": 64.96563460000004},
    131072: {"blocked": 86.11770919998918, "consumer": 43.95995900000429, "pipelined": 115.85108960000099},
}


#: docs/figures/reproduction-engine-order.py on this H200: completion ms of A (256 MiB, stream 1),
#: C (issued next, stream 2) and B (256 MiB, stream 1, issued after C); five repetitions each.
ENGINE_ORDER_MS = {
    "A,C,B": [(4.91, 9.75, 9.75), (4.9, 9.75, 9.74), (4.89, 9.74, 9.73), (4.88, 9.74, 9.73), (4.88, 9.74, 9.73)],
    "A,sleep,C,B": [(4.89, 9.76, 9.75), (4.87, 9.74, 9.73), (4.9, 9.85, 9.84), (4.88, 9.74, 9.73), (5.05, 10.09, 10.08)],
    "A,C,rec+wait,B": [(4.93, 9.8, 9.79), (4.98, 9.85, 9.84), (4.96, 10.0, 9.99), (4.94, 9.8, 9.79), (4.94, 9.9, 9.89)],
    "A,sleep,C,B big C": [(4.88, 10.95, 9.73), (4.87, 10.94, 9.72), (4.87, 10.92, 9.71), (4.88, 10.94, 9.72), (4.89, 10.96, 9.74)],
}


def copy_engine_drains_stream() -> bool:
    """Whether the H2D engine serves the stream it just served before an earlier copy of another stream.

    The micro-test: C was issued before B, yet finished with or after B (never near A's end, where
    arrival order would put it) in every repetition of every
    case (also with A already running, with an event record + wait between A and B, and with a
    64 MiB C). The schedule agrees: in arrival order a copy-bound pipelined token cannot take
    much longer than max(copy, compute), and the measured ones took 1.3-1.4 x that.
    """
    order = all(c >= b for runs in ENGINE_ORDER_MS.values() for _, c, b in runs)  # ties: 0.01 ms rounding
    schedule = all(v["pipelined"] > 1.2 * max(v["blocked"], v["consumer"]) for v in GPU_SCHEDULE_MS.values())
    return order and schedule


def _sizes() -> list[float]:
    return sorted(float(k) for k in PROBE["bandwidth"])


def _times_s(key: str) -> list[tuple[float, float]]:
    """(bytes, seconds) of each probed copy: size / measured GB/s."""
    out = []
    for mib in _sizes():
        gbps = PROBE["bandwidth"][f"{mib:g}"][key]
        out.append((mib * MIB, mib * MIB / (gbps * 1e9)))
    return out


def link_curve(key: str) -> dict[str, Any]:
    """A link curve that reproduces every probed copy time exactly.

    Latency: the intercept of the line time = latency + bytes / bandwidth
    fitted to all sizes by least squares on the relative error (each point
    weighted by 1 / time, so the 256 KiB copy counts as much as the 1 GiB one).
    Then each size gets bandwidth = size / (time - latency), which the
    profile's latency + bytes / bw(size) model turns back into the probed time.
    """
    pts = _times_s(key)
    ns = np.array([n for n, _ in pts])
    ts = np.array([t for _, t in pts])
    design = np.vstack([np.ones_like(ns), ns]).T / ts[:, None]
    latency_s = float(np.linalg.lstsq(design, np.ones_like(ts), rcond=None)[0][0])
    return {
        "latency_us": round(latency_s * 1e6, 3),
        "points": [[round(n / MIB, 4), round(n / (t - latency_s) / 1e9, 3)] for n, t in pts],
    }


def engines() -> dict[str, Any]:
    """Copy engines per direction and the full-duplex slowdown.

    Two 1 GiB H2D copies on two streams finished at 20.0 and 39.7 ms: one
    engine in that direction, FIFO (despite ``asyncEngineCount`` 3). A small
    D2H issued behind a 1 GiB H2D finished after 0.1 ms: D2H has its own.
    H2D and D2H of 1 GiB at once: H2D took 23.05 ms against 19.86 alone (the
    1 GiB pinned time), so a copy that starts while the other direction is busy
    runs that much slower.
    """
    two = PROBE["two_h2d_streams_ms"]
    h2d_engines = 1 if two["s2"] > 1.5 * two["s1"] else 2
    fifo = PROBE["fifo_big_h2d_then_small_d2h_ms"]
    d2h_separate = fifo["small_done"] < 0.5 * fifo["big_done"]
    alone_ms = dict(_times_s("h2d_pinned_GBps"))[1024 * MIB] * 1e3
    return {
        "h2d_engines": h2d_engines,
        "d2h_engines": 1,
        "d2h_separate_engine": d2h_separate,
        "duplex_slowdown": round(PROBE["h2d_plus_d2h_ms"]["h2d"] / alone_ms, 4),
    }


def compute() -> dict[str, float]:
    """GPU time: weights at the matvec's bandwidth; attention as a line in window bytes over the four kernels."""
    mv = PROBE["mlp_matvec_ms"]
    xs = [float(v["kv_bytes"]) for v in PROBE["attention"].values()]
    ys = [float(v["ms"]) * 1e-3 for v in PROBE["attention"].values()]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {
        "weight_GBps": round(mv["bytes"] / (mv["ms"] * 1e-3) / 1e9, 1),
        "attn_us": round((my - slope * mx) * 1e6, 1),
        "attn_GBps": round(1.0 / slope / 1e9, 2),
    }


def host() -> dict[str, float]:
    """Host costs: copy issue and kernel launch as probed; the event record + wait round trip split in two halves."""
    half = PROBE["event_record_wait_us"] / 2
    return {
        "launch_us": round(PROBE["tiny_kernel_launch_us"], 3),
        "copy_issue_us": round(PROBE["small_copy_issue_us"], 3),
        "event_us": round(half, 3),
        "host_wait_us": round(half, 3),
        "graph_us": 0.0,
    }


def derive() -> dict[str, Any]:
    """The preset as a dict (the file's format)."""
    eng = engines()
    pageable = link_curve("h2d_pageable_GBps")
    return {
        "name": "h200-gen5x16-kvpipe",
        "source": (
            "kvpipe's own CuPy program on an NVIDIA H200 on PCIe gen5 x16 (for upstream llama.cpp: h200-gen5x16), "
            "every number derived from the H200 probe (its numbers embedded in "
            "tools/h200_preset.py; regenerate: python tools/h200_preset.py): link curves reproduce each probed copy "
            "time; one FIFO engine per direction (two-stream probe) and the probed full-duplex slowdown; compute from the "
            "probe's matvec (weights) and attention kernels, host costs from its issue/launch/event timings; the copy "
            "engine drains a stream before serving another (kvpipe's schedule on this GPU, docs/reproduction.md); "
            "dram_GBps is the specified HBM3e bandwidth (4.8 TB/s), which copies and kernels share. The probe ran "
            "through CuPy, so launch_us (61 us) is a Python-side launch and the kernels are the probe's own; "
            "memory_reserved is the profile's default reservation "
            "(what a model places is computed per workload), cpu_split_us an estimate (no probe)."
        ),
        "estimate": False,
        "schema": "kvpipe.profile/1",
        "provenance": {
            "kind": "measured on a device (the H200 probe)",
            "host": "measured on a device (the H200 probe: CuPy issue, launch and event timings)",
            "devices.links": "measured on a device (the H200 probe's copy sizes, pinned and pageable)",
            "devices.compute": "measured on a device (the probe's own matvec and attention kernels); cpu_split_us a "
                               "specification estimate (no probe)",
            "devices.memory": "specification estimate: the card's memory less the profile's default reservation",
            "devices.dram_GBps": "specification estimate: HBM3e at 4.8 TB/s",
        },
        "host": host(),
        "devices": [
            {
                "name": "NVIDIA H200",
                "memory_total_mib": round(PROBE["totalGlobalMem"] / MIB),
                "memory_reserved_mib": 600,
                "h2d_engines": eng["h2d_engines"],
                "d2h_engines": eng["d2h_engines"],
                "duplex_slowdown": eng["duplex_slowdown"],
                "copy_engine_drains_stream": copy_engine_drains_stream(),
                "dram_GBps": H200_HBM_GBPS,
                "alignment_bytes": 256,
                "links": {
                    "h2d_pinned": link_curve("h2d_pinned_GBps"),
                    "h2d_pageable": pageable,
                    "d2h_pinned": link_curve("d2h_pinned_GBps"),
                    "d2h_pageable": pageable,
                },
                "compute": {"layer_us": 0.0, **compute(), "head_us": 0.0, "cpu_split_us": 5.0},
            }
        ],
    }


#: H200 specification: 141 GB HBM3e at 4.8 TB/s, the memory bandwidth copies and kernels share.
H200_HBM_GBPS = 4800.0

#: Datasheet figures behind the GH200 estimate (NVIDIA GH200 Grace Hopper Superchip datasheet).
GH200: dict[str, Any] = {
    "c2c_GBps_per_direction": 450.0,  # NVLink-C2C: 900 GB/s bidirectional
    "pcie_gen5_x16_GBps": 32.0 * 16 * 128 / 130 / 8,  # 63.0 GB/s per direction
    "hbm_TBps": 4.0,  # GH200 96 GB HBM3
    "h200_hbm_TBps": 4.8,  # H200 141 GB HBM3e
    "memory_mib": 97280,  # 96 GB HBM3 less what the driver keeps (about 1 GiB, as on the H200)
}


def derive_gh200(h200: dict[str, Any]) -> dict[str, Any]:
    """The GH200 estimate: the H200 preset with the link moved to NVLink-C2C and compute scaled by HBM bandwidth.

    Link: every H200 pinned bandwidth scaled by C2C / PCIe gen5 x16 line rates
    (450 / 63.0), i.e. the same share of the line rate the probe reached, with
    the H200's copy latency; pageable taken equal to pinned (the C2C link is
    cache-coherent, so we assume the driver does not stage pageable copies).
    Compute: bandwidths x 4.0 / 4.8 (HBM3 vs HBM3e). Host: the H200 probe's.
    Not measured: every number here is an estimate.
    """
    d = json.loads(json.dumps(h200))
    dev = d["devices"][0]
    link_scale = GH200["c2c_GBps_per_direction"] / GH200["pcie_gen5_x16_GBps"]
    for key in ("h2d_pinned", "d2h_pinned"):
        curve = dev["links"][key]
        curve["points"] = [[mib, round(gbps * link_scale, 1)] for mib, gbps in curve["points"]]
    dev["links"]["h2d_pageable"] = dev["links"]["h2d_pinned"]
    dev["links"]["d2h_pageable"] = dev["links"]["d2h_pinned"]
    hbm = GH200["hbm_TBps"] / GH200["h200_hbm_TBps"]
    for key in ("weight_GBps", "attn_GBps"):
        dev["compute"][key] = round(dev["compute"][key] * hbm, 2)
    dev["name"] = "NVIDIA GH200 (estimate)"
    dev["dram_GBps"] = GH200["hbm_TBps"] * 1000
    dev["memory_total_mib"] = GH200["memory_mib"]
    d["name"] = "gh200-c2c"
    d["estimate"] = True
    d["provenance"] = {"kind": "a specification estimate",
                       "all": "specification estimate: NVIDIA's GH200 datasheet, scaled from the h200-gen5x16-kvpipe preset "
                              "(see source)"}
    d["source"] = (
        "ESTIMATE, not measured: NVIDIA GH200 96 GB (HBM3, 4.0 TB/s) with the Grace host on NVLink-C2C (900 GB/s "
        "bidirectional, 450 per direction, from NVIDIA's GH200 datasheet). tools/h200_preset.py derives it from the "
        "h200-gen5x16-kvpipe preset (the H200 probe's): link bandwidths x 450/63.0 (C2C vs the PCIe gen5 x16 line "
        "rate, keeping the share of the line rate the H200 probe reached), pageable = pinned (coherent link, assumed), "
        "compute x 4.0/4.8 (HBM), host costs of the H200 probe."
    )
    return d


#: The fitted compute keys each fit gives the llama.cpp preset.
GPU_KEYS = ("layer_us", "weight_GBps", "attn_us", "attn_GBps", "head_us", "cpu_split_us")
CPU_LAYER_KEYS = ("host_layer_us", "host_weight_GBps", "host_attn_us", "host_attn_GBps")


def derive_upstream(probe: dict[str, Any], gpu_fit: dict[str, Any], cpu_fit: dict[str, Any]) -> dict[str, Any]:
    """The llama.cpp preset: the probe's preset with the GPU compute and pageable H2D of ``gpu_fit`` and the CPU layer's
    host cost of ``cpu_fit`` (two ``kvpipe calibrate --from-llama-bench`` profiles, both on the probe's preset)."""
    d = json.loads(json.dumps(probe))
    dev, gpu, cpu = d["devices"][0], gpu_fit["devices"][0], cpu_fit["devices"][0]
    dev["compute"] = {**{k: gpu["compute"][k] for k in GPU_KEYS}, **{k: cpu["compute"][k] for k in CPU_LAYER_KEYS}}
    dev["links"]["h2d_pageable"] = gpu["links"]["h2d_pageable"]
    d["name"] = "h200-gen5x16"
    d["nkvo_attention"] = gpu_fit["nkvo_attention"]
    gcal, ccal = gpu_fit["calibration"], cpu_fit["calibration"]
    gpu_runs = f"{gcal['file']} ({gcal['runs']}; llama.cpp {gcal['build_commit']}, {gcal['model_type']}, -fa 1)"
    cpu_runs = f"{ccal['file']} ({ccal['runs']}; llama.cpp {ccal['build_commit']}, -fa 1)"
    d["source"] = (
        "Upstream llama.cpp (0c1e570, b11312, -fa 1) on an NVIDIA H200 on PCIe gen5 x16: the GPU compute and the pageable "
        "H2D rate (upstream's -nkvo cache) fitted by kvpipe calibrate --from-llama-bench to five llama-bench runs of "
        "validate/results/h200-llamacpp/run1, the host cost of a layer below -ngl to the runs of run3 at -ngl 33, 25 and 9; "
        "host costs, pinned links, copy engines and memory from the H200 probe (h200-gen5x16-kvpipe), on which the fits "
        "were made. Regenerate: python tools/h200_preset.py. kvpipe's own CuPy program: h200-gen5x16-kvpipe."
    )
    d["provenance"] = {
        "kind": "fitted from llama-bench (upstream llama.cpp on the H200)",
        "host": "measured on a device (the H200 probe, as h200-gen5x16-kvpipe): the fits' base",
        "devices.compute": f"fitted from llama-bench: {gpu_runs}, the -nkvo 0 runs' line over the window bytes",
        "devices.compute.host_layer": f"fitted from llama-bench: {cpu_runs}; {cpu_fit['provenance']['devices.compute.host_layer']}",
        "devices.links.h2d_pageable": f"fitted from llama-bench: {gpu_runs}, the -nkvo 1 runs given the compute",
        "devices.links (other)": "measured on a device (the H200 probe's copy sizes)",
        "devices.memory": "specification estimate: the card's memory less the profile's default reservation",
        "devices.dram_GBps": "specification estimate: HBM3e at 4.8 TB/s",
        "nkvo_attention": "upstream llama.cpp at -fa 1 runs -nkvo's attention on the GPU, each layer's K/V copied from "
                          "host memory (validate/results/h200-llamacpp/run1/README.md): kvpipe's delivered windows",
    }
    return d


def preset_json() -> str:
    return json.dumps(derive(), indent=1) + "\n"


def upstream_json() -> str:
    return json.dumps(derive_upstream(derive(), json.loads(GPU_FIT.read_text()), json.loads(CPU_LAYER_FIT.read_text())),
                      indent=1) + "\n"


def gh200_json() -> str:
    return json.dumps(derive_gh200(derive()), indent=1) + "\n"


def probe_mismatches(path: str | Path) -> list[str]:
    """Embedded probe numbers that differ from the probe file at ``path`` (empty: they agree). Reads the file."""
    data = json.loads(Path(path).read_text())
    bad: list[str] = []

    def walk(ours: Any, theirs: Any, where: str) -> None:
        if isinstance(ours, dict):
            if not isinstance(theirs, dict):
                bad.append(where)
                return
            for k, v in ours.items():
                if k not in theirs:
                    bad.append(f"{where}.{k} (absent)")
                else:
                    walk(v, theirs[k], f"{where}.{k}")
        elif ours != theirs:
            bad.append(f"{where}: {ours!r} != {theirs!r}")

    walk({k: v for k, v in PROBE.items() if k != "totalGlobalMem"}, data, "probe")
    walk(PROBE["totalGlobalMem"], data.get("device", {}).get("totalGlobalMem"), "probe.device.totalGlobalMem")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/h200_preset.py", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless the committed preset equals the derived one")
    ap.add_argument("--probe", metavar="FILE", help="also verify the embedded numbers against this probe file")
    ap.add_argument("--out", default=str(PRESET_PATH))
    args = ap.parse_args(argv)
    if args.probe:
        bad = probe_mismatches(args.probe)
        if bad:
            print("embedded probe numbers differ from " + args.probe + ": " + "; ".join(bad), file=sys.stderr)
            return 1
    outputs = {Path(args.out): preset_json()}
    if Path(args.out) == PRESET_PATH:
        outputs[GH200_PATH] = gh200_json()
        outputs[UPSTREAM_PATH] = upstream_json()
    return write_or_check(outputs, "tools/h200_preset.py", args.check)


if __name__ == "__main__":
    sys.exit(main())
