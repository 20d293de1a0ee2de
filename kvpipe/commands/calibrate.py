"""``kvpipe calibrate``: measure the GPU and write a hardware profile the simulation reads.

Runs the micro-measurements (host costs, link curves pinned and pageable,
copy engines) and the decode program of each ``--model`` at a few calibration
windows through the CuPy backend, and writes the profile JSON (``--out``):
``kvpipe simulate --hardware FILE`` and ``kvpipe validate --hardware FILE``
read it. Without CuPy or a CUDA device it prints one line and exits 2;
``--machine simpy`` runs the same code on the simulated machine of
``--hardware`` (to check the plumbing, not the GPU).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from kvpipe.commands.args import UsageError, _bool01, _int, parse_list

DEFAULT_MODELS = "llama-3.1-8b,qwen3.8-27b"


def register(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="measure the GPU (CuPy) and write a hardware profile JSON")
    p.add_argument("--model", "-m", default="", help="model(s) whose decode program is timed (comma list; default "
                   f"{DEFAULT_MODELS}); with --from-llama-bench: the one model llama-bench ran (default: its model_filename)")
    p.add_argument("--cache-type", "--cache-type-k", "-ctk", dest="cache_type", default="q8_0",
                   help="KV cache type(s) of the timed program (comma list)")
    p.add_argument("--out", default="calibrated.json", help="profile file to write (default calibrated.json)")
    p.add_argument("--windows", default="2048,12288,32768,98304", help="calibration contexts of the compute fit (comma list)")
    p.add_argument("--reps", type=int, default=5, help="repetitions per copy size (default 5)")
    p.add_argument("--rounds", type=int, default=2, help="rounds over the calibration windows, interleaved;"
                   " samples are the fastest round's (default 2)")
    p.add_argument("--max-copy-mib", type=float, default=1024, help="largest copy of the link curves in MiB (default 1024)")
    p.add_argument("--scale", type=float, default=1.0, help="hidden/FFN/vocab of the program as a fraction of the model's (default 1.0)")
    p.add_argument("--machine", default="cupy", help="cupy (the GPU) or simpy (the simulated --hardware, for checks)")
    p.add_argument("--hardware", default="", help="profile of the simpy machine (default h200-gen5x16-kvpipe; ignored on "
                   "cupy); with --from-llama-bench: the base profile for host and link costs (default: the preset gpu_info names)")
    p.add_argument("--batch", default="", metavar="B,B,...",
                   help="add the per-sequence terms to --hardware's calibrated entries: run the program ordered at these "
                        "batch sizes (e.g. 1,2,4,8) at --windows and fit what each sequence past the first costs")
    p.add_argument("--from-llama-bench", metavar="FILE", default="",
                   help="fit the profile to llama-bench output (-o json or jsonl: -nkvo 1 at several -d, -nkvo 0 too if present); "
                        "no GPU needed")
    p.add_argument("--from-batched-bench", metavar="FILE[,FILE]", default="",
                   help="fit --hardware's per-sequence term to llama-batched-bench output (its markdown table or "
                        "--output-format jsonl; comma list), runs at several -npl; no GPU needed. Needs --nkvo and -m")
    p.add_argument("--nkvo", choices=("0", "1"), default=None,
                   help="with --from-batched-bench: 1 if the runs had -nkvo (the cache in host memory: the ordered path), 0 "
                        "if not (the cache on the device); llama-batched-bench does not record it")
    p.add_argument("--kv-unified", "-kvu", dest="kv_unified", nargs="?", const="1", default="0", metavar="0|1[,...]",
                   help="with --from-batched-bench: 1 if the runs had -kvu (one cache stream for all sequences), one value "
                        "for all files or one per file; default 0 (llama-batched-bench's default: a stream per sequence)")
    p.add_argument("--per-sequence", choices=("layer", "attention", "cpu"), default="layer",
                   help="with --from-batched-bench: where a further sequence's cost goes (whole steps fix only its sum): "
                        "each layer's matrix products (layer_seq_us, default), each attention layer (attn_seq_us) or each "
                        "CPU split (cpu_row_us)")
    p.add_argument("--fit-staging", nargs="?", const="all", default="", choices=("all", "one", "sizes"),
                   help="with --from-batched-bench --nkvo 1: refit the host->device rate (a factor on --hardware's curve): "
                        "all (the default when given bare) beside the per-sequence term, from files at two -npp values or "
                        "more; one: from the one-sequence rows alone, kept, then the term; sizes: the curve itself "
                        "from the one-sequence rows, one rate per copy size they ran (flat outside, interpolated "
                        "between), then the term")
    p.add_argument("--kv-copy", dest="kv_copy", choices=("streams", "span"), default="streams",
                   help="with --from-batched-bench --nkvo 1: how the build copied a split cache: streams (each stream's "
                        "window: the fork GenerelSchwerz/llama.cpp; default) or span (one extent over the streams of "
                        "n_kv_max / the largest -npl cells: upstream llama.cpp)")
    p.add_argument("--drop-outliers", dest="drop_outliers", type=float, default=0.0, metavar="FRACTION",
                   help="with --from-batched-bench: before a configuration's repeated calls are pooled, leave out a call "
                        "more than FRACTION below the median of its calls at that -npl (or as far above it in log), "
                        "where there are three calls or more; default 0 (keep every call). 0.25 drops a slow spell of the "
                        "machine and ~1%% of plain calls")
    p.add_argument("--nkvo-attention", choices=("device", "host"), default="device",
                   help="with --from-llama-bench: where the build runs attention under -nkvo: device (the fork's delivered "
                        "windows, default) or host (upstream llama.cpp: on the CPU)")
    p.add_argument("--pageable", action="store_true",
                   help="with --from-llama-bench: the runs' host cache was pageable (upstream llama.cpp's -nkvo; the fork "
                        "pins it with --kv-cpu-pinned): the ordered runs fit the pageable curve")
    p.add_argument("--compute-from", choices=("auto", "ordered", "resident"), default="auto",
                   help="with --from-llama-bench: the arm the compute is fitted to (auto: resident when it has two depths)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.from_batched_bench:
        return run_from_batched_bench(args)
    if args.from_llama_bench:
        return run_from_llama_bench(args)
    if args.batch:
        return run_batch(args)
    from backends.base import BackendUnavailable
    from sim.points import cache, hardware, model
    from validate import driver, micro

    models = [model(m) for m in parse_list(args.model or DEFAULT_MODELS, str, "--model", "presets, .gguf or config.json")]
    from sim.workload import CACHE_TYPES

    ctype = [cache(c) for c in parse_list(args.cache_type, str, "--cache-type", ", ".join(CACHE_TYPES))]
    windows = parse_list(args.windows, _int, "--windows", "integers >= 1")
    if args.reps < 1 or args.rounds < 1 or not 0 < args.scale <= 1 or args.max_copy_mib <= 0 or min(windows) < 1:
        raise UsageError("--reps and --rounds must be >= 1, --scale in (0, 1], --max-copy-mib > 0, --windows >= 1")
    sizes = [n for n in micro.LINK_SIZES if n <= args.max_copy_mib * 2**20] or [micro.LINK_SIZES[0]]
    if args.machine == "simpy":
        need, have = simulated_memory_need(models, ctype, windows, args.scale), available_host_bytes()
        if have and need > have:
            raise UsageError(f"--machine simpy at --scale {args.scale:g} needs about {need / 2**30:.1f} GiB of host memory for the "
                             f"simulated device's arrays, and {have / 2**30:.1f} GiB are available; give a smaller --scale or --windows")
    try:
        hw = hardware(args.hardware or "h200-gen5x16-kvpipe") if args.machine == "simpy" else None
        be, xp, info = driver.machine(args.machine, hw)
    except BackendUnavailable as exc:
        raise UsageError(driver.unavailable_message(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    command = "kvpipe " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "kvpipe calibrate"
    data = driver.run_calibrate(be, xp, info, models, ctype, args.out, windows, args.reps, args.scale, sizes, command, args.rounds)
    h = data["host"]
    print(f"wrote {args.out}: {data['device']}, peak pinned H2D "
          f"{max(p[1] for p in data['devices'][0]['links']['h2d_pinned']['points']):.1f} GB/s, "
          f"launch {h['launch_us']:.1f} us, copy issue {h['copy_issue_us']:.1f} us, event {h['event_us']:.2f} us, "
          f"host wait {h['host_wait_us']:.1f} us")
    return 0


def run_batch(args: argparse.Namespace) -> int:
    """Fit the per-sequence terms of each (model, cache type) entry of ``--hardware`` on the machine, write ``--out``."""
    import json

    from backends.base import BackendUnavailable
    from backends.profile import read_profile_dict
    from sim.points import cache, hardware, model
    from sim.safe_write import write_output
    from sim.workload import CACHE_TYPES
    from validate import driver
    from validate.batch_program import add_batch_terms

    batches = parse_list(args.batch, _int, "--batch", "batch sizes 1..8 (comma list)")
    if any(not 1 <= b <= 8 for b in batches) or len(set(batches)) < 2:
        raise UsageError(f"--batch {args.batch!r}; allowed: at least two distinct batch sizes in 1..8")
    if not args.hardware:
        raise UsageError("--batch needs --hardware: the calibrated profile (kvpipe calibrate) whose entries it extends")
    models = [model(m) for m in parse_list(args.model or DEFAULT_MODELS, str, "--model", "presets, .gguf or config.json")]
    ctypes = [cache(c) for c in parse_list(args.cache_type, str, "--cache-type", ", ".join(CACHE_TYPES))]
    windows = parse_list(args.windows, _int, "--windows", "integers >= 1")
    try:
        data, _ = read_profile_dict(args.hardware)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    base = hardware(args.hardware)
    try:
        be, xp, _info = driver.machine(args.machine, base)
    except BackendUnavailable as exc:
        raise UsageError(driver.unavailable_message(exc)) from None
    for key, terms in add_batch_terms(data, be, xp, base, models, ctypes, windows, batches, scale=args.scale):
        print(f"{key}: per sequence past the first {terms['layer_seq_us']:.2f} us a layer, "
              f"{terms['attn_seq_us']:.2f} us an attention layer, {terms['cpu_row_us']:.2f} us a CPU split")
    write_output(args.out, json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def run_from_batched_bench(args: argparse.Namespace) -> int:
    """Fit the per-sequence term of ``--hardware`` to llama-batched-bench files, write ``--out``. Blocks for the fit's
    simulations (seconds)."""
    import json

    from backends.profile import read_profile_dict
    from sim.points import cache, model
    from sim.safe_write import write_output
    from validate import batch_fit
    from validate.batched_bench import WHAT

    files = parse_list(args.from_batched_bench, str, WHAT, "llama-batched-bench output files (comma list)")
    if args.nkvo is None:
        raise UsageError(f"{WHAT} needs --nkvo 1 (the runs had -nkvo: the ordered path) or --nkvo 0 (the cache on the "
                         "device): llama-batched-bench does not record it")
    if args.kv_copy == "span" and args.nkvo != "1":
        raise UsageError("--kv-copy span with --nkvo 0: the cache on the device copies no window; allowed: --kv-copy "
                         "span with --nkvo 1, or --kv-copy streams")
    unified = parse_list(args.kv_unified, _bool01, "--kv-unified", "0 or 1, one for all files or one per file")
    if len(unified) not in (1, len(files)):
        raise UsageError(f"--kv-unified {args.kv_unified!r}: {len(unified)} values for {len(files)} files; allowed: one "
                         "value, or one per file")
    if not 0.0 <= args.drop_outliers < 1.0:
        raise UsageError(f"--drop-outliers {args.drop_outliers!r}; allowed: a fraction from 0 (keep every call) to "
                         "below 1, e.g. 0.25")
    if not args.hardware:
        raise UsageError(f"{WHAT} needs --hardware: the one-sequence profile (a preset, or kvpipe calibrate "
                         "--from-llama-bench's) whose per-sequence term it fits")
    if not args.model or "," in args.model:
        raise UsageError(f"--model {args.model!r}: {WHAT} needs the one model llama-batched-bench ran (its GGUF or a preset)")
    if "," in args.cache_type:
        raise UsageError(f"--cache-type {args.cache_type!r}: {WHAT} fits one cache type; allowed: the -ctk the runs used")
    ctype, m = cache(args.cache_type), model(args.model)
    try:
        base, where = read_profile_dict(args.hardware)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    command = "kvpipe " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
    profile, fit = batch_fit.fit_files(files, unified * len(files) if len(unified) == 1 else unified,
                                       "ordered" if args.nkvo == "1" else "resident", not args.pageable, base, where, m,
                                       ctype, ctype, args.per_sequence, command, args.fit_staging,
                                       args.kv_copy == "span", args.drop_outliers)
    write_output(args.out, json.dumps(profile, indent=1) + "\n")
    print(f"wrote {args.out}: {m.name} {ctype.name}, per sequence past the first {fit.term} {fit.value_us:.3f} us"
          + (" (the rows grow slower than the profile without it: 0)" if fit.clamped else "")
          + ("; the staging curve from the one-sequence rows: " + ", ".join(f"{b:.3f} MiB a copy {g:.3f} GB/s"
                                                                          for b, g in fit.staging_points)
             if fit.staging_points else
             (f"; the staging rate {fit.staging:.3f} times --hardware's"
              + (" (from the one-sequence rows)" if fit.staging_from == "one" else "") if fit.link_key else "")))
    print("\n".join(batch_fit.table(fit)))
    for line in batch_fit.span_notes(files, unified * len(files) if len(unified) == 1 else unified) if args.kv_copy != "span" else ():
        print(line)
    return 0


def run_from_llama_bench(args: argparse.Namespace) -> int:
    """Fit a profile to a llama-bench file and write it (``--out``). Blocks for the fit's simulations (seconds)."""
    import json
    from pathlib import Path

    from sim.points import model
    from sim.safe_write import write_output
    from validate import from_llama_bench, llama_bench

    bench = llama_bench.load(args.from_llama_bench)
    spec = args.model
    if not spec:
        if not bench.model_filename or not Path(bench.model_filename).is_file():
            raise UsageError(f"--from-llama-bench: model_filename {bench.model_filename!r} is not a file here; "
                             "allowed: give --model (the GGUF or preset llama-bench ran)")
        spec = bench.model_filename
    if "," in spec:
        raise UsageError(f"--model {spec!r}: --from-llama-bench fits one model; allowed: the one model llama-bench ran")
    m = model(spec)
    base, where = from_llama_bench.base_for(bench, args.hardware)
    command = "kvpipe " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
    fitted = from_llama_bench.fit_bench(bench, m, base, where, args.compute_from, command, args.nkvo_attention,
                                        pinned=not args.pageable)
    write_output(args.out, json.dumps(fitted.profile, indent=1) + "\n")
    print(f"wrote {args.out}: {m.name} on {bench.gpu_info or fitted.profile['name']}, llama.cpp {bench.build_commit}")
    print("| cache | compute from | weight GB/s | attn GB/s | H2D GB/s | arm | -d | measured t/s | fitted t/s | error | held out |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for key, fit in fitted.fits.items():
        held = {(h["arm"], h["context"], h["label"]): h["error"] for h in fit.held_out}
        for r in fit.residuals:
            h = held.get((r["arm"], r["context"], r["label"]))
            h2d = f"{fit.h2d_GBps:.2f}" if fit.h2d_GBps else "base"
            if fit.host_attention:
                h2d = f"CPU attn {fit.host_attention['host_attn_GBps']:.1f} GB/s + {fit.host_attention['host_attn_us']:.1f} us"
            arm = f"{r['arm']} {r['label'].split(' -nkvo')[0]}" if r["label"].startswith("-ngl") else r["arm"]
            print(f"| {key.split('@', 1)[1]} | {fit.compute_from} | {fit.compute['weight_GBps']:.1f} | {fit.compute['attn_GBps']:.1f} "
                  f"| {h2d} | {arm} | {r['label'].rsplit(' ', 1)[1]} | {r['measured_tps']:.2f} | {r['fitted_tps']:.2f} "
                  f"| {r['error']:+.2%} | {'' if h is None else f'{h:+.2%}'} |")
        cpu = fit.cpu_layers
        if cpu:
            attn = f", CPU attention {cpu['host_attn_GBps']:.2f} GB/s" if cpu["host_attn_GBps"] else f" (attention {cpu['attention']})"
            by = ", ".join(sorted({str(r["by"]) for r in fit.residuals if "by" in r}))
            print(f"CPU layers ({key.split('@', 1)[1]}): host_weight_GBps {cpu['host_weight_GBps']:.2f} over "
                  f"{cpu['layer_weight_bytes'] / 2**20:.1f} MiB a layer, host_layer_us 0{attn}; -ngl runs checked by {by}")
    for line in from_llama_bench.type_lines(fitted.profile):
        print(line)
    if not any(f.cpu_layers for f in fitted.fits.values()):
        print("CPU layers: not calibrated (no run with -ngl below the layer count)")
    return 0


def available_host_bytes() -> int:
    """Host memory available now (bytes; 0 where the system does not say). Does not block."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def simulated_memory_need(models: list[Any], ctypes: list[Any], windows: list[int], scale: float) -> int:
    """Bytes the functional SimPy machine holds for the largest calibration run: the program's stored weights and
    their float32 copies (the NumPy executor's), and the host cache with the device's copies of its windows."""
    from sim.graph import layout_of
    from sim.program.shape import full_size, shape_of
    from sim.program.weights import row_bytes
    from sim.workload import Workload

    need = 0
    for m in models:
        for c in ctypes:
            wl = Workload(m, c, c, (max(windows),), tokens=3)
            shape = shape_of(wl, full_size(0, scale, m.hidden, m.ffn, m.vocab))
            weights = sum(r * (row_bytes(cols, shape.weight_type) + 4 * cols) for r, cols in shape.weight_shapes().values())
            need = max(need, weights + 3 * layout_of(wl).nbytes)
    return need
