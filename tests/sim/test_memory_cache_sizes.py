"""``sim.memory.cache_sizes`` keeps a workload's cache rows and bytes per row per object: what ``kv_layer_bytes``,
``compute_buffer_bytes`` and the accounts built on them read is each workload's own, however many workloads come and
go (a freed workload's id taken by a new one) and past the table's size."""

from __future__ import annotations

import random
from typing import Any

import pytest

from sim import memory
from sim.memory import N_UBATCH, cache_sizes, compute_buffer_bytes, device_memory, host_kv_bytes, kv_layer_bytes
from sim.workload import CACHE_TYPES, MAX_CONTEXT, Workload, load_model, model_preset_names


def _workload(rng: random.Random, models: list[Any]) -> Workload:
    """A random valid workload: model (``models``: shared objects, as a plan's workloads share theirs), K and V cache
    types, one or several sequences (unified or split), contexts, tokens, a cache size or none, -ngl."""
    model = rng.choice(models)
    k, v = (CACHE_TYPES[rng.choice(("f16", "q8_0", "f32"))] for _ in range(2))
    n = rng.choice((1, 1, 1, 2, 4))
    context = tuple(rng.randint(1, 1 << rng.randint(1, 20)) for _ in range(rng.choice((1, n))))
    tokens = rng.randint(1, 8)
    wl = Workload(model, k, v, context, tokens=tokens, n_parallel=n, unified=rng.random() < 0.5,
                  n_gpu_layers=rng.choice((999, model.n_layers // 2, 1)))
    if rng.random() < 0.3:
        need = wl._cells_needed()
        wl = Workload(model, k, v, context, tokens=tokens, n_parallel=n, unified=wl.unified, n_gpu_layers=wl.n_gpu_layers,
                      ctx_size=min(MAX_CONTEXT, need + rng.randint(0, 5000)))
    return wl


@pytest.mark.parametrize("seed", [0, 1])
def test_each_workloads_cache_sizes_are_its_own(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 random workloads, each made, read twice and dropped (so that new ones take freed ids), with the table
    emptied every 64 (``CACHE_SIZES_KEPT``): every read equals the workload's own ``cells`` and ``row_bytes``, and
    ``kv_layer_bytes``, ``compute_buffer_bytes``, the device's and the host's accounts equal the properties'
    arithmetic."""
    monkeypatch.setattr(memory, "CACHE_SIZES_KEPT", 64)
    rng = random.Random(seed)
    models = [load_model(name) for name in model_preset_names()]
    for _ in range(2000):
        wl = _workload(rng, models)
        for _ in range(2):
            assert cache_sizes(wl) == (wl.cells, wl.row_bytes)
            assert kv_layer_bytes(wl) == wl.cells * wl.row_bytes
            gpu = wl.gpu_layer_start < wl.model.n_layers
            assert compute_buffer_bytes(wl) == (N_UBATCH * 4 * (wl.model.vocab + wl.model.hidden) + N_UBATCH * wl.cells * 2
                                                if gpu else 0)
            on = sum(1 for a in wl.model.attn_layers if a >= wl.gpu_layer_start)
            assert device_memory(wl, 1 << 40, 1 << 28, True).kv_bytes == on * wl.cells * wl.row_bytes
            assert host_kv_bytes(wl, True) == (wl.model.n_attn - on) * wl.cells * wl.row_bytes
        del wl
    assert len(memory._CACHE_SIZES) <= 64
