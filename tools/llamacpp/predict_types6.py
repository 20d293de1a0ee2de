"""Issues 30 and 28, run 6: every cache type on the H200, calibration and held-out runs interleaved in one call.

``python tools/llamacpp/predict.py --set types6 --gguf GGUF [--blind]`` (this module does the work; the campaign's
design is tools/llamacpp/README-run6.md, committed before it ran):

* **calibration** (``CALIBRATION``): run 6 call 1's ``r6-*-cal.json`` only (``split_roles`` wrote them on the device
  from each (type, arm) process): per cache type f16, q8_0, q4_0 and the q8_0/q4_0 pair one ``-nkvo 0`` run (q8_0 at
  two depths: the weights' line) and ``-nkvo 1`` at two depths, below and above 3.5 MiB a copy. Each record's
  ``avg_ns``/``avg_ts`` is the median of its 5 samples (``predict_types5.medianed``). The profile is ``kvpipe calibrate
  --from-llama-bench --pageable`` on them (``validate.type_fit``: the pair as f16 plus its conversion; the staging
  curve chosen by leave-one-out, ``validate.link_fit``).
* **held out** (``HELD``): the same processes' ``r6-*-held.json``; ``--blind`` predicts them from the design (``DESIGN``,
  read from ``run6.sh``'s ``R6_TYPES``) without opening a held-out file.
* **a second machine**: ``run6/fresh/``'s ``r6f-*-held.json`` (the held-out depths on a fresh lease at ``-r 3``,
  nothing fitted), the same predictions.

Not installed with the package: run it from a checkout.
"""

from __future__ import annotations

import re
from pathlib import Path

import predict_types as pt  # beside this file (the script's folder is on sys.path)
import predict_types5 as p5

RESULTS = pt.RESULTS
RUN = RESULTS / "run6"
NAMES = ("f16", "q8_0", "q4_0", "mixed")
CALIBRATION = tuple(f"r6-{arm}-{t}-cal.json" for t in NAMES for arm in ("res", "ord"))
HELD = tuple(f"r6-{arm}-{t}-held.json" for t in NAMES for arm in ("res", "ord"))
FRESH = tuple(f"r6f-{arm}-{t}-held.json" for t in NAMES for arm in ("res", "ord"))


SCRIPT = Path(__file__).with_name("run6.sh")


def design(script: Path = SCRIPT) -> tuple[tuple[str, str, int, int], ...]:
    """The held-out (K, V, -nkvo, depth) of run6.sh's ``R6_TYPES`` rows: each arm's depths less its calibration ones."""
    out = []
    for row in re.findall(r'"(\S+ \S+ \S+ [\d,]+ [\d,]+ [\d,]+ [\d,]+)"', script.read_text()):
        _, k, v, od, oc, rd, rc = row.split()
        for nkvo, depths, cal in ((1, od, oc), (0, rd, rc)):
            out += [(k, v, nkvo, int(d)) for d in depths.split(",") if d not in cal.split(",")]
    return tuple(out)


DESIGN = design()


def run(gguf: str, hardware: str, out: Path, blind: bool) -> int:
    """Fit, then write blind.json (``blind``) or prediction.json and prediction.md against the blind run's profile.
    Blocks (the fit: minutes)."""
    out.mkdir(parents=True, exist_ok=True)
    profile, cmd, log = pt.blind_or_fit(out, blind, lambda: pt.fit(gguf, hardware, out, p5.records(RUN / "call1", CALIBRATION)))
    if blind:
        return pt.write_blind(out, "types6", profile, gguf, DESIGN, cmd, log)
    cal = p5._rows(profile, gguf, RUN / "call1", CALIBRATION, "calibration")
    held = p5._rows(profile, gguf, RUN / "call1", HELD, "held out")
    fresh = p5._rows(profile, gguf, RUN / "fresh", FRESH, "second machine")
    p5.afterwards(profile, gguf, cal + held + fresh)
    return pt.write_report(out, "types6", gguf, cmd, log, [f"run6/call1/{n}" for n in CALIBRATION],
                           "median of each run's samples (5; fresh 3)", (cal, held, fresh), "run 6", "run6/fresh")
