"""Issues 19 and 24: calibrate on part of upstream llama-bench's H200 runs, predict the rest, and say which is which.

Reads the llama-bench files of ``validate/results/h200-llamacpp/run1`` (as llama-bench wrote them), splits the
decode runs into a calibration set and a held-out set, fits a profile to the calibration set with
``kvpipe calibrate --from-llama-bench`` (the command itself, in-process), and predicts every run with that profile:

* calibration: q8_0 ``-nkvo 0`` at ``-d 1024,8192,65536`` (the compute line) and q8_0 ``-nkvo 1`` at
  ``-d 1024,4096`` (the host->device rate: upstream's ``-nkvo`` cache is in pageable memory, so ``--pageable``);
* held out: q8_0 ``-nkvo 0`` at 2,048 / 4,096 / 16,384 / 32,768, q8_0 ``-nkvo 1`` at 512 / 2,048 / 8,192, and the
  second cache type, f16, at both arms (2,048 / 8,192), which no fit saw.

``--set ngl`` (issue 24, run 3): q8_0 at ``-ngl 33`` (every layer), ``25`` and ``9`` (8 and 24 layers on the CPU)
x ``-nkvo 0,1`` x ``-d 1024,4096`` calibrate (the GPU from ``-ngl 33``, the CPU layer from the ``-nkvo 0`` runs below
it), ``-ngl 29`` and ``17`` (4 and 16 CPU layers) at both arms and depths are held out. Each row is predicted by the
simulation where it runs CPU layers (``sim.graph`` reading ``Workload.n_gpu_layers``) and, always, by the closed form of
``validate.cpu_layers`` (the all-GPU token less the CPU layers' GPU time plus their host time); ``by`` says which the
summary used.

``--set types`` (issue 30, run 4: every cache type from one resident and one ordered run each) is
``tools/llamacpp/predict_types.py``'s.

Writes into ``--out``: ``calibration.llama-bench.json`` (the subset the fit saw), ``profile.json``, ``prediction.json``
(every run: role, measured, predicted, error) and ``prediction.md`` (the tables). The model is the GGUF llama-bench ran
(its header is all kvpipe reads): regenerate it with

    python tools/llamacpp/write_gguf.py --preset sim/presets/llama-3.1-8b.json --weights q8_0 \\
        --vocab-from llama.cpp/models/ggml-vocab-llama-bpe.gguf --out /tmp/llama-3.1-8b-q8_0.gguf
    python tools/llamacpp/predict.py --gguf /tmp/llama-3.1-8b-q8_0.gguf

Not installed with the package: run it from a checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvpipe.cli import main as kvpipe  # noqa: E402
from sim.workload import cache_type, load_model  # noqa: E402
from validate.cpu_layers import closed_form_s, sim_runs_cpu_layers, workload_gpu_layers  # noqa: E402
from validate.token_fit import TokenRun, simulated_s, workload_at  # noqa: E402

RESULTS = ROOT / "validate" / "results" / "h200-llamacpp"
#: The two sets: -fa 1 (run 1: -nkvo 1 delivers the windows, attention on the GPU) and -fa 0 (run 2: -nkvo 1 runs
#: attention on the CPU, kvpipe's host-attention arm). Each: its files, the runs the fit sees, the fit's flags.
SETS: dict[str, dict[str, Any]] = {
    "fa1": {"run": "run1", "files": ("resident-q8_0.json", "ordered-q8_0-first.json", "ordered-q8_0.json", "f16-cache.json"),
            "calibration": {("q8_0", False): (1024, 8192, 65536), ("q8_0", True): (1024, 4096)},
            "flags": ["--pageable"], "out": "prediction"},
    "fa0": {"run": "run2", "files": ("fa0-f16.json",),
            "calibration": {("f16", False): (512, 2048), ("f16", True): (256, 1024)},
            "flags": ["--pageable", "--nkvo-attention", "host"], "out": "prediction-fa0"},
    "ngl": {"run": "run3", "files": tuple(f"ngl{n}-d{d}.json" for d in (1024, 4096) for n in (33, 29, 25, 17, 9)),
            "calibration": {("q8_0", False): (1024, 4096), ("q8_0", True): (1024, 4096)}, "ngl": (33, 25, 9),
            "flags": ["--pageable"], "out": "prediction-ngl"},
}
RUN = RESULTS / "run1"
CALIBRATION: dict[tuple[str, bool], tuple[int, ...]] = SETS["fa1"]["calibration"]


def records(run: Path = RUN, files: tuple[str, ...] = SETS["fa1"]["files"]) -> list[dict[str, Any]]:
    """Every decode record of a run, in file order."""
    out = []
    for name in files:
        for r in json.loads((run / name).read_text()):
            if r["n_gen"] > 0 and r["n_prompt"] == 0:
                out.append(dict(r, _file=name))
    return out


def role(r: dict[str, Any], calibration: dict[tuple[str, bool], tuple[int, ...]] | None = None,
         ngl: tuple[int, ...] = ()) -> str:
    """``calibration`` or ``held out``: by cache type, arm and depth, and by -ngl where the set names its calibration ones."""
    cal = CALIBRATION if calibration is None else calibration
    if ngl and r["n_gpu_layers"] not in ngl:
        return "held out"
    return "calibration" if r["n_depth"] in cal.get((r["type_k"], bool(r["no_kv_offload"])), ()) else "held out"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/llamacpp/predict.py", description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the GGUF llama-bench ran (write_gguf.py makes it)")
    ap.add_argument("--hardware", default="h200-gen5x16-kvpipe",
                    help="base profile: host and copy costs (default h200-gen5x16-kvpipe: the H200 probe's)")
    ap.add_argument("--set", choices=sorted([*SETS, "types", "types5", "types6", "types7", "types8"]), default="fa1",
                    help="fa1: run 1 (-fa 1); fa0: run 2 (-fa 0, attention on the CPU); ngl: run 3 (-ngl below the layer count); "
                         "types: run 4 (every cache type: tools/llamacpp/predict_types.py); types5: run 5 (the same, the "
                         "ordered runs spanning copy sizes: tools/llamacpp/predict_types5.py); types6: run 6 (calibration "
                         "and held-out runs interleaved in one call: tools/llamacpp/predict_types6.py); types7: run 7 (each ordered "
                         "configuration in its own process: tools/llamacpp/predict_types7.py); types8: run 8 (the types "
                         "interleaved in time, the staging rule: tools/llamacpp/predict_types8.py)")
    ap.add_argument("--blind", action="store_true",
                    help="write the held-out rows' predictions only (blind.json), their measured figures unread")
    ap.add_argument("--out", default="", help="default: validate/results/h200-llamacpp/prediction (fa1), prediction-fa0 (fa0)")
    args = ap.parse_args(argv)
    if args.set == "types8":
        from predict_types8 import run as run_types8  # beside this file

        return run_types8(args.gguf, args.hardware, Path(args.out) if args.out else RESULTS / "prediction-types8", args.blind)
    if args.set == "types7":
        from predict_types7 import run as run_types7  # beside this file

        return run_types7(args.gguf, args.hardware, Path(args.out) if args.out else RESULTS / "prediction-types7", args.blind)
    if args.set == "types6":
        from predict_types6 import run as run_types6  # beside this file

        return run_types6(args.gguf, args.hardware, Path(args.out) if args.out else RESULTS / "prediction-types6", args.blind)
    if args.set == "types5":
        from predict_types5 import run as run_types5  # beside this file

        return run_types5(args.gguf, args.hardware, Path(args.out) if args.out else RESULTS / "prediction-types5", args.blind)
    if args.set == "types":
        from predict_types import run as run_types  # beside this file (the script's folder is on sys.path)

        return run_types(args.gguf, args.hardware, Path(args.out) if args.out else RESULTS / "prediction-types", args.blind)
    chosen = SETS[args.set]
    cal = chosen["calibration"]
    ngl_cal: tuple[int, ...] = chosen.get("ngl", ())
    out = Path(args.out) if args.out else RESULTS / chosen["out"]
    out.mkdir(parents=True, exist_ok=True)
    recs = records(RESULTS / chosen["run"], chosen["files"])
    calib = [{k: v for k, v in r.items() if k != "_file"} for r in recs if role(r, cal, ngl_cal) == "calibration"]
    calib_path = out / "calibration.llama-bench.json"
    calib_path.write_text(json.dumps(calib, indent=1) + "\n")
    profile_path = out / "profile.json"
    fit_cmd = ["calibrate", "--from-llama-bench", str(calib_path.relative_to(ROOT)), "-m", args.gguf, *chosen["flags"],
               "--hardware", args.hardware, "--out", str(profile_path.relative_to(ROOT))]
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        code = kvpipe(fit_cmd)
    if code:
        print(log.getvalue())
        return code
    profile = json.loads(profile_path.read_text())
    model = load_model(args.gguf)
    by_sim = sim_runs_cpu_layers(profile, model, cache_type("q8_0"), cache_type("q8_0"))
    rows = []
    if args.blind:
        recs = [r for r in recs if role(r, cal, ngl_cal) == "held out"]
    for r in recs:
        ck, cv = cache_type(r["type_k"]), cache_type(r["type_v"])
        nkvo = bool(r["no_kv_offload"])
        ngl = workload_gpu_layers(r["n_gpu_layers"], model)
        wl = workload_at(model, ck, cv, r["n_depth"] + r["n_gen"] // 2, pinned=not nkvo, n_gpu_layers=ngl)
        entry = profile["workloads"].get(f"{model.name}@{r['type_k']}")
        prof = dict(profile)
        if entry is None:  # a cache type no fit saw: the device's compute (the q8_0 fit's)
            prof = {k: v for k, v in profile.items() if k != "workloads"}
        arm = "ordered" if nkvo else "resident"
        partial = ngl < model.n_layers
        closed = closed_form_s(prof, model, ck, cv, TokenRun(wl.context[0], 1.0, arm, pinned=not nkvo, n_gpu_layers=ngl)) \
            if partial else 0.0
        by = "closed form" if partial and not by_sim else "simulation"  # the simulator runs no CPU layer yet
        s = closed if by == "closed form" else simulated_s(prof, wl, arm)
        if args.blind:
            rows.append({"cache": r["type_k"], "nkvo": int(nkvo), "depth": r["n_depth"], "ngl": r["n_gpu_layers"],
                         "role": "held out", "predicted_tps": 1 / s, "by": by})
            continue
        measured_s = r["avg_ns"] * 1e-9 / r["n_gen"]
        rows.append({
            "cache": r["type_k"], "nkvo": int(nkvo), "depth": r["n_depth"], "ngl": r["n_gpu_layers"],
            "role": role(r, cal, ngl_cal), "file": r["_file"],
            "measured_tps": 1 / measured_s, "stddev_tps": r["stddev_ts"], "samples_tps": r["samples_ts"],
            "predicted_tps": 1 / s, "error": measured_s / s - 1,
            "by": by, "closed_form_tps": 1 / closed if closed else None,
        })
    if args.blind:
        (out / "blind.json").write_text(json.dumps({"command": f"python tools/llamacpp/predict.py --set {args.set} --blind",
                                                    "rows": rows}, indent=1) + "\n")
        print(log.getvalue())
        return 0
    summary = {}
    fitted = {k[0] for k in cal}
    for name, pick in ((f"-nkvo 1 ({', '.join(sorted(fitted))}, held out)", lambda x: x["nkvo"] == 1 and x["cache"] in fitted),
                       (f"-nkvo 0 ({', '.join(sorted(fitted))}, held out)", lambda x: x["nkvo"] == 0 and x["cache"] in fitted),
                       ("second cache type (held out)", lambda x: x["cache"] not in fitted),
                       ("every held-out run", lambda x: True)):
        errs = [abs(x["error"]) for x in rows if x["role"] == "held out" and pick(x)]
        if not errs:
            continue
        summary[name] = {"runs": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}
    report = {"command": f"python tools/llamacpp/predict.py --set {args.set} --gguf " + args.gguf,
              "fit_command": "kvpipe " + " ".join(fit_cmd),
              "fit_output": log.getvalue(), "calibration": {f"{k[0]} -nkvo {int(k[1])}": v for k, v in cal.items()},
              "rows": rows, "summary": summary}
    (out / "prediction.json").write_text(json.dumps(report, indent=1) + "\n")
    md = ["| cache | -ngl | -nkvo | -d | role | measured t/s | predicted t/s | by | error |",
          "|---|---:|---:|---:|---|---:|---:|---|---:|"]
    for x in rows:
        md.append(f"| {x['cache']} | {x['ngl']} | {x['nkvo']} | {x['depth']:,} | {x['role']} | {x['measured_tps']:.2f} ± "
                  f"{x['stddev_tps']:.2f} | {x['predicted_tps']:.2f} | {x['by']} | {x['error']:+.1%} |")
    md += ["", "| held-out runs | n | median \\|error\\| | max \\|error\\| |", "|---|---:|---:|---:|"]
    md += [f"| {k} | {v['runs']} | {v['median_abs_error']:.1%} | {v['max_abs_error']:.1%} |" for k, v in summary.items()]
    (out / "prediction.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(log.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
