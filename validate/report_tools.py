"""Reading committed validation reports again: plots, runs side by side, the current model's predictions, host launches.

``python -m validate.report`` (``validate.report.main``) reaches these; none
needs a GPU. Units: tokens/s and microseconds as the reports store them.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.base import is_split_launch
from backends.profile import HardwareProfile
from sim.safe_write import write_output
from sim.transport.config import Schedule
from sim.transport.scheduler import TransportConfig


def label(p: dict[str, Any]) -> str:
    """``llama-3.1-8b q8_0 x8 split``: model, cache type and sequences of a point."""
    n = p.get("parallel", 1)
    seqs = "" if n == 1 else f" x{n} {'unified' if p.get('unified', True) else 'split'}"
    kv = f" kv-gpu-layers={p['kv_gpu_layers']}" if p.get("kv_gpu_layers") else ""
    return f"{p['model']} {p.get('cache_type', '')}".rstrip() + seqs + kv


def transport_of(p: dict[str, Any]) -> TransportConfig:
    """The arm a report point ran (reports made before arms existed: the transport arm of its depth and budget)."""
    return TransportConfig(depth=p["depth"], budget_mib=p["budget_mib"], arm=p.get("arm", "transport"),
                           mutations=frozenset(p.get("mutations") or ()), schedule=Schedule.parse(p.get("schedule", "reference")))


def calibrated_split_launch_us(profile: HardwareProfile, model: str, cache: str) -> float:
    """What the calibration measured for a split's launch (``split_launch_us``, or the older ``host_launch_us_mean``)."""
    from backends.profile import workload_entry

    found = workload_entry(profile, model, cache)
    if not found:
        return 0.0
    return float(found[1].get("split_launch_us") or found[1].get("host_launch_us_mean") or 0.0)


def host_launch_table(trace: dict[str, Any], calibration: dict[str, Any], cache: str = "q8_0") -> str:
    """Per traced arm of a GPU Chrome trace: the program's mean split launch (host) against the calibration's."""
    from backends.profile import profile_from_dict

    profile = profile_from_dict(calibration, "calibration")
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    durs: dict[int, list[float]] = {}
    for e in events:
        if e.get("ph") != "X" or threads.get((e["pid"], e["tid"])) != "host":
            continue
        # the span's kind is the event's category; a trace written before spans had kinds (no "cat") is read by name
        if is_split_launch(e["cat"], e.get("args") or {}) if "cat" in e else e["name"].startswith("launch gpu"):
            durs.setdefault(e["pid"], []).append(float(e["dur"]))
    lines = ["| traced arm | split launches | host µs per split launch | calibrated µs | ratio |", "|---|---:|---:|---:|---:|"]
    for pid, xs in sorted(durs.items(), key=lambda kv: procs.get(kv[0], "")):
        label = procs.get(pid, str(pid))
        cal = calibrated_split_launch_us(profile, label.split()[0], cache)
        mean = statistics.fmean(xs)
        lines.append(f"| {label} | {len(xs)} | {mean:.1f} | {cal:.1f} | {mean / cal:.2f} |" if cal else
                     f"| {label} | {len(xs)} | {mean:.1f} | — | — |")
    return "\n".join(lines) + "\n"


def plots(pts: Sequence[dict[str, Any]], folder: Path) -> list[Path]:
    """measured_vs_predicted.png and gain_vs_depth.png, one panel per model. Blocks on the file writes.

    One line per (context, budget, delivery schedule): the colour is the
    context, the budget 0 (uncapped) line is solid, a capped budget's is
    dotted with square markers, so a budget's decline shows as its line
    dropping to depth 0's; a schedule other than the reference is dash-dotted
    with diamonds and named, its line starting at depth 0 (no schedule).
    Gains are over depth 0 of the same context and budget.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    models = sorted({label(p) for p in pts if p.get("arm", "transport") == "transport"})
    files = []
    for kind in ("measured_vs_predicted", "gain_vs_depth"):
        ncols = min(3, len(models))
        nrows = -(-len(models) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 6.2 * nrows), squeeze=False)
        for ax in axes.flat[len(models):]:
            ax.set_visible(False)
        for ax, model in zip(axes.flat, models, strict=False):
            mp = [p for p in pts if label(p) == model and p.get("arm", "transport") == "transport"]
            for i, ctx in enumerate(sorted({p["context"] for p in mp})):
                for budget, sched in sorted({(p["budget_mib"], p.get("schedule", "")) for p in mp if p["context"] == ctx}):
                    # a delivery schedule's line starts at depth 0 (the ordered path, which has no schedule)
                    cp = sorted((p for p in mp if p["context"] == ctx and p["budget_mib"] == budget
                                 and (p.get("schedule", "") == sched or (p["depth"] == 0 and not p.get("schedule")))),
                                key=lambda p: p["depth"])
                    color, capped = f"C{i}", budget > 0
                    tag = f"{ctx:,}" + (f", {budget:g} MiB" if capped else ", uncapped") + (f", {sched}" if sched else "")
                    mstyle, pstyle = ("D-.", "d:") if sched else ("s:", "+:") if capped else ("o-", "x--")
                    d = [p["depth"] for p in cp]
                    if kind == "measured_vs_predicted":
                        m = [p["measured_tps"] for p in cp]
                        err = [[p["measured_tps"] - p["measured_tps_min"] for p in cp],
                               [p["measured_tps_max"] - p["measured_tps"] for p in cp]]
                        ax.errorbar(d, m, yerr=err, fmt=mstyle, color=color, label=f"{tag} measured", capsize=3, alpha=0.9)
                        ax.plot(d, [p["predicted_tps"] for p in cp], pstyle, color=color, label=f"{tag} predicted", alpha=0.7)
                        ax.set_ylabel("tokens/s (median of the repetitions; bars: min-max)")
                    else:
                        base_m = next((p["measured_tps"] for p in cp if p["depth"] == 0), None)
                        base_p = next((p["predicted_tps"] for p in cp if p["depth"] == 0), None)
                        if not base_m or not base_p:
                            continue
                        ax.plot(d, [100 * (p["measured_tps"] / base_m - 1) for p in cp], mstyle, color=color, label=f"{tag} measured")
                        ax.plot(d, [100 * (p["predicted_tps"] / base_p - 1) for p in cp], pstyle, color=color, label=f"{tag} predicted")
                        ax.set_ylabel("gain over depth 0 (%)")
            what = "measured vs predicted t/s" if kind == "measured_vs_predicted" else "gain vs depth"
            ax.set_title(f"{model}: {what}")
            ax.set_xlabel("look-ahead depth N")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            long = max((len(t) for t in ax.get_legend_handles_labels()[1]), default=0) > 36  # a schedule's name
            ax.legend(fontsize=7, ncol=1 if long else 2, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
        fig.tight_layout()
        path = folder / f"{kind}.png"
        buf = io.BytesIO()
        fig.savefig(buf, dpi=110)  # in savefig.format: png (the HTML report sets svg)
        plt.close(fig)
        if isinstance(path, Path):
            write_output(path, buf.getvalue())
        else:  # an in-memory file (kvpipe.html_report's folder)
            path.write(buf.getvalue())
        files.append(path)
    return files


def compare(docs: Sequence[dict[str, Any]]) -> str:
    """Markdown table of the same points measured in several reports: each run's median t/s, and the spread."""
    def key_of(p: dict[str, Any]) -> tuple[Any, ...]:
        return (label(p), p["context"], p["depth"], p["budget_mib"])

    keys = sorted({key_of(p) for d in docs for p in d["points"]})
    by = [{key_of(p): p for p in d["points"]} for d in docs]
    head = " | ".join(f"run {i + 1} measured / predicted" for i in range(len(docs)))
    lines = [f"| model | context | depth | budget MiB | {head} | measured max/min |",
             "|---|---:|---:|---:|" + "---|" * len(docs) + "---:|"]
    for k in keys:
        cells, ms = [], []
        for b in by:
            p = b.get(k)
            cells.append(f"{p['measured_tps']:.2f} / {p['predicted_tps']:.2f}" if p else "-")
            if p:
                ms.append(p["measured_tps"])
        spread = max(ms) / min(ms) if ms and min(ms) > 0 else 0.0
        lines.append(f"| {k[0]} | {k[1]:,} | {k[2]} | {k[3]:g} | " + " | ".join(cells) + f" | {spread:.2f}x |")
    return "\n".join(lines) + "\n"
