"""Issue 28 on the H200: predict upstream llama.cpp's batched decode from a calibration, then hold it to the held-out runs.

``tools/llamacpp/h200_bench.sh batched`` ran ``llama-batched-bench -nkvo -fa on`` (q8_0 cache, the random-weight
llama-3.1-8b q8_0 GGUF) at ``-npl 1,2,4,8``, ``-ntg 32``, over a cache split into a stream per sequence and a unified
one (``-kvu``): ``-npp 2048`` is the calibration, the other ``-npp`` values are held out. Two steps, in this order:

    python tools/llamacpp/predict_batched.py predict --profile P.json --gguf M.gguf --out DIR [--pp 1024,4096]
    python tools/llamacpp/predict_batched.py compare --out DIR batched-split-pp1024.jsonl ...

``predict`` reads no measured file: for every held-out (layout, PP, B) it runs ``kvpipe simulate`` as a user would
(``--context PP --tokens TG --parallel B --depth 0 --pageable``, ``--kv-unified`` or ``--no-kv-unified``) under the
profile that ``kvpipe calibrate --from-batched-bench`` fitted, and writes ``DIR/prediction.json`` and ``.md`` with each
command. ``compare`` reads the held-out files (named ``batched-{split,unified}-pp{PP}.jsonl``, as the bench script
writes them), sets each measured S_TG beside its committed prediction, and writes ``DIR/comparison.json`` and
``.md`` (error = predicted / measured - 1; median and largest |error|). A configuration called several times (``-rK``)
is measured by the median of its calls (runs 6-8, the default) or, with ``--statistic gmean`` (run 9), by the geometric
mean over the **complete rounds**: the rounds K in which every configuration among the files given (calibration files
may be given too; they only count for completeness) has a finished call (a row for every predicted ``-npl``).
Not part of the installed package.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvpipe.cli import main as kvpipe  # noqa: E402
from sim.errors import InputError  # noqa: E402
from validate import batched_bench  # noqa: E402
from validate.batch_fit import outlying  # noqa: E402

NAME = re.compile(r"batched-(split|unified)-pp(\d+)(?:-r(\d+))?\.jsonl$")


def simulate_tps(profile: str, gguf: str, pp: int, tg: int, pl: int, unified: bool, ctx_size: int = 0,
                 kv_copy: str = "streams") -> tuple[float, str]:
    """Predicted t/s over all sequences, and the ``kvpipe simulate`` command that gave it (``ctx_size``: its
    ``--ctx-size``, 0: none given; ``kv_copy``: its ``--kv-copy``). Blocks (one simulation)."""
    argv = ["simulate", "--hardware", profile, "-m", gguf, "--context", str(pp), "--tokens", str(tg), "--parallel", str(pl),
            "--depth", "0", "--pageable", "--kv-unified" if unified else "--no-kv-unified"]
    argv += ["--ctx-size", str(ctx_size)] if ctx_size else []
    argv += ["--kv-copy", kv_copy] if kv_copy != "streams" else []
    argv += ["--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = kvpipe(argv)
    if code:
        sys.exit(f"predict_batched: kvpipe {' '.join(argv)} exited {code}")
    return float(json.loads(out.getvalue())[0]["tokens_per_s"]), "kvpipe " + " ".join(argv[:-1])


def predict(args: argparse.Namespace) -> int:
    profile = json.loads(Path(args.profile).read_text())
    entry = next(iter(profile.get("workloads", {}).values()), {})
    fit = entry.get("batch") or profile.get("batch") or {}
    rows = []
    npls = [int(x) for x in args.npl.split(",")]
    ctx = {int(k): int(v) for k, v in (kv.split("=") for kv in args.ctx.split(",") if kv)}
    for pp in (int(x) for x in args.pp.split(",")):
        c = ctx.get(pp, 8 * (pp + args.tg) + 256)  # llama-batched-bench's -c (h200_bench.sh's default)
        for layout in ("split", "unified"):
            for pl in npls:
                size = 0  # with the span copy, kvpipe's streams are upstream's: -c over the largest -npl, padded
                if args.kv_copy == "span" and layout == "split":
                    size = batched_bench.stream_of(c, max(npls)) * pl
                tps, cmd = simulate_tps(args.profile, args.gguf, pp, args.tg, pl, layout == "unified", size, args.kv_copy)
                rows.append({"layout": layout, "pp": pp, "tg": args.tg, "pl": pl, "c": c, "predicted_tps": round(tps, 4),
                             "command": cmd})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"command": "python tools/llamacpp/predict_batched.py " + " ".join(sys.argv[1:]), "profile": args.profile,
            "fit_from": fit.get("from", ""), "term": fit.get("term"), "value_us": fit.get("value_us"),
            "clamped": fit.get("clamped"), "calibration": fit.get("residuals", []), "kv_copy": args.kv_copy, "held_out": rows}
    (out / "prediction.json").write_text(json.dumps(data, indent=1) + "\n")
    ctxs = ", ".join(f"{pp}: {c}" for pp, c in sorted({(r["pp"], r["c"]) for r in rows}))
    lines = [f"Predicted before the held-out runs were read: `{data['command']}`", "",
             f"Per-sequence term: {data['term']} = {data['value_us']} us" + (" (clamped at 0)" if data["clamped"] else ""), "",
             *([f"A split cache's ordered copy: `--kv-copy {args.kv_copy}` (upstream llama.cpp's span; -c per -npp: "
                f"{ctxs})", ""] if args.kv_copy == "span" else []),
             "| layout | -npp | -npl | predicted t/s |", "|---|---:|---:|---:|"]
    lines += [f"| {r['layout']} | {r['pp']} | {r['pl']} | {r['predicted_tps']:.2f} |" for r in rows]
    (out / "prediction.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'prediction.json'}, {out / 'prediction.md'}: {len(rows)} held-out rows")
    return 0


def compare(args: argparse.Namespace) -> int:
    if not 0.0 <= args.drop_outliers < 1.0:
        sys.exit(f"predict_batched: --drop-outliers {args.drop_outliers!r}; allowed: a fraction from 0 to below 1")
    out = Path(args.out)
    pred = json.loads((out / "prediction.json").read_text())
    want = {(r["layout"], r["pp"], r["tg"], r["pl"]): r for r in pred["held_out"]}
    if args.statistic == "gmean":
        machines = dict(kv.split("=", 1) for kv in args.machines.split(",") if kv) if args.machines else None
        measured, rounds = _complete_rounds(args.measured, want, machines)
    else:
        measured, rounds = _all_calls(args.measured, want), None
    stat = _gmean if args.statistic == "gmean" else statistics.median
    rows = []
    for k, v in measured.items():
        out_of = outlying([t for t, _ in v], args.drop_outliers)
        kept = [t for (t, _), o in zip(v, out_of, strict=True) if not o]
        rows.append({**want[k], "measured_tps": stat(kept), "calls_tps": [t for t, _ in v],
                     "error": want[k]["predicted_tps"] / stat(kept) - 1.0, "file": [f for _, f in v]})
        if args.drop_outliers:
            rows[-1]["left_out_tps"] = [t for (t, _), o in zip(v, out_of, strict=True) if o]
    if len(rows) != len(want):
        sys.exit(f"predict_batched: {len(rows)} of the {len(want)} predicted rows found in the measured files")
    errs = [abs(r["error"]) for r in rows]
    groups = {"every held-out row": rows, "one sequence": [r for r in rows if r["pl"] == 1],
              "2-8 sequences": [r for r in rows if r["pl"] > 1]}
    summary = {k: {"rows": len(v), "median_abs_error": statistics.median(abs(r["error"]) for r in v),
                   "max_abs_error": max(abs(r["error"]) for r in v)} for k, v in groups.items() if v}
    data = {"prediction": str(out / "prediction.json"), "rows": rows, "summary": summary,
            "target": {"median_abs_error": 0.05, "max_abs_error": 0.10},
            "met": statistics.median(errs) <= 0.05 and max(errs) <= 0.10}
    if args.drop_outliers:
        data = {"left_out": f"a call more than {args.drop_outliers:g} off its row's median of calls (validate.batch_fit.outlying)",
                **data}
    head = "measured t/s (median)"
    if rounds is not None:
        data = {"statistic": "geometric mean over the complete rounds", "complete_rounds": rounds, **data}
        head = f"measured t/s (geometric mean of {len(rounds)} complete rounds)"
    (out / "comparison.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [f"| layout | -npp | -npl | {head} | calls | predicted t/s | error |", "|---|---:|---:|---:|---|---:|---:|"]
    lines += [f"| {r['layout']} | {r['pp']} | {r['pl']} | {r['measured_tps']:.2f} | {_calls(r)} | "
              f"{r['predicted_tps']:.2f} | {r['error']:+.1%} |"
              for r in sorted(rows, key=lambda r: (r["pp"], r["layout"], r["pl"]))]
    lines += ["", "| held-out rows | n | median \\|error\\| | max \\|error\\| |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v['rows']} | {v['median_abs_error']:.1%} | {v['max_abs_error']:.1%} |" for k, v in summary.items()]
    lines += ["", f"Target: median <= 5%, max <= 10%: {'met' if data['met'] else 'missed'}."]
    if rounds is not None:
        lines += ["", f"Complete rounds (every configuration given finished its call): {', '.join(map(str, rounds))}."]
    (out / "comparison.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _calls(row: dict) -> str:
    """A row's calls for the table, a call left out as outlying in brackets."""
    left, parts = list(row.get("left_out_tps", ())), []
    for t in row["calls_tps"]:
        if t in left:
            left.remove(t)
            parts.append(f"[{t:.2f}]")
        else:
            parts.append(f"{t:.2f}")
    return " / ".join(parts)


def _gmean(values: list[float]) -> float:
    """The geometric mean of positive t/s values."""
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _name(path: str) -> re.Match[str]:
    m = NAME.search(path)
    if not m:
        sys.exit(f"predict_batched: {path!r} is not named batched-{{split,unified}}-pp{{PP}}[-rK].jsonl")
    return m


def _all_calls(paths: list[str], want: dict) -> dict[tuple[str, int, int, int], list[tuple[float, str]]]:
    """Every call's held-out rows, per configuration and -npl, in the order given (runs 6-8: the median of them)."""
    measured: dict[tuple[str, int, int, int], list[tuple[float, str]]] = {}
    for path in paths:
        m = _name(path)
        for r in batched_bench.load(path).rows:
            key = (m.group(1), r.prompt_tokens, r.gen_tokens, r.sequences)
            if key in want:
                measured.setdefault(key, []).append((r.decode_tps, str(path)))
    return measured


def _complete_rounds(paths: list[str], want: dict, machines: dict[str, str] | None = None,
                     ) -> tuple[dict[tuple[str, int, int, int], list[tuple[float, str]]], list[int] | list[str]]:
    """The held-out rows of the complete rounds only, and those rounds (ascending). A call is finished when its file
    has a row for every predicted -npl; a round is complete when every configuration (layout, -npp) among the files
    has a finished call in it. Two finished calls of one configuration and round: an error. ``machines`` (a file's
    folder name -> a machine's label): a round is (machine, K), so rounds that two machines each numbered K stay two
    (run 10), and they are named label + K. Reads the files only."""
    npl = {k[3] for k in want}
    calls: dict[tuple[str, int, Any], tuple[str, list]] = {}
    for path in paths:
        m = _name(path)
        if m.group(3) is None:
            sys.exit(f"predict_batched: {path!r} has no round (-rK); --statistic gmean needs one per file")
        try:
            rows = batched_bench.load(path).rows
        except InputError:
            continue  # killed before its first row: not finished
        if not npl <= {r.sequences for r in rows}:
            continue  # not finished (killed or cut short): no part of any round
        k: Any = int(m.group(3))
        if machines:
            folder = Path(path).parent.name
            if folder not in machines:
                sys.exit(f"predict_batched: {path!r} is in folder {folder!r}, which --machines does not name; allowed: "
                         f"{', '.join(sorted(machines))}")
            k = (machines[folder], k)
        key = (m.group(1), int(m.group(2)), k)
        if key in calls:
            sys.exit(f"predict_batched: two finished calls of {key[0]} -npp {key[1]} round {key[2]}: "
                     f"{calls[key][0]!r} and {path!r}")
        calls[key] = (str(path), rows)
    configs = {(lay, pp) for lay, pp, _ in calls}
    rounds = sorted(k for k in {k for _, _, k in calls} if all((lay, pp, k) in calls for lay, pp in configs))
    measured: dict[tuple[str, int, int, int], list[tuple[float, str]]] = {}
    for (lay, _pp, k), (path, rows) in sorted(calls.items(), key=lambda c: (c[0][2], c[0][0], c[0][1])):
        if k not in rounds:
            continue
        for r in rows:
            key = (lay, r.prompt_tokens, r.gen_tokens, r.sequences)
            if key in want:
                measured.setdefault(key, []).append((r.decode_tps, path))
    if not rounds:
        sys.exit("predict_batched: no complete round among the files given")
    return measured, [f"{a}{b}" for a, b in rounds] if machines else rounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/llamacpp/predict_batched.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("predict", help="predict the held-out rows (reads no measured file)")
    p.add_argument("--profile", required=True, help="the profile kvpipe calibrate --from-batched-bench wrote")
    p.add_argument("--gguf", required=True, help="the GGUF llama-batched-bench ran (tools/llamacpp/write_gguf.py)")
    p.add_argument("--pp", default="1024,4096", help="held-out -npp values (default 1024,4096)")
    p.add_argument("--npl", default="1,2,4,8", help="-npl values (default 1,2,4,8)")
    p.add_argument("--tg", type=int, default=32, help="-ntg (default 32)")
    p.add_argument("--ctx", default="", help="PP=C,...: the -c of those -npp (default 8 x (npp + ntg) + 256)")
    p.add_argument("--kv-copy", dest="kv_copy", choices=("streams", "span"), default="streams",
                   help="the model of a split cache's ordered copy (kvpipe --kv-copy; span: upstream llama.cpp's, its "
                        "streams -c over the largest -npl, padded to 256)")
    p.add_argument("--out", required=True, help="folder for prediction.json and prediction.md")
    p.set_defaults(func=predict)
    c = sub.add_parser("compare", help="hold the committed prediction to the held-out files")
    c.add_argument("--out", required=True, help="the folder holding prediction.json; comparison.* are written there")
    c.add_argument("--drop-outliers", type=float, default=0.0, metavar="FRACTION",
                   help="leave out a call more than FRACTION off its row's median of calls (validate.batch_fit.outlying: "
                        "three calls or more; default 0, every call kept)")
    c.add_argument("--statistic", choices=("median", "gmean"), default="median",
                   help="a configuration's measurement over its calls: median (runs 6-8, default) or gmean (run 9: the "
                        "geometric mean over the rounds every configuration given finished)")
    c.add_argument("--machines", default="", metavar="DIR=LABEL,...",
                   help="with gmean: the machine each folder's calls ran on (run 10: call1=A,call2=B,...): a round is "
                        "(machine, K), named LABEL+K")
    c.add_argument("measured", nargs="+", help="held-out llama-batched-bench JSONL files (with gmean, the calibration "
                                               "files may be given too: they count only for the complete rounds)")
    c.set_defaults(func=compare)
    args = ap.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
