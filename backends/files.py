"""Reading a file a user gave: bounded, parsed with limits, every value typed on the way in.

Every file kvpipe reads from a user -- hardware profiles, model configs,
llama-bench output, study files, rows, reports, traces -- goes through this
module, so no file can exhaust memory or crash a reader:

* :func:`read_bytes` reads at most ``limit`` bytes (``/dev/zero`` or a huge
  file is refused once past it, not read to the end) and, with ``gz``,
  inflates gzip to at most ``limit`` bytes too (a gzip bomb stops there);
* :func:`parse_json` refuses what is not UTF-8, not JSON, NaN/Infinity (unless
  allowed) and nesting deeper than :data:`MAX_NESTING` levels (Python's
  parser would raise RecursionError, and code walking the data could too);
* :func:`number`, :func:`whole` and :func:`mapping` take one field of a
  parsed object and return it typed, or raise one line naming the file, the
  key, the value and what is allowed (``1e999`` is infinity in Python's JSON:
  refused as not finite).

Every failure is a one-line :class:`backends.errors.InputError`; a path is
shown as its ``repr`` so a name with a newline stays on one line.

The module also keeps the *inputs of this run*: each file read through it is
noted (:func:`note_input`), and ``sim.safe_write`` refuses to write over any of
them (:func:`input_named`: the same resolved path or the same inode), so
``--out`` can never overwrite the measurements a command is reading.
``kvpipe.cli`` clears the list at the start of each command.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from backends.errors import InputError

MIB = 1 << 20
SMALL_LIMIT = 64 * MIB  # a profile, a model config, a study, a llama-bench file
LARGE_LIMIT = 512 * MIB  # rows, reports, traces (after gzip inflates them)
MAX_NESTING = 64  # JSON arrays/objects inside each other; kvpipe's own files use 5 at most

_inputs: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) -> the path as given
_input_paths: dict[str, str] = {}  # resolved path -> the path as given


def shown(path: str | Path) -> str:
    """A path for a one-line message: its repr (a newline in a name stays ``\\n``)."""
    return repr(str(path))


def plain(path: str | Path) -> str:
    """A path as written where it is printable, else its repr: a message stays one line either way."""
    return str(path) if str(path).isprintable() else repr(str(path))


# ------------------------------------------------------------ this run's inputs


def note_input(path: str | Path) -> None:
    """Remember ``path`` as an input of this run (a file an output must not replace). Does not block."""
    if str(path) == "-":
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    _inputs[(st.st_dev, st.st_ino)] = str(path)
    _input_paths[os.path.realpath(path)] = str(path)


def clear_inputs() -> None:
    """Forget this run's inputs (``kvpipe.cli`` does, before each command)."""
    _inputs.clear()
    _input_paths.clear()


def input_named(path: str | Path) -> str | None:
    """The input of this run that ``path`` is (same inode, or same resolved path), as it was given; else None."""
    if str(path) == "-":
        return None
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and (st.st_dev, st.st_ino) in _inputs:
        return _inputs[(st.st_dev, st.st_ino)]
    return _input_paths.get(os.path.realpath(path))


# ------------------------------------------------------------------- reading


def read_bytes(path: str | Path, what: str, limit: int = SMALL_LIMIT, gz: bool = False, note: bool = True) -> bytes:
    """At most ``limit`` bytes of the file ``what`` at ``path`` (gzip inflated when ``gz``); noted as an input unless
    ``note`` is False (a file the command itself rewrites, a sweep's journal). Raises InputError (a folder, unreadable,
    too large, bad gzip). Blocks on the read."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except IsADirectoryError:
        raise InputError(f"cannot read {what} {shown(path)}: it is a folder; allowed: a file") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {shown(path)}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InputError(f"{what} {shown(path)} is larger than {limit // MIB:,} MiB; allowed: a file up to that size")
    if note:
        note_input(path)
    if gz and data[:2] == b"\x1f\x8b":
        return gunzip(data, f"{what} {shown(path)}", limit)
    return data


def gunzip(data: bytes, where: str, limit: int = LARGE_LIMIT) -> bytes:
    """Gzip ``data`` inflated to at most ``limit`` bytes. Raises InputError (not gzip, or inflating past the limit)."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(data, limit + 1)
    except zlib.error as exc:
        raise InputError(f"{where} is not valid gzip: {exc}") from None
    if len(out) > limit or inflate.unconsumed_tail:
        raise InputError(f"{where} inflates past {limit // MIB:,} MiB; allowed: up to that size")
    return out


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(raw: bytes | str, where: str, allow_nan: bool = False) -> Any:
    """JSON text (bytes: UTF-8) parsed, at most :data:`MAX_NESTING` levels deep. Raises InputError naming ``where``."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise InputError(f"{where} is not UTF-8 text") from None
    try:
        data = json.loads(text) if allow_nan else json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise InputError(f"{where} nests deeper than {MAX_NESTING} levels; allowed: at most {MAX_NESTING}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except ValueError as exc:  # NaN / Infinity: accepted by Python's json, not by JSON
        raise InputError(f"{where} is not valid JSON: {exc}") from None
    check_nesting(data, where)
    return data


def check_nesting(data: Any, where: str, limit: int = MAX_NESTING) -> None:
    """Raise InputError if ``data`` (parsed JSON) nests lists/dicts deeper than ``limit``. Walks without recursion."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                raise InputError(f"{where} nests deeper than {limit} levels; allowed: at most {limit}")
            stack += [(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)]


def load_json(path: str | Path, what: str, limit: int = SMALL_LIMIT, allow_nan: bool = False, gz: bool = False) -> Any:
    """The JSON file ``what`` at ``path``, read with :func:`read_bytes` and parsed with :func:`parse_json`.
    Raises InputError. Blocks on the read."""
    return parse_json(read_bytes(path, what, limit, gz), f"{what} {shown(path)}", allow_nan)


def load_json_object(path: str | Path, what: str, limit: int = SMALL_LIMIT) -> dict[str, Any]:
    """As :func:`load_json`, and the top level must be an object. Raises InputError."""
    data = load_json(path, what, limit)
    if not isinstance(data, dict):
        raise InputError(f"{what} {shown(path)} must hold a JSON object, not {type(data).__name__}")
    return data


# ------------------------------------------------------------- typed fields

_MISSING: Any = object()


def _get(d: Mapping[str, Any], key: str, where: str, default: Any) -> Any:
    if not isinstance(d, Mapping):
        raise InputError(f"{where}: expected an object holding {key!r}, not {type(d).__name__}")
    if key in d:
        return d[key]
    if default is _MISSING:
        raise InputError(f"{where}: missing field {key!r}")
    return default


def number(d: Mapping[str, Any], key: str, where: str, lo: float = -math.inf, hi: float = math.inf,
           default: Any = _MISSING) -> float:
    """Field ``key`` of ``d`` as a finite number in ``lo..hi`` (a bool, text or null is refused). Raises InputError
    ``where: key = value; allowed: ...``."""
    value = _get(d, key, where, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and lo <= value <= hi
    if not ok:
        raise InputError(f"{where}: {key} = {value!r}; allowed: a finite number {_span(lo, hi)}")
    return float(value)


def whole(d: Mapping[str, Any], key: str, where: str, lo: int = 0, hi: int = 1 << 53, default: Any = _MISSING) -> int:
    """Field ``key`` of ``d`` as a whole number in ``lo..hi`` (``2.0`` is 2; ``2.5``, a bool or text is refused).
    Raises InputError naming ``where`` and ``key``."""
    value = _get(d, key, where, default)
    return whole_value(value, key, where, lo, hi)


def whole_value(value: Any, key: str, where: str, lo: int = 0, hi: int = 1 << 53) -> int:
    """``value`` (field ``key`` of ``where``) as a whole number in ``lo..hi``. Raises InputError."""
    ok = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if not ok or not lo <= value <= hi:
        raise InputError(f"{where}: {key} = {value!r}; allowed: a whole number {lo:,}..{hi:,}")
    return int(value)


def mapping(d: Mapping[str, Any], key: str, where: str, default: Any = _MISSING) -> dict[str, Any]:
    """Field ``key`` of ``d`` as an object. Raises InputError naming ``where`` and ``key``."""
    value = _get(d, key, where, default)
    if not isinstance(value, dict):
        raise InputError(f"{where}: {key} must be an object, not {type(value).__name__}")
    return value


def _span(lo: float, hi: float) -> str:
    if hi == math.inf:
        return f">= {lo:g}" if lo > -math.inf else ""
    return f"{lo:g}..{hi:g}" if lo > -math.inf else f"<= {hi:g}"
