"""Issues 30 and 28, run 7: every cache type on the H200, each ordered configuration in its own llama-bench process.

``python tools/llamacpp/predict.py --set types7 --gguf GGUF [--blind]`` (this module does the work; the campaign's
design is tools/llamacpp/README-run7.md, committed before it ran):

* **calibration** (``CALIBRATION``): run 7's ``r7-ord-*-cal.json`` (one process, one depth each: per cache type f16,
  q8_0, q4_0 and the q8_0/q4_0 pair two depths, copies near 1.3-1.5 and 5.6-6.5 MiB) and ``r7-res-*-cal.json`` (the
  resident processes' calibration rows, ``split_roles``: q8_0 at 1,024 and 16,384, the others at 8,192), each
  record's ``avg_ns``/``avg_ts`` the median of its 5 samples. The profile is ``kvpipe calibrate --from-llama-bench
  --pageable`` on them, the models of run 6 unchanged.
* **held out** (``HELD``): ``r7-ord-*-held.json`` and ``r7-res-*-held.json``; ``--blind`` predicts them from the design
  (``DESIGN``, read from ``run7.sh``'s ``R7_ORD`` and ``R7_RES``) without opening a held-out file.
* **a second machine**: ``run7/fresh/``'s ``r7f-*-held.json`` (the held-out configurations on a fresh lease, one process
  each, ``-r 3``; nothing fitted), the same predictions.

Files sit in ``run7/call1`` or ``run7/call2`` (what call 1 left, call 2 ran): each is read from the one holding it.
Not installed with the package: run it from a checkout.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import predict_types as pt  # beside this file (the script's folder is on sys.path)
import predict_types5 as p5

RESULTS = pt.RESULTS
RUN = RESULTS / "run7"
CALLS = (RUN / "call1", RUN / "call2")
SCRIPT = Path(__file__).with_name("run7.sh")
NAMES = ("f16", "q8_0", "q4_0", "mixed")


def _ordered(script: Path) -> list[tuple[str, str, str, int, str]]:
    """run7.sh's ``R7_ORD`` rows: (name, K, V, depth, role), in run order."""
    return [(n, k, v, int(d), role) for n, k, v, d, role in re.findall(r'"(\S+) (\S+) (\S+) (\d+) (cal|held)"', script.read_text())]


def _resident(script: Path) -> list[tuple[str, str, str, list[int], list[int]]]:
    """run7.sh's ``R7_RES`` rows: (name, K, V, depths, calibration depths)."""
    return [(n, k, v, [int(x) for x in d.split(",")], [int(x) for x in c.split(",")])
            for n, k, v, d, c in re.findall(r'"(\S+) (\S+) (\S+) ([\d,]+) ([\d,]+)"', script.read_text())]


def design(script: Path = SCRIPT) -> tuple[tuple[str, str, int, int], ...]:
    """The held-out (K, V, -nkvo, depth) of run7.sh: the ordered ``held`` processes, then each resident process's depths
    less its calibration ones."""
    out = [(k, v, 1, d) for _, k, v, d, role in _ordered(script) if role == "held"]
    out += [(k, v, 0, d) for _, k, v, ds, cal in _resident(script) for d in ds if d not in cal]
    return tuple(out)


DESIGN = design()
CALIBRATION = tuple(f"r7-ord-{n}-d{d}-cal.json" for n, _, _, d, role in _ordered(SCRIPT) if role == "cal") + \
    tuple(f"r7-res-{n}-cal.json" for n in NAMES)
HELD = tuple(f"r7-ord-{n}-d{d}-held.json" for n, _, _, d, role in _ordered(SCRIPT) if role == "held") + \
    tuple(f"r7-res-{n}-held.json" for n in NAMES)
FRESH = tuple(n.replace("r7-", "r7f-", 1) for n in HELD)


def _folder(name: str, folders: tuple[Path, ...] = CALLS) -> Path:
    """The call folder holding ``name`` (the last one that has it; the first when none does)."""
    return next((f for f in reversed(folders) if (f / name).exists()), folders[0])


def calibration_records() -> list[dict[str, Any]]:
    """Every calibration record, medianed, in CALIBRATION's order. Reads files only."""
    return [r for n in CALIBRATION for r in p5.records(_folder(n), (n,))]


def _rows(profile: dict[str, Any], gguf: str, names: tuple[str, ...], role: str, folders: tuple[Path, ...] = CALLS) -> list[dict[str, Any]]:
    return [r for n in names for r in p5._rows(profile, gguf, _folder(n, folders), (n,), role)]


def run(gguf: str, hardware: str, out: Path, blind: bool) -> int:
    """Fit, then write blind.json (``blind``) or prediction.json and prediction.md against the blind run's profile.
    Blocks (the fit: minutes)."""
    out.mkdir(parents=True, exist_ok=True)
    profile, cmd, log = pt.blind_or_fit(out, blind, lambda: pt.fit(gguf, hardware, out, calibration_records()))
    if blind:
        return pt.write_blind(out, "types7", profile, gguf, DESIGN, cmd, log)
    cal = _rows(profile, gguf, CALIBRATION, "calibration")
    held = _rows(profile, gguf, HELD, "held out")
    fresh = _rows(profile, gguf, FRESH, "second machine", (RUN / "fresh",))
    p5.afterwards(profile, gguf, cal + held + fresh)
    return pt.write_report(out, "types7", gguf, cmd, log, [f"{_folder(n).relative_to(RESULTS)}/{n}" for n in CALIBRATION],
                           "median of each run's samples (5; fresh 3)", (cal, held, fresh), "run 7", "run7/fresh")
