"""``kvpipe plan``: per context, the depth and ring budget to run, and what they buy.

One model on one machine (the grid flags' syntax, one value each) over a
list of contexts; a table, or ``--json`` with one object per context. See
``kvpipe/plan.py`` for the method and docs/capacity-planning.md for how to read it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kvpipe.commands.args import EXACT_HELP, REFERENCE_CONTEXTS, UsageError, expand_ranges, parse_list
from sim.transport.config import MAX_BUDGET_MIB, TransportConfig
from sim.workload import MAX_CONTEXT

DEFAULT_BUDGET_MIB = TransportConfig().budget_mib  # kvpipe.plan's default, without importing it at parser build


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="which depth and ring budget each context needs, and the gain they buy")
    p.add_argument("--model", "-m", default="qwen3.8-27b", help="preset, .gguf file or config.json")
    p.add_argument("--hardware", default="rtx4070-gen4x16", help="hardware preset or profile .json")
    p.add_argument("--cache-type", "--cache-type-k", "-ctk", dest="cache_type", default="q8_0", help="KV cache type (q8_0, f16, ...)")
    p.add_argument("--context", "--n-depth", "-d", dest="context", default=REFERENCE_CONTEXTS,
                   help="contexts to plan, comma list (START..STOP/STEP ranges too)")
    p.add_argument("--max-depth", type=int, default=4, help="deepest look-ahead to try (default 4)")
    p.add_argument("--default-budget", "--kv-pipeline-budget", "-kvpb", dest="default_budget", type=float, default=DEFAULT_BUDGET_MIB,
                   help="the budget to judge, MiB (default 128)")
    p.add_argument("--budget", "--budgets", dest="budgets", metavar="MIB[,MIB...]",
                   help="also: per context, the best depth and its gain at each of these budgets, MiB (0: no cap; "
                        "START..STOP/STEP ranges too)")
    p.add_argument("--budget-for-gain", type=float, metavar="FRACTION",
                   help="also: smallest budget keeping this fraction of the uncapped gain")
    p.add_argument("--tokens", type=int, default=4, help="decode tokens simulated per point (default 4)")
    p.add_argument("--pageable", action="store_true", help="host cache in pageable memory (default pinned)")
    p.add_argument("--jobs", type=int, default=0, help="local worker processes (default: all cores)")
    p.add_argument("--llama-cpp", action="store_true", help="(kept for old command lines: the flags are always printed)")
    p.add_argument("--vram", type=float, metavar="GIB", help="device memory to fit, GiB (default: the card's)")
    p.add_argument("--host-mem", type=float, metavar="GIB", help="host memory to fit, GiB (default: this machine's)")
    p.add_argument("--build", choices=("fork", "upstream"), default="fork",
                   help="llama.cpp build to plan for: fork (GenerelSchwerz/llama.cpp, the pipelining pull requests #39, "
                        "#66, #92: depth, budget, --kv-gpu-layers) or upstream (-ngl, -nkvo only); default fork")
    p.add_argument("--min-tps", type=float, metavar="T/S", help="also: the largest context at or above this t/s")
    p.add_argument("--n-gpu-layers", "-ngl", dest="n_gpu_layers", type=int, metavar="N",
                   help="llama.cpp's -ngl: the last N layers on the GPU (default: every layer, or the most that fit)")
    p.add_argument("--weights-type", metavar="TYPE|BITS",
                   help="the weights' type for a model file that does not say (a config.json): q4_k_m, q8_0, ... or bits "
                        "per weight")
    p.add_argument("--exact", action="store_true", help=EXACT_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object per context")
    p.add_argument("--check", type=int, default=32, metavar="N",
                   help="re-simulate at least N of the evaluator's rows at the end (the simulator's default path; exact "
                        "where it differs), and every point where the best depth changes (default 32; 0: no check)")
    p.add_argument("--plot", metavar="PREFIX", help="also write PREFIX.png and PREFIX.svg: t/s and the memory split per context")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    contexts = parse_list(expand_ranges(args.context), lambda t: int(t.replace("_", "")), "--context", f"integers 1..{MAX_CONTEXT}")
    if args.tokens < 1 or args.jobs < 0:
        raise UsageError("--tokens must be >= 1 and --jobs >= 0")
    if not 0 <= args.default_budget <= MAX_BUDGET_MIB:
        raise UsageError(f"--default-budget {args.default_budget:g} out of range; allowed: 0 (no cap) .. {MAX_BUDGET_MIB}")
    budgets = parse_list(expand_ranges(args.budgets), float, "--budget", f"numbers 0 (no cap) .. {MAX_BUDGET_MIB}") if args.budgets else []
    for b in budgets:
        if not 0 <= b <= MAX_BUDGET_MIB:
            raise UsageError(f"--budget {b:g} out of range; allowed: 0 (no cap) .. {MAX_BUDGET_MIB}")
    for flag in ("model", "hardware", "cache_type"):
        if "," in getattr(args, flag):
            raise UsageError("plan takes one model, one hardware and one cache type")
    if args.n_gpu_layers is not None and args.n_gpu_layers < 1:
        raise UsageError(f"-ngl {args.n_gpu_layers} out of range; allowed: a whole number >= 1 (llama.cpp's -ngl; 99: every "
                         "layer)")
    from kvpipe.capacity import FitPlan, plan_fit
    from kvpipe.capacity_report import render_fit, render_fit_head
    from kvpipe.plan import PlanRequest, render
    from sim.workload import ALL_LAYERS

    req = PlanRequest(model=args.model, hardware=args.hardware, cache_type=args.cache_type, contexts=tuple(contexts),
                      max_depth=args.max_depth, tokens=args.tokens, default_budget_mib=args.default_budget,
                      budget_for_gain=args.budget_for_gain, budgets_mib=tuple(dict.fromkeys(budgets)),
                      pinned=not args.pageable, jobs=args.jobs or None,
                      llama_cpp=args.llama_cpp, exact=args.exact, vram_gib=args.vram, host_mem_gib=args.host_mem,
                      build=args.build, min_tps=args.min_tps,
                      n_gpu_layers=ALL_LAYERS if args.n_gpu_layers is None else args.n_gpu_layers,
                      weights_type=args.weights_type or "", check_n=args.check)
    made: dict[str, str] = {}  # the text, made while the check's simulations run (the check's lines after it)

    def text(fp: FitPlan) -> None:
        made["head"] = render_fit_head(fp, args.cache_type)
        made["gains"] = render(fp.plans) if fp.plans else ""

    fp = plan_fit(req, None if args.json else text)
    if args.plot:
        from kvpipe.capacity_plot import memory_plan
        from kvpipe.plots import save

        for path in save(memory_plan(fp, args.cache_type), args.plot):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        head = fp.to_json()
        by_ctx = {p.context: p for p in fp.plans}
        out = []
        for f in fp.fits:
            d: dict[str, Any] = by_ctx[f.context].to_json() if f.context in by_ctx else {"context": f.context}
            d["memory_plan"] = {**head, "best": f.best.to_json() if f.best else None, "reason": f.reason,
                                "candidates": [c.to_json() for c in f.candidates]}
            out.append(d)
        print(json.dumps(out, indent=1))
        return 0
    print(render_fit(fp, args.cache_type, made.get("head")))  # (made now where no check ran)
    if fp.plans:
        print()
        print(made["gains"] if "gains" in made else render(fp.plans))
    return 0
