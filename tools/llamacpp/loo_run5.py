"""Run 5's nine ordered calibration runs through run 6's leave-one-out choice of the staging curve (design data).

``python tools/llamacpp/loo_run5.py --gguf /tmp/llama-3.1-8b-q8_0.gguf`` (about 4 min on a loaded 2-core machine):
each run of ``run5/call1/r5-ord-*-cal.json`` (the median of its samples) under its type's compute in
``prediction-types5/profile.json``, through ``validate.link_fit.fit_pageable``; prints the curve chosen and each
candidate's in-sample and leave-one-out rms error. Docs: docs/validation.md ("Run 6"). Not installed with the package.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import predict_types as pt  # noqa: E402  (beside this file)

from sim.workload import cache_type  # noqa: E402
from validate.link_fit import OrderedRun, fit_pageable  # noqa: E402
from validate.token_sim import TokenRun, workload_of  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/llamacpp/loo_run5.py", description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the GGUF llama-bench ran (write_gguf.py makes it)")
    args = ap.parse_args(argv)
    profile = json.loads((pt.RESULTS / "prediction-types5" / "profile.json").read_text())
    model = pt.model_of(args.gguf)
    items = []
    for t in ("q8_0", "f16", "q4_0"):
        prof, _ = pt.entry_profile(profile, model.name, t, t)
        for r in json.loads((pt.RESULTS / "run5" / "call1" / f"r5-ord-{t}-cal.json").read_text()):
            run = TokenRun(r["n_depth"] + r["n_gen"] // 2, statistics.median(r["samples_ns"]) * 1e-9 / r["n_gen"], "ordered",
                           f"{t} -d {r['n_depth']}", pinned=False)
            items.append(OrderedRun(prof, workload_of(model, cache_type(t), cache_type(t), run), run))
    rec = fit_pageable(items)
    print(f"chosen: {rec['curve']}")
    for name, c in rec.get("choice", {}).items():
        loo = c["leave_one_out_rms"]
        print(f"  {name}: in-sample rms {c['in_sample_rms']:.1%}, leave-one-out rms {'-' if loo is None else f'{loo:.1%}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
