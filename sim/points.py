"""A grid of points from typed values: the library's way in (the command line's flags parse into a GridSpec).

:func:`points` expands a :class:`GridSpec` -- models, hardware, cache types,
contexts, sequences, depths, budgets, ... as Python values -- into
:class:`sim.run.point.Point` objects, one per element of the cross product,
each with its whole :class:`~sim.transport.config.TransportConfig` and the
calibrated entry of its program where the hardware profile has one. Bad values
raise :class:`sim.errors.InputError` with a one-line message. Nothing here
parses text: ``kvpipe.commands.args`` turns flags into a GridSpec.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from backends.profile import HardwareProfile, for_workload, load_profile
from sim.errors import InputError
from sim.run.point import Point
from sim.transport.config import Schedule, TransportConfig
from sim.workload import ALL_LAYERS, CacheType, ModelShape, Workload, cache_type, layers_of_ngl, load_model


@dataclass(frozen=True)
class GridSpec:
    """The axes of a grid (each a tuple: the grid is their product) and the settings every point shares."""

    models: tuple[str, ...] = ("qwen3.8-27b",)
    hardware: tuple[str, ...] = ("rtx4070-gen4x16",)
    cache_types: tuple[str, ...] = ("q8_0",)
    cache_types_v: tuple[str, ...] = ()  # V cache types; () = the K type
    kv_offload: tuple[bool, ...] = (True,)  # True: the cache in host memory (-nkvo); False: the resident arm
    contexts: tuple[tuple[int, ...], ...] = ((4096,), (16384,), (32768,))
    parallels: tuple[int, ...] = (1,)
    depths: tuple[int, ...] = (0, 1)
    budgets_mib: tuple[float, ...] = (128.0,)
    tokens: int = 8
    pinned: bool = True
    unified: bool = True
    ctx_size: int = 0
    split_mode: str = "none"
    tensor_split: tuple[float, ...] = ()
    pack_streams: bool = True
    flat_prefix: bool = False
    copy_span: bool = False  # --kv-copy span: upstream llama.cpp's ordered copy of a split cache (Workload.copy_span)
    mutations: frozenset[str] = frozenset()
    kv_gpu_layers: tuple[int, ...] = (0,)  # the fork's --kv-gpu-layers: the first N attention layers' KV on the device
    n_gpu_layers: tuple[int, ...] = (ALL_LAYERS,)  # llama.cpp -ngl: the last N layers on the GPU
    schedules: tuple[Schedule, ...] = (Schedule(),)  # delivery schedules (docs/schedules.md); the first also at depth 0


def model(spec: str) -> ModelShape:
    """A model preset, GGUF file or config.json. Raises InputError."""
    try:
        return load_model(spec)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def hardware(spec: str) -> HardwareProfile:
    """A hardware preset or profile file. Raises InputError."""
    try:
        return load_profile(spec)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def cache(name: str) -> CacheType:
    """A cache type by name. Raises InputError."""
    try:
        return cache_type(name)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def nkvo_attention(profile: HardwareProfile) -> str:
    """Where the llama.cpp a profile describes runs attention under ``-nkvo``: ``device`` (the fork: the windows are
    delivered to the GPU, kvpipe's transport) or ``host`` (upstream: on the CPU over the host cache). Pure."""
    return str(profile.meta.get("nkvo_attention", "device"))


#: The most points a grid may have: counted before any is built (1.5e9 would exhaust memory long before it ran).
MAX_POINTS = 10_000_000


def size(spec: GridSpec) -> int:
    """How many points the grid's axes multiply to (the resident arm's are fewer: an upper bound). Pure."""
    axes = (spec.models, spec.hardware, spec.cache_types, spec.cache_types_v or ("",), spec.kv_offload, spec.contexts,
            spec.parallels, spec.depths, spec.budgets_mib, spec.schedules)
    return math.prod(len(a) for a in axes)


def points(spec: GridSpec) -> list[Point]:
    """Every point of the grid, in product order (:func:`point_grid`'s points, each made). Raises InputError on any bad
    value, or on a grid of more than :data:`MAX_POINTS` points (counted before any is built). Does not block."""
    return point_grid(spec).points()


def point_grid(spec: GridSpec) -> PointGrid:
    """The points of :func:`points` as a :class:`PointGrid`: their distinct workload, machine and config objects (the
    same objects :func:`points` shares) and each point's index of each, with no ``Point`` made. The loop runs per
    workload, not per point (a plan's grid: half a million points, a few thousand workloads). Raises InputError as
    :func:`points`. Does not block."""
    if spec.tokens < 1:
        raise InputError(f"--tokens {spec.tokens} out of range; allowed: >= 1")
    if spec.copy_span and not spec.unified and max(spec.parallels) > 1 and max(spec.depths) > 0 and any(spec.kv_offload):
        raise InputError(f"--kv-copy span with --depth {max(spec.depths)}: upstream llama.cpp's span copy has no pipelined "
                         "path; allowed: --depth 0 (or --kv-copy streams, the fork's copy)")
    n = size(spec)
    if n > MAX_POINTS:
        raise InputError(f"the grid has {n:,} points ({len(spec.contexts):,} contexts x {len(spec.depths):,} depths x "
                         f"{len(spec.budgets_mib):,} budgets x the other flags); allowed: at most {MAX_POINTS:,} points")
    models = [model(m) for m in spec.models]
    hws = [hardware(h) for h in spec.hardware]
    caches = [cache(c) for c in spec.cache_types]
    caches_v: list[CacheType | None] = [cache(c) for c in spec.cache_types_v] or [None]
    made: dict[tuple[int | tuple[int, ...], ...], int] = {}  # a workload's key -> its index in ``wls``
    wls: list[Workload] = []
    hw_of: list[int] = []  # each workload's machine (its index in ``machines``)
    machines: dict[int, int] = {}
    hw_objs: list[HardwareProfile] = []
    configs: dict[tuple[int, float, str, Schedule], int] = {}
    cfg_objs: list[TransportConfig] = []
    w_parts: list[np.ndarray] = []
    c_parts: list[np.ndarray] = []
    try:
        workloads = itertools.product(models, hws, caches, caches_v, spec.contexts, spec.parallels)
        placements = [pl for pl in itertools.product(spec.kv_gpu_layers, spec.n_gpu_layers, spec.kv_offload, spec.depths,
                                                     spec.budgets_mib, spec.schedules)
                      # the resident arm has no depth or budget, and every layer's KV on the device: one point per
                      # context; a schedule times the pipelined path's copies: the ordered path is one point
                      if (pl[2] or (pl[3], pl[4], pl[0], pl[5]) == (spec.depths[0], spec.budgets_mib[0], spec.kv_gpu_layers[0],
                                                                    spec.schedules[0]))
                      and (pl[3] != 0 or pl[5] == spec.schedules[0])]
        layers: dict[tuple[int, int], int] = {}
        per_arm: dict[bool, _Placed] = {}

        def configs_of(host_attention: bool) -> _Placed:
            """The placements' steps as a walk of them takes them: each new (kv-gpu-layers, -ngl) in turn, up to the
            first placement whose depth is an error (its message); and per placement, its (kv, -ngl)'s position among
            those and its config's index."""
            steps: list[tuple[int, int] | str] = []
            local: dict[tuple[int, int], int] = {}
            at, cfg = [], []
            for kv, ngl, off, d, b, sched in placements:
                host_attn = off and host_attention
                if host_attn and d:
                    steps.append(f"--depth {d} on {{}}: its llama.cpp runs -nkvo attention on the CPU (upstream, no "
                                 "pipelined path); allowed: --depth 0")
                    break
                arm = ("host-attention" if host_attn else "transport") if off else "resident"
                k = configs.get((d, b, arm, sched))
                if k is None:  # one config per depth, budget, arm and schedule (frozen, shared by every workload)
                    k = configs[d, b, arm, sched] = len(cfg_objs)
                    cfg_objs.append(TransportConfig(
                        depth=d if off else 0, budget_mib=b if off else 0.0, mutations=spec.mutations if off else frozenset(),
                        pack_streams=spec.pack_streams, arm=arm, schedule=sched if arm == "transport" else Schedule()))
                place = (kv if off else 0, ngl)
                if place not in local:
                    local[place] = len(local)
                    steps.append(place)
                at.append(local[place])
                cfg.append(k)
            return _Placed(steps, np.array(at, dtype=np.intp), np.array(cfg, dtype=np.int64))

        for m, h, c, cv, ctx, npar in workloads:
            if spec.split_mode != "none" and len(h.devices) < 2:
                raise InputError(f"--split-mode {spec.split_mode} needs several devices; give --hardware A+B (got {h.name})")
            host_attention = nkvo_attention(h) == "host"
            arm_of = per_arm.get(host_attention) or per_arm.setdefault(host_attention, configs_of(host_attention))
            mine: list[int] = []  # this workload's by (kv, -ngl), in the order the walk first meets them
            for step in arm_of.steps:
                if isinstance(step, str):
                    raise InputError(step.format(h.name))
                kv, ngl = step
                gpu_layers = layers.get((id(m), ngl))
                if gpu_layers is None:
                    try:  # the flag is llama.cpp's -ngl (the output layer counts)
                        gpu_layers = layers[id(m), ngl] = layers_of_ngl(ngl, m.n_layers)
                    except ValueError as exc:
                        raise InputError(f"--n-gpu-layers: {exc}") from None
                key = (id(m), id(h), id(c), id(cv), ctx, npar, kv, gpu_layers)
                got = made.get(key)
                if got is None:  # one Workload and profile for the depths and budgets of a workload (frozen, shared)
                    got = made[key] = len(wls)
                    wls.append(Workload(m, c, cv or c, ctx, tokens=spec.tokens, pinned=spec.pinned, n_parallel=npar,
                                        unified=spec.unified, ctx_size=spec.ctx_size, split_mode=spec.split_mode,
                                        tensor_split=spec.tensor_split, flat_prefix=spec.flat_prefix, copy_span=spec.copy_span,
                                        kv_gpu_layers=kv,
                                        n_gpu_layers=gpu_layers))
                    hw = for_workload(h, m.name, c.name, (cv or c).name)  # a calibrated file's entry
                    hw_of.append(machines.setdefault(id(hw), len(machines)))
                    if hw_of[-1] == len(hw_objs):
                        hw_objs.append(hw)
                mine.append(got)
            w_parts.append(np.array(mine, dtype=np.int64)[arm_of.at])
            c_parts.append(arm_of.cfg)
    except InputError:
        raise
    except ValueError as exc:
        raise InputError(str(exc)) from None
    w = np.concatenate(w_parts) if w_parts else np.zeros(0, dtype=np.int64)
    if not len(w):
        raise InputError("the grid is empty; give at least one value per flag")
    return PointGrid([(wls, w), (hw_objs, np.array(hw_of, dtype=np.int64)[w]), (cfg_objs, np.concatenate(c_parts))])


@dataclass(frozen=True)
class _Placed:
    """What :func:`point_grid` does per workload of one arm kind: ``steps``, the (kv-gpu-layers, -ngl) placements to
    make in turn (or the error to raise); ``at``, each point's placement among them; ``cfg``, each point's config."""

    steps: list[tuple[int, int] | str]
    at: np.ndarray
    cfg: np.ndarray


class PointGrid(Sequence[Point]):
    """Points as arrays: ``parts``, their distinct workload, machine and config objects and each point's index of each
    (``[(objects, indices)] * 3``, as ``kvpipe.executors.PackedPoints.parts``). A ``Point`` is made only when one is
    asked for (``grid[i]``), and kept: asking again gives the same object (a run keeps points by identity)."""

    def __init__(self, parts: list[tuple[list[Any], np.ndarray]], base: tuple[PointGrid, np.ndarray] | None = None) -> None:
        self.parts = parts
        self._made: dict[int, Point] = {}
        self._base = base  # a subset (``take``): its points are the base grid's, at these indices

    def __len__(self) -> int:
        return len(self.parts[0][1])

    @overload
    def __getitem__(self, i: int) -> Point: ...

    @overload
    def __getitem__(self, i: slice) -> list[Point]: ...

    def __getitem__(self, i: int | slice) -> Point | list[Point]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = operator.index(i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"point {i} of a grid of {len(self)}")
        i %= len(self)
        if self._base is not None:
            return self._base[0][int(self._base[1][i])]
        got = self._made.get(i)
        if got is None:
            (ws, w), (hs, h), (cs, c) = self.parts
            got = self._made[i] = new_point(ws[w[i]], hs[h[i]], cs[c[i]])
        return got

    def made(self) -> dict[int, Point]:
        """The points made so far, by index (the only ones any caller can hold)."""
        if self._base is None:
            return self._made
        grid, at = self._base
        made = grid.made()
        return {i: made[int(at[i])] for i in np.flatnonzero(np.isin(at, list(made))).tolist()}

    def take(self, idx: np.ndarray) -> PointGrid:
        """The points at ``idx``, in that order: a view of this grid (``sub[i] is grid[idx[i]]``)."""
        idx = np.asarray(idx, dtype=np.intp)
        if self._base is not None:
            return self._base[0].take(self._base[1][idx])
        return PointGrid([(objs, at[idx]) for objs, at in self.parts], (self, idx))

    def with_workloads(self, change: Callable[[Workload], Workload]) -> PointGrid:
        """The points with each distinct workload object replaced by ``change`` of it (called once per object)."""
        (ws, w), *rest = self.parts
        return PointGrid([([change(x) for x in ws], w), *rest])

    def field(self, k: int, get: Callable[[Any], Any], dtype: Any = None) -> np.ndarray:
        """``get`` of each point's workload (``k`` 0), machine (1) or config (2) object, as an array (``get`` called once
        per object)."""
        objs, at = self.parts[k]
        return np.array([get(x) for x in objs], dtype=dtype)[at]

    def points(self) -> list[Point]:
        """Every point made, in order (those already made, the same objects). Does not block."""
        (ws, w), (hs, h), (cs, c) = self.parts
        made = self.made()
        return [made.get(i) or new_point(ws[a], hs[b], cs[k])
                for i, (a, b, k) in enumerate(zip(w.tolist(), h.tolist(), c.tolist(), strict=True))]


def new_point(wl: Workload, hw: HardwareProfile, tc: TransportConfig, _new: Any = object.__new__,
           _set: Any = object.__setattr__) -> Point:
    """``Point(wl, hw, tc)`` built by filling its ``__dict__`` (a frozen dataclass without ``__post_init__``: equal,
    with the same hash, repr and pickle, at a fraction of its field-by-field ``__init__``; half a million per plan)."""
    obj = _new(Point)
    _set(obj, "__dict__", {"workload": wl, "hardware": hw, "transport": tc})
    return obj  # type: ignore[no-any-return]


_FIELDS = ("workload", "hardware", "transport")


def objects_of(pts: Sequence[Point], k: int) -> tuple[list[Any], np.ndarray]:
    """The points' distinct workload (``k`` 0), machine (1) or config (2) objects and each point's index among them: a
    :class:`PointGrid`'s read off its arrays (no point made), else found from object ids (``pts`` keeps the objects
    alive). Pure."""
    if isinstance(pts, PointGrid):
        objs, at = pts.parts[k]
        used, inv = np.unique(at, return_inverse=True)
        return [objs[j] for j in used.tolist()], inv.reshape(-1)
    get = operator.attrgetter(_FIELDS[k])
    _, first, inv = np.unique(np.fromiter(map(id, map(get, pts)), dtype=np.int64, count=len(pts)), return_index=True,
                              return_inverse=True)
    return [get(pts[i]) for i in first.tolist()], inv.reshape(-1)


def line_arrays(pts: Any, parts: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each point's line (a number: equal numbers, the same model, machine, cache types, sequences, tokens, arm and
    placement), context, depth and budget (MiB), as arrays: each config object read once, each (workload, machine,
    arm) once, found from object ids (``pts`` keeps the objects alive) or ``parts``, the points' distinct workload,
    machine and config objects and each point's index of each (``kvpipe.executors.PackedPoints.parts``). Pure."""
    n = len(pts)
    if parts is None:
        parts = [objects_of(pts, k) for k in range(3)]
    cfgs, cfg = parts[2]
    arms: dict[str, int] = {}
    arm = np.array([arms.setdefault(c.arm, len(arms)) for c in cfgs], dtype=np.int64)[cfg.reshape(-1)]
    depth = np.array([c.depth for c in cfgs], dtype=np.int64)[cfg.reshape(-1)]
    budget = np.array([c.budget_mib for c in cfgs], dtype=np.float64)[cfg.reshape(-1)]
    code = arm
    for _, inv in parts[:2]:  # codes below n x arms at each step: no overflow
        _, code = np.unique(code * n + np.asarray(inv, dtype=np.int64).reshape(-1), return_inverse=True)
        code = code.reshape(-1)
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    lines: dict[Any, int] = {}
    line, context = [], []
    for i in first.tolist():
        p = pts[i]
        wl = p.workload
        line.append(lines.setdefault((wl.model.name, p.hardware.name, wl.cache_k.name, wl.cache_v.name, wl.n_parallel,
                                      wl.unified, wl.split_mode, wl.tokens, p.transport.arm, wl.kv_gpu_layers,
                                      wl.n_gpu_layers, wl.pinned), len(lines)))
        context.append(p.context)
    inv = inv.reshape(-1)
    return (np.array(line, dtype=np.int64)[inv], np.array(context, dtype=np.int64)[inv], depth, budget)
