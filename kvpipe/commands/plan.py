"""``kvpipe plan``: per context, the depth and ring budget to run, and what they buy.

One model on one machine (the grid flags' syntax, one value each) over a
list of contexts; a table, or ``--json`` with one object per context. See
``kvpipe/plan.py`` for the method and docs/capacity-planning.md for how to read it.
"""

from __future__ import annotations

import argparse
import json
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
    p.add_argument("--llama-cpp", action="store_true",
                   help="also print llama.cpp's flags per context and the verdict against a cache on the device")
    p.add_argument("--exact", action="store_true", help=EXACT_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object per context")
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
    from kvpipe.plan import PlanRequest, plan, render, render_llama_cpp

    req = PlanRequest(model=args.model, hardware=args.hardware, cache_type=args.cache_type, contexts=tuple(contexts),
                      max_depth=args.max_depth, tokens=args.tokens, default_budget_mib=args.default_budget,
                      budget_for_gain=args.budget_for_gain, budgets_mib=tuple(dict.fromkeys(budgets)),
                      pinned=not args.pageable, jobs=args.jobs or None,
                      llama_cpp=args.llama_cpp, exact=args.exact)
    plans = plan(req)
    if args.json:
        print(json.dumps([p.to_json() for p in plans], indent=1))
    else:
        print(render(plans))
        if args.llama_cpp:
            print()
            print(render_llama_cpp(plans))
    return 0
