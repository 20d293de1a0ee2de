"""What ``kvpipe calibrate`` and ``kvpipe validate`` do, behind their thin command modules.

Both run on a *machine*: the CUDA GPU through CuPy (the real thing) or, for
tests and CI, the SimPy machine in functional mode built from a profile (the
same code paths with NumPy arrays and simulated time). ``machine(name)``
builds either and returns it with its array module; without CuPy or a CUDA
device it raises BackendUnavailable, which the commands turn into one line
and exit code 2.

Progress goes to stderr through tqdm (a plain line per step where tqdm is
missing).
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable, Sequence
from itertools import groupby
from typing import Any

from backends import get_backend
from backends.base import BackendUnavailable
from backends.profile import HardwareProfile
from sim.run.point import Point
from sim.telemetry import chrome_trace, write_atomic


def machine(name: str, profile: HardwareProfile | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """(backend, array module, description) for machine ``name`` of the one registry (``backends.BACKENDS``); the
    SimPy machine runs functionally (real bytes) on ``profile``. Raises BackendUnavailable, ValueError."""
    if name == "simpy" and profile is None:
        raise ValueError("the simpy machine needs a hardware profile")
    be = get_backend(name, **({"profile": profile, "functional": True} if name == "simpy" else {}))
    return be, be.xp, be.describe()


def progress_bar(total: int, desc: str) -> Callable[[str], None]:
    """A callable that advances a tqdm bar on stderr by one step and shows the message."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return lambda msg: print(f"{desc}: {msg}", file=sys.stderr)
    bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=True, dynamic_ncols=True)

    def step(msg: str) -> None:
        bar.set_postfix_str(msg[:60])
        bar.update(1)

    return step


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_calibrate(backend: Any, xp: Any, info: dict[str, Any], models: Sequence[Any], ctype: Any, out: str,
                  windows: Sequence[int], reps: int, scale: float, sizes: Sequence[int], command: str,
                  rounds: int = 2) -> dict[str, Any]:
    """Calibrate and write the profile file to ``out``. Blocks for the measurements."""
    from validate.calibrate import calibrate

    info = {**info, "date": now_iso()}
    bar = progress_bar(4 + len(models) * (1 + 2 * rounds * len(windows)), "calibrate")
    data = calibrate(backend, models, ctype, xp, info, sizes=sizes, reps=reps, windows=windows, scale=scale,
                     command=command, progress=bar, rounds=rounds)
    write_atomic(out, json.dumps(data, indent=1, default=str))
    return data


def run_validate(backend: Any, xp: Any, info: dict[str, Any], points: Sequence[Point], profile: HardwareProfile,
                 out: str, reps: int, warmup: int, scale: float, command: str, trace: str | None = None,
                 reference_arms: bool = True) -> dict[str, Any]:
    """Measure every point's group on ``backend``, simulate it, write the report folder. Blocks for all of it.

    The groups of one model (its weights made once) take turns: repetition 1
    of every group, then repetition 2 ... A slow stretch of the host (the H200
    machine's launch rate moved 1.4x between runs, and once for a whole
    group) then lands on one repetition of several groups, and the median
    over repetitions leaves it out, instead of moving every repetition of one
    group. Every repetition starts with a host probe (``GroupRunner``).
    ``reference_arms`` adds each group's ``resident`` and ``copy-only`` arms
    (:func:`reference_arms_of`), from which the report takes the ceiling.
    """
    from sim.program import WeightStore, gpu_program
    from validate.gpu_run import GroupResult, GroupRunner, arm_label, trim_pool
    from validate.report import write_report

    def key(p: Point) -> tuple[Any, ...]:  # one group = one host cache: model, cache type, sequences and their layout
        w = p.workload  # and one placement: the program's graph differs with the layers' (and their KV's) devices
        return (w.model.name, w.cache_k.name, w.contexts, w.n_parallel, w.unified, w.ctx_size, w.kv_gpu_layers, w.n_gpu_layers)

    ordered = sorted(points, key=key)
    groups_in = [(k, list(v)) for k, v in groupby(ordered, key=key)]
    total = sum(len(v) + (2 if reference_arms else 0) for _, v in groups_in) * reps
    bar = progress_bar(total, "validate")
    store = WeightStore()
    groups: list[GroupResult] = []
    meta = {**info, "command": command, "mutations": sorted(points[0].transport.mutations),
            "machine": backend.name, "scale": scale, "warmup_graphs": warmup, "repetitions": reps}

    def write(now: Sequence[GroupResult], done: int, complete: bool) -> dict[str, Any]:
        stamp = {"date": now_iso(), "complete": complete, "repetitions_done": done}
        return write_report(out, now, profile, {**meta, **stamp}, draw=complete)

    for _, model_groups in groupby(groups_in, key=lambda kv: kv[0][0]):
        runners = []
        for _, pts in model_groups:
            wl = pts[0].workload
            arms = list(dict.fromkeys(p.transport for p in pts))
            if reference_arms:
                arms += reference_arms_of(arms)
            program = gpu_program(wl, xp, store, scale=scale)
            runners.append(GroupRunner(backend, wl, pts[0].hardware, arms, program, warmup=warmup, progress=bar, probe=True))
        try:
            for runner in runners:
                runner.open()
            for rep in range(reps):
                for runner in runners:
                    runner.rep(rep, last=rep == reps - 1)
                if rep < reps - 1:  # what is measured so far, in case the run is stopped (a deadline, a crash)
                    write(groups + [r.result() for r in runners], rep + 1, complete=False)
        finally:
            groups += [runner.close() for runner in runners]
            trim_pool(xp)
    store.release(backend)
    doc = write(groups, reps, complete=True)
    if trace:
        timelines = []
        for g in groups:
            for r in g.runs:
                if r.spans:
                    label = f"{g.workload.model.name} ctx={max(g.workload.context)} {arm_label(r.transport)} ({backend.name})"
                    timelines.append((label, r.spans))
        write_atomic(trace, json.dumps(chrome_trace(timelines)))
    return doc


def reference_arms_of(arms: Sequence[Any]) -> list[Any]:
    """The reference arms beside a group's transport arms: ``resident``, and ``copy-only`` at the deepest depth (>= 1).

    Both drop the mutations (they measure the machine, not the schedule under
    test) and cap nothing, so the copy-only ring is never declined. The
    copy-only arm moves the last arm's schedule's deliveries (docs/schedules.md:
    a schedule that moves fewer bytes, or overlaps tokens, raises the ceiling
    every arm of the group is held to).
    """
    from dataclasses import replace

    base = arms[-1]
    deepest = max(1, max(a.depth for a in arms))
    return [replace(base, arm="resident", depth=0, budget_mib=0.0, mutations=frozenset()),
            replace(base, arm="copy-only", depth=deepest, budget_mib=0.0, mutations=frozenset())]


def unavailable_message(exc: BackendUnavailable) -> str:
    return f"{exc} (this command needs a CUDA GPU; --machine simpy runs the same code on the simulated machine)"


