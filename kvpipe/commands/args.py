"""Grid flags shared by ``simulate``, ``sweep``, ``plan``, ``plot`` and ``validate``: text in, a GridSpec out.

This is the only place that parses the command line's strings. Every list
flag takes comma-separated values and ``START..STOP/STEP`` ranges; the grid is
their cross product, built by :func:`sim.points.points` from the typed
:class:`sim.points.GridSpec` that :func:`spec_from_args` makes. Bad values
raise :class:`UsageError` (a :class:`sim.errors.InputError`) with a one-line
message naming the value and what is allowed; ``kvpipe.cli`` turns that into exit
code 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

from sim.errors import InputError
from sim.points import GridSpec, points
from sim.run.point import Point
from sim.transport.config import MAX_BUDGET_MIB, MAX_DEPTH, MIB, MUTATIONS, Schedule
from sim.workload import ALL_LAYERS, CACHE_TYPES, MAX_CONTEXT

T = TypeVar("T")

REFERENCE_CONTEXTS = "4096,16384,32768"
MAX_RANGE_VALUES = 100_000  # values one range may expand to
RANGE_FLAGS = ("context", "depth", "budget", "parallel", "kv_gpu_layers", "n_gpu_layers")
RANGE_DEFAULTS = {"kv_gpu_layers": "0", "n_gpu_layers": str(ALL_LAYERS)}  # commands built without the flag
UsageError = InputError  # the command line's name for it
EXACT_HELP = ("simulate every requested point and every token (default: each distinct simulation once, token 0 and the "
              "steady tokens of each window block, the rest extrapolated; ms/token within 1e-3 of exact, ring, decline "
              "and bytes identical)")


def parse_list(text: str, conv: Callable[[str], T], flag: str, allowed: str) -> list[T]:
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t for t in items):
        raise UsageError(f"{flag} {text!r}: empty value; allowed: {allowed}")
    out = []
    for t in items:
        try:
            out.append(conv(t))
        except ValueError:
            raise UsageError(f"{flag} {t!r} is not valid; allowed: {allowed}") from None
    return out


def _int(t: str) -> int:
    return int(t.replace("_", ""))


def _bool01(t: str) -> bool:
    """'1' -> True (the cache in host memory), '0' -> False; anything else is refused."""
    if t not in ("0", "1"):
        raise ValueError(t)
    return t == "1"


def _per_sequence(t: str) -> tuple[int, ...]:
    """'2048' -> (2048,); '20000:20000:12' -> one context per sequence."""
    return tuple(_int(x) for x in t.split(":"))


def add_grid_args(p: argparse.ArgumentParser, exact: bool = True) -> None:
    """The workload/grid flags (identical on simulate, sweep, plot and validate; ``--exact`` where the command
    simulates, so not on validate)."""
    p.add_argument("--model", "-m", default="qwen3.8-27b", help="preset, .gguf file or config.json (comma list for a grid)")
    p.add_argument("--hardware", default="rtx4070-gen4x16", help="hardware preset or profile .json (comma list)")
    p.add_argument("--cache-type", "--cache-type-k", "-ctk", dest="cache_type", default="q8_0",
                   help=f"K cache type(s): {', '.join(CACHE_TYPES)} (llama.cpp -ctk)")
    p.add_argument("--cache-type-v", "-ctv", dest="cache_type_v", default="",
                   help="V cache type(s) (llama.cpp -ctv); default: the K type")
    p.add_argument("--context", "--n-depth", "-d", dest="context", default=REFERENCE_CONTEXTS,
                   help="tokens already cached when decoding starts (llama-bench -d), comma list or START..STOP/STEP")
    p.add_argument("--no-kv-offload", "-nkvo", dest="nkvo", default="1", nargs="?", const="1",
                   help="1: the KV cache in host memory, delivered by the scheduler (default; a bare -nkvo means 1, as "
                        "in llama.cpp); 0: kept on the device (the resident arm, what llama.cpp runs without -nkvo); a "
                        "comma list for both")
    p.add_argument("--depth", "--kv-pipeline-depth", "-kvpd", dest="depth", default="0,1",
                   help=f"look-ahead depth(s) 0..{MAX_DEPTH}; 0 = ordered")
    p.add_argument("--budget", "--kv-pipeline-budget", "-kvpb", dest="budget", default="128",
                   help=f"ring budget MiB per device (0 = no cap, max {MAX_BUDGET_MIB}), comma list")
    p.add_argument("--tokens", type=int, default=8, help="decode tokens simulated per point (default 8)")
    p.add_argument("--pageable", action="store_true", help="host cache in pageable memory (default pinned)")
    p.add_argument("--mutate", default="", help=f"switch off one load-bearing piece: {', '.join(MUTATIONS)}")
    p.add_argument("--parallel", "-np", default="1", help="sequences decoding at once (llama.cpp --parallel), comma list")
    p.add_argument("--kv-unified", "-kvu", dest="kv_unified", action=argparse.BooleanOptionalAction, default=True,
                   help="one cache stream shared by all sequences (default) or one stream per sequence")
    p.add_argument("--ctx-size", "-c", dest="ctx_size", type=int, default=0,
                   help="total cache cells (split evenly over streams when not unified); default: just enough")
    p.add_argument("--split-mode", "-sm", dest="split_mode", default="none", help="none, layer or tensor (several devices)")
    p.add_argument("--tensor-split", "-ts", dest="tensor_split", default="",
                   help="proportions per device, e.g. 3,1 (default: even)")
    p.add_argument("--no-pack", dest="pack", action="store_false",
                   help="reserve each stream's whole stride in a ring slot (the unpacked layout, for comparison)")
    p.add_argument("--flat-prefix", action="store_true",
                   help="one stable prefix over a multi-stream window (the old behaviour, for comparison)")
    p.add_argument("--kv-copy", dest="kv_copy", choices=("streams", "span"), default="streams",
                   help="how the ordered path copies a split cache's window: streams (each stream's window: the fork "
                        "GenerelSchwerz/llama.cpp; default) or span (one extent over the streams, gaps included: upstream "
                        "llama.cpp; depth 0 only)")
    p.add_argument("--kv-gpu-layers", dest="kv_gpu_layers", default="0",
                   help="the first N attention layers' K/V kept on the device under -nkvo (the fork's --kv-gpu-layers; "
                        "no CPU split, nothing delivered for them), comma list or START..STOP/STEP")
    p.add_argument("--n-gpu-layers", "-ngl", dest="n_gpu_layers", default=str(ALL_LAYERS),
                   help="llama.cpp -ngl: the last N layers on the GPU, the layers before them on the CPU (default "
                        f"{ALL_LAYERS}: every layer), comma list or START..STOP/STEP")
    add_schedule_args(p)
    if exact:
        p.add_argument("--exact", action="store_true", help=EXACT_HELP)


def add_schedule_args(p: argparse.ArgumentParser) -> None:
    """The delivery-schedule flags (docs/schedules.md), default off: the reference schedule."""
    p.add_argument("--kv-fresh-on-device", "-kvfd", dest="kv_fresh", action="store_true",
                   help="the split that computes a layer's new K/V rows also writes them into its staged slot: no late "
                        "copy, the CPU split off the GPU's path (one-stream caches; others keep the late copy)")
    p.add_argument("--kv-inputs-first", "-kvif", dest="kv_inputs_first", action="store_true",
                   help="copy a graph's first small inputs before priming the ring (not behind the first deliveries)")
    p.add_argument("--kv-across-tokens", "-kvat", dest="kv_across", action="store_true",
                   help="issue the next token's first delivery while this token's last layers and head compute")
    p.add_argument("--kv-late-first", dest="kv_late_first", action="store_true",
                   help="issue the next early delivery only after the current split's late rows are on the engine")
    p.add_argument("--kv-pipeline-piece", "-kvpp", dest="kv_piece", type=float, default=0.0, metavar="MIB",
                   help="cut each early delivery into copies of at most MIB (0: whole; >= 0.0625)")
    p.add_argument("--kv-schedule", dest="kv_schedule", default="",
                   help="schedules by name, comma list (reference, or late-first, fresh, inputs-first, across-tokens, "
                        "piece<MiB> joined by '+'; e.g. reference,fresh+inputs-first+across-tokens): instead of the flags above")


def schedules_from_args(args: argparse.Namespace) -> tuple[Schedule, ...]:
    """The schedules the flags ask for (one unless ``--kv-schedule`` lists several). Raises UsageError."""
    piece = getattr(args, "kv_piece", 0.0) or 0.0
    flags = (getattr(args, "kv_fresh", False), getattr(args, "kv_inputs_first", False), getattr(args, "kv_late_first", False), piece,
             getattr(args, "kv_across", False))
    names = str(getattr(args, "kv_schedule", "") or "")
    if names and any(flags):
        raise UsageError("--kv-schedule names whole schedules; give it or the --kv-* policy flags, not both")
    try:
        if names:
            return tuple(dict.fromkeys(Schedule.parse(n) for n in names.split(",")))
        if not 0 <= piece <= MAX_BUDGET_MIB:
            raise ValueError(f"--kv-pipeline-piece {piece:g} MiB out of range; allowed: 0 (whole) or 0.0625..{MAX_BUDGET_MIB}")
        return (Schedule(piece_bytes=int(piece * MIB), late_first=flags[2], fresh_on_device=flags[0], inputs_first=flags[1],
                         across_tokens=flags[4]),)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def spec_from_args(args: argparse.Namespace) -> GridSpec:
    """The grid flags (ranges expanded) as typed values. Raises UsageError on any malformed value."""
    text = {name: expand_ranges(str(getattr(args, name, RANGE_DEFAULTS.get(name, "1")))) for name in RANGE_FLAGS}
    splits = getattr(args, "tensor_split", "") or ""
    return GridSpec(
        models=tuple(parse_list(args.model, str, "--model", "a preset, .gguf or config.json")),
        hardware=tuple(parse_list(args.hardware, str, "--hardware", "a preset or profile .json")),
        cache_types=tuple(parse_list(args.cache_type, str, "--cache-type", ", ".join(CACHE_TYPES))),
        cache_types_v=tuple(parse_list(args.cache_type_v, str, "--cache-type-v", ", ".join(CACHE_TYPES)))
        if getattr(args, "cache_type_v", "") else (),
        kv_offload=tuple(parse_list(getattr(args, "nkvo", "1"), _bool01, "--no-kv-offload", "0 or 1 (comma list)")),
        contexts=tuple(parse_list(text["context"], _per_sequence, "--context", f"integers 1..{MAX_CONTEXT}, per sequence joined by ':'")),
        parallels=tuple(parse_list(text["parallel"], _int, "--parallel", "integers 1..256")),
        depths=tuple(parse_list(text["depth"], _int, "--depth", f"integers 0..{MAX_DEPTH}")),
        budgets_mib=tuple(parse_list(text["budget"], float, "--budget", f"MiB 0..{MAX_BUDGET_MIB} (0 = no cap)")),
        tokens=args.tokens,
        pinned=not args.pageable,
        unified=getattr(args, "kv_unified", True),
        ctx_size=getattr(args, "ctx_size", 0),
        split_mode=getattr(args, "split_mode", "none"),
        tensor_split=tuple(parse_list(splits, float, "--tensor-split", "non-negative proportions")) if splits else (),
        pack_streams=getattr(args, "pack", True),
        flat_prefix=getattr(args, "flat_prefix", False),
        copy_span=getattr(args, "kv_copy", "streams") == "span",
        mutations=frozenset(m for m in str(getattr(args, "mutate", "") or "").split(",") if m),
        kv_gpu_layers=tuple(parse_list(text["kv_gpu_layers"], _int, "--kv-gpu-layers", "integers 0..the model's attention layers")),
        n_gpu_layers=tuple(parse_list(text["n_gpu_layers"], _int, "--n-gpu-layers", f"integers >= 1 ({ALL_LAYERS}: every layer)")),
        schedules=schedules_from_args(args),
    )


def points_from_args(args: argparse.Namespace) -> list[Point]:
    """Expand the grid flags into points. Raises UsageError on any bad value."""
    return points(spec_from_args(args))


def expand_ranges(text: str) -> str:
    """Expand ``START..STOP`` and ``START..STOP/STEP`` items of a comma list (STOP included, STEP default 1).

    ``"1024..4096/1024,8192"`` -> ``"1024,2048,3072,4096,8192"``. Other items (``:``
    joins one context per sequence) pass through. Raises UsageError on a malformed range.
    """
    out: list[str] = []
    for item in str(text).split(","):
        if ".." not in item:
            out.append(item)
            continue
        spec = item.strip()
        head, _, step_text = spec.partition("/")
        start_text, _, stop_text = head.partition("..")
        try:
            start, stop = float(start_text.replace("_", "")), float(stop_text.replace("_", ""))
            step = float(step_text.replace("_", "")) if step_text else 1.0
        except ValueError:
            start = stop = step = math.nan
        if not step > 0 or not stop >= start or not all(map(math.isfinite, (start, stop, step))):
            raise UsageError(f"range {spec!r} is not valid; allowed: START..STOP or START..STOP/STEP with finite numbers, "
                             "STEP > 0, STOP >= START")
        span = (stop - start) / step
        if not span < MAX_RANGE_VALUES:  # an infinite or absurd count (0..1e308/1e-308) before any int() of it
            raise UsageError(f"range {spec!r} has {span + 1:.3g} values; allowed: at most {MAX_RANGE_VALUES:,}")
        n = int(math.floor(span + 1e-9)) + 1
        integral = all(float(x).is_integer() for x in (start, step))
        out += [str(int(start + i * step)) if integral else f"{start + i * step:g}" for i in range(n)]
    return ",".join(out)


