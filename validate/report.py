"""The validation report: what the GPU measured, what the simulation predicted, and the exactness gate.

Input: the measured groups (``validate.gpu_run.GroupResult``) and the
calibrated profile. For every (model, context, depth, budget) the report
holds the measured tokens/s (median, min, max over the repetitions), the
simulation's prediction for the same point on the calibrated profile, the
error, the share of the max(copy, compute) ceiling, the telemetry row of
the median run (the schema of ``sim.simulate.row``) beside the predicted one,
the bandwidth the deliveries moved at (from CUDA event spans) and the output
hash. The *exactness gate* holds every run of every depth of a context to the
per-step logits hashes of the first depth-0 run.

Ceiling: ``copy`` is one token's window bytes over the calibrated peak pinned
H2D bandwidth (the best plain rate of copies of 16 MiB and up); ``compute`` is the measured ordered token minus the time its
window copies took (their CUDA event spans and host costs) -- the reference's
"same run, cache on device" figure, measured rather than modelled.

Writes ``report.json``, ``report.md`` and two PNG plots (matplotlib Agg).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from backends.base import Span
from backends.profile import HardwareProfile, for_workload
from sim.graph import decode_graph
from sim.scheduler import TransportConfig
from sim.simulate import Point, row, simulate
from sim.telemetry import write_atomic
from sim.workload import Workload
from validate.gpu_run import GroupResult, Run, result_of

MIB = 1 << 20
TARGET_MEDIAN_ERR, TARGET_MAX_ERR, TARGET_SHARE = 0.05, 0.10, 0.90


_PREDICTED: dict[tuple[Any, ...], dict[str, Any]] = {}  # (workload, warm-up, depth, budget, profile) -> row


def predict(group: GroupResult, depth: int, budget_mib: float, profile: HardwareProfile) -> dict[str, Any]:
    """The simulation's row for one arm on the calibrated profile, warm-up graphs dropped. Blocks for the simulation.

    Remembered per (workload, warm-up, arm, profile), so a report rewritten
    after every repetition simulates each arm once.
    """
    key = (group.workload, group.warmup, depth, budget_mib, id(profile), profile.name)
    if key not in _PREDICTED:
        _PREDICTED[key] = predict_arm(group.workload, group.warmup, depth, budget_mib, profile)
    return dict(_PREDICTED[key])


def predict_arm(wl: Workload, warmup: int, depth: int, budget_mib: float, profile: HardwareProfile) -> dict[str, Any]:
    """The row of ``wl``'s measured tokens (``wl.tokens``) after ``warmup`` unmeasured graphs, simulated on
    ``profile``'s entry for the workload's program. Blocks for the simulation."""
    hw = for_workload(profile, wl.model.name, wl.cache_k.name)
    res = simulate(Point(replace(wl, tokens=wl.tokens + warmup), hw, TransportConfig(depth=depth, budget_mib=budget_mib)))
    res.graphs = res.graphs[warmup:]
    return row(res)


def _window_copy_s(spans: Sequence[Span], graphs: int) -> float:
    """Seconds per graph the consumer stream spent in ordered window copies (event spans)."""
    t = sum(s.end_s - s.start_s for s in spans if s.track.startswith("consumer") and s.name.startswith("cache_"))
    return t / graphs if graphs else 0.0


def peak_h2d(profile: HardwareProfile) -> float:
    """Peak pinned H2D bytes per second: the calibration's best plain rate, else the curve's at 16 MiB and up."""
    peak = profile.meta.get("measurements", {}).get("peak_GBps", {}).get("h2d_pinned")
    if peak:
        return float(peak) * 1e9
    link = profile.devices[0].h2d_pinned
    sizes = [n for n in link.sizes_bytes if n >= 16 * MIB] or list(link.sizes_bytes)
    return max(n / link.seconds(n) for n in sizes)


def delivery_rate(spans: Sequence[Span]) -> tuple[float, float]:
    """(bytes per second, bytes) of the early deliveries on the H2D engine track."""
    ds = [s for s in spans if s.track.startswith("h2d") and s.name.startswith("delivery")]
    nbytes = sum(s.args.get("bytes", 0) for s in ds)
    secs = sum(s.end_s - s.start_s for s in ds)
    return (nbytes / secs if secs > 0 else 0.0), float(nbytes)


def ceiling(group: GroupResult, profile: HardwareProfile) -> dict[str, float]:
    """Per-token copy and compute seconds, and the max of the two (see the module text)."""
    wl = group.workload
    hw = for_workload(profile, wl.model.name, wl.cache_k.name)
    dev = hw.devices[0]
    g = decode_graph(wl, dev.compute, position=max(wl.context) + group.warmup)
    window_bytes = sum(i.nbytes for s in g.splits for i in s.staged)
    copy_s = window_bytes / peak_h2d(hw)
    ordered = group.arm(0, group.runs[0].budget_mib) or [r for r in group.runs if r.depth == 0]
    if ordered:
        total = statistics.median(statistics.fmean(s.total_s for s in r.stats) for r in ordered)
        with_spans = [r for r in ordered if r.spans]
        n_copies = sum(len(s.staged) for s in g.splits)
        per_copy = hw.host.copy_issue_s + hw.host.host_wait_s
        copies = _window_copy_s(with_spans[0].spans, wl.tokens + group.warmup) if with_spans else copy_s
        compute_s = max(total - copies - n_copies * per_copy, 0.0)
    else:
        compute_s = sum(s.compute_s for s in g.splits)
    return {"copy_ms": copy_s * 1e3, "compute_ms": compute_s * 1e3, "ceiling_ms": max(copy_s, compute_s) * 1e3}


def exactness(groups: Sequence[GroupResult]) -> dict[str, Any]:
    """Per group: the reference hashes (first depth-0 run) and every run that differs. ``ok`` is the gate."""
    out: list[dict[str, Any]] = []
    for g in groups:
        ref = next((r for r in g.runs if r.depth == 0), g.runs[0])
        bad = []
        for r in g.runs:
            if r.step_hashes != ref.step_hashes:
                first = next((i for i, (a, b) in enumerate(zip(r.step_hashes, ref.step_hashes, strict=False)) if a != b), -1)
                bad.append({"depth": r.depth, "budget_mib": r.budget_mib, "rep": r.rep, "first_bad_step": first})
        out.append({"model": g.workload.model.name, "cache_type": g.workload.cache_k.name, "context": max(g.workload.context),
                    "parallel": g.workload.n_parallel,
                    "unified": g.workload.unified, "output_hash": _hash(ref),
                    "tokens": ref.tokens, "depths": sorted({r.depth for r in g.runs}), "mismatches": bad})
    return {"ok": all(not e["mismatches"] for e in out), "groups": out}


def _hash(run: Run) -> str:
    import hashlib

    return hashlib.sha256("".join(run.step_hashes).encode()).hexdigest()


def points(groups: Sequence[GroupResult], profile: HardwareProfile, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (model, context, depth, budget): measured, predicted, error, ceiling share, telemetry."""
    out = []
    peak = peak_h2d(profile)
    cal_launch_us = profile.meta.get("measurements", {}).get("host_costs_us", {}).get("launch_s", 0.0)
    for g in groups:
        ceil = ceiling(g, profile)
        arms = sorted({(r.depth, r.budget_mib) for r in g.runs})
        n_seq = g.workload.n_parallel  # t/s count every sequence's tokens; the ceiling is per graph
        for depth, budget in arms:
            runs = g.arm(depth, budget)
            tps = sorted(r.tokens_per_s for r in runs)
            med = statistics.median(tps)
            median_run = min(runs, key=lambda r: abs(r.tokens_per_s - med))
            spans_run = next((r for r in runs if r.spans), median_run)
            measured_row = row(result_of(g, median_run, profile))
            pred = predict(g, depth, budget, profile)
            rate, dbytes = delivery_rate(spans_run.spans)
            probes = [r.host_probe_launch_s * 1e6 for r in runs if r.host_probe_launch_s > 0]
            split_us = split_launch_us(spans_run.spans)
            cal_split_us = calibrated_split_launch_us(profile, g.workload.model.name, g.workload.cache_k.name)
            probe_us = statistics.median(probes) if probes else 0.0
            out.append({
                "model": g.workload.model.name,
                "cache_type": g.workload.cache_k.name,
                "context": max(g.workload.context),
                "parallel": g.workload.n_parallel,
                "unified": g.workload.unified,
                "depth": depth,
                "budget_mib": budget,
                "repetitions": len(runs),
                "tokens_per_run": g.workload.tokens,
                "measured_tps": med,
                "measured_tps_min": tps[0],
                "measured_tps_max": tps[-1],
                "measured_tps_all": [r.tokens_per_s for r in runs],
                "predicted_tps": pred["tokens_per_s"],
                "error": (pred["tokens_per_s"] - med) / med if med else 0.0,
                "copy_ms": ceil["copy_ms"],
                "compute_ms": ceil["compute_ms"],
                "ceiling_tps": n_seq * 1e3 / ceil["ceiling_ms"] if ceil["ceiling_ms"] else 0.0,
                "ceiling_share": med * ceil["ceiling_ms"] / 1e3 / n_seq,
                "delivery_GBps": rate / 1e9,
                "delivery_share_of_peak": rate / peak if peak else 0.0,
                "delivery_bytes_traced": dbytes,
                "output_hash": _hash(median_run),
                "hashes_equal_across_reps": len({tuple(r.step_hashes) for r in runs}) == 1,
                "host_probe_launch_us": probe_us,  # the launch micro-cost measured before each repetition (median)
                "host_probe_vs_calibration": probe_us / cal_launch_us if probe_us and cal_launch_us else 0.0,
                "host_split_launch_us": split_us,  # the program's own launch of a GPU split, host time (traced repetition)
                "host_split_launch_vs_calibration": split_us / cal_split_us if split_us and cal_split_us else 0.0,
                "telemetry": measured_row,
                "predicted": pred,
                **meta,
            })
    return out


def summary(pts: Sequence[dict[str, Any]], gate: dict[str, Any]) -> dict[str, Any]:
    """Median and max |error|, the ceiling share where copy ~ compute, the delivery bandwidth share."""
    errs = [abs(p["error"]) for p in pts]
    piped = [p for p in pts if p["depth"] > 0]
    best: dict[str, dict[str, Any]] = {}
    for p in piped:
        bal = abs(p["copy_ms"] - p["compute_ms"]) / max(p["copy_ms"], p["compute_ms"], 1e-9)
        name = _label(p)
        cur = best.get(name)
        if cur is None or bal < cur["balance"] or (bal == cur["balance"] and p["ceiling_share"] > cur["ceiling_share"]):
            best[name] = {"context": p["context"], "depth": p["depth"], "balance": bal, "ceiling_share": p["ceiling_share"]}
    rates = [p["delivery_share_of_peak"] for p in piped if p["delivery_bytes_traced"]]
    med_err = statistics.median(errs) if errs else 0.0
    max_err = max(errs) if errs else 0.0
    return {
        "points": len(pts),
        "median_abs_error": med_err,
        "max_abs_error": max_err,
        "error_targets_met": med_err <= TARGET_MEDIAN_ERR and max_err <= TARGET_MAX_ERR,
        "copy_eq_compute": best,
        "ceiling_share_target_met": all(b["ceiling_share"] >= TARGET_SHARE for b in best.values()) if best else False,
        "delivery_share_of_peak_median": statistics.median(rates) if rates else 0.0,
        "delivery_share_of_peak_min": min(rates) if rates else 0.0,
        "exactness_gate": gate["ok"],
    }


def _label(p: dict[str, Any]) -> str:
    """``llama-3.1-8b q8_0 x8 split``: model, cache type and sequences of a point."""
    return f"{p['model']} {p.get('cache_type', '')}".rstrip() + _seqs(p)


def _seqs(p: dict[str, Any]) -> str:
    """`` x8 split`` for a point of several sequences (absent in reports made before sequences existed)."""
    n = p.get("parallel", 1)
    return "" if n == 1 else f" x{n} {'unified' if p.get('unified', True) else 'split'}"


def markdown(pts: Sequence[dict[str, Any]], summ: dict[str, Any], gate: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report as a markdown page: header, summary, one table row per point, the gate."""
    lines = [
        "# kvpipe validate: GPU against simulation",
        "",
        f"Device: {meta.get('device')}; driver {meta.get('driver_version')}; CuPy {meta.get('cupy_version')}; {meta.get('date')}",
        "",
        f"Command: `{meta.get('command')}`",
        "",
    ]
    if meta.get("complete") is False:
        lines += [f"**Partial report**: written after {meta.get('repetitions_done')} of {meta.get('repetitions')} "
                  "repetitions of the last model's groups; the run had not finished.", ""]
    lines += [
        f"Median |error| {summ['median_abs_error']:.1%}, max {summ['max_abs_error']:.1%} "
        f"(targets 5% / 10%: {'met' if summ['error_targets_met'] else 'NOT met'}); "
        f"deliveries at {summ['delivery_share_of_peak_median']:.1%} of peak pinned H2D (min {summ['delivery_share_of_peak_min']:.1%}); "
        f"exactness gate: {'PASS' if gate['ok'] else 'FAIL'}.",
        "",
    ]
    for model, b in summ["copy_eq_compute"].items():
        lines.append(f"- {model}: copy ~ compute at context {b['context']:,} (depth {b['depth']}): "
                     f"{b['ceiling_share']:.1%} of the max(copy, compute) ceiling")
    lines += ["", "Host launch: the program's host time to launch a GPU split (traced repetition) over the calibration's "
              "(1.00 = the host as fast as when calibrated; above 1 slower; — = not traced).",
              "", "| model | context | depth | budget MiB | measured t/s (min-max) | predicted t/s | error | ceiling share | "
              "ring MiB | early / late / ordered MiB | delivery GB/s | host launch | hash |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for p in pts:
        t = p["telemetry"]
        lines.append(
            f"| {_label(p)} | {p['context']:,} | {p['depth']} | {p['budget_mib']:g} | {p['measured_tps']:.2f} "
            f"({p['measured_tps_min']:.2f}-{p['measured_tps_max']:.2f}) | {p['predicted_tps']:.2f} | {p['error']:+.1%} | "
            f"{p['ceiling_share']:.1%} | {t['ring_mib']:.1f} | {t['early_mib']:.1f} / {t['late_mib']:.2f} / {t['ordered_mib']:.2f} | "
            f"{p['delivery_GBps']:.1f} | {_probe(p)} | `{p['output_hash'][:12]}` |"
        )
    lines += ["", "## Exactness", ""]
    for e in gate["groups"]:
        status = "identical" if not e["mismatches"] else f"DIFFER: {e['mismatches']}"
        lines.append(f"- {_label(e)} at {e['context']:,}: depths {e['depths']} -> `{e['output_hash'][:16]}` {status}")
    return "\n".join(lines) + "\n"


def _probe(p: dict[str, Any]) -> str:
    r = p.get("host_split_launch_vs_calibration", 0.0)
    return f"{r:.2f}" if r else "—"


def split_launch_us(spans: Sequence[Span]) -> float:
    """Mean host microseconds inside the launch of a GPU split (host spans ``launch gpu...``), 0 if none."""
    xs = [s.end_s - s.start_s for s in spans if s.track == "host" and s.name.startswith("launch gpu")]
    return statistics.fmean(xs) * 1e6 if xs else 0.0


def calibrated_split_launch_us(profile: HardwareProfile, model: str, cache: str) -> float:
    """What the calibration measured for the same launches (``split_launch_us``, or the older ``host_launch_us_mean``)."""
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
        if e.get("ph") == "X" and threads.get((e["pid"], e["tid"])) == "host" and e["name"].startswith("launch gpu"):
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

    One line per (context, budget): the colour is the context, the budget
    0 (uncapped) line is solid, a capped budget's is dotted with square
    markers, so a budget's decline shows as its line dropping to depth 0's.
    Gains are over depth 0 of the same context and budget.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    models = sorted({_label(p) for p in pts})
    files = []
    for kind in ("measured_vs_predicted", "gain_vs_depth"):
        fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 6.2), squeeze=False)
        for ax, model in zip(axes[0], models, strict=True):
            mp = [p for p in pts if _label(p) == model]
            for i, ctx in enumerate(sorted({p["context"] for p in mp})):
                for budget in sorted({p["budget_mib"] for p in mp if p["context"] == ctx}):
                    cp = sorted((p for p in mp if p["context"] == ctx and p["budget_mib"] == budget), key=lambda p: p["depth"])
                    color, capped = f"C{i}", budget > 0
                    tag = f"{ctx:,}" + (f", {budget:g} MiB" if capped else ", uncapped")
                    mstyle, pstyle = ("s:", "+:") if capped else ("o-", "x--")
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
            ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)  # under the axes
        fig.tight_layout()
        path = folder / f"{kind}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def compare(docs: Sequence[dict[str, Any]]) -> str:
    """Markdown table of the same points measured in several reports: each run's median t/s, and the spread."""
    def key_of(p: dict[str, Any]) -> tuple[Any, ...]:
        return (_label(p), p["context"], p["depth"], p["budget_mib"])

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


def repredict(doc: dict[str, Any], calibration: dict[str, Any]) -> str:
    """A markdown table: each point's measured t/s, the prediction stored with it, and the current simulator's.

    The calibration's host costs are fitted again by the current simulator
    from what the calibration stored (``validate.calibrate.refit``); nothing
    of the report's measurements goes into the fit. Blocks for the simulations.
    """
    from backends.profile import profile_from_dict
    from sim.workload import cache_type, load_model
    from validate.calibrate import refit

    names = {p["model"] for p in doc["points"]} | {k.split("@")[0] for k in calibration.get("workloads", {})}
    profile = profile_from_dict(refit(calibration, {n: load_model(n) for n in names}), "calibration")
    lines = ["| point | measured t/s | stored prediction (error) | current prediction (error) |", "|---|---:|---:|---:|"]
    old_errs, new_errs = [], []
    for p in doc["points"]:
        ct = cache_type(p.get("cache_type", "q8_0"))
        wl = Workload(load_model(p["model"]), ct, ct, (p["context"],), tokens=p["tokens_per_run"],
                      n_parallel=p.get("parallel", 1), unified=p.get("unified", True))
        new = predict_arm(wl, int(doc.get("warmup_graphs", 1)), p["depth"], p["budget_mib"], profile)["tokens_per_s"]
        meas, old = p["measured_tps"], p["predicted_tps"]
        old_errs.append(abs(old - meas) / meas)
        new_errs.append(abs(new - meas) / meas)
        lines.append(f"| {_label(p)} {p['context']:,} N={p['depth']} b={p['budget_mib']:g} | {meas:.2f} | "
                     f"{old:.2f} ({(old - meas) / meas:+.1%}) | {new:.2f} ({(new - meas) / meas:+.1%}) |")
    lines.append(rf"| median \|error\| | | {statistics.median(old_errs):.1%} | {statistics.median(new_errs):.1%} |")
    lines.append(rf"| max \|error\| | | {max(old_errs):.1%} | {max(new_errs):.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m validate.report FOLDER`` redraws a report's plots from its report.json;
    ``--compare A.json B.json ...`` prints the same points across several reports;
    ``--repredict CALIBRATED.json REPORT.json`` holds a report's measurements to the current simulator;
    ``--host-launch CALIBRATED.json TRACE.json.gz`` compares a GPU trace's split launches with the calibration's.
    Blocks on the files (and the simulations)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m validate.report", description=main.__doc__)
    ap.add_argument("paths", nargs="+", help="a report folder (redraw its plots), or report.json files with --compare")
    ap.add_argument("--compare", action="store_true", help="print a table of the same points across the given report.json files")
    ap.add_argument("--repredict", metavar="CALIBRATED_JSON",
                    help="the calibration the report was predicted from: print measured, stored and current predictions")
    ap.add_argument("--host-launch", metavar="CALIBRATED_JSON",
                    help="with GPU trace files (.json or .json.gz): each traced arm's host time per split launch against the calibration's")
    args = ap.parse_args(argv)
    try:
        if args.host_launch:
            import gzip

            cal = json.loads(Path(args.host_launch).read_text())
            for path in args.paths:
                raw = Path(path).read_bytes()
                doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
                print(host_launch_table(doc, cal), end="")
            return 0
        if args.repredict:
            cal = json.loads(Path(args.repredict).read_text())
            for path in args.paths:
                print(repredict(json.loads(Path(path).read_text()), cal), end="")
            return 0
        if args.compare:
            print(compare([json.loads(Path(p).read_text()) for p in args.paths]), end="")
            return 0
        for folder in map(Path, args.paths):
            for f in plots(json.loads((folder / "report.json").read_text())["points"], folder):
                print(f"wrote {f}")
    except (OSError, ValueError, KeyError) as exc:
        print(f"python -m validate.report: cannot read a report ({exc}); give report folders, or report.json files with --compare",
              file=sys.stderr)
        return 2
    return 0


def write_report(folder: str | Path, groups: Sequence[GroupResult], profile: HardwareProfile, meta: dict[str, Any],
                 draw: bool = True) -> dict[str, Any]:
    """Build and write the report folder; returns the JSON object (``summary.exactness_gate`` is the gate).

    Each file is replaced whole (written aside, then renamed). ``draw=False``
    leaves the plots out (``python -m validate.report FOLDER`` draws them
    from report.json). Blocks on the predictions and the writes.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gate = exactness(groups)
    pts = points(groups, profile, {k: meta.get(k) for k in ("device", "driver_version", "cupy_version", "date", "command")})
    summ = summary(pts, gate)
    doc = {**meta, "profile": profile.name, "summary": summ, "exactness": gate, "points": pts}
    write_atomic(folder / "report.json", json.dumps(doc, indent=1, default=str))
    write_atomic(folder / "report.md", markdown(pts, summ, gate, meta))
    if draw:
        plots(pts, folder)
    return doc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
