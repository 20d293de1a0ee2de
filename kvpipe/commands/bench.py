"""``kvpipe bench``: the simulator's speed (events/s vs bare SimPy, wall ms per simulated token) and both engines'
points per second (the simulator's and the compiled evaluator's)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvpipe.commands.args import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure the simulator's speed on the reference preset")
    p.add_argument("--model", "-m", default="qwen3.8-27b", help="one model preset, .gguf or config.json (default qwen3.8-27b)")
    p.add_argument("--hardware", default="rtx4070-gen4x16", help="one hardware preset or profile .json (default rtx4070-gen4x16)")
    p.add_argument("--cache-type", "--cache-type-k", "-ctk", dest="cache_type", default="q8_0",
                   help="KV cache type (llama.cpp -ctk; default q8_0)")
    p.add_argument("--context", "--n-depth", "-d", dest="context", type=int, default=16384,
                   help="tokens already cached when decoding starts (llama-bench -d; default 16384)")
    p.add_argument("--depth", "--kv-pipeline-depth", "-kvpd", dest="depth", type=int, default=1,
                   help="look-ahead depth; 0 = ordered (default 1)")
    p.add_argument("--tokens", type=int, default=64, help="simulated decode tokens per repeat (default 64)")
    p.add_argument("--repeats", type=int, default=3,
                   help="repeats, each a simulation then a bare loop; the best wall time of each is kept (default 3)")
    p.add_argument("--trace", action="store_true", help="record every span of the timeline while timing, as simulate --trace does")
    p.add_argument("--json", action="store_true", help="print the measurements as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvpipe.bench import run_bench
    from sim.points import GridSpec, points

    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats} out of range; allowed: >= 1")
    spec = GridSpec(models=(args.model,), hardware=(args.hardware,), cache_types=(args.cache_type,), contexts=((args.context,),),
                    depths=(args.depth,), budgets_mib=(0.0,), tokens=args.tokens)
    point = points(spec)[0]
    r = run_bench(point, repeats=args.repeats, trace=args.trace)
    if args.json:
        print(json.dumps(r.as_dict(), indent=1))
        return 0
    print(f"point: {args.model} on {args.hardware}, {args.cache_type}, context {args.context:,}, depth {args.depth}, "
          f"{args.tokens} tokens, best of {args.repeats} interleaved with the bare loop, timeline {'on' if args.trace else 'off'}")
    print(f"machine events/s        {r.machine_events_per_s:12,.0f}   ({r.machine_events:,} events in {r.machine_wall_s * 1e3:.1f} ms)")
    print(f"bare SimPy events/s     {r.bare_events_per_s:12,.0f}")
    print(f"ratio                   {r.ratio:12.1%}")
    print(f"wall ms / sim. token    {r.ms_per_token:12.3f}")
    print(f"simulator points/s      {r.simulator_points_per_s:12,.2f}   (one simulation of the point, {args.tokens} tokens)")
    if r.evaluator_points:
        print(f"evaluator points/s      {r.evaluator_points_per_s:12,.1f}   ({r.evaluator_points} points around it (16 contexts x "
              f"depths 0-7 x 2 budgets), {args.tokens} tokens each, in {r.evaluator_wall_s * 1e3:.1f} ms)")
    else:
        print("evaluator points/s               -   (the point is outside the evaluator's envelope)")
    return 0
