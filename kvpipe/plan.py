"""Capacity planning: which depth and ring budget to give each context size.

For one model on one machine the pipeline's gain over the ordered path rises
with the context while the token is compute-bound (each extra window row adds
copy time the ring hides), peaks where copy ~ compute, and falls once the
copies dominate (the ring can only hide the compute). The ring it needs grows
linearly with the window: ``n_slots x rows x b`` for ``b`` bytes of K+V per
row of one attention layer, so a fixed budget declines past
``budget / (n_slots x b)`` rows and the gain drops to zero there.

The plan simulates, per context, the ordered path and depths 1..max uncapped
(the budget that keeps the ring is the ring it reports), then the best depth
at the default budget, and places three peaks side by side:

* the closed form ``rows* = compute x BW / (n_attn x b)`` with ``compute``
  the per-token GPU compute of the decode graph (it grows with the window, so
  rows* is solved as a fixed point) and ``BW`` the pinned H2D bandwidth of a
  delivery of that size; the ring there is ``(n_slots / n_attn) x compute x BW``;
* the simulated peak, from a scan of windows (256-row steps near the top);
* the best of the contexts asked for.

The closed form balances bare copy time against bare compute. The simulation
also charges the GPU side for the late rows copied on the consumer stream and
the host's round trip at every CPU split, and the copy side for link latency
and the small blocking copies that queue FIFO behind deliveries; whichever
side carries more moves the balance, and the plan says by how much.

Units: seconds and bytes inside; MiB, ms and rows in the report.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvpipe.sweep import CHECK_N, gain_rows, key_of_point, key_of_row, run_sweep
from sim.errors import InputError
from sim.graph import decode_graph
from sim.model_files import with_weights_type
from sim.points import MAX_POINTS, GridSpec
from sim.points import points as grid_points
from sim.simulate import Point
from sim.transport.config import MAX_BUDGET_MIB, MAX_DEPTH, MIB, TransportConfig
from sim.workload import ALL_LAYERS, MAX_CONTEXT, WINDOW_PAD_ROWS, Workload, layers_of_ngl

DEFAULT_BUDGET_MIB = TransportConfig().budget_mib
#: Gains closer than this are a tie: two depths that run the same schedule differ by float noise (~1e-14), which
#: must not pick the depth (nor let the fast path's extrapolation pick another one than every token simulated would).
TIE_GAIN = 1e-9


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: one model/hardware/cache type over contexts (grid-flag syntax for the specs)."""

    model: str = "qwen3.8-27b"
    hardware: str = "rtx4070-gen4x16"
    cache_type: str = "q8_0"
    contexts: tuple[int, ...] = (4096, 16384, 32768)
    max_depth: int = 4
    tokens: int = 4
    default_budget_mib: float = DEFAULT_BUDGET_MIB
    budget_for_gain: float | None = None
    budgets_mib: tuple[float, ...] = ()  # also: per context, the best depth and its gain at each of these budgets
    pinned: bool = True
    jobs: int | None = None
    llama_cpp: bool = False  # kept for old command lines: the flags are always part of the memory plan now
    exact: bool = False  # simulate every point and every token (default: the distinct simulations, steady tokens)
    vram_gib: float | None = None  # the device memory to fit (default: the card's)
    host_mem_gib: float | None = None  # the host memory to fit (default: this machine's)
    build: str = "fork"  # the llama.cpp build to plan for: "fork" (the pipelining pull requests) or "upstream"
    min_tps: float | None = None  # also: the largest context at or above this t/s
    n_gpu_layers: int = ALL_LAYERS  # llama.cpp's -ngl (default: every layer; lowered by the plan if the weights do not fit)
    weights_type: str = ""  # the weights' type or bits per weight, for a model file that does not say (a config.json)
    check_n: int = CHECK_N  # the evaluator's rows re-simulated exact at the plan's end, at least (0: none)

    def __post_init__(self) -> None:
        if not self.contexts:
            raise InputError("--context: need at least one value")
        if not 1 <= self.max_depth <= MAX_DEPTH:
            raise InputError(f"--max-depth {self.max_depth} out of range; allowed: 1..{MAX_DEPTH}")
        if self.budget_for_gain is not None and not 0 < self.budget_for_gain <= 1:
            raise InputError(f"--budget-for-gain {self.budget_for_gain:g} out of range; allowed: a fraction in (0, 1]")
        for b in self.budgets_mib:
            if not 0 <= b <= MAX_BUDGET_MIB:
                raise InputError(f"--budget {b:g} out of range; allowed: 0 (no cap) .. {MAX_BUDGET_MIB}")
        n = len(self.contexts) * (self.max_depth + 1) * (1 + len(self.budgets_mib))
        if n > MAX_POINTS:
            raise InputError(f"the plan has {n:,} points (contexts x depths x budgets); allowed: at most {MAX_POINTS:,}")
        if self.check_n < 0:
            raise InputError(f"--check {self.check_n} out of range; allowed: >= 0 (0 = no check)")
        if self.build not in ("fork", "upstream"):
            raise InputError(f"--build {self.build!r} unknown; allowed: fork (GenerelSchwerz/llama.cpp), upstream")
        if self.min_tps is not None and not (math.isfinite(self.min_tps) and self.min_tps > 0):
            raise InputError(f"--min-tps {self.min_tps:g} out of range; allowed: a number of tokens/s > 0")
        if self.n_gpu_layers < 1:
            raise InputError(f"-ngl {self.n_gpu_layers} out of range; allowed: a whole number >= 1 (llama.cpp's -ngl; 99: "
                             "every layer)")


@dataclass(frozen=True)
class ClosedForm:
    """The copy = compute balance: window rows, ring MiB, and the compute (ms) and bandwidth (GB/s) used."""

    rows: float
    ring_mib: float
    compute_ms: float
    bw_gbps: float
    n_slots: int
    n_attn: int
    row_bytes: int


@dataclass
class ContextPlan:
    """One context's answer (the JSON object ``kvpipe plan --json`` prints)."""

    context: int
    window_rows: int
    best_depth: int
    uncapped_gain: float
    budget_mib_for_full_gain: float
    gain_at_default_budget: float
    default_budget_mib: float
    default_declines: bool
    default_decline_rows: int | None
    gain_per_mib: float | None
    copy_ms: float
    compute_ms: float
    gain_by_depth: dict[int, float]
    ring_mib_by_depth: dict[int, float]
    peak_depth: int = 1
    peak_rows_closed_form: float = 0.0
    peak_ring_mib_closed_form: float = 0.0
    peak_rows_simulated: int = 0
    peak_context_simulated: int = 0
    peak_gain_simulated: float = 0.0
    peak_ring_mib_simulated: float = 0.0
    peak_note: str = ""
    budget_for_gain: float | None = None
    budget_mib_for_gain: float | None = None
    depth_for_gain: int | None = None
    best_by_budget: dict[float, tuple[int, float]] = field(default_factory=dict)  # budget MiB -> (best depth, its gain)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("extra"))
        d["gain_by_depth"] = {str(k): v for k, v in self.gain_by_depth.items()}
        d["ring_mib_by_depth"] = {str(k): v for k, v in self.ring_mib_by_depth.items()}
        d["best_by_budget"] = {f"{b:g}": {"depth": dd, "gain": g} for b, (dd, g) in self.best_by_budget.items()}
        return d


# ------------------------------------------------------------- mechanics


def points(req: PlanRequest, contexts: list[int], depths: list[int], budget_mib: float, tokens: int | None = None) -> list[Point]:
    """The plan's points, through the library's grid (same validation, same messages). Raises InputError."""
    spec = GridSpec(models=(req.model,), hardware=(req.hardware,), cache_types=(req.cache_type,),
                    contexts=tuple((c,) for c in contexts), depths=tuple(depths), budgets_mib=(budget_mib,),
                    tokens=tokens or req.tokens, pinned=req.pinned)
    pts = grid_points(spec)
    if req.weights_type or req.n_gpu_layers != ALL_LAYERS:
        try:
            model = with_weights_type(pts[0].workload.model, req.weights_type) if req.weights_type else pts[0].workload.model
        except ValueError as exc:
            raise InputError(str(exc)) from None
        try:  # the flag is llama.cpp's -ngl, which counts the output layer
            gpu_layers = layers_of_ngl(req.n_gpu_layers, model.n_layers) if req.n_gpu_layers != ALL_LAYERS else ALL_LAYERS
        except ValueError as exc:
            raise InputError(str(exc)) from None
        pts = [replace(p, workload=replace(p.workload, model=model, n_gpu_layers=gpu_layers)) for p in pts]
    return pts


class Evaluated:
    """The evaluator's rows of one plan, held to the simulator once at the plan's end (``check``) rather than once
    per sweep the plan runs: a plan runs several small sweeps, and a sample of 32 each cost more than the plan."""

    def __init__(self) -> None:
        self.points: list[Point] = []
        self.rows: list[dict[str, Any]] = []

    def add(self, pts: Sequence[Point], rows: Sequence[dict[str, Any]]) -> None:
        """Keep the evaluated ones of ``rows`` (any order) beside their points."""
        by_key = {key_of_point(p): p for p in pts}
        for r in rows:
            p = by_key.get(key_of_row(r))
            if p is not None and r.get("engine") == "evaluator":
                self.points.append(p)
                self.rows.append(r)

    def check(self, n: int = CHECK_N) -> float:
        """Re-simulate at least ``n`` of the kept rows and every boundary (``sim.evaluator.check_sample``); the largest
        relative disagreement. Raises EvaluatorDisagreement above 1e-9. Blocks for the simulations."""
        from sim.evaluator import check_sample

        return check_sample(self.points, self.rows, n=n)


EVALUATED: list[Evaluated] = []  # while a plan runs: where its sweeps leave their evaluated rows


def run_points(req: PlanRequest, pts: Sequence[Point]) -> Any:
    """One sweep of the plan (``kvpipe.sweep.run_sweep``); inside a plan its evaluated rows wait for the plan's one
    sample check. Blocks for the simulations."""
    collecting = EVALUATED[-1] if EVALUATED else None
    res = run_sweep(pts, None, jobs=req.jobs, progress=False, exact=req.exact, check_n=0 if collecting else CHECK_N)
    if collecting is not None:
        collecting.add(pts, res.rows)
    return res


def _run(req: PlanRequest, pts: list[Point]) -> list[dict[str, Any]]:
    res = run_points(req, pts)
    if res.failed:
        key, msg = res.failed[0]
        raise InputError(f"point {key} failed: {msg}")
    return gain_rows(res.rows)


def gpu_compute_s(point: Point, window_rows: int) -> float:
    """GPU compute of one decode token of ``point``'s model whose window is ``window_rows`` (its GPU splits), seconds."""
    wl = point.workload
    big = Workload(wl.model, wl.cache_k, wl.cache_v, (max(1, window_rows - 1),), tokens=1, pinned=wl.pinned)
    g = decode_graph(big, point.hardware.devices[0].compute, position=max(0, window_rows - 1))
    return sum(s.compute_s for s in g.splits if s.kind == "gpu")


def copy_s(point: Point, window_rows: int) -> float:
    """Bare H2D time of one token's windows (every attention layer, K and V), seconds."""
    wl = point.workload
    link = point.hardware.devices[0].link(True, wl.pinned)
    return wl.model.n_attn * sum(link.seconds(window_rows * b) for b in (wl.k_row_bytes, wl.v_row_bytes))


def peak_rows(compute_s: float, bw_bytes_per_s: float, n_attn: int, row_bytes: int) -> float:
    """The closed-form peak ``rows* = compute x BW / (n_attn x b)``: window rows where copy equals compute."""
    return compute_s * bw_bytes_per_s / (n_attn * row_bytes)


def peak_ring_bytes(compute_s: float, bw_bytes_per_s: float, n_attn: int, n_slots: int) -> float:
    """The ring at the closed-form peak, ``(n_slots / n_attn) x compute x BW``, bytes (independent of the cache type)."""
    return n_slots / n_attn * compute_s * bw_bytes_per_s


def closed_form(point: Point, n_slots: int) -> ClosedForm:
    """Solve rows* = compute(rows*) x BW(rows* x b) / (n_attn x b) by fixed-point iteration. Does not block."""
    wl = point.workload
    b, n_attn = wl.row_bytes, wl.model.n_attn
    link = point.hardware.devices[0].link(True, wl.pinned)
    rows = 4096.0
    for _ in range(200):
        compute = gpu_compute_s(point, min(MAX_CONTEXT, max(1, round(rows))))  # a peak past any context: the largest
        bw = link.bandwidth(rows * b)
        new = peak_rows(compute, bw, n_attn, b)
        done = abs(new - rows) < 0.01
        rows = new
        if done:
            break
    ring = peak_ring_bytes(compute, bw, n_attn, n_slots)
    return ClosedForm(rows, ring / MIB, compute * 1e3, bw / 1e9, n_slots, n_attn, b)


def _context_for_window(window_rows: int) -> int:
    """A context whose first decode window is ``window_rows`` (a multiple of the padding)."""
    return max(1, window_rows - WINDOW_PAD_ROWS)


def simulated_peak(req: PlanRequest, depth: int, around_rows: float, max_rows: int) -> dict[str, Any]:
    """The window with the largest uncapped gain at ``depth``: a log scan, then 256-row steps near the top. Blocks."""
    hi = min(max(4 * around_rows, max_rows, 4 * WINDOW_PAD_ROWS), MAX_CONTEXT - WINDOW_PAD_ROWS)
    coarse = sorted({_pad(512 * (hi / 512) ** (i / 23)) for i in range(24)})
    best = _best(req, coarse, depth)
    i = coarse.index(best["window_rows"])
    lo_w, hi_w = coarse[max(0, i - 1)], coarse[min(len(coarse) - 1, i + 1)]
    step = max(WINDOW_PAD_ROWS, _pad((hi_w - lo_w) / 64))
    fine = sorted(set(range(lo_w, hi_w + 1, step)) | {best["window_rows"]})
    return _best(req, fine, depth)


def _pad(rows: float) -> int:
    return max(WINDOW_PAD_ROWS, int(math.ceil(rows / WINDOW_PAD_ROWS)) * WINDOW_PAD_ROWS)


def _best(req: PlanRequest, windows: list[int], depth: int) -> dict[str, Any]:
    rows = _run(req, points(req, [_context_for_window(w) for w in windows], [0, depth], 0, tokens=2))
    piped = [r for r in rows if r["depth"] == depth]
    return max(piped, key=lambda r: (r["gain"] or 0.0, -r["window_rows"]))


def decline_rows(ring_mib: float, window_rows: int, budget_mib: float) -> int | None:
    """Largest window the budget still holds: budget / (ring bytes per window row). None without a cap."""
    if not budget_mib or not window_rows or not ring_mib:
        return None
    per_row = ring_mib * MIB / window_rows
    return int(budget_mib * MIB // per_row)


# ------------------------------------------------------------------- plan


def plan(req: PlanRequest) -> list[ContextPlan]:
    """Plan every context of ``req``. Blocks for the simulations (about a second on two cores)."""
    depths = list(range(req.max_depth + 1))
    budgets = [0.0, *(b for b in req.budgets_mib if b)]  # uncapped first; the asked budgets in the same run
    rows = _run(req, [p for b in budgets for p in points(req, list(req.contexts), depths, b)])
    by_ctx: dict[int, dict[int, dict[str, Any]]] = {}
    for r in rows:
        if r["budget_mib"] == 0:
            by_ctx.setdefault(r["context"], {})[r["depth"]] = r
    out = [_uncapped(req, c, by_ctx[c]) for c in req.contexts]
    _at_budget(req, out)
    peak_depth = Counter(p.best_depth for p in out if p.best_depth).most_common(1)
    depth = peak_depth[0][0] if peak_depth else 1
    _peak(req, out, depth)
    if req.budget_for_gain is not None:
        _budget_for_gain(req, out, by_ctx)
    if req.budgets_mib:
        _by_budget(req, out, rows)
    return out


def _uncapped(req: PlanRequest, context: int, by_depth: dict[int, dict[str, Any]]) -> ContextPlan:
    gains = {d: r["gain"] if not r["declined"] else 0.0 for d, r in by_depth.items() if d}
    rings = {d: r["ring_mib"] for d, r in by_depth.items() if d}
    top = max(gains.values())
    best = min(d for d, g in gains.items() if g >= top - TIE_GAIN)  # ties go to the shallower depth
    if gains[best] <= 0:
        best = 0
    r = by_depth[best]
    pt = points(req, [context], [0], 0)[0]
    w = r["window_rows"]
    last_w = pt.workload.window_rows(context + req.tokens - 1)  # the ring the row reports is the last graph's
    uncapped = gains.get(best, 0.0)
    ring = rings.get(best, 0.0)
    return ContextPlan(
        context=context, window_rows=w, best_depth=best, uncapped_gain=uncapped,
        budget_mib_for_full_gain=float(math.ceil(ring)) if best else 0.0,
        gain_at_default_budget=0.0, default_budget_mib=req.default_budget_mib, default_declines=False,
        default_decline_rows=decline_rows(rings.get(best or 1, 0.0), last_w, req.default_budget_mib),
        gain_per_mib=uncapped / ring if best and ring else None,
        copy_ms=copy_s(pt, w) * 1e3, compute_ms=gpu_compute_s(pt, w) * 1e3,
        gain_by_depth=gains, ring_mib_by_depth=rings,
        extra={"uncapped_tokens_per_s": r["tokens_per_s"], "ordered_tokens_per_s": by_depth[0]["tokens_per_s"]},
    )


def _at_budget(req: PlanRequest, out: list[ContextPlan]) -> None:
    """Simulate each context's best depth at the default budget (the gain the default actually buys)."""
    todo = [p for p in out if p.best_depth]
    if not todo:
        return
    pts = [points(req, [p.context], [0, p.best_depth], req.default_budget_mib)[i] for p in todo for i in (0, 1)]
    rows = _run(req, pts)
    for p, r in zip(todo, rows[1::2], strict=True):
        p.gain_at_default_budget = 0.0 if r["declined"] else r["gain"]
        p.default_declines = bool(r["declined"])


def _peak(req: PlanRequest, out: list[ContextPlan], depth: int) -> None:
    pt = points(req, [out[0].context], [depth], 0, tokens=1)[0]
    cf = closed_form(pt, depth + 2)
    sim = simulated_peak(req, depth, cf.rows, max(req.contexts))
    asked = max(out, key=lambda p: p.gain_by_depth.get(depth, 0.0))
    note = peak_note(pt, cf, sim, asked, depth)
    for p in out:
        p.peak_depth = depth
        p.peak_rows_closed_form, p.peak_ring_mib_closed_form = cf.rows, cf.ring_mib
        p.peak_rows_simulated, p.peak_context_simulated = sim["window_rows"], sim["context"]
        p.peak_gain_simulated, p.peak_ring_mib_simulated = sim["gain"] or 0.0, sim["ring_mib"]
        p.peak_note = note
        p.extra.update({"peak_compute_ms_closed_form": cf.compute_ms, "peak_bw_gbps_closed_form": cf.bw_gbps,
                        "peak_context_asked": asked.context})


def peak_note(pt: Point, cf: ClosedForm, sim: dict[str, Any], asked: ContextPlan, depth: int) -> str:
    """Why the simulated peak differs from the closed form, in numbers from the simulated peak's row."""
    w, n_attn = sim["window_rows"], pt.workload.model.n_attn
    copy_ms, compute_ms = copy_s(pt, w) * 1e3, gpu_compute_s(pt, w) * 1e3
    g0_ms = first_split_compute_s(pt, w) * 1e3
    late_ms = sim["late_mib"] * MIB / pt.hardware.devices[0].link(True, pt.workload.pinned).bandwidth(sim["late_mib"] * MIB / n_attn) * 1e3
    per_split = (compute_ms - g0_ms) / n_attn
    dram = pt.hardware.devices[0].dram_bytes_per_s
    contention = (
        f" The copies also share the card's memory with the kernels ({dram / 1e9:.1f} GB/s): a delivery under a split "
        f"stretches it by up to {w * pt.workload.row_bytes / dram * 1e3:.3f} ms (its bytes over that bandwidth), "
        f"part of what it carries."
        if dram > 0 else ""
    )
    return (
        f"Simulated peak at {w:,} window rows (context {sim['context']:,}, {sim['gain'] or 0:+.1%}, ring {sim['ring_mib']:.1f} MiB) "
        f"against the closed form's {cf.rows:,.0f} rows ({(w - cf.rows) / cf.rows:+.1%}, ring {cf.ring_mib:.1f} MiB from "
        f"{cf.compute_ms:.2f} ms of compute at {cf.bw_gbps:.2f} GB/s). The closed form balances a token's bare copy against its "
        f"whole GPU compute. The pipeline balances split by split: the first {depth + 1} deliveries land while the GPU waits "
        f"for the first split's small blocking inputs, which queue behind them on the one H2D engine "
        f"(all blocking copies, those inputs and the "
        f"{2 * n_attn} D2H row copies, take {sim['breakdown_ms']['blocked_in_ordered_copies']:.2f} ms a token), and "
        f"the {g0_ms:.2f} ms of compute before the first attention layer overlaps no copy; after that each delivery must fit "
        f"under one split's compute plus the late rows it copies on the consumer stream ({late_ms / n_attn:.3f} ms a split) and "
        f"the host's round trip at the CPU split between them, while the GPU idles. At the simulated peak a delivery takes "
        f"{copy_ms / n_attn:.3f} ms against {per_split:.3f} ms of split compute: the {copy_ms / n_attn - per_split:+.3f} ms is "
        f"what each split carries beside its compute.{contention} Among the contexts asked the best is {asked.context:,} "
        f"({asked.gain_by_depth.get(depth, 0.0):+.1%} at depth {depth}, ring {asked.ring_mib_by_depth.get(depth, 0.0):.1f} MiB)."
    )


def first_split_compute_s(point: Point, window_rows: int) -> float:
    """Compute of the GPU split before the first attention layer (no delivery overlaps it), seconds."""
    wl = point.workload
    big = Workload(wl.model, wl.cache_k, wl.cache_v, (max(1, window_rows - 1),), tokens=1, pinned=wl.pinned)
    g = decode_graph(big, point.hardware.devices[0].compute, position=max(0, window_rows - 1))
    return g.splits[0].compute_s


def _budget_for_gain(req: PlanRequest, out: list[ContextPlan], by_ctx: dict[int, dict[int, dict[str, Any]]]) -> None:
    """Smallest budget (whole MiB) at which some depth keeps >= fraction x the uncapped gain; confirmed by simulation."""
    frac = req.budget_for_gain or 1.0
    todo = []
    for p in out:
        p.budget_for_gain = frac
        if p.uncapped_gain <= 0:
            continue
        ok = [d for d, g in p.gain_by_depth.items() if g >= frac * p.uncapped_gain - 1e-12]
        d = min(ok, key=lambda d: (p.ring_mib_by_depth[d], d))
        p.depth_for_gain, p.budget_mib_for_gain = d, float(math.ceil(p.ring_mib_by_depth[d]))
        todo.append(p)
    if not todo:
        return
    pts = [points(req, [p.context], [0, p.depth_for_gain or 1], p.budget_mib_for_gain or 0)[i] for p in todo for i in (0, 1)]
    for p, r in zip(todo, _run(req, pts)[1::2], strict=True):
        p.extra["gain_at_budget_for_gain"] = 0.0 if r["declined"] else r["gain"]


def _by_budget(req: PlanRequest, out: list[ContextPlan], rows: list[dict[str, Any]]) -> None:
    """Each context's best depth and its gain at each budget of ``req.budgets_mib``, from ``rows`` (every context x
    depth x budget, run with the uncapped points: a budget that keeps the uncapped plan, or declines the ring, is a
    simulation already run, and the point planner runs each distinct one once). Ties go to the shallower depth; a
    best gain <= 0 is depth 0."""
    gains: dict[tuple[float, int], dict[int, float]] = {}
    for r in rows:
        if r["depth"]:
            gains.setdefault((float(r["budget_mib"]), r["context"]), {})[r["depth"]] = 0.0 if r["declined"] else r["gain"]
    for budget in req.budgets_mib:
        for p in out:
            g = gains[(float(budget), p.context)]
            top = max(g.values())
            best = min(d for d, v in g.items() if v >= top - TIE_GAIN)
            p.best_by_budget[budget] = (best, g[best]) if g[best] > 0 else (0, 0.0)


# ------------------------------------------------------------------ report


def render(plans: list[ContextPlan]) -> str:
    """The plan as a fixed-width table, the peak lines and the note. Does not block."""
    frac = plans[0].budget_for_gain
    head = ["context", "window", "best depth", "uncapped gain", "budget MiB (full gain)", f"gain @{plans[0].default_budget_mib:g} MiB",
            "default declines past", "gain %/MiB", "copy ms", "compute ms"]
    if frac is not None:
        head += [f"budget MiB ({frac:.0%} of gain)", "at depth"]
    budgets = list(plans[0].best_by_budget)
    head += [f"@{b:g} MiB: depth gain" if b else "no cap: depth gain" for b in budgets]
    lines = [head]
    for p in plans:
        line = [f"{p.context:,}", f"{p.window_rows:,}", str(p.best_depth), f"{p.uncapped_gain:+.1%}",
                f"{p.budget_mib_for_full_gain:g}" if p.best_depth else "-",
                f"{p.gain_at_default_budget:+.1%}" + (" (declined)" if p.default_declines else ""),
                f"{p.default_decline_rows:,} rows" if p.default_decline_rows else "never",
                f"{p.gain_per_mib * 100:.3f}" if p.gain_per_mib else "-", f"{p.copy_ms:.2f}", f"{p.compute_ms:.2f}"]
        if frac is not None:
            line += [f"{p.budget_mib_for_gain:g}" if p.budget_mib_for_gain is not None else "-",
                     str(p.depth_for_gain) if p.depth_for_gain is not None else "-"]
        line += [f"{p.best_by_budget[b][0]} {p.best_by_budget[b][1]:+.1%}" for b in budgets]
        lines.append(line)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    text = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    p = plans[0]
    cf_ring = p.peak_ring_mib_closed_form
    pad = " " * len(f"peak (depth {p.peak_depth}, {p.peak_depth + 2} slots): ")
    text += [
        "",
        f"peak (depth {p.peak_depth}, {p.peak_depth + 2} slots): closed form rows* = compute x BW / (n_attn x b) = "
        f"{p.extra['peak_compute_ms_closed_form']:.2f} ms x {p.extra['peak_bw_gbps_closed_form']:.2f} GB/s / (n_attn x b) = "
        f"{p.peak_rows_closed_form:,.0f} rows, ring (n_slots / n_attn) x compute x BW = {cf_ring:.1f} MiB",
        f"{pad}simulated: {p.peak_rows_simulated:,} rows (context {p.peak_context_simulated:,}), "
        f"gain {p.peak_gain_simulated:+.1%}, ring {p.peak_ring_mib_simulated:.1f} MiB",
        f"{pad}best of the contexts asked: {_asked_line(plans)}",
        "",
        "note: " + p.peak_note,
    ]
    return "\n".join(text)


def _asked_line(plans: list[ContextPlan]) -> str:
    d = plans[0].peak_depth
    best = max(plans, key=lambda p: p.gain_by_depth.get(d, 0.0))
    return (f"context {best.context:,} (window {best.window_rows:,} rows), gain {best.gain_by_depth.get(d, 0.0):+.1%}, "
            f"ring {best.ring_mib_by_depth.get(d, 0.0):.1f} MiB")
