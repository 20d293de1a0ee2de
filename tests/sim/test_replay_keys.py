"""``sim.replay_keys``: the numbers the planner's and the evaluator's caches are keyed by. Equal values get one number
whatever object holds them, different values different numbers, a number is kept per object, and an evaluation whose
caches are keyed by them answers every point as that point alone, every cache cleared, does -- bit for bit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim import replay_keys as rk
from sim.points import GridSpec, points


def test_equal_values_get_one_number_and_different_values_another() -> None:
    pts = points(GridSpec(contexts=((4096,), (8192,)), kv_gpu_layers=(0, 2), hardware=("rtx4070-gen4x16", "rtx3060-gen3x4")))
    wls = {id(p.workload): p.workload for p in pts}.values()
    twins = [replace(w) for w in wls]  # equal, other objects
    for w, t in zip(wls, twins, strict=True):
        assert w is not t and rk.number(w) == rk.number(t) == rk.number(w)
        assert rk.free_number(w, True) == rk.free_number(t, True) != rk.free_number(w, False)
    assert len({rk.number(w) for w in wls}) == len(set(wls)) == 4  # context and --kv-gpu-layers tell them apart
    assert len({rk.free_number(w, False) for w in wls}) == 2  # at any context: the --kv-gpu-layers count alone
    hws = {id(p.hardware): p.hardware for p in pts}.values()
    assert len({rk.compute_number(h) for h in hws}) == len({tuple(d.compute for d in h.devices) for h in hws}) == 2
    kept = rk.number(pts[0].workload)
    rk.clear_numbers()
    assert rk.number(pts[0].workload) == kept and rk.number(replace(pts[0].workload)) == kept  # the value's number stays


def test_numbers_after_the_table_is_emptied(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once ``interned``'s table is emptied an object's kept number goes with it: equal values still share one number,
    and no number is given to another value."""
    monkeypatch.setattr(rk, "_INTERNED", {})
    pts = points(GridSpec(contexts=((4096,), (8192,), (12288,))))
    a, b, c = ({id(p.workload): p.workload for p in pts}.values())
    na, nb = rk.number(a), rk.number(b)
    for k in range(1 << 16):  # fill the table past its bound: it is emptied
        rk.interned(("filler", k))
    assert len(rk._INTERNED) < 1 << 16
    assert rk.number(replace(a)) == rk.number(a) != na and rk.number(c) not in (na, nb)


def test_an_evaluation_keyed_by_numbers_answers_each_point_as_alone() -> None:
    """``summarize`` of points whose workloads and machines differ in one field each (context, --kv-gpu-layers, cache,
    machine, sequences), equal values held by other objects among them, equals each point summarized alone with every
    cache cleared, bit for bit: no cache answers a point with another value's numbers."""
    from sim.evaluator import clear_caches, summarize
    from sim.run.point import clear_graph_cache

    pts = points(GridSpec(contexts=((4096,), (9000,)), depths=(0, 1, 2), budgets_mib=(0, 64), kv_gpu_layers=(0, 3),
                          cache_types=("q8_0", "f16"), hardware=("rtx4070-gen4x16", "rtx3060-gen3x4"), parallels=(1, 2),
                          tokens=3, kv_offload=(True, False)))
    mixed = pts + [replace(p, workload=replace(p.workload), hardware=replace(p.hardware)) for p in pts[::5]]
    together = summarize(mixed)
    for i in np.random.default_rng(7).choice(len(mixed), 40, replace=False).tolist():
        clear_caches()
        clear_graph_cache()
        rk.clear_numbers()
        alone = summarize([mixed[i]])
        for f in together.__dataclass_fields__:
            assert getattr(alone, f)[0] == getattr(together, f)[i], (i, f)


def test_a_workloads_context_free_number_is_its_context_free_workloads() -> None:
    """``free_number`` (read off the fields, no workload made) tells workloads apart exactly as ``context_free`` of them
    does, with and without the cache's size: over contexts, tokens, cache sizes, sequences, caches, pinning, resident
    layers, -ngl and models."""
    import itertools

    from sim.workload import Workload, cache_type, load_model

    models = [load_model("qwen3.8-27b"), load_model("llama-3.1-8b")]
    caches = [cache_type("q8_0"), cache_type("f16")]
    wls = []
    for m, ck, ctx, tok, npar, pinned, kv, ngl, size in itertools.product(models, caches, (1000, 4096), (1, 3), (1, 2),
                                                                           (True, False), (0, 2), (999, 20), (0, 20000)):
        if kv and ngl != 999:
            continue
        wls.append(Workload(m, ck, ck, (ctx,), tokens=tok, n_parallel=npar, pinned=pinned, kv_gpu_layers=kv,
                            n_gpu_layers=ngl, ctx_size=size))
    wls += [replace(w) for w in wls[::7]]
    for cells in (False, True):
        want: dict[object, int] = {}
        truth = [want.setdefault(rk.context_free(w, cells), len(want)) for w in wls]
        got: dict[int, int] = {}
        mine = [got.setdefault(rk.free_number(w, cells), len(got)) for w in wls]
        assert mine == truth and len(want) < len(wls)


def test_the_context_free_key_reads_every_field_it_keeps_once_and_by_its_declared_type() -> None:
    """``_free_key`` reads each field but context, tokens and the cache's size exactly once: the dataclass-typed ones
    (model, K and V cache types) as numbers, every other as its value; a workload whose model is swapped for an equal
    copy keeps its number, one whose model differs in one field does not."""
    from dataclasses import fields

    from sim import replay_keys as keys
    from sim.workload import Workload, cache_type, load_model

    kept = [f.name for f in fields(Workload) if f.name not in ("context", "tokens", "ctx_size")]
    values = list(keys._values_of.__reduce__()[1])
    assert sorted(keys._OBJECT_FIELDS + values) == sorted(kept) and not set(keys._OBJECT_FIELDS) & set(values)
    assert keys._OBJECT_FIELDS == ["model", "cache_k", "cache_v"]
    wl = points(GridSpec(contexts=((4096,),), depths=(0,)))[0].workload
    twin = replace(wl, model=replace(wl.model))
    other = replace(wl, model=replace(wl.model, name=wl.model.name + "-x"))
    assert twin.model is not wl.model
    assert keys.free_number(twin, False) == keys.free_number(wl, False) != keys.free_number(other, False)
    f16 = cache_type("f16")
    assert wl.cache_k != f16 and wl.cache_v != f16
    for changed in (replace(wl, cache_k=f16), replace(wl, cache_v=f16), replace(wl, model=load_model("llama-3.1-8b"))):
        assert keys.free_number(changed, False) != keys.free_number(wl, False)
        assert keys.free_number(changed, True) != keys.free_number(wl, True)


def test_lines_are_numbered_as_by_the_workloads_themselves() -> None:
    """``sim.replay._lines`` keys a line by the workload's context-free number and the context, tokens and cache size
    it leaves out (the number ``family_key`` reads next): every point's line and each line's first point are those the
    workload's own number gives, over workloads that differ in one field each (those three among them), equal copies,
    two sequences and two machines."""
    import itertools

    from sim import replay
    from sim.workload import Workload, cache_type, load_model

    models = [load_model("qwen3.8-27b"), load_model("llama-3.1-8b")]
    caches = [cache_type("q8_0"), cache_type("f16")]
    wls = [Workload(m, ck, ck, (ctx,), tokens=tok, n_parallel=npar, pinned=pinned, kv_gpu_layers=kv, ctx_size=size)
           for m, ck, ctx, tok, npar, pinned, kv, size in itertools.product(models, caches, (1000, 4096), (1, 3), (1, 2),
                                                                           (True, False), (0, 2), (0, 20000))]
    wls += [replace(w) for w in wls[::5]]
    base = points(GridSpec(contexts=((4096,),), depths=(0, 2), hardware=("rtx4070-gen4x16", "h200-gen5x16")))
    pts = [replace(p, workload=w) for w in wls for p in base]
    rng = np.random.default_rng(5)
    pts = [pts[i] for i in rng.permutation(len(pts))]
    want: dict[object, int] = {}
    truth = [want.setdefault((rk.number(p.workload), rk.number(p.hardware), rk.config_class(p.transport)), len(want))
             for p in pts]
    line_of, firsts = replay._lines(pts)
    assert line_of.tolist() == truth and len(firsts) == len(want) < len(pts)
    assert [truth[pts.index(f)] for f in firsts] == list(range(len(firsts)))
