"""Every simulated figure a restructuring must not move, in one JSON file; and a comparison of two such files.

``python tools/figures_snapshot.py write OUT.json`` runs, through the CLI as a user would:

* the sweep grid: the reference preset at 51 contexts (1,024..52,224 step 1,024) x depths 0-4 x budgets
  0 / 64 / 128 / 256 MiB (1,020 points);
* the reproduction table: ``kvpipe simulate`` on the reference preset at the contexts docs/reproduction.md
  quotes, depths 0, 1, 2, 4, default budget, and the same on the H200 probe's (``h200-gen5x16-kvpipe``, kvpipe's
  kernels) and RTX 3060 presets;
* the functional hashes: ``kvpipe simulate --functional`` at depths 0, 1, 2, 4, with 3 sequences over a unified
  and a split cache, and under the mutations that change the output.

``python tools/figures_snapshot.py compare A.json B.json`` exits 1 and names the first differences unless every
number and hash is bit-identical (floats compared by their repr). Wall-clock fields are left out.

``write OUT.json --exact`` runs every command with ``--exact`` (every point and token simulated); ``compare A B --rel R
--ignore F,G`` takes floats within a relative R as equal and leaves fields F, G out: ``compare fast.json
exact.json --rel 1e-3 --ignore simulated_as,shared_with_n,tokens_simulated`` holds the fast path to the exact one.

The sweep grid's rows come from the compiled evaluator (``sim.evaluator``, ``engine: evaluator``) since issue 26; a
snapshot written before it holds them with ``compare OLD NEW --rel 1e-9 --ignore
engine,hazards,tokens_simulated,simulated_as,shared_with_n`` (every other figure stays bit-identical: ``compare OLD NEW
--ignore sweep``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WALL = {"wall_s", "sim_wall_s", "wall_ms", "events_per_s", "date"}


EXACT: list[str] = []  # ["--exact"] when writing the exact snapshot


def _kvpipe(*args: str) -> Any:
    out = subprocess.run([sys.executable, "-m", "kvpipe.cli", *args, *EXACT], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _strip(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in sorted(x.items()) if k not in WALL}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return repr(x) if isinstance(x, float) else x


def snapshot() -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "kvpipe.cli", "sweep", "--context", "1024..52224/1024", "--depth", "0..4",
                        "--budget", "0,64,128,256", "--jobs", "2", "--quiet", "--out", tmp, *EXACT], check=True,
                       capture_output=True)
        out["sweep"] = json.loads((Path(tmp) / "rows.json").read_text())
    ctx = "4096,8192,16384,19246,19332,20480,20736,32768,65536"
    out["reproduction"] = _kvpipe("simulate", "--context", ctx, "--depth", "0,1,2,4", "--json")
    out["h200"] = _kvpipe("simulate", "--hardware", "h200-gen5x16-kvpipe", "--model", "llama-3.1-8b", "--context", "4096,65536",
                          "--depth", "0,1,4", "--json")
    out["rtx3060"] = _kvpipe("simulate", "--hardware", "rtx3060-gen3x4", "--context", "4096,16384", "--depth", "0,1", "--json")
    out["functional"] = _kvpipe("simulate", "--functional", "--depth", "0,1,2,4", "--json")
    out["functional_parallel"] = [
        _kvpipe("simulate", "--functional", "--parallel", "3", *flag, "--context", "8192", "--depth", "0,2", "--json")
        for flag in ([], ["--no-kv-unified"])]
    mutated = ("simulate", "--functional", "--context", "8192", "--depth", "0,1", "--no-fail-on-hazard", "--json")
    out["functional_mutations"] = {m: _kvpipe(*mutated, "--mutate", m)
                                   for m in ("stale-prefix", "margin0,no-release-wait", "allocator-staging")}
    return _strip(out)


def _diff(a: Any, b: Any, path: str, found: list[str], rel: float = 0.0, ignore: frozenset[str] = frozenset()) -> None:
    if len(found) >= 20:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in ignore:
                _diff(a.get(k), b.get(k), f"{path}.{k}", found, rel, ignore)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", found, rel, ignore)
    elif a != b and not (rel and _close(a, b, rel)):
        found.append(f"{path}: {a!r} != {b!r}")


def _close(a: Any, b: Any, rel: float) -> bool:
    """Two float reprs within ``rel`` of each other (relative to the larger)."""
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return False
    return abs(x - y) <= rel * max(abs(x), abs(y))


def main(argv: list[str]) -> int:
    if len(argv) in (2, 3) and argv[0] == "write" and argv[2:] in ([], ["--exact"]):
        EXACT[:] = argv[2:]
        Path(argv[1]).write_text(json.dumps(snapshot(), indent=0, sort_keys=True))
        return 0
    if len(argv) >= 3 and argv[0] == "compare":
        opts = dict(zip(argv[3::2], argv[4::2], strict=False))
        if len(argv[3:]) % 2 or set(opts) - {"--rel", "--ignore"}:
            return _usage()
        found: list[str] = []
        rel = float(opts.get("--rel", 0.0))
        ignore = frozenset(f for f in opts.get("--ignore", "").split(",") if f)
        _diff(json.loads(Path(argv[1]).read_text()), json.loads(Path(argv[2]).read_text()), "", found, rel, ignore)
        print("\n".join(found) if found else ("bit-identical" if not rel else f"identical within {rel:g}"))
        return 1 if found else 0
    return _usage()


def _usage() -> int:
    print("usage: python tools/figures_snapshot.py write OUT.json [--exact] | compare A.json B.json [--rel R] [--ignore F,G]",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
