"""The decode program: cache codecs, determinism, and that the output depends on exactly the valid window rows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends.profile import load_profile
from sim.graph import layout_of
from sim.program import DecodeProgram, ProgramConfig, decode_rows, encode_rows
from sim.run.point import Point
from sim.run.run import check
from sim.transport.scheduler import TransportConfig
from sim.workload import CacheType, Workload, cache_type
from tests.conftest import toy_model

CODECS = ("f32", "f16", "bf16", "q8_0", "q4_0")


@pytest.mark.parametrize("name", CODECS)
def test_codec_round_trip_is_within_the_type_precision(name: str) -> None:
    ct = cache_type(name)
    x = np.random.default_rng(1).standard_normal((5, 128)).astype(np.float32) * 3
    raw = encode_rows(np, x, ct)
    assert raw.dtype == np.uint8 and raw.shape == (5, ct.row_bytes(128))
    y = decode_rows(np, raw, ct, 128)
    if name == "q8_0":  # half a step of each 32-element block, plus the f16 rounding of the scale (127 steps)
        step = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs((x - y).reshape(-1, 32)) <= step * (0.5 + 127 * 2.0**-11) + 1e-6)
    elif name == "q4_0":  # a step is max/8; the value 8*d (the largest magnitude with the other sign) clips to 7*d
        step = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True) / 8
        assert np.all(np.abs((x - y).reshape(-1, 32)) <= step * (1.0 + 16 * 2.0**-11) + 1e-6)
    else:
        tol = {"f32": 0.0, "f16": 1e-3, "bf16": 8e-3}[name]
        assert np.all(np.abs(x - y) <= tol * np.abs(x) + 1e-7)


def test_q8_0_block_is_an_f16_scale_then_32_int8() -> None:
    x = np.zeros((1, 32), np.float32)
    x[0, 3] = -2.54
    raw = encode_rows(np, x, cache_type("q8_0"))
    assert raw.shape == (1, 34)
    assert raw[0, :2].view(np.float16)[0] == np.float16(2.54 / 127)
    q = raw[0, 2:].view(np.int8)
    assert q[3] == -127 and np.count_nonzero(q) == 1


def test_q4_0_block_is_an_f16_scale_then_nibbles_low_half_first() -> None:
    x = np.zeros((1, 32), np.float32)
    x[0, 1], x[0, 17] = -4.0, 2.0  # d = -4 / -8 = 0.5: element 1 -> q 0 (low nibble), element 17 -> q 12 (high nibble of byte 1)
    raw = encode_rows(np, x, cache_type("q4_0"))
    assert raw.shape == (1, 18) and raw[0, :2].view(np.float16)[0] == np.float16(0.5)
    assert raw[0, 3] == (0 | 12 << 4) and raw[0, 2] == (8 | 8 << 4)
    assert np.array_equal(decode_rows(np, raw, cache_type("q4_0"), 32), x)


def test_unsupported_cache_type_is_refused() -> None:
    with pytest.raises(ValueError, match="q4_1"):
        encode_rows(np, np.zeros((1, 32), np.float32), CacheType("q4_1", 32, 20))


def _point(context: int = 100, tokens: int = 3, cache: str = "f16", depth: int = 0) -> Point:
    ct = cache_type(cache)
    wl = Workload(toy_model(6, every=2, n_head_kv=2, head_dim_k=32, head_dim_v=32), ct, ct, (context,), tokens=tokens)
    return Point(wl, load_profile("rtx4070-gen4x16"), TransportConfig(depth=depth))


def _hashes(point: Point, config: ProgramConfig | None = None) -> list[str]:
    program = DecodeProgram(point.workload, config)
    run = check(point, functional=True, program=program)
    assert run.checker.hazard_count == 0
    return program.step_hashes()


def test_same_seed_same_output_other_seed_other_output() -> None:
    p = _point()
    a, b = _hashes(p), _hashes(p)
    assert a == b and len(a) == 3 and len(set(a)) == 3
    assert _hashes(p, ProgramConfig(seed=7)) != a


def test_output_depends_on_every_valid_row_and_on_no_row_above_the_position() -> None:
    p = _point(context=100)
    full = _hashes(p)
    # Rows at or above the first position (100) are masked until the CPU split writes them.
    assert _hashes(p, ProgramConfig(prefill_rows=100)) == full
    # Leaving the last cached row empty changes every step.
    short = _hashes(p, ProgramConfig(prefill_rows=99))
    assert all(x != y for x, y in zip(short, full, strict=True))


def test_tokens_are_the_greedy_choice_of_each_step() -> None:
    p = _point(tokens=4)
    program = DecodeProgram(p.workload)
    check(p, functional=True, program=program)
    toks = program.tokens()
    assert len(toks) == 4 and all(0 <= t < program.vocab for t in toks)
    assert len(program.output_hash()) == 64


def test_new_rows_reach_the_host_cache_through_the_cpu_split() -> None:
    p = _point(context=100, tokens=2)
    program = DecodeProgram(p.workload)
    run = check(p, functional=True, program=program)
    cache = program.host_cache
    assert cache is not None and run.result.graphs
    lay = layout_of(p.workload)
    kb = p.workload.k_row_bytes
    rows = program.seqs.capacity(0) if program.cfg.prefill_rows < 0 else min(program.cfg.prefill_rows, program.seqs.capacity(0))
    for j in range(p.workload.model.n_attn):
        prefill = np.zeros(lay.nbytes, np.uint8)  # what setup wrote before any token ran
        program._write_prompt(prefill, j, 0, 0, rows)
        for row in range(96, 102):
            off = lay.k_offset(j, 0, row)
            same = np.array_equal(cache.array[off : off + kb], prefill[off : off + kb])
            # rows 100 and 101 were written by the two decode steps' CPU splits; the prompt rows below are untouched
            assert same == (row < 100), (j, row)


def test_host_writes_must_be_whole_rows() -> None:
    p = _point()
    program = DecodeProgram(p.workload)
    lay = layout_of(p.workload)
    with pytest.raises(ValueError, match="whole rows"):
        program._region(lay.k_offset(0, 0, 1) + 1, p.workload.k_row_bytes)
    assert program._region(lay.v_offset(1, 0, 4), 3 * p.workload.v_row_bytes) == (1, 1, 4, 7)


def test_hidden_sizes_are_capped_but_kv_rows_are_the_workload_s() -> None:
    p = _point()
    wl = replace(p.workload, model=replace(p.workload.model, hidden=4096, ffn=16384, vocab=100000))
    program = DecodeProgram(wl, ProgramConfig(max_hidden=32, max_ffn=48, max_vocab=64))
    assert (program.hidden, program.ffn, program.vocab) == (32, 32, 64)  # whole 32-element blocks
    assert (program.kb, program.vb) == (wl.k_row_bytes, wl.v_row_bytes)
