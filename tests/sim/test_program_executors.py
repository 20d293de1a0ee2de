"""The decode program's two executors on a GPU: the CUDA graphs compute what the NumPy reference computes.

Both run through the scheduler on the CuPy backend with the same weights and
cache bytes (drawn by CuPy from the same seeds); the reference executor runs
eagerly on CuPy arrays. Logits agree to float tolerance and the greedy tokens
are the same; the CUDA executor's output is identical across depths. GPU-only
(``gpu`` marker): skipped with the reason where CuPy or a device is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

from backends.profile import load_profile
from sim.program import DecodeProgram, ProgramConfig, WeightStore
from sim.run.decode import run_decode
from sim.run.point import Point, graphs_for
from sim.transport.scheduler import TransportConfig
from sim.workload import Workload, cache_type
from tests.conftest import toy_model

SHAPES = {
    "dense-d128": dict(n_layers=4, every=1, n_head=8, n_head_kv=2, head_dim_k=128, head_dim_v=128, hidden=256, ffn=512, vocab=300),
    "hybrid-d256": dict(n_layers=8, every=4, n_head=12, n_head_kv=2, head_dim_k=256, head_dim_v=256, hidden=256, ffn=384, vocab=500),
}


def _gpu():  # type: ignore[no-untyped-def]
    from backends.base import BackendUnavailable
    from backends.cupy_gpu import CupyGPU

    try:
        return CupyGPU()
    except BackendUnavailable as exc:
        pytest.skip(f"no GPU: {exc}")


def _run(be, wl: Workload, executor: str, depth: int) -> DecodeProgram:  # type: ignore[no-untyped-def]
    from backends.base import drive

    cfg = ProgramConfig(seed=3, max_hidden=4096, max_ffn=4096, max_vocab=4096, prefill_rows=0, executor=executor, fill="device")
    prog = DecodeProgram(wl, cfg, be.cp, WeightStore())
    point = Point(wl, load_profile("h200-gen5x16-kvpipe"), TransportConfig(depth=depth, budget_mib=0.0))
    host = be.alloc_host(next(iter(graphs_for(point))).host_cache_bytes, "kv")
    drive(run_decode(be, point, prog, host_cache=host))
    be.cp.cuda.runtime.deviceSynchronize()
    return prog


@pytest.mark.gpu
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0"])
def test_cuda_graphs_compute_what_the_reference_computes(shape: str, cache: str) -> None:
    be = _gpu()
    ct = cache_type(cache)
    kw = dict(SHAPES[shape])
    n_layers, every = kw.pop("n_layers"), kw.pop("every")
    wl = Workload(toy_model(n_layers, every=every, **kw), ct, ct, (1500,), tokens=4)
    ref = _run(be, wl, "numpy", 0)
    cuda = _run(be, wl, "cuda", 1)
    a, b = ref.exec.logits(), cuda.exec.logits()
    assert len(a) == len(b) == 4
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        scale = float(np.abs(x).max())
        assert np.abs(x - y).max() <= 2e-3 * scale + 1e-5, f"step {step}: max diff {np.abs(x - y).max()} of {scale}"
    assert ref.tokens() == cuda.tokens()


@pytest.mark.gpu
@pytest.mark.parametrize("unified", [True, False])
def test_cuda_graphs_keep_parallel_sequences_apart_like_the_reference(unified: bool) -> None:
    be = _gpu()
    ct = cache_type("q8_0")
    kw = dict(SHAPES["dense-d128"])
    n_layers, every = kw.pop("n_layers"), kw.pop("every")
    wl = Workload(toy_model(n_layers, every=every, **kw), ct, ct, (600, 900, 700), tokens=3, n_parallel=3, unified=unified)
    ref, cuda = _run(be, wl, "numpy", 0), _run(be, wl, "cuda", 2)
    for x, y in zip(ref.exec.logits(), cuda.exec.logits(), strict=True):
        assert np.abs(x - y).max() <= 2e-3 * float(np.abs(x).max()) + 1e-5
    assert [ref.tokens(s) for s in range(3)] == [cuda.tokens(s) for s in range(3)]


@pytest.mark.gpu
def test_cuda_output_is_identical_across_depths_and_each_split_is_one_graph() -> None:
    be = _gpu()
    ct = cache_type("q8_0")
    kw = dict(SHAPES["hybrid-d256"])
    n_layers, every = kw.pop("n_layers"), kw.pop("every")
    wl = Workload(toy_model(n_layers, every=every, **kw), ct, ct, (3000,), tokens=5)
    runs = [_run(be, wl, "cuda", d) for d in (0, 1, 2, 4)]
    assert len({tuple(r.step_hashes()) for r in runs}) == 1
    n_gpu_splits = 1 + wl.model.n_attn
    piped = runs[1].exec
    # one graph per split and slot address: the pipelined run's splits cycle through the ring's slots, never re-captured per token
    assert n_gpu_splits <= len(piped.graphs) <= n_gpu_splits * (1 + TransportConfig(depth=1).n_slots)


@pytest.mark.gpu
@pytest.mark.parametrize("unified", [True, False])
def test_cuda_graphs_over_device_resident_kv_layers_compute_what_the_reference_computes(unified: bool) -> None:
    """--kv-gpu-layers: a split through resident layers is one CUDA graph per layer, over the device's prefix."""
    from dataclasses import replace

    be = _gpu()
    ct = cache_type("q8_0")
    kw = dict(SHAPES["dense-d128"])
    n_layers, every = kw.pop("n_layers"), kw.pop("every")
    wl = Workload(toy_model(n_layers, every=every, **kw), ct, ct, (600, 900), tokens=3, n_parallel=2, unified=unified)
    ref = _run(be, wl, "numpy", 0)
    runs = {(kv, d): _run(be, replace(wl, kv_gpu_layers=kv), "cuda", d) for kv in (1, 2, wl.model.n_attn) for d in (0, 2)}
    assert len({tuple(r.step_hashes()) for r in runs.values()}) == 1
    for r in runs.values():
        for x, y in zip(ref.exec.logits(), r.exec.logits(), strict=True):
            assert np.abs(x - y).max() <= 2e-3 * float(np.abs(x).max()) + 1e-5
        assert [ref.tokens(s) for s in range(2)] == [r.tokens(s) for s in range(2)]


@pytest.mark.gpu
def test_cuda_span_copy_of_a_split_cache_computes_what_the_per_stream_copy_does() -> None:
    """Upstream's span copy (issue 28: one extent over the streams, gaps included) through the CuPy backend: streams
    of 16,384 cells against windows of 600-900 rows, so the extent carries other streams' cells; the output is the
    per-stream copy's and the NumPy reference's."""
    from dataclasses import replace

    be = _gpu()
    ct = cache_type("q8_0")
    kw = dict(SHAPES["dense-d128"])
    n_layers, every = kw.pop("n_layers"), kw.pop("every")
    wl = Workload(toy_model(n_layers, every=every, **kw), ct, ct, (600, 900, 700), tokens=3, n_parallel=3, unified=False,
                  ctx_size=3 * 16384)
    ref = _run(be, wl, "numpy", 0)
    runs = {s: _run(be, replace(wl, copy_span=s), "cuda", 0) for s in (False, True)}
    assert runs[True].step_hashes() == runs[False].step_hashes()
    for x, y in zip(ref.exec.logits(), runs[True].exec.logits(), strict=True):
        assert np.abs(x - y).max() <= 2e-3 * float(np.abs(x).max()) + 1e-5
    assert [ref.tokens(s) for s in range(3)] == [runs[True].tokens(s) for s in range(3)]
