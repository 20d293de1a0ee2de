"""Read llama-batched-bench output (its markdown table or ``--output-format jsonl``) into decode rows kvpipe can fit.

llama.cpp's ``llama-batched-bench`` prefills ``B`` prompts of ``PP`` tokens
(one sequence each; with ``-pps`` one prompt shared by all), then decodes
``TG`` steps in which every sequence generates one token, and prints a row
per (PP, TG, B): ``PP TG B N_KV T_PP S_PP T_TG S_TG T S`` in its markdown
table, or the JSONL keys ``n_kv_max n_batch n_ubatch flash_attn
is_pp_shared n_gpu_layers n_threads n_threads_batch pp tg pl n_kv t_pp
speed_pp t_tg speed_tg t speed`` (``B`` is ``pl``). The decode rate is
``S_TG = B x TG / T_TG`` tokens per second over all sequences, so one step
of the batch takes ``B / S_TG`` seconds; that step is what kvpipe fits
(``validate.batch_fit``), behind the step's mean context ``PP + TG / 2``.
The markdown's settings line (``n_kv_max = ..., n_batch = ...``) is read
when present; a bare table is accepted.

Neither form records ``-nkvo``, ``-kvu``, the cache types or the model:
the command takes them (:func:`token_runs`).

:func:`load` refuses, with one line naming the file and the value, a file
that holds no such row, a row with a bad number, a shared prompt (``-pps``:
one prompt's cells serve every sequence, which kvpipe's cache layout does
not model), sequences decoded one at a time (``-tgs``) and a file mixing
settings. Pure: reads one file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.files import parse_json, read_bytes, shown, whole
from sim.errors import InputError
from sim.workload import ALL_LAYERS, MAX_CONTEXT, pad_rows
from validate.token_fit import TokenRun

WHAT = "--from-batched-bench"
ALLOWED = "llama-batched-bench's markdown table or its --output-format jsonl"
#: The markdown table's columns, in order (llama.cpp tools/batched-bench).
COLUMNS = ("PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s")
#: JSONL keys a row needs (the others are kept when present).
REQUIRED = ("pp", "tg", "pl", "n_kv", "t_tg", "speed_tg")
SETTINGS = ("n_kv_max", "n_batch", "n_ubatch", "flash_attn", "is_pp_shared", "is_tg_separate", "n_gpu_layers", "n_threads",
            "n_threads_batch")
MAX_SEQUENCES = 256  # sim.workload's --parallel bound
MAX_TG = 1 << 20


@dataclass(frozen=True)
class BatchedRow:
    """One (PP, TG, B) row: ``sequences`` prompts of ``prompt_tokens`` each, then ``gen_tokens`` decode steps."""

    prompt_tokens: int  # PP
    gen_tokens: int  # TG: decode steps, one token per sequence each
    sequences: int  # B (pl)
    n_kv: int  # N_KV: cells the row needed
    decode_s: float  # T_TG: seconds of the TG steps
    decode_tps: float  # S_TG: tokens per second over all sequences (B x TG / T_TG)

    @property
    def seconds_per_step(self) -> float:
        """Seconds one decode step of all ``sequences`` takes: B / S_TG (= T_TG / TG)."""
        return self.sequences / self.decode_tps

    @property
    def context(self) -> int:
        """Tokens cached per sequence at the middle of the decode steps: PP + TG / 2 (as llama-bench's -d + n / 2)."""
        return self.prompt_tokens + self.gen_tokens // 2


@dataclass(frozen=True)
class BatchedFile:
    """The rows of one llama-batched-bench file and the settings it recorded (-1: not recorded)."""

    path: str
    form: str  # "jsonl" or "markdown"
    rows: tuple[BatchedRow, ...]
    settings: tuple[tuple[str, int], ...]  # (name, value) of SETTINGS the file recorded

    def setting(self, name: str, default: int = -1) -> int:
        """A recorded setting (``n_kv_max``, ``n_gpu_layers`` ...), or ``default``."""
        return dict(self.settings).get(name, default)


def _row(rec: dict[str, Any], where: str) -> BatchedRow:
    pp = whole(rec, "pp", where, 0, MAX_CONTEXT)
    tg = whole(rec, "tg", where, 1, MAX_TG)
    pl = whole(rec, "pl", where, 1, MAX_SEQUENCES)
    n_kv = whole(rec, "n_kv", where, 1, MAX_SEQUENCES * (MAX_CONTEXT + MAX_TG))
    t_tg, speed = (_positive(rec, k, where) for k in ("t_tg", "speed_tg"))
    if n_kv != pl * (pp + tg):  # llama-batched-bench: N_KV = B (PP + TG) unless the prompt is shared
        raise InputError(f"{where}: n_kv {n_kv} is not pl x (pp + tg) = {pl * (pp + tg)}: a shared prompt (-pps); allowed: "
                         "runs without -pps (one prompt per sequence), which is what kvpipe's cache layout models")
    return BatchedRow(prompt_tokens=pp, gen_tokens=tg, sequences=pl, n_kv=n_kv, decode_s=t_tg, decode_tps=speed)


def _positive(rec: dict[str, Any], key: str, where: str) -> float:
    value = rec.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{where}: {key} {value!r}; allowed: a finite number > 0 (llama-batched-bench's own figure)")
    return float(value)


def _markdown(lines: list[str], where: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The table's rows as JSONL-keyed records, and the settings line's values."""
    settings: dict[str, Any] = {}
    for line in lines:
        if "n_kv_max =" in line:
            settings = {k: int(v) for k, v in re.findall(r"(\w+) = (-?\d+)", line)}
            break
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    start = next((i for i, c in enumerate(cells) if tuple(c) == COLUMNS), None)
    if start is None:
        raise InputError(f"{WHAT} {where} is not llama-batched-bench output (no JSON row, no table with the columns "
                         f"{' '.join(COLUMNS)}); allowed: {ALLOWED}")
    keys = ("pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed")
    out = []
    for n, c in enumerate(cells[start + 1:], start + 2):
        if not lines[n - 1].lstrip().startswith("|"):
            break  # the table ended
        if set("".join(c)) <= set("-: "):
            continue  # the separator row
        if len(c) != len(COLUMNS):
            raise InputError(f"{WHAT} {where} line {n}: {len(c)} cells; allowed: the table's {len(COLUMNS)} ({ALLOWED})")
        rec: dict[str, Any] = {}
        for key, text in zip(keys, c, strict=True):
            try:
                rec[key] = int(text) if key in ("pp", "tg", "pl", "n_kv") else float(text)
            except ValueError:
                raise InputError(f"{WHAT} {where} line {n}: {key} {text!r} is not a number; allowed: {ALLOWED}") from None
        out.append(rec)
    return out, settings


def _jsonl(lines: list[str], where: str) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("{"):
            try:
                rec = parse_json(line, f"{WHAT} {where} line {n}")
            except InputError as exc:
                raise InputError(f"{exc}; allowed: {ALLOWED}") from None
            if not isinstance(rec, dict):
                raise InputError(f"{WHAT} {where} line {n}: not a JSON object; allowed: {ALLOWED}")
            missing = [k for k in REQUIRED if k not in rec]
            if missing:
                raise InputError(f"{WHAT} {where} line {n} has no {missing[0]!r}: not llama-batched-bench output; "
                                 f"allowed: {ALLOWED}")
            out.append(dict(rec, _line=n))
    return out


def load(path: str | Path) -> BatchedFile:
    """The rows of a llama-batched-bench file. Raises InputError (one line) on anything else. Reads the file."""
    where = shown(path)
    text = read_bytes(Path(path), WHAT).decode(errors="replace")
    lines = text.splitlines()
    recs = _jsonl(lines, where)
    form = "jsonl"
    settings: dict[str, Any] = {}
    if not recs:
        form = "markdown"
        recs, settings = _markdown(lines, where)
    if not recs:
        raise InputError(f"{WHAT} {where} has no row (no JSON line, an empty table); allowed: {ALLOWED}")
    for key in SETTINGS:  # one run a file: every JSONL record carries the same settings
        values = {str(r.get(key)) for r in recs if key in r}
        if len(values) > 1:
            raise InputError(f"{WHAT} {where} mixes {key} {', '.join(sorted(values))}; allowed: one llama-batched-bench "
                             "run a file")
        if values:
            settings[key] = next(r[key] for r in recs if key in r)
    clean = {key: whole_setting(value, key, f"{WHAT} {where}") for key, value in settings.items() if key in SETTINGS}
    if clean.get("is_pp_shared", 0):
        raise InputError(f"{WHAT} {where}: is_pp_shared 1 (-pps); allowed: runs without -pps (one prompt per sequence), "
                         "which is what kvpipe's cache layout models")
    if clean.get("is_tg_separate", 0):
        raise InputError(f"{WHAT} {where}: is_tg_separate 1 (-tgs: each sequence decoded alone, not a batch); allowed: "
                         "runs without -tgs")
    rows = tuple(_row(r, f"{WHAT} {where} " + (f"line {r['_line']}" if "_line" in r else f"row {i + 1}"))
                 for i, r in enumerate(recs))
    return BatchedFile(path=str(path), form=form, rows=rows, settings=tuple(sorted(clean.items())))


def whole_setting(value: Any, key: str, where: str) -> int:
    """A recorded setting as a whole number (n_gpu_layers and flash_attn may be -1). Raises InputError."""
    return whole({key: value}, key, where, -1, 1 << 40)


def check_layers(bench: BatchedFile, n_layers: int) -> None:
    """Refuse a run with layers on the CPU (``n_gpu_layers`` recorded at or below the model's ``n_layers``: llama.cpp's
    -ngl counts the output layer; -1 is its default, every layer). Raises InputError."""
    ngl = bench.setting("n_gpu_layers", -1)
    if 0 <= ngl <= n_layers:
        raise InputError(f"{WHAT} {shown(bench.path)}: n_gpu_layers {ngl} of {n_layers} layers (and the output layer); "
                         "allowed: runs with every layer on the GPU (-ngl 99)")


def token_runs(bench: BatchedFile, arm: str, unified: bool, pinned: bool = True, copy_span: bool = False) -> list[TokenRun]:
    """The file's rows as fit points: one step of ``sequences`` sequences behind ``context`` cached tokens each, on
    ``arm`` (``ordered``: the run had -nkvo; ``resident``: not), over a unified cache (-kvu) or one stream a sequence,
    every layer on the GPU (:func:`check_layers`). ``copy_span``: the build copied a split cache as upstream llama.cpp
    does (``Workload.copy_span``), over streams of :func:`stream_cells` (a file without ``n_kv_max``: just enough).
    Pure."""
    stream = stream_cells(bench) if copy_span and not unified else 0
    out = []
    for r in bench.rows:
        label = f"{'unified' if unified else 'split'} -npp {r.prompt_tokens} -ntg {r.gen_tokens} -npl {r.sequences}"
        out.append(TokenRun(r.context, r.seconds_per_step, arm, label, pinned, ALL_LAYERS, r.sequences, unified, stream,
                            copy_span and not unified))
    return out


def stream_cells(bench: BatchedFile) -> int:
    """Cells of one stream of a split cache in the file's runs: ``n_kv_max`` over llama-batched-bench's ``n_seq_max``
    (its largest -npl), padded to 256; 0 without ``n_kv_max``. Pure."""
    n_kv_max = bench.setting("n_kv_max")
    if n_kv_max <= 0 or not bench.rows:
        return 0
    return stream_of(n_kv_max, max(r.sequences for r in bench.rows))


def stream_of(n_kv_max: int, n_seq_max: int) -> int:
    """Cells of one stream of upstream llama.cpp's split cache of ``n_kv_max`` cells (``-c``) over ``n_seq_max``
    sequences: the share padded to 256 (``n_ctx_seq``). Pure."""
    return pad_rows(-(-n_kv_max // n_seq_max))


def span_ratios(bench: BatchedFile, unified: bool) -> list[tuple[BatchedRow, int, int, float]]:
    """Rows of a split-cache file (not -kvu) whose stream is longer than the window their last step reads, with that
    stream, that window (rows) and how many times kvpipe's copy upstream llama.cpp moves. Upstream copies each attention
    layer's K (and V) view of ``ns`` streams as one extent whose stride is the whole stream, ``(ns - 1) x stream + window``
    rows, where kvpipe (and the fork) moves ``ns x window`` (docs/validation.md, "Run 9's largest miss"). A stream is
    ``n_kv_max / n_seq_max`` cells padded to 256, ``n_seq_max`` the file's largest -npl (llama-batched-bench's); a
    file without ``n_kv_max`` gives nothing. Pure."""
    stream = stream_cells(bench)
    if unified or not stream:
        return []
    out = []
    for r in bench.rows:
        window = min(pad_rows(r.prompt_tokens + r.gen_tokens), stream)
        if stream > window and r.sequences > 1:
            out.append((r, stream, window, ((r.sequences - 1) * stream + window) / (r.sequences * window)))
    return out
