"""Read llama-bench output (``-o json`` or ``-o jsonl``) into decode runs kvpipe can fit and check.

llama-bench writes one record per test: the build (``build_commit``,
``build_number``), the machine (``gpu_info``, ``cpu_info``, ``backends``), the
model (``model_type``, ``model_size`` in bytes, ``model_n_params``), the
settings (``n_gpu_layers``: llama-bench's ``-ngl``, per test, ``type_k``, ``type_v``, ``no_kv_offload``,
``flash_attn``, ``n_prompt``, ``n_gen``, ``n_depth``) and the result
(``avg_ts``, ``stddev_ts``, ``samples_ts``; ``avg_ns`` per test, whose mean over
``n_gen`` is the seconds per token kvpipe fits: a mean time, where ``avg_ts`` is
a mean of rates). A decode test
is ``n_prompt == 0`` and ``n_gen > 0``: ``n_gen`` tokens generated behind
``n_depth`` cached ones; a prompt test (``n_gen == 0``) is skipped.

:func:`load` refuses, with one line naming the file and the value, a file that
is not llama-bench output, mixed builds, models or GPUs, and unknown cache
types. Runs at several ``-ngl`` are kept apart (``BenchRun.n_gpu_layers``):
those with layers on the CPU calibrate the CPU-layer cost
(``validate.cpu_layers``). Which depths a fit needs is the fit's
business (``validate.token_fit``). Pure: reads one file, does not block
beyond that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.files import parse_json, read_bytes, shown, whole
from sim.errors import InputError
from sim.workload import CACHE_TYPES, MAX_CONTEXT

#: Fields every record must have (``-o json`` and ``-o jsonl`` write the same ones).
REQUIRED = ("build_commit", "model_type", "model_size", "model_n_params", "n_gpu_layers", "type_k", "type_v",
            "no_kv_offload", "n_prompt", "n_gen", "n_depth", "avg_ts")
#: Bounds of llama-bench's counts (past them a value is a typo or a hostile file, not a test).
MAX_COUNTS = {"n_depth": MAX_CONTEXT, "n_prompt": MAX_CONTEXT, "n_gen": 1 << 20, "n_gpu_layers": 1 << 16}
ALLOWED_FORMAT = "llama-bench -o json (an array of records) or -o jsonl (one record a line)"


@dataclass(frozen=True)
class BenchRun:
    """One decode test: ``n_gen`` tokens behind ``depth`` cached ones, t/s as llama-bench measured them."""

    depth: int
    n_gen: int
    kv_offload_host: bool  # llama-bench no_kv_offload: the cache in host memory
    type_k: str
    type_v: str
    avg_tps: float
    stddev_tps: float
    samples_tps: tuple[float, ...]
    avg_ns: float = 0.0  # mean nanoseconds of one test's n_gen tokens (0: not in the file)
    n_gpu_layers: int = 99  # llama-bench's -ngl as written (the output layer counts as the last layer)

    @property
    def seconds_per_token(self) -> float:
        """Mean seconds per generated token: avg_ns / n_gen (the mean time), else 1 / avg_ts (the mean of the rates)."""
        return self.avg_ns * 1e-9 / self.n_gen if self.avg_ns > 0 else 1.0 / self.avg_tps

    @property
    def arm(self) -> str:
        """kvpipe's arm: ``ordered`` (-nkvo 1, host cache) or ``resident`` (-nkvo 0)."""
        return "ordered" if self.kv_offload_host else "resident"


@dataclass(frozen=True)
class BenchFile:
    """The decode runs of one llama-bench file, and what they ran on."""

    path: str
    runs: tuple[BenchRun, ...]
    build_commit: str
    build_number: int
    gpu_info: str
    model_type: str
    model_size_bytes: int
    model_n_params: int
    n_gpu_layers: int  # the largest -ngl of the file's runs
    flash_attn: Any
    model_filename: str
    cpu_info: str = ""  # llama-bench's cpu_info (the host's CPU model), or each distinct one joined by " | "

    @property
    def machine(self) -> dict[str, str]:
        """What llama-bench says of the machine that ran the file: ``cpu_info`` and ``gpu_info``. Pure."""
        return {"cpu_info": self.cpu_info, "gpu_info": self.gpu_info}

    def cache_types(self) -> list[tuple[str, str]]:
        """The (K, V) cache types present, in file order."""
        out: list[tuple[str, str]] = []
        for r in self.runs:
            if (r.type_k, r.type_v) not in out:
                out.append((r.type_k, r.type_v))
        return out



def _records(path: Path) -> list[Any]:
    what = "--from-llama-bench"
    text = read_bytes(path, what).decode(errors="replace")
    stripped = text.strip()
    if not stripped:
        raise InputError(f"{what} {shown(path)} is empty; allowed: {ALLOWED_FORMAT}")
    if stripped[0] == "[":
        data = parse_json(stripped, f"{what} {shown(path)}")
        return data if isinstance(data, list) else [data]
    out = []
    for n, line in enumerate(stripped.splitlines(), 1):
        if line.strip():
            out.append(parse_json(line, f"{what} {shown(path)} line {n}"))
    return out


def _number(rec: dict[str, Any], key: str, where: str, kind: type = float) -> Any:
    if kind is int:
        return whole(rec, key, where, -1 if key == "n_gpu_layers" else 0, MAX_COUNTS.get(key, 1 << 53))
    value = rec[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"{where}: {key} {value!r} is not a finite number; allowed: llama-bench's numbers")
    return kind(value)


def _one(records: list[dict[str, Any]], key: str, path: str, what: str) -> Any:
    values = list(dict.fromkeys(str(r.get(key, "")) for r in records))
    if len(values) > 1:
        raise InputError(f"--from-llama-bench {path!r} mixes {what} ({key} {', '.join(repr(v) for v in values)}); "
                         f"allowed: one {what} a file (split it, or rerun llama-bench)")
    return records[0].get(key, "")


def load(path: str | Path) -> BenchFile:
    """The decode runs of a llama-bench file. Raises InputError (one line) on anything else. Reads the file."""
    p = Path(path)
    where = str(p)
    records = _records(p)
    recs: list[dict[str, Any]] = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise InputError(f"--from-llama-bench {where!r} record {i}: {type(rec).__name__}, not a test record; allowed: {ALLOWED_FORMAT}")
        missing = [k for k in REQUIRED if k not in rec]
        if missing:
            raise InputError(f"--from-llama-bench {where!r} record {i} has no {missing[0]!r}: not llama-bench output; "
                             f"allowed: {ALLOWED_FORMAT}")
        recs.append(rec)
    named = f"--from-llama-bench {where!r}"
    decode = [r for i, r in enumerate(recs)
              if _number(r, "n_gen", f"{named} record {i}", int) > 0 and _number(r, "n_prompt", f"{named} record {i}", int) == 0]
    if not decode:
        raise InputError(f"--from-llama-bench {where!r} has no decode test (n_prompt 0, n_gen > 0); allowed: llama-bench -p 0 -n N")
    for key, what in (("build_commit", "builds"), ("model_type", "models"), ("model_size", "models"),
                      ("model_n_params", "models"), ("gpu_info", "GPUs")):
        _one(decode, key, where, what)
    runs = []
    for i, r in enumerate(decode):
        at = f"--from-llama-bench {where!r} test {i} (-d {r.get('n_depth')})"
        tk, tv = str(r["type_k"]), str(r["type_v"])
        for name, t in (("type_k", tk), ("type_v", tv)):
            if t not in CACHE_TYPES:
                raise InputError(f"{at}: {name} {t!r} unsupported; allowed: {', '.join(CACHE_TYPES)}")
        tps = _number(r, "avg_ts", at)
        depth = int(_number(r, "n_depth", at, int))
        if tps <= 0 or depth < 0:
            raise InputError(f"{at}: avg_ts {tps:g} and n_depth {depth}; allowed: avg_ts > 0, n_depth >= 0")
        samples = tuple(float(s) for s in r.get("samples_ts") or () if isinstance(s, int | float) and math.isfinite(s))
        nkvo = r["no_kv_offload"]
        if not isinstance(nkvo, bool | int):
            raise InputError(f"{at}: no_kv_offload {nkvo!r}; allowed: true or false")
        stddev = r.get("stddev_ts", 0.0)
        avg_ns = r.get("avg_ns", 0)
        avg_ns = float(avg_ns) if isinstance(avg_ns, int | float) and not isinstance(avg_ns, bool) and math.isfinite(avg_ns) else 0.0
        ngl = int(_number(r, "n_gpu_layers", at, int))
        if ngl < 0:
            raise InputError(f"{at}: n_gpu_layers {ngl}; allowed: >= 0 (llama-bench -ngl)")
        runs.append(BenchRun(depth=depth, n_gen=_number(r, "n_gen", at, int), kv_offload_host=bool(nkvo), type_k=tk, type_v=tv,
                             avg_tps=tps, stddev_tps=float(stddev) if isinstance(stddev, int | float) else 0.0,
                             samples_tps=samples, avg_ns=max(avg_ns, 0.0), n_gpu_layers=ngl))
    first = decode[0]
    return BenchFile(
        path=where, runs=tuple(runs), build_commit=str(first["build_commit"]),
        build_number=int(first.get("build_number", 0) or 0), gpu_info=str(first.get("gpu_info", "")),
        model_type=str(first["model_type"]), model_size_bytes=_number(first, "model_size", named, int),
        model_n_params=_number(first, "model_n_params", named, int), n_gpu_layers=max(r.n_gpu_layers for r in runs),
        flash_attn=first.get("flash_attn"), model_filename=str(first.get("model_filename", "")),
        cpu_info=" | ".join(dict.fromkeys(str(r.get("cpu_info", "")) for r in decode)),
    )
