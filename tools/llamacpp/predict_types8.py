"""Issue 30, run 8: every cache type on the H200, the types interleaved in time, two processes per ordered configuration,
the staging rate chosen by run 8's rule (tools/llamacpp/staging_rule.py; the design: tools/llamacpp/README-run8.md).

``python tools/llamacpp/predict.py --set types8 --gguf GGUF [--blind]`` (this module does the work):

* **calibration**: the 16 ``r8-ord-*-cal-p{1,2}.json`` processes (8 ordered configurations; a configuration's record is
  the median of its processes' medians) and ``r8-res-*-cal.json`` (the resident processes' calibration rows). The
  profile is ``kvpipe calibrate --from-llama-bench --pageable`` on them; then each ordered calibration process's implied
  staging rate and start (``starts.txt``) choose the staging candidate by leave-one-configuration-out.
* **held out**: the 8 ordered configurations' ``r8-ord-*-held-p{1,2}.json`` and ``r8-res-*-held.json``; ``--blind``
  predicts them from the design (``run8.sh``) and the processes' starts, without opening a held-out file.

Files sit in ``run8/call1`` or ``run8/call2``. Not installed with the package: run it from a checkout.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import predict_types as pt  # beside this file (the script's folder is on sys.path)
import predict_types5 as p5
import predict_types7 as p7
import staging_rule as sr

RESULTS = pt.RESULTS
RUN = RESULTS / "run8"
CALLS = (RUN / "call1", RUN / "call2")
SCRIPT = Path(__file__).with_name("run8.sh")
ORDERED = p7._ordered(SCRIPT)  # (name, K, V, depth, role)
RESIDENT = p7._resident(SCRIPT)  # (name, K, V, depths, calibration depths)
PROCS = ("p1", "p2")


def _name(n: str, d: int, role: str, p: str) -> str:
    return f"r8-ord-{n}-d{d}-{role}-{p}.json"


def _folder(name: str) -> Path:
    return p7._folder(name, CALLS)


def starts() -> dict[str, float]:
    """Each process's start, hours since the campaign's first process (every call's ``starts.txt``). Reads files only."""
    raw = {}
    for f in CALLS:
        if (f / "starts.txt").exists():
            for line in (f / "starts.txt").read_text().splitlines():
                name, t = line.split()
                raw[name] = float(t)
    t0 = min(raw.values())
    return {k: (v - t0) / 3600.0 for k, v in raw.items()}


def _record(name: str) -> dict[str, Any]:
    recs = p5.records(_folder(name), (name,))
    if len(recs) != 1:
        raise SystemExit(f"predict_types8: {_folder(name) / name}: {len(recs)} decode records; expected 1")
    return recs[0]


def config_record(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """One record for a configuration's processes: avg_ns the median of theirs (each already the median of its samples),
    avg_ts from it, the samples pooled. Pure."""
    ns = statistics.median(r["avg_ns"] for r in recs)
    return dict(recs[0], avg_ns=int(ns), avg_ts=recs[0]["n_gen"] / (ns * 1e-9),
                samples_ns=[s for r in recs for s in r["samples_ns"]], samples_ts=[s for r in recs for s in r["samples_ts"]])


def calibration_records() -> list[dict[str, Any]]:
    """The fit's records: one per ordered calibration configuration, then the resident calibration rows. Reads files."""
    out = [config_record([_record(_name(n, d, "cal", p)) for p in PROCS]) for n, _, _, d, role in ORDERED if role == "cal"]
    return out + [r for n, *_ in RESIDENT for r in p5.records(_folder(f"r8-res-{n}-cal.json"), (f"r8-res-{n}-cal.json",))]


def _cache(k: str, v: str) -> str:
    return k if k == v else f"{k}/{v}"


def processes(profile: dict[str, Any], gguf: str, role: str, when: dict[str, float]) -> list[tuple[sr.Process, str, str, int]]:
    """The ordered processes of ``role``: (Process, K, V, depth). Calibration ones are read and carry their implied rate;
    held-out ones are NOT read (measured 0): the design and their starts only. Blocks (calibration: golden searches)."""
    out = []
    for n, k, v, d, r in ORDERED:
        if r != role:
            continue
        for p in PROCS:
            name = _name(n, d, role, p)
            meas, g = 0.0, 0.0
            if role == "cal":
                rec = _record(name)
                meas = rec["n_gen"] / (rec["avg_ns"] * 1e-9)
                g = p5.implied_GBps(profile, gguf, k, v, d, meas)
            out.append((sr.Process(f"{_cache(k, v)}@{d}", _cache(k, v), when[name[:-5]], meas, g), k, v, d))
    return out


def _tps_at(profile: dict[str, Any], gguf: str, table: dict[str, tuple[str, str, int]]) -> Any:
    memo: dict[tuple[str, float], float] = {}

    def tps_at(p: sr.Process, g: float) -> float:
        key = (p.config, round(g, 9))
        if key not in memo:
            k, v, d = table[p.config]
            memo[key] = pt.predict(p5._flat(profile, g), gguf, k, v, 1, d)["predicted_tps"]
        return memo[key]

    return tps_at


def rule(profile: dict[str, Any], gguf: str) -> dict[str, Any]:
    """The staging rule on the calibration processes: implied rates, leave-one-out per candidate, the choice, and each
    candidate fitted to all of them. Blocks (simulations: about a minute)."""
    when = starts()
    cal = processes(profile, gguf, "cal", when)
    procs = [c[0] for c in cal]
    tps_at = _tps_at(profile, gguf, {c[0].config: c[1:] for c in cal})
    loo = sr.leave_one_out(procs, tps_at)
    score = sr.scores(loo)
    chosen = sr.choose(score)
    return {"chosen": chosen, "scores_mse": score, "loo_rms": {c: s ** 0.5 for c, s in score.items()}, "loo_errors": loo,
            "calibration_processes": [vars(p) for p in procs], "when": when, "procs": procs}


def blind_rows(profile: dict[str, Any], gguf: str, found: dict[str, Any]) -> list[dict[str, Any]]:
    """The held-out predictions: each ordered configuration under every candidate (fitted to all calibration processes;
    ``predicted_tps`` the chosen one's), each resident run by the profile. Reads no held-out file. Blocks."""
    held = processes(profile, gguf, "held", found["when"])
    tps_at = _tps_at(profile, gguf, {h[0].config: h[1:] for h in held})
    rates = {c: sr.fit(c, found["procs"]) for c in sr.CANDIDATES}
    rows = []
    for cfg, mine in sr.by_config([h[0] for h in held]).items():
        k, v, d = next(h[1:] for h in held if h[0].config == cfg)
        base = pt.predict(profile, gguf, k, v, 1, d)
        per = {c: {"predicted_tps": statistics.fmean(tps_at(p, rates[c](p)) for p in mine),
                   "processes": [{"t_h": p.t_h, "GBps": rates[c](p), "predicted_tps": tps_at(p, rates[c](p))} for p in mine]}
               for c in sr.CANDIDATES}
        rows.append(base | {"role": "held out", "predicted_tps": per[found["chosen"]]["predicted_tps"],
                            "band": found["loo_rms"][found["chosen"]], "staging": found["chosen"], "candidates": per})
    for _n, k, v, ds, cal in RESIDENT:
        rows += [pt.predict(profile, gguf, k, v, 0, d) | {"role": "held out"} for d in ds if d not in cal]
    return rows


def run(gguf: str, hardware: str, out: Path, blind: bool) -> int:
    """``blind``: fit, choose the staging, write blind.json. Otherwise compare the committed blind predictions with the
    held-out files (prediction.json, prediction.md). Blocks (minutes)."""
    out.mkdir(parents=True, exist_ok=True)
    if blind:
        profile, cmd, log = pt.fit(gguf, hardware, out, calibration_records())
        found = rule(profile, gguf)
        rows = blind_rows(profile, gguf, found)
        keep = {k: v for k, v in found.items() if k not in ("procs", "when")}
        (out / "blind.json").write_text(json.dumps({"command": f"python tools/llamacpp/predict.py --set types8 --blind --gguf {gguf}",
                                                    "fit_command": cmd, "fit_output": log, "staging_rule": keep,
                                                    "starts_h": found["when"], "rows": rows}, indent=1) + "\n")
        print(log)
        print(f"staging: {found['chosen']} (leave-one-out rms: "
              + ", ".join(f"{c} {r:.1%}" for c, r in found["loo_rms"].items()) + ")")
        for r in rows:
            print(f"{r['cache']:>10} -nkvo {r['nkvo']} -d {r['depth']:>6}: {r['predicted_tps']:.2f} t/s ±{r['band']:.1%}")
        return 0
    from compare_types8 import compare  # beside this file: read only after the blind predictions are committed

    return compare(out, gguf)
