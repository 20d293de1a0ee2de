"""A study file: the command lines of a planning job, written down once as TOML.

A study names a grid -- models, hardware, cache types, contexts, depths,
budgets, sequences, ``-nkvo``, tokens -- and the outputs to make from it, one
table per command (``[plan]``, ``[simulate]``, ``[sweep]``, ``[plot]``). It
is not a second front end: :func:`load` turns it into the ``kvpipe`` command
lines it stands for (:class:`Task`), and ``kvpipe run`` hands those to the
commands' own parsers and ``run`` functions. So a study accepts exactly what
the flags accept, and a bad value gets the flag's own message. This module
checks only what TOML adds: the keys (an unknown one is named with the
allowed ones), the shape of a value (a scalar or a flat list), true/false for
switches, and the choice of ``format``.

The translation, key by key:

* a list becomes the flag's comma list, a string is passed as written (so
  ``"1024..65536/1024"`` ranges and ``"4096,8192"`` lists work too), a number
  as its text; a key left out leaves the flag out, so the command's default holds;
* a switch (``pageable``, ``quiet``) is the flag when true;
* model files, hardware profiles and every output path are taken from the
  study file's folder, not the working directory (presets stay names);
* the grid at the top is shared by every table; a table may set a grid key for
  itself. ``plan`` takes only the grid keys it has flags for
  (:data:`PLAN_GRID`), the other tables take them all;
* ``[plot] kinds`` runs ``kvpipe plot KIND`` once per kind, into ``out/KIND``.

Tasks run in the order plan, simulate, sweep, plot (a plot may read the
sweep's rows). :data:`EXAMPLE` is the commented example ``kvpipe run
--print-example`` prints (and ``docs/examples/study.toml`` holds).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.files import plain, read_bytes
from sim.errors import InputError

VERSION = 1


@dataclass(frozen=True)
class Key:
    """How one study key becomes flag text: ``text`` (a value or comma list), ``paths`` (comma list, files
    taken from the study's folder), ``path`` (one output or input file, likewise) or ``switch`` (the flag when true)."""

    flag: str
    kind: str = "text"


#: The grid (top level): study key -> the long flag it becomes (one every command that takes it shares).
GRID: dict[str, Key] = {
    "models": Key("--model", "paths"),
    "hardware": Key("--hardware", "paths"),
    "cache_types_k": Key("--cache-type"),
    "cache_types_v": Key("--cache-type-v"),
    "contexts": Key("--context"),
    "depths": Key("--depth"),
    "budgets_mib": Key("--kv-pipeline-budget"),  # simulate's --budget, plan's --default-budget
    "sequences": Key("--parallel"),
    "nkvo": Key("--no-kv-offload"),
    "tokens": Key("--tokens"),
    "pageable": Key("--pageable", "switch"),
    "exact": Key("--exact", "switch"),  # every point and token simulated (default: the fast path)
}
#: The grid keys ``kvpipe plan`` has flags for (one model, hardware and cache type; it searches the depths itself).
PLAN_GRID = ("models", "hardware", "cache_types_k", "contexts", "budgets_mib", "tokens", "pageable", "exact")
#: ``format`` of a table whose standard output is the result: value -> the flags it adds.
FORMATS = {"json": ("--json",), "table": ()}
#: The keys a table has beside its command's flags, by where its ``out`` goes.
EXTRA = {"stdout": ("out", "format"), "flag": ("out",), "prefix": ("out", "kinds")}
ORDER = ("plan", "simulate", "sweep", "plot")


@dataclass(frozen=True)
class Table:
    """One output table: the grid keys it takes, its own keys, where ``out`` goes and its default."""

    grid: tuple[str, ...]
    own: Mapping[str, Key]
    out: str  # "stdout": the command's standard output is written to ``out``; "flag": --out; "prefix": plot's
    default_out: str = "-"


TABLES: dict[str, Table] = {
    "plan": Table(PLAN_GRID, {"max_depth": Key("--max-depth"), "budget_for_gain": Key("--budget-for-gain"),
                              "jobs": Key("--jobs"), "llama_cpp": Key("--llama-cpp", "switch")}, "stdout"),
    "simulate": Table(tuple(GRID), {"csv": Key("--csv", "path"), "trace": Key("--trace", "path")}, "stdout"),
    "sweep": Table(tuple(GRID), {"jobs": Key("--jobs"), "quiet": Key("--quiet", "switch"), "resume": Key("--resume", "switch")},
                   "flag", "out/sweep"),
    "plot": Table(tuple(GRID), {"format": Key("--format"), "rows": Key("--rows", "path"), "jobs": Key("--jobs")},
                  "prefix", "out/plots"),
}


@dataclass(frozen=True)
class Task:
    """One command a study stands for: ``kvpipe ARGV`` with its standard output sent to ``out`` (``-``: left alone)."""

    section: str
    argv: tuple[str, ...]
    out: str = "-"

    def command_line(self) -> str:
        """The shell line that does the same thing."""
        line = shlex.join(["kvpipe", *self.argv])
        return line if self.out == "-" else f"{line} > {shlex.quote(self.out)}"


def load(path: str | Path) -> list[Task]:
    """The tasks of the study file at ``path``, in run order. Raises InputError (one line) on a missing or
    unreadable file, a TOML syntax error (``file:line: reason``) or a key, shape or choice TOML adds. Blocks on the read."""
    where = str(path)
    raw = read_bytes(path, "study")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise InputError(f"study {where!r} is not UTF-8 text") from None
    return tasks(parse_toml(text, plain(where)), Path(path).absolute().parent, plain(where))


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """TOML text as a dict. Raises InputError ``where:line: reason`` on a syntax error."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise InputError("kvpipe run reads TOML with the standard library's tomllib: Python 3.11 or newer") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        at = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
        if at:
            raise InputError(f"{where}:{at[1]}: {msg[:at.start()]} (column {at[2]})") from None
        end = msg.removesuffix(" (at end of document)")
        raise InputError(f"{where}:{text.count(chr(10)) + 1}: {end} (at the end of the file)") from None


def tasks(study: Mapping[str, Any], base: Path, where: str = "study") -> list[Task]:
    """The tasks of a parsed study; relative paths are taken from ``base``. Raises InputError ``where: reason``."""
    try:
        return _tasks(study, base)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _tasks(study: Mapping[str, Any], base: Path) -> list[Task]:
    _known(study, ["version", *GRID, *TABLES], "", tables=tuple(TABLES))
    if study.get("version", VERSION) != VERSION:
        raise InputError(f"version {study['version']!r} is not supported; allowed: {VERSION}")
    grid = {k: v for k, v in study.items() if k in GRID}
    chosen = [name for name in ORDER if name in study]
    if not chosen:
        raise InputError(f"the study runs nothing; add a table: {', '.join(f'[{t}]' for t in ORDER)}")
    out: list[Task] = []
    for name in chosen:
        table = study[name]
        if not isinstance(table, dict):
            raise InputError(f"{name} must be a table [{name}], not {table!r}")
        out += _table_tasks(name, table, grid, base)
    return out


def _table_tasks(name: str, table: dict[str, Any], grid: dict[str, Any], base: Path) -> list[Task]:
    spec = TABLES[name]
    extra = EXTRA[spec.out]
    _known(table, [*extra, *spec.own, *spec.grid], name)
    values = {**{k: v for k, v in grid.items() if k in spec.grid}, **table}
    argv: list[str] = []
    for key, value in values.items():
        if key in extra:
            continue
        argv += _argv(f"{name}.{key}" if key in table else key, GRID.get(key) or spec.own[key], value, base)
    out = _path(f"{name}.out", values.get("out", spec.default_out), base, stdout=spec.out == "stdout")
    if spec.out == "flag":
        return [Task(name, (name, *argv, f"--out={out}"))]
    if spec.out == "stdout":
        fmt = values.get("format", "table")
        if not isinstance(fmt, str) or fmt not in FORMATS:
            raise InputError(f"{name}.format = {fmt!r} is not valid; allowed: {', '.join(map(repr, FORMATS))}")
        return [Task(name, (name, *argv, *FORMATS[fmt]), out)]
    kinds = _text(f"{name}.kinds", values.get("kinds", "all")).split(",")
    return [Task(name, (name, kind, *argv, f"--out={Path(out) / kind}")) for kind in kinds]


def _known(table: Mapping[str, Any], allowed: list[str], section: str, tables: tuple[str, ...] = ()) -> None:
    for key in table:
        if key not in allowed:
            keys = ", ".join(k for k in allowed if k not in tables)
            keys += "; tables " + ", ".join(f"[{t}]" for t in tables) if tables else ""
            raise InputError(f"unknown key {key!r}{f' in [{section}]' if section else ''}; allowed: {keys}")


def _argv(key: str, spec: Key, value: Any, base: Path) -> list[str]:
    """The flag a study value stands for (``--flag=TEXT``, so a value starting with '-' stays a value)."""
    if spec.kind == "switch":
        if not isinstance(value, bool):
            raise InputError(f"{key} = {value!r}: expected true or false ({spec.flag})")
        return [spec.flag] if value else []
    if spec.kind == "path":
        return [f"{spec.flag}={_path(key, value, base, stdout=True)}"]
    text = _text(key, value)
    if spec.kind == "paths":  # comma list; a hardware item may join devices with '+'
        text = ",".join("+".join(_maybe_file(part, base) for part in item.split("+")) for item in text.split(","))
    return [f"{spec.flag}={text}"]


def _text(key: str, value: Any) -> str:
    """A TOML scalar as its text, a flat list as a comma list."""
    items = value if isinstance(value, list) else [value]
    for v in items:
        if isinstance(v, dict | list):
            raise InputError(f"{key}: expected a value or a flat list, not {value!r}")
    return ",".join(str(v) for v in items)


def _path(key: str, value: Any, base: Path, stdout: bool = False) -> str:
    """A file or folder, taken from ``base`` when relative; ``-`` (standard output) where ``stdout``."""
    if not isinstance(value, str) or not value or (value == "-" and not stdout):
        raise InputError(f"{key} = {value!r}: expected a path (a string){'' if stdout else ', not standard output'}")
    return value if value == "-" or Path(value).is_absolute() else str(base / value)


def _maybe_file(item: str, base: Path) -> str:
    """A model or hardware item: a file (a '/', or a .gguf / .json name) is taken from ``base``; a preset stays a name."""
    is_file = "/" in item or Path(item).suffix in (".gguf", ".json")
    return str(base / item) if is_file and not Path(item).is_absolute() else item


EXAMPLE = """\
# A kvpipe study: the command lines of a planning job, written down once.
#   kvpipe run study.toml              run it
#   kvpipe run study.toml --dry-run    print the equivalent kvpipe commands, check every value, run nothing
#
# Each key stands for a flag and takes exactly what the flag takes, checked by the same code:
# a list becomes the flag's comma list, a string is passed as written ("4096..65536/4096"
# ranges, "4096,8192" lists), a key left out keeps the flag's default. Relative paths (model
# files, hardware profiles, outputs) are taken from this file's folder.

version = 1

# The grid, shared by every table below (a table may set one of these keys for itself).
models = ["qwen3.8-27b"]        # --model: presets, .gguf files (header only) or Hugging Face config.json
hardware = ["rtx4070-gen4x16"]  # --hardware: presets or profile .json (kvpipe calibrate); "a+b" for two devices
cache_types_k = ["q8_0"]        # --cache-type / -ctk
# cache_types_v = ["q8_0"]      # --cache-type-v / -ctv (default: the K type)
contexts = [4096, 16384]        # --context / -d: tokens already cached, or a range "4096..32768/4096"
depths = "0..1"                 # --depth / -kvpd: 0 = ordered, 1.. = pipelined look-ahead
budgets_mib = [128]             # --kv-pipeline-budget / -kvpb: ring budget per device, MiB (0 = no cap)
sequences = [1]                 # --parallel / -np: sequences decoding at once
nkvo = [1]                      # --no-kv-offload / -nkvo: 1 = cache in host memory, 0 = on the device
tokens = 2                      # --tokens: decode tokens simulated per point
pageable = false                # --pageable: host cache in pageable memory (default pinned)

# The outputs: each table runs one command, in this order; leave a table out to skip it.

[plan]                          # kvpipe plan: depth and budget per context (one model, hardware and cache type)
out = "out/plan.txt"            # a file, or "-" for standard output (the default)
format = "table"                # "table" or "json" (--json)
max_depth = 2                   # --max-depth: deepest look-ahead tried
jobs = 1                        # --jobs: worker processes (0 = all cores)
# budget_for_gain = 0.9         # --budget-for-gain
# llama_cpp = true              # --llama-cpp: also llama.cpp's flags per context

[simulate]                      # kvpipe simulate: one row per grid point
out = "out/rows.json"
format = "json"
# csv = "out/rows.csv"          # --csv
# trace = "out/trace.json"      # --trace: open in ui.perfetto.dev

[sweep]                         # kvpipe sweep: the grid in parallel, resumable
out = "out/sweep"               # --out: a folder (rows.json, rows.csv, the rows.jsonl journal)
jobs = 1                        # --jobs (0 = all cores)
quiet = true                    # --quiet: no progress bar
# resume = true                 # --resume: add this grid's points to a folder that holds another grid's sweep
# contexts = "1024..65536/1024" # a grid key set here is for this table only

[plot]                          # kvpipe plot KIND, once per kind
kinds = ["gain-vs-depth"]       # gain-vs-depth, gain-vs-context, gain-per-mib, ring-vs-context, tps-vs-context, timeline, xy, all
out = "out/plots"               # a folder: KIND.png / KIND.svg
format = ["svg"]                # --format: png, svg
rows = "out/sweep/rows.json"    # --rows: the sweep's rows (leave out to simulate the grid again)
"""
