"""Run 8 (issue 30): hold the committed blind predictions (``prediction-types8/blind.json``) to the held-out files, as
``python tools/llamacpp/predict.py --set types8 --gguf GGUF`` calls it after ``--blind``. Nothing is refitted: every
figure predicted is blind.json's. A configuration's measurement is the median of its two processes (each the median of
its 5 samples); the candidates the rule did not choose are reported beside the chosen one, as after the fact.
Not installed with the package."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import predict_types as pt
import predict_types5 as p5
import predict_types8 as p8
import staging_rule as sr


def _summary(errs: list[float]) -> dict[str, Any]:
    med, top = statistics.median(abs(e) for e in errs), max(errs, key=abs)
    return {"runs": len(errs), "median_abs_error": med, "max_error": top, "met": med <= 0.05 and abs(top) <= 0.10}


def compare(out: Path, gguf: str) -> int:
    """Write prediction.json and prediction.md from blind.json and the held-out files; 0. Reads files only."""
    blind = json.loads((out / "blind.json").read_text())
    chosen = blind["staging_rule"]["chosen"]
    pred = {(r["cache"], r["nkvo"], r["depth"]): r for r in blind["rows"]}
    rows, procs = [], []
    for n, k, v, d, role in p8.ORDERED:
        if role != "held":
            continue
        recs = [p8._record(p8._name(n, d, "held", p)) for p in p8.PROCS]
        tps = [r["n_gen"] / (r["avg_ns"] * 1e-9) for r in recs]
        meas = statistics.median(tps)
        b = pred[(p8._cache(k, v), 1, d)]
        row = {k2: b[k2] for k2 in ("cache", "nkvo", "depth", "entry", "band", "staging")}
        row |= {"role": "held out", "file": [f"{p8._folder(p8._name(n, d, 'held', p)).relative_to(pt.RESULTS)}/{p8._name(n, d, 'held', p)}"
                                             for p in p8.PROCS],
                "measured_tps": meas, "processes_tps": tps, "stddev_tps": statistics.pstdev(tps),
                "samples_tps": [r["samples_ts"] for r in recs], "predicted_tps": b["predicted_tps"],
                "error": b["predicted_tps"] / meas - 1,
                "candidates": {c: b["candidates"][c]["predicted_tps"] / meas - 1 for c in sr.CANDIDATES}}
        rows.append(row)
        for p, t, bp in zip(p8.PROCS, tps, b["candidates"][chosen]["processes"], strict=True):
            procs.append({"cache": row["cache"], "depth": d, "process": p, "t_h": bp["t_h"], "measured_tps": t,
                          "predicted_tps": bp["predicted_tps"], "error": bp["predicted_tps"] / t - 1})
    for n, k, v, _ds, _cal in p8.RESIDENT:
        name = f"r8-res-{n}-held.json"
        for r in p5.records(p8._folder(name), (name,)):
            b = pred[(p8._cache(k, v), 0, r["n_depth"])]
            t = r["n_gen"] / (r["avg_ns"] * 1e-9)
            rows.append({k2: b[k2] for k2 in ("cache", "nkvo", "depth", "entry", "band")} |
                        {"role": "held out", "file": f"{p8._folder(name).relative_to(pt.RESULTS)}/{name}", "measured_tps": t,
                         "stddev_tps": r["stddev_ts"], "samples_tps": r["samples_ts"], "predicted_tps": b["predicted_tps"],
                         "error": b["predicted_tps"] / t - 1})
    cal_files = [f"{p8._folder(x).relative_to(pt.RESULTS)}/{x}" for n, _, _, d, role in p8.ORDERED if role == "cal"
                 for x in (p8._name(n, d, "cal", p) for p in p8.PROCS)]
    cal_files += [f"{p8._folder(f'r8-res-{n}-cal.json').relative_to(pt.RESULTS)}/r8-res-{n}-cal.json" for n, *_ in p8.RESIDENT]
    pt.write_report(out, "types8", gguf, blind["fit_command"], "(the blind run's profile, not refitted)", cal_files,
                    "a configuration: the median of its processes, each the median of its 5 samples", ([], rows, []),
                    "run 8", "none")
    ordered = [r for r in rows if r["nkvo"] == 1]
    cand = {c: {name: _summary([r["candidates"][c] for r in ordered if name in ("every ordered configuration", r["cache"])])
                for name in [*dict.fromkeys(r["cache"] for r in ordered), "every ordered configuration"]}
            for c in sr.CANDIDATES}
    per_proc = {name: _summary([p["error"] for p in procs if name in ("every ordered process", p["cache"])])
                for name in [*dict.fromkeys(p["cache"] for p in procs), "every ordered process"]}
    report = json.loads((out / "prediction.json").read_text())
    report |= {"staging_rule": blind["staging_rule"], "candidates_held_out": cand, "processes": procs,
               "summary_per_process": per_proc}
    (out / "prediction.json").write_text(json.dumps(report, indent=1) + "\n")
    md = (out / "prediction.md").read_text().splitlines()
    md += ["", f"Staging rule (chosen before any held-out file was read): **{chosen}**; leave-one-out rms over the 8 "
           "calibration configurations: " + ", ".join(f"{c} {r:.1%}" for c, r in blind["staging_rule"]["loo_rms"].items()) + ".",
           "", "| ordered held out, by candidate | " + " | ".join(
               f"{c}{' (chosen)' if c == chosen else ' (after the fact)'}" for c in sr.CANDIDATES) + " |",
           "|---|" + "---|" * len(sr.CANDIDATES)]
    for name in cand[chosen]:
        md.append(f"| {name} | " + " | ".join(f"{cand[c][name]['median_abs_error']:.1%} / {cand[c][name]['max_error']:+.1%}"
                                              for c in sr.CANDIDATES) + " |")
    md += ["", "| process (chosen staging) | start, h | measured t/s | predicted t/s | error |", "|---|---:|---:|---:|---:|"]
    md += [f"| {p['cache']} -d {p['depth']:,} {p['process']} | {p['t_h']:.3f} | {p['measured_tps']:.2f} | {p['predicted_tps']:.2f} | "
           f"{p['error']:+.1%} |" for p in procs]
    md += pt.summary_table("held out per process (run 8)", per_proc)
    (out / "prediction.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[-40:]))
    return 0
