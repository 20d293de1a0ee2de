"""The validation report as a markdown page (``report.md``): summary, per-regime errors, recovery, points, gate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from validate.report_tools import label

TARGETS = "median ≤ 3%, every point ≤ 8%"


def driver_text(version: Any) -> Any:
    """A CUDA driver version as the driver API gives it (13000) in the form nvidia-smi prints (13.0); else as is."""
    if isinstance(version, int) and not isinstance(version, bool) and version >= 1000:
        return f"{version // 1000}.{version % 1000 // 10}"
    return version


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _summary(summ: dict[str, Any], gate: dict[str, Any]) -> list[str]:
    lines = [
        f"Transport arms: median |error| {_pct(summ['median_abs_error'])}, max {_pct(summ['max_abs_error'])} over "
        f"{summ['points']} points ({TARGETS}: {'met' if summ['error_targets_met'] else 'NOT met'}); "
        f"reference arms (resident, copy-only): median {_pct(summ['reference_arms']['median_abs_error'])}, "
        f"max {_pct(summ['reference_arms']['max_abs_error'])} over {summ['reference_arms']['points']}.",
        "",
        f"Gain sign right at {summ['gain_signs_right']} of {summ['gain_signs']} pipelined points. "
        f"Repetitions' max/min t/s: at most {summ['max_spread']:.3f} (target 1.03: {'met' if summ['spread_target_met'] else 'NOT met'}). "
        f"Deliveries (idle gaps included) at {_pct(summ['delivery_share_of_peak_median'])} of peak pinned H2D "
        f"(min {_pct(summ['delivery_share_of_peak_min'])}). Exactness gate: {'PASS' if gate['ok'] else 'FAIL'}.",
        "",
        "| regime | points | median \\|error\\| | max |",
        "|---|---:|---:|---:|",
    ]
    for regime, e in summ["per_regime"].items():
        lines.append(f"| {regime} | {e['points']} | {_pct(e['median_abs_error'])} | {_pct(e['max_abs_error'])} |")
    lines.append("")
    if summ["copy_eq_compute_best_share"]:
        lines.append("Best pipelined share of the ceiling where copy ≈ compute (target 95%): " + "; ".join(
            f"{k} {_pct(v)}" for k, v in summ["copy_eq_compute_best_share"].items()) + ".")
    else:
        lines.append("No group of this grid is in the copy ≈ compute regime: the 95% ceiling target is not tested here.")
    cal = summ.get("calibration", {})
    if cal.get("windows"):
        lines += ["", "Calibration points (contexts the calibration ran each program at): " + "; ".join(
            f"{k} {', '.join(f'{w:,}' for w in ws)}" for k, ws in cal["windows"].items()) + ". "
            + ("Validation points equal to one: " + ", ".join(cal["validation_points_equal_to_calibration"]) + "."
               if cal["validation_points_equal_to_calibration"] else "No validation point equals one.")]
    if summ["ceiling_defects"]:
        lines += ["", "**Measurement defects** (share of the ceiling over 100%, left out of every result): "
                  + "; ".join(summ["ceiling_defects"]) + "."]
    return lines + [""]


def _recovery(pts: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["## Resident recovery", "",
             "Pipelined t/s (best depth) as a share of the resident arm's t/s: what the host cache recovers of "
             "keeping the cache on the device.", "",
             "| model | context | resident t/s measured / predicted | best pipelined t/s (depth) | recovered measured | predicted |",
             "|---|---:|---:|---:|---:|---:|"]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in pts:
        groups.setdefault((label(p), p["context"]), []).append(p)
    for (name, ctx), ps in groups.items():
        res = next((p for p in ps if p["arm"] == "resident"), None)
        piped = [p for p in ps if p["arm"] == "transport" and p["depth"] > 0 and not p["mutations"]]
        if res is None or not piped:
            continue
        best = max(piped, key=lambda p: p["measured_tps"])
        lines.append(f"| {name} | {ctx:,} | {res['measured_tps']:.2f} / {res['predicted_tps']:.2f} | "
                     f"{best['measured_tps']:.2f} ({best['depth']}) | {_pct(best['resident_recovery'])} | "
                     f"{_pct(best['predicted_resident_recovery'])} |")
    return lines + [""]


def _arm(p: dict[str, Any]) -> str:
    if p["arm"] == "resident":
        return "resident"
    name = f"{'copy-only ' if p['arm'] == 'copy-only' else ''}N={p['depth']}"
    return (name + (f" b={p['budget_mib']:g}" if p["budget_mib"] else "") + (f" {','.join(p['mutations'])}" if p["mutations"] else "")
            + (f" {p['schedule']}" if p.get("schedule") else ""))


def _points(pts: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["## Points", "",
             "copy/compute: the group's copy-only over resident token time. Ceiling share: measured (predicted); "
             "flagged ! over 100%. Host µs: median host time inside one GPU split's launch (traced repetition).", "",
             "| model | context | arm | measured t/s (min-max) | spread | predicted t/s | error | regime | copy/compute | "
             "ceiling share | delivery GB/s | host µs/split | hash |",
             "|---|---:|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for p in pts:
        share = (f"{_pct(p['ceiling_share'])}{' !' if p['ceiling_defect'] else ''} ({_pct(p['predicted_ceiling_share'])})"
                 if p["arm"] == "transport" else "—")
        lines.append(
            f"| {label(p)} | {p['context']:,} | {_arm(p)} | {p['measured_tps']:.2f} ({p['measured_tps_min']:.2f}-"
            f"{p['measured_tps_max']:.2f}) | {p['spread']:.3f} | {p['predicted_tps']:.2f} | {p['error']:+.1%} | {p['regime']} | "
            f"{p['copy_over_compute']:.2f} | {share} | {p['delivery_GBps']:.1f} | {p['host_split_launch_us']:.1f} | "
            f"`{p['output_hash'][:12]}` |")
    return lines + [""]


def markdown(pts: Sequence[dict[str, Any]], summ: dict[str, Any], gate: dict[str, Any], meta: dict[str, Any]) -> str:
    """The report as a markdown page."""
    lines = ["# kvpipe validate: GPU against simulation", "",
             f"Device: {meta.get('device')}; driver {driver_text(meta.get('driver_version'))}; CuPy {meta.get('cupy_version')}; "
             f"{meta.get('date')}",
             "", f"Command: `{meta.get('command')}`", ""]
    if meta.get("complete") is False:
        lines += [f"**Partial report**: written after {meta.get('repetitions_done')} of {meta.get('repetitions')} "
                  "repetitions of the last model's groups; the run had not finished.", ""]
    lines += _summary(summ, gate) + _recovery(pts) + _points(pts) + ["## Exactness", ""]
    for e in gate["groups"]:
        status = "identical" if not e["mismatches"] else f"DIFFER: {e['mismatches']}"
        res = " and resident" if e.get("resident_checked") else ""
        lines.append(f"- {label(e)} at {e['context']:,}: depths {e['depths']}{res} -> `{e['output_hash'][:16]}` {status}")
    return "\n".join(lines) + "\n"
