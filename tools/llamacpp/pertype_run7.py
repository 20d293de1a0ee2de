"""Run 7, read after its held-out figures (docs/validation.md "Run 7"): the ordered held-out runs under a staging rate
fitted per cache type (each type's own two ordered calibration runs) instead of the profile's one flat rate for all.

    python tools/llamacpp/pertype_run7.py --gguf /tmp/llama-3.1-8b-q8_0.gguf     # about 15 s

Nothing is refitted but the flat rate per type (``predict_types5._flat`` under ``prediction-types7/profile.json``'s
compute); nothing committed changes. In run 7 each type's processes ran consecutively, so a rate per type is also a
rate per stretch of the call: the two cannot be told apart in these files. Not installed with the package.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import predict_types as pt  # noqa: E402  (beside this file)
import predict_types5 as p5  # noqa: E402

from validate.token_sim import golden_log  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the GGUF llama-bench ran (tools/llamacpp/write_gguf.py)")
    gguf = ap.parse_args().gguf
    folder = pt.RESULTS / "prediction-types7"
    prof = json.loads((folder / "profile.json").read_text())
    rows = [r for r in json.loads((folder / "prediction.json").read_text())["rows"] if r["nkvo"] == 1]
    errs: dict[str, list[float]] = {}
    for cache in dict.fromkeys(r["cache"] for r in rows):
        k, v = cache.split("/") if "/" in cache else (cache, cache)
        cal = [r for r in rows if r["cache"] == cache and r["role"] == "calibration"]

        def loss(g: float, k: str = k, v: str = v, cal: list = cal) -> float:
            return sum((pt.predict(p5._flat(prof, g), gguf, k, v, 1, r["depth"])["predicted_tps"] / r["measured_tps"] - 1) ** 2
                       for r in cal)

        rate = golden_log(loss, 3.0, 30.0, 30)
        for r in rows:
            if r["cache"] == cache and r["role"] != "calibration":
                e = pt.predict(p5._flat(prof, rate), gguf, k, v, 1, r["depth"])["predicted_tps"] / r["measured_tps"] - 1
                errs.setdefault(r["role"], []).append(e)
                print(f"{cache:>10} {rate:.2f} GB/s  {r['role']:<15} -d {r['depth']:>5}: {e:+.1%} (one flat rate: {r['error']:+.1%})")
    for role, e in errs.items():
        print(f"{role}: {len(e)} runs, median |error| {statistics.median(abs(x) for x in e):.1%}, max {max(e, key=abs):+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
