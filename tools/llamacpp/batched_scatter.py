"""Issue 28: how much one llama-batched-bench call scatters, and how many calls a configuration needs.

Runs 6-8 called ``llama-batched-bench`` two or three times per configuration (run, layout split / unified, ``-npp``),
each call writing one row per ``-npl`` (1, 2, 4, 8). This tool reads every such JSONL file
(``run*/call*/r{RUN}-batched-{split,unified}-pp{PP}-r{K}.jsonl``) and asks four things of the decode rate (S_TG, t/s):

1. **Scatter**: each call's t/s over its configuration's median, per ``-npl`` and pooled.
2. **The floor**: a perfect model, held to the median of N calls, still errs by the calls' scatter. Resampling whole
   calls (a call is its vector of per-``-npl`` log-residuals, so rows of one call keep moving together) from the pooled
   residuals, seeded, gives the expected median and max |error| over 16 rows (4 configurations x 4 ``-npl``, as runs
   7-8 held out) and how often such a model would meet issue 28's target (median <= 5%, max <= 10%).
3. **Do the rows of one call move together?** The correlation, across calls, of a call's ``-npl 1`` residual with its
   ``-npl k`` one; and the scatter of ``-npl k`` left once the call's own ``-npl 1`` row is divided out.
4. **Same-call normalisation, after the fact** (runs 7-8; their held-out rows had been read, so this is design
   evidence, not a test): predict a call's ``-npl k`` row as its own measured ``-npl 1`` row times the committed
   prediction's ratio P_k / P_1, against the committed cross-call prediction P_k; and the same with that ratio
   corrected by how far the calibration calls' own ratios m_k / m_1 sat from the fit's.
5. **Rounds**: the mean residual of each round (-rK) of a run, and (after the fact, runs 7-8) the committed
   prediction scaled per held-out call by its round's calibration calls' measured / fitted.

The residual of a call is log(t/s) minus its configuration's mean log, times sqrt(n / (n - 1)) for n calls (so that
a pool of two- and three-call residuals has the spread of one call, not less); configurations with one call are left
out. Not part of the installed package; reads files only, writes nothing unless ``--json`` is given.

    python tools/llamacpp/batched_scatter.py [--root validate/results/h200-llamacpp] [--runs 6,7,8] [--evaluate 7,8]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from validate import batched_bench  # noqa: E402

NAME = re.compile(r"r(\d+)-batched-(split|unified)-pp(\d+)-r(\d+)\.jsonl$")
TARGET_MEDIAN, TARGET_MAX = 0.05, 0.10  # issue 28, H200 held-out rows


@dataclass(frozen=True)
class Call:
    """One llama-batched-bench call: its configuration and its decode t/s per -npl."""

    run: int
    layout: str  # "split" or "unified" (-kvu)
    pp: int  # -npp, tokens
    repeat: int  # the -rK of its file name
    tps: tuple[tuple[int, float], ...]  # (-npl, S_TG t/s), sorted by -npl

    @property
    def config(self) -> tuple[int, str, int]:
        return (self.run, self.layout, self.pp)


def load_calls(root: Path, runs: list[int]) -> list[Call]:
    """Every batched JSONL call of ``runs`` under ``root`` (``run{N}/*/``). Reads files; blocks on disk only."""
    calls = []
    for run in runs:
        for path in sorted((root / f"run{run}").glob("*/r*-batched-*.jsonl")):
            m = NAME.search(path.name)
            if not m or int(m.group(1)) != run:
                continue
            rows = batched_bench.load(path).rows
            calls.append(Call(run, m.group(2), int(m.group(3)), int(m.group(4)),
                              tuple(sorted((r.sequences, r.decode_tps) for r in rows))))
    return whole_calls(calls)


def whole_calls(calls: list[Call]) -> list[Call]:
    """``calls`` less those cut short: a call lacking an -npl row that another call of its run has (a device call's
    time limit stopping llama-batched-bench between rows, as run 13's last call). Each one left out is named on
    stderr. CPU only."""
    seen: dict[int, set[int]] = {}
    for c in calls:
        seen.setdefault(c.run, set()).update(dict(c.tps))
    kept = []
    for c in calls:
        missing = sorted(seen[c.run] - set(dict(c.tps)))
        if missing:
            print(f"batched_scatter: run {c.run} {c.layout} -npp {c.pp} -r{c.repeat} left out: cut short, no "
                  f"-npl {','.join(map(str, missing))} row", file=sys.stderr)
            continue
        kept.append(c)
    return kept


def by_config(calls: list[Call]) -> dict[tuple[int, str, int], list[Call]]:
    """Calls grouped by configuration, only configurations with two calls or more."""
    out: dict[tuple[int, str, int], list[Call]] = {}
    for c in calls:
        out.setdefault(c.config, []).append(c)
    return {k: v for k, v in sorted(out.items()) if len(v) >= 2}


def npls(calls: list[Call]) -> list[int]:
    """The -npl values every call has."""
    sets = [set(dict(c.tps)) for c in calls]
    return sorted(set.intersection(*sets)) if sets else []


def ratios_to_median(groups: dict[tuple[int, str, int], list[Call]], npl: list[int]) -> dict[int, list[float]]:
    """Per -npl: every call's t/s over its configuration's median t/s, minus 1 (dimensionless)."""
    out: dict[int, list[float]] = {k: [] for k in npl}
    for calls in groups.values():
        for k in npl:
            med = statistics.median(dict(c.tps)[k] for c in calls)
            out[k] += [dict(c.tps)[k] / med - 1.0 for c in calls]
    return out


def residuals(groups: dict[tuple[int, str, int], list[Call]], npl: list[int]) -> list[tuple[float, ...]]:
    """One vector per call: log t/s minus its configuration's mean log, per -npl, inflated by sqrt(n / (n - 1))."""
    return [v for _, v in call_residuals(groups, npl)]


def call_residuals(groups: dict[tuple[int, str, int], list[Call]], npl: list[int]) -> list[tuple[Call, tuple[float, ...]]]:
    """``residuals``, each beside its call."""
    out = []
    for calls in groups.values():
        n = len(calls)
        logs = [[math.log(dict(c.tps)[k]) for k in npl] for c in calls]
        means = [statistics.fmean(col) for col in zip(*logs, strict=True)]
        scale = math.sqrt(n / (n - 1))
        out += [(c, tuple((x - m) * scale for x, m in zip(row, means, strict=True))) for c, row in zip(calls, logs, strict=True)]
    return out


def rounds(groups: dict[tuple[int, str, int], list[Call]], npl: list[int]) -> list[dict[str, float]]:
    """Per (run, round -rK): calls and their mean residual over every -npl row -- a round that ran slow or fast for
    every configuration shows as a mean far from 0 (log units)."""
    out: dict[tuple[int, int], list[float]] = {}
    for c, v in call_residuals(groups, npl):
        out.setdefault((c.run, c.repeat), []).append(statistics.fmean(v))
    return [{"run": r, "round": k, "calls": len(v), "mean": statistics.fmean(v)} for (r, k), v in sorted(out.items())]


def floor(pool: list[tuple[float, ...]], n_calls: int, configs: int, draws: int, seed: int, stat: str = "median") -> dict[str, float]:
    """A perfect model held to the median (``stat`` "mean": the geometric mean) of ``n_calls`` calls drawn from
    ``pool`` (whole call vectors), for
    ``configs`` configurations x len(vector) rows: expected median and max |error|, their 90th percentiles and the
    share of draws meeting the target. Errors are predicted / measured - 1 = exp(-median residual) - 1. CPU only."""
    rng = random.Random(seed)
    meds, maxes, met = [], [], 0
    for _ in range(draws):
        errs = []
        for _ in range(configs):
            picked = [rng.choice(pool) for _ in range(n_calls)]
            centre = statistics.median if stat == "median" else statistics.fmean
            errs += [abs(math.exp(-centre(col)) - 1.0) for col in zip(*picked, strict=True)]
        med, top = statistics.median(errs), max(errs)
        meds.append(med)
        maxes.append(top)
        met += med <= TARGET_MEDIAN and top <= TARGET_MAX
    q = lambda xs: sorted(xs)[int(0.9 * (len(xs) - 1))]  # noqa: E731
    return {"calls": n_calls, "median_abs": statistics.fmean(meds), "median_abs_p90": q(meds),
            "max_abs": statistics.fmean(maxes), "max_abs_p90": q(maxes), "met_share": met / draws}


def correlation(xs: list[float], ys: list[float]) -> float:
    """Pearson correlation (dimensionless); nan when either side has no spread."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def rms(xs: list[float]) -> float:
    return math.sqrt(statistics.fmean(x * x for x in xs))


def together(pool: list[tuple[float, ...]], npl: list[int]) -> list[dict[str, float]]:
    """Per -npl k > the first: corr(residual at the first -npl, at k), the rms residual at k and the rms of
    (residual at k - residual at the first) -- the scatter left after dividing out the call's own first row."""
    first = [v[0] for v in pool]
    return [{"npl": k, "corr": correlation(first, [v[i] for v in pool]), "rms": rms([v[i] for v in pool]),
             "rms_same_call": rms([v[i] - v[0] for v in pool])} for i, k in enumerate(npl) if i > 0]


def ratio_correction(prediction: dict) -> dict[tuple[str, int], float]:
    """From the calibration calls alone (prediction.json's ``calibration``, one entry per call-row, a call's rows in
    -npl order): per (layout, -npl k), the median over calls of (m_k / m_1) / (F_k / F_1), F the fitted t/s --
    how far the fit's ratio to its own one-sequence row misses the calls' own ratio (dimensionless)."""
    out: dict[tuple[str, int], list[float]] = {}
    for rows in calibration_calls(prediction):
        one = rows[0]
        if one["sequences"] != 1:
            continue
        for e in rows[1:]:
            out.setdefault(("unified" if e["unified"] else "split", e["sequences"]), []).append(
                (e["measured_tps"] / one["measured_tps"]) / (e["fitted_tps"] / one["fitted_tps"]))
    return {k: statistics.median(v) for k, v in out.items()}


def calibration_calls(prediction: dict) -> list[list[dict]]:
    """prediction.json's ``calibration`` entries (one per call-row, a call's rows in -npl order) cut into calls."""
    calls: list[list[dict]] = []
    for e in prediction["calibration"]:
        if not calls or e["sequences"] <= calls[-1][-1]["sequences"]:
            calls.append([])
        calls[-1].append(e)
    return calls


def round_factors(prediction: dict) -> dict[int, float]:
    """Per round -rK: exp of the mean over the calibration calls of that round, over their rows, of log(measured /
    fitted) -- how much faster than the fit that round ran (dimensionless). The calls' files are prediction.json's
    ``fit_from`` list, in the order the fit read them."""
    text = prediction["fit_from"].split(" (", 1)[0].removeprefix("llama-batched-bench ")
    files = [f.strip() for f in text.split(",")]
    calls = calibration_calls(prediction)
    if len(files) != len(calls):
        raise SystemExit(f"batched_scatter: fit_from names {len(files)} files but calibration has {len(calls)} calls")
    out: dict[int, list[float]] = {}
    for f, rows in zip(files, calls, strict=True):
        m = NAME.search(f)
        if not m:
            raise SystemExit(f"batched_scatter: calibration file {f!r} is not named r{{RUN}}-batched-*-pp*-r*.jsonl")
        out.setdefault(int(m.group(4)), []).extend(math.log(e["measured_tps"] / e["fitted_tps"]) for e in rows)
    return {k: math.exp(statistics.fmean(v)) for k, v in sorted(out.items())}


def round_rule(calls: list[Call], prediction: dict) -> list[dict]:
    """Every held-out row: the committed prediction P and P times its call's round factor (``round_factors``),
    the median over the configuration's calls, each against the measured median (t/s, errors predicted / measured - 1)."""
    g = round_factors(prediction)
    out = []
    for r in prediction["held_out"]:
        mine = [c for c in calls if (c.layout, c.pp) == (r["layout"], r["pp"])]
        meas = statistics.median(dict(c.tps)[r["pl"]] for c in mine)
        lost = sorted({c.repeat for c in mine} - set(g))
        if lost:
            raise SystemExit(f"batched_scatter: round {lost[0]} of a held-out call has no calibration call to scale it")
        rnd = statistics.median(r["predicted_tps"] * g[c.repeat] for c in mine)
        out.append({"layout": r["layout"], "pp": r["pp"], "pl": r["pl"], "cross_error": r["predicted_tps"] / meas - 1.0,
                    "round_error": rnd / meas - 1.0})
    return out


def same_call(calls: list[Call], prediction: dict) -> list[dict]:
    """Held-out rows of ``prediction`` (prediction.json's ``held_out``) with -npl > 1: the configuration's measured
    median, the committed cross-call prediction, the same-call one (median over calls of m_1(c) P_k / P_1) and the
    same-call one with the ratio corrected on the calibration calls (times ``ratio_correction``); per call the
    cross- and same-call errors against that call's own row. t/s throughout."""
    pred = {(r["layout"], r["pp"], r["pl"]): r["predicted_tps"] for r in prediction["held_out"]}
    fix = ratio_correction(prediction)
    out = []
    for (layout, pp, pl), p_k in sorted(pred.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        if pl == 1 or (layout, pp, 1) not in pred:
            continue
        mine = [c for c in calls if (c.layout, c.pp) == (layout, pp)]
        if not mine:
            raise SystemExit(f"batched_scatter: no call of {layout} -npp {pp} for a held-out row of the prediction")
        p_1 = pred[(layout, pp, 1)]
        meas = statistics.median(dict(c.tps)[pl] for c in mine)
        same = [dict(c.tps)[1] * p_k / p_1 for c in mine]
        fixed = statistics.median(same) * fix.get((layout, pl), math.nan)
        out.append({"layout": layout, "pp": pp, "pl": pl, "measured_tps": meas, "cross_tps": p_k,
                    "same_tps": statistics.median(same), "cross_error": p_k / meas - 1.0,
                    "same_error": statistics.median(same) / meas - 1.0, "fixed_tps": fixed, "fixed_error": fixed / meas - 1.0,
                    "cross_call_errors": [p_k / dict(c.tps)[pl] - 1.0 for c in mine],
                    "same_call_errors": [s / dict(c.tps)[pl] - 1.0 for s, c in zip(same, mine, strict=True)]})
    return out


def _ints(text: str, what: str, low: int) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if not vals or min(vals) < low:
        print(f"batched_scatter: {what} {text!r} is not a comma list of whole numbers >= {low}", file=sys.stderr)
        raise SystemExit(2)
    return vals


def _stats(xs: list[float]) -> str:
    return f"{len(xs)} | {statistics.median(abs(x) for x in xs):.1%} | {max(xs, key=abs):+.1%} | {min(xs):+.1%} .. {max(xs):+.1%}"


def report(args: argparse.Namespace) -> dict:
    """Every table, printed as markdown; returns the figures. Reads files, CPU only (a few seconds)."""
    root = Path(args.root)
    if not root.is_dir():
        print(f"batched_scatter: --root {args.root!r} is not a folder; allowed: validate/results/h200-llamacpp or a copy",
              file=sys.stderr)
        raise SystemExit(2)
    runs, evaluate = _ints(args.runs, "--runs", 1), _ints(args.evaluate, "--evaluate", 1) if args.evaluate else []
    n_list = _ints(args.calls, "--calls", 1)
    if args.draws < 1:
        print(f"batched_scatter: --draws {args.draws} is below 1; allowed: a whole number >= 1", file=sys.stderr)
        raise SystemExit(2)
    calls = load_calls(root, runs)
    groups = by_config(calls)
    npl = npls([c for g in groups.values() for c in g])
    if not groups or not npl:
        print(f"batched_scatter: no configuration of runs {args.runs} under {root} has two calls with common -npl rows",
              file=sys.stderr)
        raise SystemExit(2)
    ratio = ratios_to_median(groups, npl)
    pool = residuals(groups, npl)
    print(f"{len(calls)} calls, {len(groups)} configurations with >= 2 calls ({sum(len(g) for g in groups.values())} calls)\n")
    print("| -npl | call-rows | median \\|t/s / config median - 1\\| | largest | range |\n|---:|---:|---:|---:|---|")
    for k in npl:
        print(f"| {k} | {_stats(ratio[k])} |")
    print(f"| pooled | {_stats([x for k in npl for x in ratio[k]])} |")
    sd = {k: rms([v[i] for v in pool]) for i, k in enumerate(npl)}
    print("\nOne call's sd (log t/s, pooled residuals): " + ", ".join(f"-npl {k} {s:.1%}" for k, s in sd.items())
          + f"; pooled {rms([x for v in pool for x in v]):.1%}")
    for run in runs:
        sub = [x for key, g in groups.items() if key[0] == run for x in residuals({key: g}, npl)]
        if sub:
            print(f"  run {run}: {len(sub)} calls, sd {rms([x for v in sub for x in v]):.1%}")
    tog = together(pool, npl)
    print(f"\n| -npl k | corr(residual at -npl {npl[0]}, at k) | sd at k | sd of (k - {npl[0]}) in one call |\n|---:|---:|---:|---:|")
    for t in tog:
        print(f"| {t['npl']} | {t['corr']:+.2f} | {t['rms']:.1%} | {t['rms_same_call']:.1%} |")
    print("\n| run | round -rK | calls | mean residual (log t/s) |\n|---:|---:|---:|---:|")
    for r in rounds(groups, npl):
        print(f"| {r['run']} | {r['round']} | {r['calls']} | {r['mean']:+.1%} |")
    configs = 4
    pools = {"runs " + args.runs: pool}
    for run in runs:
        sub = residuals({k: g for k, g in groups.items() if k[0] == run}, npl)
        if len(sub) >= 4:
            pools[f"run {run}"] = sub
    floors = {name: [floor(p, n, configs, args.draws, args.seed, args.statistic) for n in n_list] for name, p in pools.items()}
    for name, fl in floors.items():
        print(f"\nFloor ({name}'s calls, {len(pools[name])}): a perfect model, {configs} configurations x {len(npl)} -npl = "
              f"{configs * len(npl)} rows, the {args.statistic} of N calls, {args.draws} draws (seed {args.seed})\n\n| N calls | "
              "expected median \\|error\\| (p90) | expected max \\|error\\| (p90) | share meeting median <= 5%, max <= 10% |"
              "\n|---:|---|---|---:|")
        for f in fl:
            print(f"| {f['calls']} | {f['median_abs']:.1%} ({f['median_abs_p90']:.1%}) | {f['max_abs']:.1%} "
                  f"({f['max_abs_p90']:.1%}) | {f['met_share']:.0%} |")
    evals: dict[str, list[dict]] = {}
    for run in evaluate:
        path = root / f"prediction-batched{run}" / "prediction.json"
        if not path.is_file():
            print(f"batched_scatter: {path} is missing; allowed --evaluate runs: those with a committed prediction",
                  file=sys.stderr)
            raise SystemExit(2)
        rows = same_call([c for c in calls if c.run == run], json.loads(path.read_text()))
        evals[str(run)] = rows
        print(f"\nRun {run}, after the fact (design evidence): held-out rows with -npl > 1\n\n| layout | -npp | -npl | measured "
              "(median) | cross-call | error | same-call | error | same-call, ratio corrected | error |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['layout']} | {r['pp']} | {r['pl']} | {r['measured_tps']:.2f} | {r['cross_tps']:.2f} | "
                  f"{r['cross_error']:+.1%} | {r['same_tps']:.2f} | {r['same_error']:+.1%} | "
                  f"{r['fixed_tps']:.2f} | {r['fixed_error']:+.1%} |")
        for name in ("cross", "same"):
            cfg = [abs(r[f"{name}_error"]) for r in rows]
            per = [abs(e) for r in rows for e in r[f"{name}_call_errors"]]
            print(f"  {name}-call: {len(cfg)} rows median {statistics.median(cfg):.1%} max {max(cfg):.1%}; "
                  f"per single call {len(per)} call-rows median {statistics.median(per):.1%} max {max(per):.1%}")
        fixed = [abs(r["fixed_error"]) for r in rows]
        print(f"  same-call, ratio corrected: {len(fixed)} rows median {statistics.median(fixed):.1%} max {max(fixed):.1%}")
        rr = round_rule([c for c in calls if c.run == run], json.loads(path.read_text()))
        g = round_factors(json.loads(path.read_text()))
        print("  round factors (calibration calls' measured / fitted): " + ", ".join(f"r{k} {v:.3f}" for k, v in g.items()))
        for name in ("cross", "round"):
            for part, sel in (("every row", rr), ("one sequence", [r for r in rr if r["pl"] == 1]),
                              ("2-8 sequences", [r for r in rr if r["pl"] > 1])):
                e = [abs(r[f"{name}_error"]) for r in sel]
                print(f"  {name}: {part}, {len(e)} rows: median {statistics.median(e):.1%} max {max(e):.1%}")
        evals[f"{run}-round"] = rr
    return {"calls": len(calls), "configurations": len(groups), "npl": npl, "ratios": ratio, "sd": sd,
            "together": tog, "floor": floors, "same_call": evals}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/llamacpp/batched_scatter.py", description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(ROOT / "validate/results/h200-llamacpp"), help="folder holding run*/ (default: ours)")
    ap.add_argument("--runs", default="6,7,8", help="runs whose batched calls to read (default 6,7,8)")
    ap.add_argument("--evaluate", default="7,8", help="runs to evaluate same-call normalisation on ('' for none)")
    ap.add_argument("--calls", default="1,2,3,5,7", help="N calls per configuration for the floor (default 1,2,3,5,7)")
    ap.add_argument("--draws", type=int, default=20000, help="bootstrap draws (default 20000)")
    ap.add_argument("--statistic", choices=("median", "mean"), default="median",
                    help="a configuration's measurement: the median of its calls (default) or their geometric mean")
    ap.add_argument("--seed", type=int, default=28, help="bootstrap seed (default 28)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    data = report(args)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
