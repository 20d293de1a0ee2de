"""Plot one token of the measured GPU timeline beside the simulated one (docs/reproduction.md).

    python docs/figures/reproduction-gpu-timeline.py docs/figures/reproduction-gpu-trace-131072.json \
        docs/figures/reproduction-gpu-timeline.png

Reads a Chrome trace written by reproduction-gpu-schedule.py (context 131,072, depth 1 on an
H200), simulates the same point on the SimPy machine with the copy engine draining a stream and
without, and draws the third token's H2D engine and consumer kernels of all three.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from backends.profile import load_profile  # noqa: E402
from sim.run.point import Point  # noqa: E402
from sim.run.run import run_point  # noqa: E402
from sim.telemetry import chrome_trace  # noqa: E402
from sim.transport.scheduler import TransportConfig  # noqa: E402
from sim.workload import Workload, cache_type, load_model  # noqa: E402

CONTEXT, TOKEN = 131072, 2


def spans_of(trace: dict) -> list[tuple[str, str, float, float]]:  # type: ignore[type-arg]
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    return [(names[e["tid"]], e["name"], e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3) for e in trace["traceEvents"] if e["ph"] == "X"]


def token_window(spans: list[tuple[str, str, float, float]], token: int) -> tuple[float, float]:
    starts = sorted(s[2] for s in spans if s[0].startswith("h2d") and s[1] == "delivery0")
    return starts[token], starts[token + 1] if token + 1 < len(starts) else max(s[3] for s in spans)


def simulated(drain: bool) -> dict:  # type: ignore[type-arg]
    h200, rtx = load_profile("h200-gen5x16-kvpipe"), load_profile("rtx4070-gen4x16")
    dev = replace(h200.devices[0], compute=rtx.devices[0].compute, copy_engine_drains_stream=drain)
    q8 = cache_type("q8_0")
    point = Point(Workload(load_model("qwen3.8-27b"), q8, q8, (CONTEXT,), tokens=4), replace(h200, devices=(dev,)), TransportConfig(1, 0.0))
    return chrome_trace([("sim", run_point(point, trace=True).spans)])


def main() -> None:
    panels = [("measured on an H200 (CuPy, spin kernels)", json.load(open(sys.argv[1]))),
              ("simulated, copy engine drains a stream", simulated(True)),
              ("simulated, copy engine in arrival order", simulated(False))]
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 6.5), sharex=True)
    for ax, (title, trace) in zip(axes, panels, strict=True):
        spans = spans_of(trace)
        t0, t1 = token_window(spans, TOKEN)
        for track, name, a, b in spans:
            if a < t0 or a >= t1:
                continue
            if track.startswith("h2d"):
                y, color = 1, "#1f77b4" if name.startswith("delivery") else ("#17becf" if name == "late" else "#d62728")
            elif track.startswith("consumer") and name.startswith("gpu"):
                y, color = 0, "#2ca02c"
            else:
                continue
            ax.broken_barh([(a - t0, max(b - a, 0.05))], (y - 0.35, 0.7), facecolors=color, edgecolor="white", linewidth=0.3)
        ax.set_yticks([0, 1], ["consumer kernels", "H2D engine"])
        ax.set_title(f"{title}: {t1 - t0:.1f} ms per token", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("ms since the token's first delivery (blue: deliveries, cyan: late rows, green: kernels)")
    fig.suptitle(f"qwen3.8-27b q8_0, context {CONTEXT:,}, depth 1: H200 link, reference-card split times", fontsize=11)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
