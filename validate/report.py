"""The validation report: what the GPU measured, what the simulation predicted, the ceiling, and the exactness gate.

Input: the measured groups (``validate.gpu_run.GroupResult``) and the
calibrated profile. For every arm of every group (model, cache type,
context): the measured tokens/s (median, min, max over the repetitions), the
simulation's prediction of the same arm (its whole ``TransportConfig``:
depth, budget, packing, mutations, arm) on the calibrated profile, the error,
the telemetry row of the median run beside the predicted one, the delivery
bandwidth (idle gaps included) and the output hash.

The ceiling is measured on its own (``validate.ceiling``): the group's
``resident`` and ``copy-only`` arms. Each transport arm gets its share of it
(measured and predicted), the share of the resident t/s it recovers, and the
group's regime (host-, compute-, copy-bound or copy ≈ compute); errors are
summarised per regime. A share over 100% is flagged as a measurement defect
and left out of every result. The *exactness gate* holds every run with
output (transport and resident arms) to the per-step logits hashes of the
first depth-0 run of its group.

Writes ``report.json``, ``report.md`` and two PNG plots (matplotlib Agg).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backends.base import is_split_launch
from backends.profile import HardwareProfile, for_workload
from sim.rows import placement_fields, row
from sim.run.point import Point
from sim.run.run import run_point
from sim.safe_write import write_outputs
from sim.transport.scheduler import TransportConfig
from sim.workload import Workload
from validate import ceiling, race
from validate.gpu_run import GroupResult, Run, arm_label, result_of
from validate.report_tools import calibrated_split_launch_us, compare, host_launch_table, label, plots, transport_of

__all__ = ["compare", "main", "plots", "predict_arm", "repredict", "write_report"]

TARGET_MEDIAN_ERR, TARGET_MAX_ERR, TARGET_SHARE, TARGET_SPREAD = 0.03, 0.08, 0.95, 1.03

_PREDICTED: dict[tuple[Any, ...], dict[str, Any]] = {}  # (workload, warm-up, transport, profile) -> row


def predict(group: GroupResult, transport: TransportConfig, profile: HardwareProfile) -> dict[str, Any]:
    """The simulation's row for one arm on the calibrated profile, warm-up graphs dropped. Blocks for the simulation.

    Remembered per (workload, warm-up, arm, profile), so a report rewritten
    after every repetition simulates each arm once.
    """
    key = (group.workload, group.warmup, transport, id(profile), profile.name)
    if key not in _PREDICTED:
        _PREDICTED[key] = predict_arm(group.workload, group.warmup, transport, profile)
    return dict(_PREDICTED[key])


def predict_arm(wl: Workload, warmup: int, transport: TransportConfig, profile: HardwareProfile) -> dict[str, Any]:
    """The row of ``wl``'s measured tokens (``wl.tokens``) after ``warmup`` unmeasured graphs, simulated on
    ``profile``'s entry for the workload's program. Blocks for the simulation."""
    hw = for_workload(profile, wl.model.name, wl.cache_k.name, wl.cache_v.name)
    res = run_point(Point(wl, hw, transport), checked=False, warmup=warmup)
    return row(res)


def peak_h2d(profile: HardwareProfile) -> float:
    """Peak pinned H2D bytes per second: the calibration's best plain rate, else the curve's at 16 MiB and up."""
    peak = profile.meta.get("measurements", {}).get("peak_GBps", {}).get("h2d_pinned")
    if peak:
        return float(peak) * 1e9
    link = profile.devices[0].h2d_pinned
    sizes = [n for n in link.sizes_bytes if n >= 16 << 20] or list(link.sizes_bytes)
    return max(n / link.seconds(n) for n in sizes)


def exactness(groups: Sequence[GroupResult]) -> dict[str, Any]:
    """Per group: the reference hashes (first depth-0 run) and every run with output that differs. ``ok`` is the gate."""
    out: list[dict[str, Any]] = []
    for g in groups:
        with_output = [r for r in g.runs if r.arm != "copy-only"]
        ref = next((r for r in with_output if r.depth == 0 and r.arm == "transport"), with_output[0])
        bad = []
        for r in with_output:
            if r.step_hashes != ref.step_hashes:
                first = next((i for i, (a, b) in enumerate(zip(r.step_hashes, ref.step_hashes, strict=False)) if a != b), -1)
                bad.append({"arm": arm_label(r.transport), "depth": r.depth, "budget_mib": r.budget_mib, "rep": r.rep,
                            "first_bad_step": first})
        out.append({"model": g.workload.model.name, "cache_type": g.workload.cache_k.name, "context": max(g.workload.context),
                    "parallel": g.workload.n_parallel, "unified": g.workload.unified, "output_hash": _hash(ref),
                    "tokens": ref.tokens, "depths": sorted({r.depth for r in with_output if r.arm == "transport"}),
                    "resident_checked": any(r.arm == "resident" for r in with_output), "mismatches": bad,
                    **placement_fields(g.workload)})
    return {"ok": all(not e["mismatches"] for e in out), "groups": out}


def _hash(run: Run) -> str:
    return hashlib.sha256("".join(run.step_hashes).encode()).hexdigest()


def _split_launch_us(spans: Sequence[Any]) -> float:
    """Median host microseconds inside the launch of a GPU split (host spans of kind LAUNCH of a GPU split), 0 if none."""
    xs = [s.end_s - s.start_s for s in spans if s.track == "host" and is_split_launch(s.kind, s.args)]
    return statistics.median(xs) * 1e6 if xs else 0.0


def _predicted_reference(g: GroupResult, profile: HardwareProfile) -> ceiling.Reference:
    refs = {r.arm: r.transport for r in g.runs if r.arm != "transport"}
    t = {arm: 1.0 / predict(g, tr, profile)["tokens_per_s"] * g.workload.n_parallel for arm, tr in refs.items()}
    return ceiling.Reference(t.get("resident", 0.0), t.get("copy-only", 0.0))


def points(groups: Sequence[GroupResult], profile: HardwareProfile, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per arm of every group: measured, predicted, error, ceiling share, recovery, regime, telemetry."""
    out = []
    peak = peak_h2d(profile)
    for g in groups:
        n_seq = g.workload.n_parallel  # t/s count every sequence's tokens; the ceiling is per graph
        ref_m, ref_p = ceiling.measured(g), _predicted_reference(g, profile)
        cal_split_us = calibrated_split_launch_us(profile, g.workload.model.name, g.workload.cache_k.name)
        for transport in g.arms():
            runs = g.arm(transport)
            tps = sorted(r.tokens_per_s for r in runs)
            med = statistics.median(tps)
            median_run = min(runs, key=lambda r: abs(r.tokens_per_s - med))
            spans_run = next((r for r in runs if r.spans), median_run)
            pred = predict(g, transport, profile)
            rate, dbytes = ceiling.delivery_rate(spans_run.spans)
            probes = [r.host_probe_launch_s * 1e6 for r in runs if r.host_probe_launch_s > 0]
            split_us = _split_launch_us(spans_run.spans)
            held = transport.arm == "transport"  # a reference arm is one part of the ceiling, not held to it
            share_m = med * ref_m.ceiling_s / n_seq if ref_m.ceiling_s and held else 0.0
            share_p = pred["tokens_per_s"] * ref_p.ceiling_s / n_seq if ref_p.ceiling_s and held else 0.0
            out.append({
                "model": g.workload.model.name, "cache_type": g.workload.cache_k.name, "context": max(g.workload.context),
                "parallel": n_seq, "unified": g.workload.unified, **placement_fields(g.workload),
                "arm": transport.arm, "depth": transport.depth, "budget_mib": transport.budget_mib,
                "mutations": sorted(transport.mutations), "pack_streams": transport.pack_streams,
                **({"schedule": transport.schedule.name} if transport.schedule.active else {}),
                "repetitions": len(runs), "tokens_per_run": g.workload.tokens,
                "measured_tps": med, "measured_tps_min": tps[0], "measured_tps_max": tps[-1],
                "measured_tps_all": [r.tokens_per_s for r in runs],
                "spread": tps[-1] / tps[0] if tps[0] > 0 else 0.0,
                "predicted_tps": pred["tokens_per_s"],
                "error": (pred["tokens_per_s"] - med) / med if med else 0.0,
                "resident_ms": ref_m.resident_s * 1e3, "copy_only_ms": ref_m.copy_only_s * 1e3,
                "copy_over_compute": ref_m.copy_over_compute, "regime": ref_m.regime,
                "resident_host_share": ref_m.host_share,
                "ceiling_tps": n_seq / ref_m.ceiling_s if ref_m.ceiling_s else 0.0,
                "ceiling_share": share_m, "ceiling_defect": share_m > 1.0,
                "predicted_ceiling_share": share_p,
                "resident_recovery": med * ref_m.resident_s / n_seq if ref_m.resident_s and held else 0.0,
                "predicted_resident_recovery": pred["tokens_per_s"] * ref_p.resident_s / n_seq if ref_p.resident_s and held else 0.0,
                "delivery_GBps": rate / 1e9, "delivery_share_of_peak": rate / peak if peak else 0.0,
                "delivery_bytes_traced": dbytes,
                "release_margin": race.release_margins(spans_run.spans, g.workload, transport) if transport.depth and held else {},
                "output_hash": _hash(median_run),
                "hashes_equal_across_reps": len({tuple(r.step_hashes) for r in runs}) == 1,
                "host_probe_launch_us": statistics.median(probes) if probes else 0.0,
                "host_split_launch_us": split_us,  # median host time inside one GPU split's launch (traced repetition)
                "host_split_launch_vs_calibration": split_us / cal_split_us if split_us and cal_split_us else 0.0,
                "telemetry": row(result_of(g, median_run, profile)),
                "predicted": pred,
                **meta,
            })
    return out


def _errors(pts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(p["error"]) for p in pts]
    return {"points": len(errs), "median_abs_error": statistics.median(errs) if errs else 0.0,
            "max_abs_error": max(errs) if errs else 0.0}


def gain_signs(pts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pipelined transport point's measured and predicted gain over depth 0 of its group and budget."""
    out = []
    base = {(label(p), p["context"], p["budget_mib"]): p for p in pts if p["arm"] == "transport" and p["depth"] == 0}
    for p in pts:
        b = base.get((label(p), p["context"], p["budget_mib"]))
        if p["arm"] != "transport" or p["depth"] == 0 or b is None or p["mutations"]:
            continue
        gm, gp = p["measured_tps"] / b["measured_tps"] - 1, p["predicted_tps"] / b["predicted_tps"] - 1
        out.append({"point": f"{label(p)} {p['context']:,} N={p['depth']}", "measured": gm, "predicted": gp,
                    "sign_right": (gm > 0) == (gp > 0)})
    return out


def summary(pts: Sequence[dict[str, Any]], gate: dict[str, Any]) -> dict[str, Any]:
    """Errors (pooled and per regime), gain signs, the ceiling shares where copy ≈ compute, spreads, the gate."""
    transport = [p for p in pts if p["arm"] == "transport"]
    pooled = _errors(transport)
    regimes = {r: _errors([p for p in transport if p["regime"] == r]) for r in ceiling.REGIMES}
    balanced: dict[str, float] = {}
    for p in transport:
        if p["depth"] > 0 and p["regime"] == "copy ≈ compute" and not p["ceiling_defect"] and not p["mutations"]:
            key = f"{label(p)} {p['context']:,}"
            balanced[key] = max(balanced.get(key, 0.0), p["ceiling_share"])
    signs = gain_signs(pts)
    rates = [p["delivery_share_of_peak"] for p in transport if p["depth"] > 0 and p["delivery_bytes_traced"]]
    return {
        **pooled,
        "error_targets_met": pooled["median_abs_error"] <= TARGET_MEDIAN_ERR and pooled["max_abs_error"] <= TARGET_MAX_ERR,
        "per_regime": {r: e for r, e in regimes.items() if e["points"]},
        "reference_arms": _errors([p for p in pts if p["arm"] != "transport"]),
        "gain_signs_right": sum(s["sign_right"] for s in signs), "gain_signs": len(signs),
        "copy_eq_compute_best_share": balanced,
        "ceiling_share_target_met": bool(balanced) and min(balanced.values()) >= TARGET_SHARE,
        "ceiling_defects": [f"{label(p)} {p['context']:,} {arm_label(transport_of(p))}: {p['ceiling_share']:.1%}"
                            for p in transport if p["ceiling_defect"]],
        "max_spread": max((p["spread"] for p in pts), default=0.0),
        "spread_target_met": all(p["spread"] <= TARGET_SPREAD for p in pts),
        "delivery_share_of_peak_median": statistics.median(rates) if rates else 0.0,
        "delivery_share_of_peak_min": min(rates) if rates else 0.0,
        "regimes_present": sorted({p["regime"] for p in transport if p["regime"]}),
        "exactness_gate": gate["ok"],
    }


def calibration_points(profile: HardwareProfile, pts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The points the calibration ran (model@cache -> windows) and any validation point that equals one."""
    cal = {k: list(w.get("windows", [])) for k, w in (profile.meta.get("workloads") or {}).items()}
    same = sorted({f"{p['model']}@{p['cache_type']} {p['context']:,}" for p in pts
                   if p["context"] in cal.get(f"{p['model']}@{p['cache_type']}", cal.get(p["model"], []))})
    return {"windows": cal, "validation_points_equal_to_calibration": same}


def merge(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report from several (``report.json`` objects of one calibration): their points, groups and a new summary."""
    pts = [p for d in docs for p in d["points"]]
    groups = [g for d in docs for g in d["exactness"]["groups"]]
    gate = {"ok": all(not g["mismatches"] for g in groups), "groups": groups}
    summ = summary(pts, gate)
    cal = docs[0]["summary"].get("calibration", {})
    summ["calibration"] = {"windows": cal.get("windows", {}), "validation_points_equal_to_calibration": sorted(
        {x for d in docs for x in d["summary"].get("calibration", {}).get("validation_points_equal_to_calibration", [])})}
    meta = {k: v for k, v in docs[0].items() if k not in ("summary", "exactness", "points", "command")}
    meta["command"] = " ; ".join(str(d.get("command")) for d in docs)
    meta["complete"] = all(d.get("complete", True) for d in docs)
    return {**meta, "summary": summ, "exactness": gate, "points": pts}


def write_report(folder: str | Path, groups: Sequence[GroupResult], profile: HardwareProfile, meta: dict[str, Any],
                 draw: bool = True) -> dict[str, Any]:
    """Build and write the report folder; returns the JSON object (``summary.exactness_gate`` is the gate).

    Each file is replaced whole (written aside, then renamed). ``draw=False``
    leaves the plots out (``python -m validate.report FOLDER`` draws them
    from report.json). Blocks on the predictions and the writes.
    """
    from validate.report_md import markdown

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gate = exactness(groups)
    pts = points(groups, profile, {k: meta.get(k) for k in ("device", "driver_version", "cupy_version", "date", "command")})
    summ = summary(pts, gate)
    summ["calibration"] = calibration_points(profile, pts)
    doc = {**meta, "profile": profile.name, "summary": summ, "exactness": gate, "points": pts}
    write_outputs([(folder / "report.json", json.dumps(doc, indent=1, default=str)),
                   (folder / "report.md", markdown(pts, summ, gate, meta))])
    if draw:
        plots(pts, folder)
    return doc


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
                      n_parallel=p.get("parallel", 1), unified=p.get("unified", True), kv_gpu_layers=p.get("kv_gpu_layers", 0))
        new = predict_arm(wl, int(doc.get("warmup_graphs", 1)), transport_of(p), profile)["tokens_per_s"]
        meas, old = p["measured_tps"], p["predicted_tps"]
        old_errs.append(abs(old - meas) / meas)
        new_errs.append(abs(new - meas) / meas)
        lines.append(f"| {label(p)} {p['context']:,} N={p['depth']} b={p['budget_mib']:g} | {meas:.2f} | "
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
    ap.add_argument("--merge", metavar="FOLDER", help="write one report folder from the given report.json files")
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
        if args.merge:
            from validate.report_md import markdown

            doc = merge([json.loads(Path(p).read_text()) for p in args.paths])
            folder = Path(args.merge)
            folder.mkdir(parents=True, exist_ok=True)
            write_outputs([(folder / "report.json", json.dumps(doc, indent=1, default=str)),
                           (folder / "report.md", markdown(doc["points"], doc["summary"], doc["exactness"], doc))])
            for f in plots(doc["points"], folder):
                print(f"wrote {f}")
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
