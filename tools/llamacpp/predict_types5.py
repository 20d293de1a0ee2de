"""Issues 30 and 28, run 5: every cache type on the H200 calibrated with ordered runs that span the copy sizes.

``python tools/llamacpp/predict.py --set types5 --gguf GGUF [--blind]`` (this module does the work; the campaign's
design is tools/llamacpp/README-run5.md, written before it ran):

* **calibration** (``CALIBRATION``): run 5 call 1's ``r5-*-cal.json`` only: per cache type f16, q8_0, q4_0 one
  ``-nkvo 0`` run (q8_0 at two depths: the weights' line) and ``-nkvo 1`` at three depths whose per-layer copies lie
  below, near and above 3 MiB. The profile is ``kvpipe calibrate --from-llama-bench --pageable`` on them
  (``validate.type_fit``; the staging curve ``validate.link_fit.fit_pageable``).
* **the median of 3**: every llama-bench configuration ran ``-r 3``; each record's ``avg_ns`` and ``avg_ts`` are
  replaced by the median of its 3 samples (the file's mean kept as ``mean_ns``) before the fit and before a
  comparison: one fast sample in three moved the mean of an ordered run by up to 7%.
* **held out** (``HELD``): run 5 call 1's ``r5-*-held.json`` (depths no earlier run used, both arms, every type and
  ``-ctk q8_0 -ctv q4_0``); ``--blind`` predicts them from the design (``DESIGN``) without opening a held-out file.
* **a second machine**: ``run5/fresh/`` if it exists (the held-out grid on another lease, nothing fitted).

Not installed with the package: run it from a checkout.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import predict_types as pt  # beside this file (the script's folder is on sys.path)

from validate.token_sim import golden_log

RESULTS = pt.RESULTS
RUN = RESULTS / "run5"
TYPES = ("f16", "q8_0", "q4_0")
CALIBRATION = tuple(f"r5-{arm}-{t}-cal.json" for t in TYPES for arm in ("res", "ord"))
HELD = tuple(f"r5-{arm}-{t}-held.json" for t in (*TYPES, "mixed") for arm in ("res", "ord"))
#: The held-out benches as h200_bench.sh's run5 phase runs them (tools/llamacpp/run5.sh): (K, V, -nkvo, -d).
ORDERED_HELD = {("q8_0", "q8_0"): (1280, 5120), ("f16", "f16"): (768, 2560), ("q4_0", "q4_0"): (3584, 12288),
                ("q8_0", "q4_0"): (1792, 6656)}
DESIGN = tuple((k, v, 1, d) for (k, v), ds in ORDERED_HELD.items() for d in ds) + \
    tuple((k, v, 0, d) for (k, v) in ORDERED_HELD for d in (5120, 20480))


def medianed(r: dict[str, Any]) -> dict[str, Any]:
    """A llama-bench record whose avg_ns / avg_ts are the median of its samples (mean kept as mean_ns). Pure."""
    if not r.get("samples_ns"):
        return r
    return dict(r, mean_ns=r["avg_ns"], avg_ns=int(statistics.median(r["samples_ns"])), avg_ts=statistics.median(r["samples_ts"]))


def records(folder: Path, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every decode record of ``names`` under ``folder`` (files absent skipped), medianed."""
    return [medianed(r) for n in names if (folder / n).exists() for r in pt.decode_records(folder / n)]


def _rows(profile: dict[str, Any], gguf: str, folder: Path, names: tuple[str, ...], role: str) -> list[dict[str, Any]]:
    """Every decode record of ``names`` (medianed) predicted and compared, as predict_types.measured_rows. Blocks."""
    rows = []
    for name in names:
        for r in records(folder, (name,)):
            p = pt.predict(profile, gguf, r["type_k"], r["type_v"], int(r["no_kv_offload"]), r["n_depth"], r["n_gen"])
            tps = r["n_gen"] / (r["avg_ns"] * 1e-9)
            rows.append(p | {"role": role, "file": f"{folder.relative_to(RESULTS)}/{name}", "measured_tps": tps,
                             "mean_tps": r["n_gen"] / (r["mean_ns"] * 1e-9), "stddev_tps": r["stddev_ts"],
                             "samples_tps": r["samples_ts"], "error": p["predicted_tps"] / tps - 1,
                             "error_vs_mean": p["predicted_tps"] * r["mean_ns"] * 1e-9 / r["n_gen"] - 1,
                             "machine": pt.machine_differs(profile, {"cpu_info": r.get("cpu_info", ""),
                                                                     "gpu_info": r.get("gpu_info", "")})})
    return rows


def fit(gguf: str, hardware: str, out: Path) -> tuple[dict[str, Any], str, str]:
    """Write the medianed calibration file and fit on it (predict_types.fit's command). Blocks (minutes)."""
    return pt.fit(gguf, hardware, out, records(RUN / "call1", CALIBRATION))


def _flat(profile: dict[str, Any], gbps: float) -> dict[str, Any]:
    return {k: v for k, v in profile.items() if k != "devices"} | {
        "devices": [dict(d, links=dict(d["links"], h2d_pageable=dict(d["links"]["h2d_pageable"], points=[[1.0, gbps]])))
                    for d in profile["devices"]]}


def afterwards(profile: dict[str, Any], gguf: str, rows: list[dict[str, Any]]) -> None:
    """Read after the figures, for the reading in docs/validation.md (nothing refitted): each ordered row's error under
    the profile's one flat rate over every calibration run (``flat_error``), and the flat staging rate that run alone
    implies (``implied_GBps``). Adds both to the rows. Blocks (simulations)."""
    flat = _flat(profile, profile["calibration"]["link"]["GBps"])
    for r in rows:
        if r["nkvo"] != 1:
            continue
        k, v = (r["cache"].split("/") * 2)[:2] if "/" in r["cache"] else (r["cache"], r["cache"])
        r["flat_error"] = pt.predict(flat, gguf, k, v, 1, r["depth"])["predicted_tps"] / r["measured_tps"] - 1
        r["implied_GBps"] = implied_GBps(profile, gguf, k, v, r["depth"], r["measured_tps"])


def implied_GBps(profile: dict[str, Any], gguf: str, k: str, v: str, depth: int, measured_tps: float) -> float:
    """The flat pageable staging rate, GB/s (3-30), at which ``profile`` predicts an ordered run of (``k``, ``v``) at
    ``depth`` at ``measured_tps``. Blocks (a golden-section search: 32 simulations)."""

    def cost(g: float) -> float:
        return float((pt.predict(_flat(profile, g), gguf, k, v, 1, depth)["predicted_tps"] / measured_tps - 1) ** 2)

    return golden_log(cost, 3.0, 30.0, 30)


def run(gguf: str, hardware: str, out: Path, blind: bool) -> int:
    """Fit, then write blind.json (``blind``) or prediction.json and prediction.md. Blocks."""
    out.mkdir(parents=True, exist_ok=True)
    profile, cmd, log = pt.blind_or_fit(out, blind, lambda: fit(gguf, hardware, out))
    if blind:
        return pt.write_blind(out, "types5", profile, gguf, DESIGN, cmd, log)
    cal = _rows(profile, gguf, RUN / "call1", CALIBRATION, "calibration")
    held = _rows(profile, gguf, RUN / "call1", HELD, "held out")
    fresh = _rows(profile, gguf, RUN / "fresh", HELD, "second machine") if (RUN / "fresh").is_dir() else []
    afterwards(profile, gguf, cal + held)
    return pt.write_report(out, "types5", gguf, cmd, log, [f"run5/call1/{n}" for n in CALIBRATION],
                           "median of each run's 3 samples", (cal, held, fresh), "run 5", "run5/fresh")
