"""Write and check the reference presets, and study what the calibration chose.

``tools/reference_derivation.py`` derives ``rtx4070-gen4x16`` from the
published ordered-path numbers; this command writes it, and what is built on
it: the ``rtx3060-gen3x4`` estimate (the reference's second card, the 4070's
calibration scaled by the published link and the cards' memory bandwidths).
It also answers what the calibration's choices are worth: sensitivity
variants of the preset (one choice changed each, docs/reproduction.md), the
simulated ordered rows beside the published ones, and the *unordered ceiling*
1 / max(copy, compute) per token. Not part of the installed package: run it
from a checkout; it writes the checkout's ``backends/presets``.

    python tools/calibrate_reference.py            # rewrite both presets
    python tools/calibrate_reference.py --check    # exit 1 unless the committed presets equal the derivation
    python tools/calibrate_reference.py --explain  # also print every derived number and the ordered check
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the checkout's backends/ and sim/ (whose presets this writes), before any installed copy

from preset_files import write_or_check  # noqa: E402
from reference_batch import with_batch_terms  # noqa: E402
from reference_derivation import (  # noqa: E402
    BORROWED_PAGEABLE_POINTS,
    HOST_4096,
    ORDERED_TABLE,
    PHYSICAL,
    PRESET_PATH,
    derive,
    graph_counts,
    preset_json,
    workload_at,
)

from backends.profile import PRESET_DIR, load_profile, profile_from_dict  # noqa: E402
from sim.graph import decode_graph  # noqa: E402
from sim.rows import row  # noqa: E402
from sim.run.point import Point  # noqa: E402
from sim.run.run import run_point  # noqa: E402
from sim.transport.scheduler import TransportConfig  # noqa: E402
from sim.workload import Workload, cache_type, load_model  # noqa: E402

RTX3060_PATH = PRESET_DIR / "rtx3060-gen3x4.json"


#: The second card of the reference's layer-split runs (an estimate built on the calibrated 4070).
RTX3060: dict[str, Any] = {
    "device": "NVIDIA GeForce RTX 3060",
    "h2d_GBps": 3.3,  # published: "a second card, RTX 3060 on gen3 x4, ~3.3 GB/s"
    "pcie_gen3_x4_GBps": 8.0 * 4 * 128 / 130 / 8,  # 8 GT/s x 4 lanes, 128b/130b: 3.94 GB/s
    "dram_GBps": 360.0,  # 15 Gbps GDDR6 x 192 bit
    "rtx4070_dram_GBps": 504.2,  # 21 Gbps GDDR6X x 192 bit
    "memory_mib": 12288,  # 12 GB card; the 4070 loses 12,282 - 11,902 MiB to the driver, the 3060 the same
    "rtx4070_memory_mib": 12282,
}


def derive_rtx3060(rtx4070: dict[str, Any]) -> dict[str, Any]:
    """The RTX 3060 (gen3 x4) preset: the published ~3.3 GB/s link, the 4070's host, compute scaled by DRAM bandwidth.

    Decode kernels stream weights and windows from device memory, so the 4070's
    calibrated bandwidths scale by 360 / 504.2 GB/s. The host (same machine in the
    reference), copy latency and memory bookkeeping follow the 4070. An estimate:
    no ordered-path table exists for this card.
    """
    d = json.loads(json.dumps(rtx4070))
    d.pop("derivation", None)
    d.pop("calibration", None)  # the 4070's residuals say nothing of this card: uncalibrated
    d["provenance"] = {"kind": "a specification estimate",
                       "all": "specification estimate built on the calibrated rtx4070-gen4x16 (see source)"}
    dev = d["devices"][0]
    scale = RTX3060["dram_GBps"] / RTX3060["rtx4070_dram_GBps"]
    dev["name"] = RTX3060["device"]
    dev["dram_GBps"] = RTX3060["dram_GBps"]
    dev["memory_total_mib"] = RTX3060["memory_mib"] - (RTX3060["rtx4070_memory_mib"] - PHYSICAL["memory_usable_mib"])
    lat = dev["links"]["h2d_pinned"]["latency_us"]
    bw = RTX3060["h2d_GBps"]
    pageable = [[mib, round(min(gbps, bw), 3)] for mib, gbps in BORROWED_PAGEABLE_POINTS]
    dev["links"] = {
        "h2d_pinned": {"latency_us": lat, "points": [[1.0, bw]]},
        "h2d_pageable": {"latency_us": lat, "points": pageable},
        "d2h_pinned": {"latency_us": lat, "points": [[1.0, bw]]},
        "d2h_pageable": {"latency_us": lat, "points": pageable},
    }
    for key in ("weight_GBps", "attn_GBps"):
        dev["compute"][key] = round(dev["compute"][key] * scale, 2)
    d["name"] = "rtx3060-gen3x4"
    d["estimate"] = True
    d["source"] = (
        "ESTIMATE. RTX 3060 12 GB on PCIe gen3 x4 (line rate 3.94 GB/s): H2D and D2H at the ~3.3 GB/s the reference "
        "measured for its deliveries; compute = the calibrated rtx4070-gen4x16 bandwidths x 360/504.2 (GDDR6 vs GDDR6X, "
        "both 192 bit); host costs, copy latency and reserved memory as the 4070 (same host); pageable link borrowed from "
        "the H200 probe, capped at the link. Regenerate: python tools/calibrate_reference.py"
    )
    return d


#: Sensitivity variants of the derived preset: what each calibration choice is worth (docs/reproduction.md).
VARIANTS = {
    "fixed-on-engine": "the whole fixed cost of a copy on the copy engine (latency f, no host issue or wake cost)",
    "fixed-on-host": "the whole fixed cost of a copy on the host (issue f/2, wake f/2, no link latency)",
    "duplex-h200": "the H200 probe's full-duplex slowdown (1.161) on the 4070's link",
    "events-x2": "twice the borrowed event cost",
    "launch-only": "the per-split host residual charged to GPU launches only (no CPU split time)",
    "engine-fifo": "copy engines strictly in arrival order across streams (copy_engine_drains_stream off)",
    "no-dram-contention": "copies do not slow the kernels they overlap (dram_GBps 0)",
    "per-sequence-attention": "the per-sequence cost of the published rows at 1-8 sequences on each attention layer "
                              "(attn_seq_us) instead of every layer",
    "per-sequence-cpu": "the per-sequence cost of the published rows at 1-8 sequences on each CPU split (cpu_row_us: host "
                        "time) instead of every layer",
}


def variant(preset: dict[str, Any], name: str) -> dict[str, Any]:
    """A copy of ``preset`` with one calibration choice changed (see VARIANTS). Raises KeyError for an unknown name."""
    d = json.loads(json.dumps(preset))
    d.pop("derivation", None)
    dev, host = d["devices"][0], d["host"]
    f = preset["derivation"]["link"]["fixed_per_copy_us"]
    links = [dev["links"][k] for k in ("h2d_pinned", "d2h_pinned")]
    if name == "fixed-on-engine":
        host["copy_issue_us"], host["host_wait_us"] = 0.0, 0.0
        for c in links:
            c["latency_us"] = f
    elif name == "fixed-on-host":
        host["copy_issue_us"], host["host_wait_us"] = f / 2, f / 2
        for c in links:
            c["latency_us"] = 0.0
    elif name == "duplex-h200":
        dev["duplex_slowdown"] = 1.161
    elif name == "events-x2":
        host["event_us"] *= 2
    elif name == "engine-fifo":
        dev["copy_engine_drains_stream"] = False
    elif name == "no-dram-contention":
        dev["dram_GBps"] = 0.0
    elif name.startswith("per-sequence-"):
        d = with_batch_terms(d, term=name.removeprefix("per-sequence-"))
        d.pop("derivation", None)
    elif name == "launch-only":
        counts = graph_counts(ORDERED_TABLE[0][0])
        host["launch_us"] += dev["compute"]["cpu_split_us"] * counts["cpu_splits"] / counts["gpu_splits"]
        dev["compute"]["cpu_split_us"] = 0.0
    else:
        raise KeyError(name)
    d["name"] = f"rtx4070-gen4x16-{name}"
    d["source"] = f"Sensitivity variant of rtx4070-gen4x16: {VARIANTS[name]}."
    return d


def ordered_check(preset: dict[str, Any]) -> list[dict[str, float]]:
    """The calibrated preset's simulated ordered rows beside the published ones (ms/token, blocking ms)."""
    hw = profile_from_dict(preset, "calibrated")
    out = []
    for ctx, tps, ms, blocked, _mb, _dev in ORDERED_TABLE:
        r = row(run_point(Point(workload_at(ctx, tokens=2), hw, TransportConfig(depth=0)), checked=False, warmup=0))
        out.append({"context": ctx, "published_tps": tps, "sim_tps": r["tokens_per_s"], "published_ms": ms,
                    "sim_ms": r["ms_per_token"], "published_blocked_h2d_ms": blocked,
                    "sim_blocked_ms": r["breakdown_ms"]["blocked_in_ordered_copies"]})
    return out


def copy_and_compute_ms(hardware: str | Path, context: int, cache: str = "q8_0") -> dict[str, float]:
    """One token's H2D copy time and GPU time under a profile, from the decode graph (no simulation).

    copy = every staged window and small input of the token through the pinned
    H2D link curve, back to back; compute = the sum of the GPU splits. The
    *unordered ceiling* a perfect overlap could reach is 1 / max(copy, compute).
    Does not block beyond the arithmetic.
    """
    hw = load_profile(str(hardware))
    dev = hw.devices[0]
    ct = cache_type(cache)
    wl = Workload(load_model(str(PHYSICAL["model"])), ct, ct, (context,), tokens=1)
    g = decode_graph(wl, dev.compute, position=context)
    link = dev.link(True, True)
    copy_s = sum(link.seconds(p.nbytes) for s in g.splits for i in s.staged for p in i.pieces)
    copy_s += sum(link.seconds(i.nbytes) for s in g.splits for i in s.ordered if i.to_device)
    compute_s = sum(s.compute_s for s in g.splits if s.kind == "gpu")
    top = max(copy_s, compute_s)
    return {"context": context, "window_rows": g.window_rows, "copy_ms": copy_s * 1e3, "compute_ms": compute_s * 1e3,
            "max_ms": top * 1e3, "ceiling_tps": 1.0 / top}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/calibrate_reference.py", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless the committed preset equals the derived one")
    ap.add_argument("--out", default=str(PRESET_PATH), help="where to write the preset (default: the committed preset)")
    ap.add_argument("--compute-source", choices=("ordered", "device"), default="ordered",
                    help="GPU time from the ordered rows (default) or from the cache-on-device times (sensitivity study)")
    ap.add_argument("--explain", action="store_true", help="print every derived number and the ordered check")
    ap.add_argument("--ceiling", metavar="CONTEXTS", help="print copy, compute and 1/max(copy, compute) per token for "
                    "these contexts under the committed preset (or --hardware), then exit")
    ap.add_argument("--hardware", default=str(PRESET_PATH), help="profile for --ceiling (default: the committed preset)")
    ap.add_argument("--cache-type", default="q8_0", help="cache type for --ceiling")
    ap.add_argument("--variant", choices=sorted(VARIANTS), help="write a sensitivity variant of the derived preset to --out")
    args = ap.parse_args(argv)
    if args.variant:
        if Path(args.out) == PRESET_PATH:
            ap.error("--variant needs --out FILE (it must not overwrite the committed preset)")
        Path(args.out).write_text(preset_json(variant(derive(), args.variant)))
        print(f"wrote {args.out}")
        return 0
    if args.ceiling:
        print("| context | window | copy ms | compute ms | max ms | 1/max t/s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for ctx in (int(c) for c in args.ceiling.split(",")):
            c = copy_and_compute_ms(args.hardware, ctx, args.cache_type)
            print(f"| {ctx:,} | {c['window_rows']:,} | {c['copy_ms']:.2f} | {c['compute_ms']:.2f} | {c['max_ms']:.2f} "
                  f"| {c['ceiling_tps']:.2f} |")
        return 0
    preset = derive(args.compute_source)
    outputs = {Path(args.out): preset_json(preset)}
    if args.compute_source == "ordered" and Path(args.out) == PRESET_PATH:
        outputs[RTX3060_PATH] = preset_json(derive_rtx3060(preset))
    code = write_or_check(outputs, "tools/calibrate_reference.py", args.check)
    if code or args.check:
        return code
    if args.explain:
        print(json.dumps(preset["derivation"], indent=1))
        for r in ordered_check(preset):
            print(f"ordered {r['context']:>6}: sim {r['sim_tps']:.2f} t/s vs published {r['published_tps']} "
                  f"({r['sim_tps'] / r['published_tps'] - 1:+.1%}); blocked {r['sim_blocked_ms']:.2f} ms "
                  f"(published H2D {r['published_blocked_h2d_ms']} + D2H {HOST_4096['d2h_rows_ms']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
