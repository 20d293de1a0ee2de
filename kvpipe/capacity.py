"""The plan under a memory cap: my model, my card, my VRAM -- which context, depth, budget and resident layers.

What a device holds is computed (``sim.memory``), never read from a profile: the driver's reservation, the weights
of the GPU layers, llama.cpp's compute buffer (an estimate), the KV of the attention layers kept on the device and
the ring. Per context the plan tries, within ``--vram`` (default: the card):

* the whole cache on the device (upstream llama.cpp without ``-nkvo``), where it fits;
* the host cache (``-nkvo``) at each depth 0..max, each with the most attention layers whose KV still fits beside
  the ring and the scheduler's headroom (the fork's ``--kv-gpu-layers``), its budget the ring it needs;

simulates them through the one scheduler and keeps the fastest. The host is checked too: the host cache and the CPU
layers' weights against ``--host-mem`` (default: this machine's memory, said so). A model whose weights do not fit
gets one verdict: the largest ``-ngl`` that fits and what it gives, never a gain. Flags name the build they belong
to: upstream llama.cpp (``-ngl -nkvo -c -ctk -ctv``) or the fork that carries the pipelining pull requests
(GenerelSchwerz/llama.cpp #39, #66, #92: ``--kv-cpu-pinned --kv-pipeline-depth --kv-pipeline-budget
--kv-gpu-layers``), and only flags the chosen ``--build`` has are printed.

Units: bytes and seconds inside; GiB, MiB and t/s in the report. Everything here blocks for its simulations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kvpipe.capacity_fit import (
    Limits,
    Placed,
    candidates,
    fits_host_cache,
    fits_resident,
    host_need_bytes,
    ngl_that_fits,
    placed,
    scheduler_need_bytes,
)
from sim.errors import InputError
from sim.memory import (
    GIB,
    MIB,
    DeviceMemory,
    compute_buffer_bytes,
    device_memory,
    weights_on_devices,
)
from sim.rows import interval_fields, placement_fields
from sim.run.point import Point
from sim.transport.config import TransportConfig
from sim.workload import Workload, ngl_of

BUILDS = ("fork", "upstream")
FORK = "GenerelSchwerz/llama.cpp (pull requests #39, #66, #92)"
UPSTREAM = "upstream llama.cpp (ggml-org)"


@dataclass
class Choice:
    """One way to run a context, simulated: arm, kv-gpu-layers, depth, budget, t/s and the memory it uses."""

    resident: bool  # the whole cache on the device (no -nkvo)
    n_gpu_layers: int  # llama.cpp's -ngl (99: every layer)
    kv_gpu_layers: int
    pinned: bool
    depth: int
    budget_mib: float
    tokens_per_s: float
    interval: list[float] | None
    memory: DeviceMemory
    host_bytes: int
    declined: bool = False
    cpu_layers_cost: str = ""  # how CPU layers (-ngl) were priced: "profile", "estimate", "" (none)

    def to_json(self) -> dict[str, Any]:
        return {"resident": self.resident, "n_gpu_layers": self.n_gpu_layers, "kv_gpu_layers": self.kv_gpu_layers,
                "pinned": self.pinned, "depth": self.depth,
                "budget_mib": self.budget_mib, "tokens_per_s": self.tokens_per_s, "tokens_per_s_interval": self.interval,
                "declined": self.declined, "memory_gib": self.memory.as_gib(), "host_gib": self.host_bytes / GIB,
                "cpu_layers_cost": self.cpu_layers_cost}


@dataclass
class ContextFit:
    """One context's answer: the best choice that fits (None: nothing fits), and every candidate tried."""

    context: int
    best: Choice | None
    candidates: list[Choice] = field(default_factory=list)
    reason: str = ""


def largest_context(fits: Callable[[int], bool], hi: int) -> int:
    """The largest context in 1..hi for which ``fits`` holds (monotone: fits at c implies fits below c); 0: none."""
    if not fits(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def choice_of(pt: Point, figs: Any, i: int, limits: Limits, known: Unfigured | None = None) -> Choice:
    """Candidate ``i`` of ``figs`` (``kvpipe.plan_run.Figures``) as a Choice, with its memory account and the row's
    interval and CPU-layers pricing (``sim.rows.interval_fields``, ``placement_fields``); ``known``: :func:`unfigured`
    of ``pt``, made already."""
    wl, tc = pt.workload, pt.transport
    declined, tps = bool(figs.declined[i]), float(figs.tokens_per_s[i])
    ring = 0 if declined else int(float(figs.ring_alloc_mib[i]) * MIB)
    m, host, cost = known if known is not None else unfigured(pt, limits)
    mem = DeviceMemory(m.device, m.total_bytes, m.reserved_bytes, m.weights_bytes, m.compute_buffer_bytes, m.kv_bytes, ring)
    interval = interval_fields(pt, tps)["tokens_per_s_interval"]
    return Choice(tc.arm == "resident", ngl_of(wl), wl.kv_gpu_layers, wl.pinned, tc.depth, tc.budget_mib, tps, interval, mem,
                  host, declined, cost)


#: What :func:`choice_of` reads of a candidate whatever its figures: its device's account without the ring, the host
#: bytes and how its CPU layers are priced.
Unfigured = tuple[DeviceMemory, int, str]


def unfigured(pt: Point, limits: Limits) -> Unfigured:
    """:data:`Unfigured` of candidate ``pt`` (made while the workers answer the candidates). Pure."""
    wl, resident = pt.workload, pt.transport.arm == "resident"
    mem = device_memory(wl, limits.vram_bytes, pt.hardware.devices[0].memory_reserved_bytes, kv_offload=resident)
    return mem, host_need_bytes(wl, resident), str(placement_fields(wl, pt.hardware.devices[0].compute).get("cpu_layers_cost", ""))


def flags(c: Choice, context: int, cache_k: str, cache_v: str) -> tuple[str, str]:
    """(the llama.cpp flags of ``c``, the build they belong to): upstream's where they suffice (the cache on the
    device, or an ordered pageable host cache), else the fork's (a pinned host cache, a pipeline, resident layers)."""
    base = f"-ngl {c.n_gpu_layers} -fa on -c {context} -ctk {cache_k} -ctv {cache_v}"
    if c.resident:
        return base, UPSTREAM
    if not c.depth and not c.kv_gpu_layers and not c.pinned:
        return f"{base} -nkvo", UPSTREAM
    fork = " --kv-cpu-pinned" if c.pinned else ""
    if c.depth:
        fork += f" --kv-pipeline-depth {c.depth} --kv-pipeline-budget {c.budget_mib:g}"
    if c.kv_gpu_layers:
        fork += f" --kv-gpu-layers {c.kv_gpu_layers}"
    return f"{base} -nkvo{fork}", FORK


def limits_of(vram_gib: float | None, host_gib: float | None, card_bytes: int, card: str, machine_bytes: int) -> Limits:
    """The memory the plan must fit. Raises InputError for a --vram above the card or a non-positive size."""
    for flag, v in (("--vram", vram_gib), ("--host-mem", host_gib)):
        if v is not None and (not math.isfinite(v) or v <= 0):
            raise InputError(f"{flag} {v:g} out of range; allowed: a size in GiB > 0")
    if vram_gib is not None and vram_gib * GIB > card_bytes:
        raise InputError(f"--vram {vram_gib:g} GiB is above the card ({card}: {card_bytes / GIB:.2f} GiB); "
                         f"allowed: 0 < --vram <= {card_bytes / GIB:.2f}")
    vram = int(vram_gib * GIB) if vram_gib is not None else card_bytes
    host = int(host_gib * GIB) if host_gib is not None else machine_bytes
    return Limits(vram, host, "--vram" if vram_gib is not None else f"the card ({card})",
                  "--host-mem" if host_gib is not None else "this machine's memory (--host-mem to plan for another host)")


# ------------------------------------------------------------------ the plan


@dataclass
class FitPlan:
    """``kvpipe plan``'s answer under the memory cap (``plans``: the gain analysis, empty when the weights do not fit)."""

    model: str
    hardware: str
    limits: Limits
    ngl: int
    fits: list[ContextFit]
    plans: list[Any]
    verdict: str = ""
    largest_host_context: int = 0
    largest_resident_context: int = 0
    largest_at_min_tps: int | None = None
    min_tps: float | None = None
    build: str = "fork"
    pinned: bool = True
    n_layers: int = 0
    check_n: int = 0
    check: tuple[int, float] = (0, 0.0)  # (the evaluator's points in the plan, the sample check's largest disagreement)
    checked: int = 0  # the points the sample check re-simulated (the simulator's default path)
    checked_exact: int = 0  # of those, the points simulated again exact (their default-path rows differed by > 1e-9)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "hardware": self.hardware, "vram_gib": self.limits.vram_bytes / GIB,
                "vram_from": self.limits.vram_from, "host_mem_gib": self.limits.host_bytes / GIB,
                "host_mem_from": self.limits.host_from, "gpu_layers": min(self.ngl, self.n_layers),
                "weights_verdict": self.verdict,
                "largest_host_cache_context": self.largest_host_context,
                "largest_resident_context": self.largest_resident_context,
                "min_tps": self.min_tps, "largest_context_at_min_tps": self.largest_at_min_tps,
                "evaluated_rows": self.check[0], "sample_check_resimulated": self.checked,
                "sample_check_resimulated_exact": self.checked_exact,
                "sample_check_max_disagreement": self.check[1]}


def _with_context(pt: Point, context: int) -> Point:
    return replace(pt, workload=replace(pt.workload, context=(context,)))


def ring_estimate_mib(wl: Workload, depth: int) -> float:
    """The ring of ``depth`` for a one-sequence window: its slots (``TransportConfig.n_slots``) of one attention layer's
    K+V window, MiB."""
    rows = wl.window_rows(max(wl.contexts) + wl.tokens - 1)
    return TransportConfig(depth=depth).n_slots * rows * wl.row_bytes / MIB if depth else 0.0


def best_choices(req: Any, base: Point, contexts: list[int], limits: Limits, rings: dict[int, dict[int, float]],
                 run: Callable[[list[Point]], Any], auto_ngl: bool = False,
                 mark: Callable[[list[Point]], None] | None = None) -> list[ContextFit]:
    """Answer every context's candidates in one run (``run``: their ``kvpipe.plan_run.Figures``) and keep each context's
    fastest (ties: fewer resident layers, then the shallower depth). ``rings``: per context, the ring MiB of each depth.
    ``auto_ngl``: each context at the largest -ngl that fits it. ``mark``: given the best candidates of the contexts where
    the choice (arm, depth, resident layers, decline) changes from the next or previous context."""
    def now(pts: list[Point]) -> Callable[[], Any]:
        figs = run(pts)
        return lambda: figs

    return choices_started(req, base, contexts, limits, rings, now, auto_ngl, mark)()


def choices_started(req: Any, base: Point, contexts: list[int], limits: Limits, rings: dict[int, dict[int, float]],
                    start: Callable[[list[Point]], Callable[[], Any]], auto_ngl: bool = False,
                    mark: Callable[[list[Point]], None] | None = None, known: dict[int, Placed] | None = None
                    ) -> Callable[[], list[ContextFit]]:
    """:func:`best_choices` begun: the candidates made and their run started now (``start``: a function giving their
    figures, ``kvpipe.plan_run.Runner.start``), the choices made when the function returned is called (blocks).
    ``known``: per context, ``kvpipe.capacity_fit.placed`` of it, made already (taken out of ``known``: a context asked
    twice makes its second from scratch, as it did)."""
    per: list[list[Point]] = []
    configs: dict[Any, Any] = {}  # the contexts' candidates share their configs (``candidates``)
    for c in contexts:
        got = known.pop(c, None) if known is not None else None
        pt = got.point if got is not None else _with_context(base, c)
        per.append(candidates(pt, limits, req.max_depth, rings.get(c) or {d: ring_estimate_mib(pt.workload, d)
                                                                         for d in range(req.max_depth + 1)}, req.build,
                              auto_ngl, got, configs))
    pending = start([p for ps in per for p in ps]) if any(per) else None

    def choose() -> list[ContextFit]:
        known = [unfigured(p, limits) for ps in per for p in ps]  # while the workers answer them
        return _choices(contexts, per, pending() if pending is not None else None, base, limits, mark, known)

    return choose


def _choices(contexts: list[int], per: list[list[Point]], figs: Any, base: Point, limits: Limits,
             mark: Callable[[list[Point]], None] | None, known: list[Unfigured]) -> list[ContextFit]:
    out, i = [], 0
    picked: list[Point | None] = []  # each context's best candidate
    for c, ps in zip(contexts, per, strict=True):
        choices = [(choice_of(p, figs, i + k, limits, known[i + k]), p) for k, p in enumerate(ps) if figs.fits[i + k]]
        i += len(ps)
        best = max(choices, key=lambda cp: (round(cp[0].tokens_per_s, 9), -cp[0].kv_gpu_layers, -cp[0].depth), default=None)
        picked.append(best[1] if best else None)
        reason = "" if best else _why_nothing_fits(_with_context(base, c).workload, limits, base.hardware.devices[0].memory_reserved_bytes)
        out.append(ContextFit(c, best[0] if best else None, [ch for ch, _ in choices], reason))
    if mark is not None:  # where the answer changes from one context to the next, the sample check re-simulates both
        how = [(p.transport.arm, p.transport.depth, p.workload.kv_gpu_layers, f.best.declined) if p and f.best else None
               for p, f in zip(picked, out, strict=True)]
        mark([p for k, p in enumerate(picked) if p is not None and (
            (k > 0 and how[k - 1] != how[k]) or (k + 1 < len(how) and how[k + 1] != how[k]))])
    return out


def _why_nothing_fits(wl: Workload, limits: Limits, reserved: int) -> str:
    dev = device_memory(wl, limits.vram_bytes, reserved, kv_offload=False, ring_bytes=scheduler_need_bytes(wl))
    if not dev.fits:
        return (f"the device needs {dev.used_bytes / GIB:.2f} GiB with the cache in host memory (weights "
                f"{dev.weights_bytes / GIB:.2f}, compute buffer {dev.compute_buffer_bytes / GIB:.2f}, one staged window) "
                f"> {limits.vram_bytes / GIB:.2f} GiB ({limits.vram_from})")
    return (f"the host cache and CPU weights need {host_need_bytes(wl, False) / GIB:.2f} GiB > "
            f"{limits.host_bytes / GIB:.2f} GiB of host memory ({limits.host_from})")


def weights_verdict(wl: Workload, limits: Limits, reserved: int) -> tuple[str, int]:
    """("", every GPU layer asked) when the GPU layers fit; else the one-line verdict and the largest -ngl that fits."""
    need = reserved + weights_on_devices(wl, 1)[0] + compute_buffer_bytes(wl) + scheduler_need_bytes(wl)
    if need <= limits.vram_bytes:
        return "", min(wl.n_gpu_layers, wl.model.n_layers)
    ngl = ngl_that_fits(wl, limits, reserved)
    return (f"{wl.model.name}: {weights_on_devices(wl, 1)[0] / GIB:.1f} GiB of weights on the GPU do not fit "
            f"{limits.vram_bytes / GIB:.2f} GiB ({limits.vram_from}) beside the driver's {reserved / GIB:.2f} GiB and "
            f"llama.cpp's compute buffer (~{compute_buffer_bytes(wl) / GIB:.2f} GiB, an estimate): -ngl "
            f"{ngl_of(replace(wl, n_gpu_layers=ngl))} at most ({ngl} of {wl.model.n_layers} layers on the GPU and the output "
            f"layer; {UPSTREAM})"), ngl


def plan_fit(req: Any, meanwhile: Callable[[FitPlan], None] | None = None) -> FitPlan:
    """The plan under the memory cap for ``req`` (a ``kvpipe.plan.PlanRequest``), its evaluated points held to the
    simulator once at the end (``FitPlan.check``). ``meanwhile``: given the plan, whole but for the check's figures,
    while the check's simulations run (``kvpipe plan`` makes its text then); not called without a check. Blocks for
    the evaluation and simulations. Raises EvaluatorDisagreement."""
    from kvpipe.executors import without_cycle_collection
    from kvpipe.plan_run import Runner

    with Runner(req) as runner, without_cycle_collection():  # one pool of workers for the plan and its check
        out = _plan_fit(req, runner)
        out.check = runner.check(req.check_n, None if meanwhile is None else lambda: meanwhile(out))
    out.checked, out.checked_exact = runner.checked, runner.checked_exact
    return out


def _plan_fit(req: Any, runner: Any) -> FitPlan:
    from kvpipe import plan as gain_plan
    from sim.memory import host_memory_bytes

    base = gain_plan.points(req, [req.contexts[0]], [0], 0)[0]
    base = replace(base, workload=replace(base.workload, n_gpu_layers=req.n_gpu_layers))
    dev = base.hardware.devices[0]
    limits = limits_of(req.vram_gib, req.host_mem_gib, dev.memory_total_bytes, req.hardware, host_memory_bytes())
    reserved = dev.memory_reserved_bytes
    verdict, ngl = weights_verdict(base.workload, limits, reserved)
    base = replace(base, workload=replace(base.workload, n_gpu_layers=ngl))
    started: list[Callable[[], list[ContextFit]]] = []  # the memory plan's run, begun beside the gain analysis's budgets
    known: dict[int, Placed] = {}  # each context's candidates but the rings', made while the grid runs on the workers

    def place() -> None:
        for c in req.contexts:
            if c not in known:
                known[c] = placed(_with_context(base, c), limits, req.build, bool(verdict))

    def start_fits(got: dict[int, dict[int, float]]) -> None:
        rings = {c: {0: 0.0, **r} for c, r in got.items()}
        started.append(choices_started(req, base, list(req.contexts), limits, rings, runner.start, bool(verdict), runner.mark,
                                       known))

    plans = (gain_plan.plan(req, runner, then=start_fits, meanwhile=place) if not verdict and ngl >= base.workload.model.n_layers
             else [])
    fits = (started or [choices_started(req, base, list(req.contexts), limits, {}, runner.start, bool(verdict), runner.mark,
                                        known)])[0]()
    out = FitPlan(req.model, req.hardware, limits, ngl, fits, plans, verdict, min_tps=req.min_tps, build=req.build,
                  pinned=req.pinned, n_layers=base.workload.model.n_layers, check_n=req.check_n)
    wl = base.workload
    out.largest_host_context = largest_context(lambda c: fits_host_cache(replace(wl, context=(c,)), limits, reserved), 1 << 24)
    out.largest_resident_context = largest_context(lambda c: fits_resident(replace(wl, context=(c,)), limits, reserved), 1 << 24)
    if req.min_tps is not None and out.largest_host_context:
        def fast_enough(c: int) -> bool:
            best = best_choices(req, base, [c], limits, {}, runner.run, auto_ngl=bool(verdict))[0].best
            return best is not None and best.tokens_per_s >= req.min_tps

        hi = max(out.largest_host_context, out.largest_resident_context)
        out.largest_at_min_tps = largest_context(fast_enough, hi)
    by_context = {p.context: p for p in plans}
    for f in fits:
        p = by_context.get(f.context)
        if p is not None and f.best is not None:
            fl, build = flags(f.best, f.context, req.cache_type, req.cache_type)
            p.extra["llama_cpp"] = {"flags": fl, "build": build, **f.best.to_json()}
    return out
