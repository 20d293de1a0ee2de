"""Issue 30: every cache type of upstream llama.cpp on the H200 from one resident and one ordered run per type.

``python tools/llamacpp/predict.py --set types --gguf GGUF [--blind]`` (this module does the work):

* **calibration** (``CALIBRATION``): the resident runs of run 1 and run 3 that earlier fits already used (q8_0
  ``-nkvo 0`` at 1,024, 4,096, 8,192, 65,536, every layer on the GPU: the card) and run 4's ``*-cal.json``: per cache
  type f16, q8_0, q4_0 one ``-nkvo 0`` run at 8,192 and one ``-nkvo 1`` run at 1,024 (the ordered runs of this
  machine only: its host's pageable staging). One file, fitted by ``kvpipe
  calibrate --from-llama-bench --pageable`` (``validate.type_fit``: shared weights and link, each type's attention).
* **held out** (``HELD``): run 4's ``*-held.json``: per type ``-nkvo 0`` at 2,048 and 32,768 and ``-nkvo 1`` at 3,072,
  and the mixed ``-ctk q8_0 -ctv q4_0`` at both arms at 4,096 (no run of that pair was fitted: it is composed).
  ``--blind`` predicts them from the bench design alone (``DESIGN``, as ``h200_bench.sh types`` runs them) and
  writes ``blind.json`` without opening a held-out file; without it, the held-out files are read and compared.
* **before**: the held-out runs predicted by issue 19's profile too (``prediction/profile.json``: q8_0's compute for
  every type, run 1's flat pageable rate), as ``issue19_error``.
* **a second machine**: files under ``run4/fresh/`` (the same benches on another lease), predicted with the same
  profile, if there are any.

Not installed with the package: run it from a checkout.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backends.profile import workload_key
from kvpipe.cli import main as kvpipe
from sim.workload import cache_type, load_model
from validate.from_llama_bench import machine_differs
from validate.token_fit import simulated_s, workload_at

RESULTS = Path(__file__).resolve().parents[2] / "validate" / "results" / "h200-llamacpp"
#: The calibration records: (run folder, file, the depths taken; () = every decode record of the file).
#: The ordered runs of runs 1 and 3 are left out: their host was another lease's (the pageable staging is a property of
#: the machine, issue 30), so the link is run 4's own; their resident runs (the GPU, the same model of card) stay.
CALIBRATION: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("run1", "resident-q8_0.json", (1024, 8192, 65536)),
    ("run3", "ngl33-d1024.json", (1024,)),
    ("run3", "ngl33-d4096.json", (4096,)),
    *(("run4/call1", f"types-{arm}-{t}-cal.json", ()) for t in ("f16", "q8_0", "q4_0") for arm in ("res", "ord")),
)
HELD = tuple(f"types-{arm}-{t}-held.json" for t in ("f16", "q8_0", "q4_0") for arm in ("res", "ord")) + ("types-mixed-held.json",)
#: The held-out benches as h200_bench.sh's 'types' phase runs them: (K type, V type, -nkvo, -d), n_gen 64.
DESIGN = (tuple((t, t, 0, d) for t in ("f16", "q8_0", "q4_0") for d in (2048, 32768))
          + tuple((t, t, 1, 3072) for t in ("f16", "q8_0", "q4_0")) + (("q8_0", "q4_0", 0, 4096), ("q8_0", "q4_0", 1, 4096)))
N_GEN = 64
#: The GGUF's header, read once (its tokenizer makes a read take seconds).
model_of = functools.lru_cache(maxsize=2)(load_model)


def decode_records(path: Path, depths: tuple[int, ...] = (), nkvo: int | None = None) -> list[dict[str, Any]]:
    """A llama-bench file's decode records (at ``depths`` only, and ``-nkvo`` ``nkvo`` only, when given)."""
    return [r for r in json.loads(path.read_text()) if r["n_gen"] > 0 and r["n_prompt"] == 0 and (not depths or r["n_depth"] in depths)
            and (nkvo is None or int(r["no_kv_offload"]) == nkvo)]


def _nkvo(run: str) -> int | None:
    """The arm a calibration folder contributes: runs 1 and 3 their resident runs only (``CALIBRATION``'s note)."""
    return None if run.startswith("run4") else 0


def entry_profile(profile: dict[str, Any], model: str, ck: str, cv: str) -> tuple[dict[str, Any], str]:
    """The profile dict with the compute of (``ck``, ``cv``)'s entry on its devices, and the entry's key ("" when the
    profile has none for the pair: its stand-in compute, uncalibrated)."""
    key = workload_key(model, ck, cv)
    entry = profile.get("workloads", {}).get(key)
    out = {k: v for k, v in profile.items() if k != "workloads"}
    if entry is None:
        return out, ""
    out["devices"] = [dict(d, compute=entry["compute"]) for d in profile["devices"]]
    return out, key


def predict(profile: dict[str, Any], gguf: str, ck: str, cv: str, nkvo: int, depth: int, n_gen: int = N_GEN) -> dict[str, Any]:
    """One run's prediction: t/s, the entry used, its band. Blocks (simulation)."""
    model = model_of(gguf)
    prof, key = entry_profile(profile, model.name, ck, cv)
    wl = workload_at(model, cache_type(ck), cache_type(cv), depth + n_gen // 2, pinned=not nkvo)
    s = simulated_s(prof, wl, "ordered" if nkvo else "resident")
    band = profile["workloads"][key]["band"] if key else profile["uncalibrated_cache"]["band"]
    return {"cache": ck if ck == cv else f"{ck}/{cv}", "nkvo": nkvo, "depth": depth, "predicted_tps": 1 / s,
            "entry": key or "none: uncalibrated", "band": band}


def fit(gguf: str, hardware: str, out: Path, calib: list[dict[str, Any]] | None = None) -> tuple[dict[str, Any], str, str]:
    """Write the calibration file (``calib``, default CALIBRATION's records) and fit the profile on it (``kvpipe
    calibrate``, in-process). Returns the profile, the command and its output. Blocks (the fit: minutes)."""
    if calib is None:
        calib = [r for run, name, depths in CALIBRATION for r in decode_records(RESULTS / run / name, depths, _nkvo(run))]
    calib_path = out / "calibration.llama-bench.json"
    calib_path.write_text(json.dumps(calib, indent=1) + "\n")
    root = RESULTS.parents[2]
    cmd = ["calibrate", "--from-llama-bench", str(calib_path.relative_to(root)), "-m", gguf, "--pageable", "--hardware", hardware,
           "--out", str((out / "profile.json").relative_to(root))]
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        code = kvpipe(cmd)
    if code:
        raise SystemExit(f"kvpipe {' '.join(cmd)} failed ({code}): {log.getvalue()}")
    return json.loads((out / "profile.json").read_text()), "kvpipe " + " ".join(cmd), log.getvalue()


#: Issue 19's profile (prediction/profile.json: q8_0's compute for every cache type, one flat pageable rate from run 1's
#: ordered runs): what the same held-out runs would have been predicted to before this issue.
BEFORE = RESULTS / "prediction" / "profile.json"


def before_tps(gguf: str, r: dict[str, Any]) -> float:
    """A record predicted by issue 19's profile, as it predicted a cache type it did not fit (the device compute). Blocks."""
    old = {k: v for k, v in json.loads(BEFORE.read_text()).items() if k != "workloads"}
    nkvo = int(r["no_kv_offload"])
    wl = workload_at(model_of(gguf), cache_type(r["type_k"]), cache_type(r["type_v"]), r["n_depth"] + r["n_gen"] // 2, pinned=not nkvo)
    return 1 / simulated_s(old, wl, "ordered" if nkvo else "resident")


def measured_rows(profile: dict[str, Any], gguf: str, folder: Path, names: tuple[str, ...], role: str) -> list[dict[str, Any]]:
    """Every decode record of ``names`` under ``folder``, predicted and compared (error = predicted / measured - 1, in
    t/s: measured is avg_ns / n_gen), each with what differs of its machine from the profile's. Blocks."""
    rows = []
    for name in names:
        if not (folder / name).exists():
            continue
        for r in decode_records(folder / name):
            p = predict(profile, gguf, r["type_k"], r["type_v"], int(r["no_kv_offload"]), r["n_depth"], r["n_gen"])
            tps = r["n_gen"] / (r["avg_ns"] * 1e-9)
            rows.append(p | {"role": role, "file": f"{folder.relative_to(RESULTS)}/{name}", "measured_tps": tps,
                             "stddev_tps": r["stddev_ts"], "samples_tps": r["samples_ts"], "error": p["predicted_tps"] / tps - 1,
                             "machine": machine_differs(profile, {"cpu_info": r.get("cpu_info", ""), "gpu_info": r.get("gpu_info", "")})})
            if role == "held out":
                rows[-1]["issue19_error"] = before_tps(gguf, r) / tps - 1
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cache type, per arm and over all: runs, median |error|, the largest error (signed), and whether the median is
    within 5% and every run within 10% (the issue's target)."""
    names = [*dict.fromkeys(r["cache"] for r in rows), "-nkvo 0, every cache type", "-nkvo 1, every cache type", "every run"]
    groups: dict[str, list[float]] = {n: [] for n in names}
    for r in rows:
        for name in (r["cache"], f"-nkvo {r['nkvo']}, every cache type", "every run"):
            groups[name].append(r["error"])
    out = {}
    for name, errs in groups.items():
        if not errs:
            continue
        med, top = statistics.median(abs(e) for e in errs), max(errs, key=abs)
        out[name] = {"runs": len(errs), "median_abs_error": med, "max_error": top, "met": med <= 0.05 and abs(top) <= 0.10}
    return out


def summary_table(title: str, summ: dict[str, Any]) -> list[str]:
    md = ["", f"| {title} | runs | median \\|error\\| | max error | median ≤ 5%, every run ≤ 10% |", "|---|---:|---:|---:|---|"]
    return md + [f"| {k} | {v['runs']} | {v['median_abs_error']:.1%} | {v['max_error']:+.1%} | {'met' if v['met'] else 'missed'} |"
                 for k, v in summ.items()]


def table(rows: list[dict[str, Any]], summ: dict[str, Any]) -> list[str]:
    md = ["| cache | -nkvo | -d | role | measured t/s | predicted t/s | band | entry | error |",
          "|---|---:|---:|---|---:|---:|---:|---|---:|"]
    md += [f"| {x['cache']} | {x['nkvo']} | {x['depth']:,} | {x['role']} | {x['measured_tps']:.2f} ± {x['stddev_tps']:.2f} | "
           f"{x['predicted_tps']:.2f} | ±{x['band']:.1%} | {x['entry'].split('@')[-1]} | {x['error']:+.1%} |" for x in rows]
    return md + summary_table("held out (run 4)", summ)


def blind_or_fit(out: Path, blind: bool, fit_now: Callable[[], tuple[dict[str, Any], str, str]]) -> tuple[dict[str, Any], str, str]:
    """The profile, its fit command and output: when comparing (not ``blind``) and ``out/blind.json`` exists, the
    profile the blind predictions were made with, read back, not refitted (reads files only); else ``fit_now()``
    (blocks: the fit, minutes)."""
    if not blind and (out / "blind.json").exists():
        profile = json.loads((out / "profile.json").read_text())
        return profile, json.loads((out / "blind.json").read_text())["fit_command"], "(the blind run's profile, not refitted)"
    return fit_now()


def write_blind(out: Path, name: str, profile: dict[str, Any], gguf: str, design: Any, cmd: str, log: str) -> int:
    """Predict every held-out run of ``design`` from the profile alone, write ``out/blind.json`` (the command that
    made it, ``--set name``) and print the predictions; 0. Blocks (simulations)."""
    rows = [predict(profile, gguf, *d) | {"role": "held out"} for d in design]
    (out / "blind.json").write_text(json.dumps({"command": f"python tools/llamacpp/predict.py --set {name} --blind --gguf {gguf}",
                                                "fit_command": cmd, "rows": rows}, indent=1) + "\n")
    print(log)
    for r in rows:
        print(f"{r['cache']:>10} -nkvo {r['nkvo']} -d {r['depth']:>6}: {r['predicted_tps']:.2f} t/s ±{r['band']:.1%} ({r['entry']})")
    return 0


def write_report(out: Path, name: str, gguf: str, cmd: str, log: str, calibration: list[str], measured: str,
                 rows: tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]], run_label: str,
                 fresh_label: str) -> int:
    """Write ``out/prediction.json`` and ``prediction.md`` of a held-out set (runs 5-7): ``rows`` are the calibration,
    held-out and second-machine rows; the summaries are of the held-out and the second machine's rows. Prints the
    tables and the fit's output; 0. Blocks (file writes only)."""
    cal, held, fresh = rows
    summ = summary(held)
    second: dict[str, Any] | str = summary(fresh) if fresh else "not run"
    report = {"command": f"python tools/llamacpp/predict.py --set {name} --gguf {gguf}", "fit_command": cmd, "fit_output": log,
              "calibration": calibration, "measured": measured,
              "rows": cal + held + fresh, "summary": summ, "summary_second_machine": second}
    (out / "prediction.json").write_text(json.dumps(report, indent=1) + "\n")
    md = [line.replace("| held out (run 4) |", f"| held out ({run_label}) |") for line in table(cal + held + fresh, summ)]
    md += summary_table(f"second machine ({fresh_label}, nothing fitted)", second) if isinstance(second, dict) else \
        ["", "Second machine: not run."]
    (out / "prediction.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(log)
    return 0


def run(gguf: str, hardware: str, out: Path, blind: bool) -> int:
    """Fit, then write blind.json (``blind``) or prediction.json and prediction.md. Blocks."""
    out.mkdir(parents=True, exist_ok=True)
    profile, cmd, log = fit(gguf, hardware, out)
    if blind:
        return write_blind(out, "types", profile, gguf, DESIGN, cmd, log)
    cal = [r for run_, name, depths in CALIBRATION for r in measured_rows(profile, gguf, RESULTS / run_, (name,), "calibration")
           if (not depths or r["depth"] in depths) and _nkvo(run_) in (None, r["nkvo"])]
    held = measured_rows(profile, gguf, RESULTS / "run4" / "call1", HELD, "held out")
    fresh_dir = RESULTS / "run4" / "fresh"
    fresh = measured_rows(profile, gguf, fresh_dir, tuple(sorted(p.name for p in fresh_dir.glob("types-*.json"))),
                          "second machine") if fresh_dir.is_dir() else []
    summ = summary(held)
    summ_before = summary([dict(r, error=r["issue19_error"]) for r in held])
    second: dict[str, Any] | str = summary(fresh) if fresh else "not run"
    report = {"command": f"python tools/llamacpp/predict.py --set types --gguf {gguf}", "fit_command": cmd, "fit_output": log,
              "calibration": [f"{r}/{n}" + (f" -d {','.join(map(str, d))}" if d else "") for r, n, d in CALIBRATION],
              "rows": cal + held + fresh, "summary": summ, "summary_issue19_profile": summ_before, "summary_second_machine": second}
    (out / "prediction.json").write_text(json.dumps(report, indent=1) + "\n")
    md = table(cal + held + fresh, summ) + summary_table("held out, issue 19's profile (before)", summ_before)
    notes = sorted({r["machine"] for r in cal + held + fresh if r["machine"]})
    machine = (profile.get("calibration") or {}).get("machine", {})
    md += ["", *(f"Warning: {n}" for n in notes)] if notes else \
        ["", f"Machine: every row's llama-bench cpu_info and gpu_info are the profile's ({machine.get('cpu_info')!r}, "
             f"{machine.get('gpu_info')!r}); llama-bench's fields cannot tell two leases of one kind apart."]
    fresh_title = "second machine (run4/fresh, nothing fitted)"
    md += summary_table(fresh_title, second) if isinstance(second, dict) else ["", "Second machine: not run."]
    (out / "prediction.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(log)
    return 0
