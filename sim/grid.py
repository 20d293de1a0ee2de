"""Grid flags shared by ``simulate``, ``sweep`` and ``validate``, and the points they expand to.

Every list flag takes comma-separated values; the grid is their cross
product. Bad values raise :class:`UsageError` with a one-line message naming
the value and what is allowed; the CLI turns that into exit code 2.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from backends.profile import HardwareProfile, for_workload, load_profile
from sim.scheduler import MAX_BUDGET_MIB, MAX_DEPTH, MUTATIONS, TransportConfig
from sim.simulate import Point
from sim.workload import CACHE_TYPES, MAX_CONTEXT, ModelShape, Workload, cache_type, load_model

T = TypeVar("T")

REFERENCE_CONTEXTS = "4096,16384,32768"


class UsageError(ValueError):
    """Bad input from the command line: print one line, exit 2."""


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


def _per_sequence(t: str) -> tuple[int, ...]:
    """'2048' -> (2048,); '20000:20000:12' -> one context per sequence."""
    return tuple(_int(x) for x in t.split(":"))


def add_grid_args(p: argparse.ArgumentParser) -> None:
    """The workload/grid flags (identical on simulate, sweep and validate)."""
    p.add_argument("--model", default="qwen3.8-27b", help="preset, .gguf file or config.json (comma list for a grid)")
    p.add_argument("--hardware", default="rtx4070-gen4x16", help="hardware preset or profile .json (comma list)")
    p.add_argument("--cache-type", default="q8_0", help=f"KV cache type(s): {', '.join(CACHE_TYPES)}")
    p.add_argument("--context", default=REFERENCE_CONTEXTS, help="tokens already cached when decoding starts (llama-bench -d), comma list")
    p.add_argument("--depth", "--kv-pipeline-depth", "-kvpd", dest="depth", default="0,1",
                   help=f"look-ahead depth(s) 0..{MAX_DEPTH}; 0 = ordered")
    p.add_argument("--budget", "--kv-pipeline-budget", "-kvpb", dest="budget", default="128",
                   help=f"ring budget MiB per device (0 = no cap, max {MAX_BUDGET_MIB}), comma list")
    p.add_argument("--tokens", type=int, default=8, help="decode tokens simulated per point (default 8)")
    p.add_argument("--pageable", action="store_true", help="host cache in pageable memory (default pinned)")
    p.add_argument("--mutate", default="", help=f"switch off one load-bearing piece: {', '.join(MUTATIONS)}")
    p.add_argument("--parallel", "-np", default="1", help="sequences decoding at once (llama.cpp --parallel), comma list")
    p.add_argument("--kv-unified", dest="kv_unified", action=argparse.BooleanOptionalAction, default=True,
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


@dataclass(frozen=True)
class Labels:
    model: str
    hardware: str
    cache_type: str


def _load_model(spec: str) -> ModelShape:
    try:
        return load_model(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _load_hw(spec: str) -> HardwareProfile:
    try:
        return load_profile(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def points_from_args(args: argparse.Namespace) -> list[Point]:
    """Expand the grid flags into points. Raises UsageError on any bad value."""
    models = [_load_model(m) for m in parse_list(args.model, str, "--model", "a preset, .gguf or config.json")]
    hws = [_load_hw(h) for h in parse_list(args.hardware, str, "--hardware", "a preset or profile .json")]
    caches = [cache_type_or_usage(c) for c in parse_list(args.cache_type, str, "--cache-type", ", ".join(CACHE_TYPES))]
    contexts = parse_list(args.context, _per_sequence, "--context", f"integers 1..{MAX_CONTEXT}, per sequence joined by ':'")
    parallels = parse_list(getattr(args, "parallel", "1"), _int, "--parallel", "integers 1..256")
    splits = parse_list(getattr(args, "tensor_split", "") or "1", float, "--tensor-split", "non-negative proportions")
    depths = parse_list(args.depth, _int, "--depth", f"integers 0..{MAX_DEPTH}")
    budgets = parse_list(args.budget, float, "--budget", f"MiB 0..{MAX_BUDGET_MIB} (0 = no cap)")
    mutations = frozenset(m for m in str(getattr(args, "mutate", "") or "").split(",") if m)
    if args.tokens < 1:
        raise UsageError(f"--tokens {args.tokens} out of range; allowed: >= 1")
    points = []
    try:
        for m, h, c, ctx, npar, d, b in itertools.product(models, hws, caches, contexts, parallels, depths, budgets):
            wl = Workload(
                m, c, c, ctx, tokens=args.tokens, pinned=not args.pageable, n_parallel=npar,
                unified=getattr(args, "kv_unified", True), ctx_size=getattr(args, "ctx_size", 0),
                split_mode=getattr(args, "split_mode", "none"),
                tensor_split=tuple(splits) if getattr(args, "tensor_split", "") else (),
                flat_prefix=getattr(args, "flat_prefix", False),
            )
            if wl.split_mode != "none" and len(h.devices) < 2:
                raise UsageError(f"--split-mode {wl.split_mode} needs several devices; give --hardware A+B (got {h.name})")
            tc = TransportConfig(depth=d, budget_mib=b, mutations=mutations, pack_streams=getattr(args, "pack", True))
            points.append(Point(wl, for_workload(h, m.name, c.name), tc))  # a calibrated file's entry for this program
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not points:
        raise UsageError("the grid is empty; give at least one value per flag")
    return points


def cache_type_or_usage(name: str):  # type: ignore[no-untyped-def]
    try:
        return cache_type(name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
