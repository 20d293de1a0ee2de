"""Exactness with parallel sequences: 8 sequences, each with its own prompt, over a unified and a split cache.

The reference's second exactness gate: concurrent sequences with *different*
prompts and a deterministic batching schedule (here: every graph decodes one
token of every sequence) give the ordered path's output at every depth. It
caught a delivery sized from one cell instead of each stream's window, which
unit tests built with one sequence had passed: the ``one-cell-range``
mutation. Sizes are the default functional workload's (64 rows per sequence).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from backends.base import Backend, Buffer
from backends.profile import load_profile
from kvpipe.cli import main
from sim import functional as fn
from sim.graph import layout_of
from sim.program import DecodeProgram
from sim.run.point import Point
from sim.run.run import Checked, check
from sim.sequences import SequenceCells
from sim.transport.scheduler import TransportConfig
from tests.conftest import reference_workload

N = 8
CONTEXT = 2048  # the functional workload scales it to 64 rows per sequence
LAYOUTS = pytest.mark.parametrize("unified", [True, False], ids=["unified", "split"])


def fpoint(unified: bool, depth: int, mutations: str = "") -> Point:
    wl = reference_workload(CONTEXT, tokens=fn.MIN_GRAPHS, n_parallel=N, unified=unified)
    tc = TransportConfig(depth=depth, mutations=frozenset(m for m in mutations.split(",") if m))
    return fn.functional_point(Point(wl, load_profile("rtx4070-gen4x16"), tc))


def run(point: Point, program: DecodeProgram | None = None, events: bool = True) -> Checked:
    return check(point, functional=True, graphs=fn.functional_graphs if events else None, program=program)


def output(r: Checked) -> DecodeProgram:
    assert r.program is not None
    return r.program


@pytest.fixture(scope="module")
def ordered() -> dict[bool, Checked]:
    return {unified: run(fpoint(unified, 0)) for unified in (True, False)}


# ---------------------------------------------------------------- the gate


@LAYOUTS
def test_8_sequences_give_the_ordered_output_at_depths_1_and_4_without_hazards(unified: bool, ordered: dict[bool, Checked]) -> None:
    ref = ordered[unified]
    hashes = output(ref).step_hashes()
    assert ref.checker.hazard_count == 0 and len(hashes) == fn.MIN_GRAPHS and len(set(hashes)) == len(hashes)
    for depth in (1, 4):
        r = run(fpoint(unified, depth))
        assert r.checker.hazard_count == 0, r.checker.report()
        assert output(r).step_hashes() == hashes, f"depth {depth}"
        assert all(g.deliveries > 0 and g.early_bytes > 0 for g in r.result.graphs)  # pipelined, not declined


def test_one_cell_range_breaks_the_output_of_a_split_cache(ordered: dict[bool, Checked]) -> None:
    r = run(fpoint(False, 1, "one-cell-range"))  # depth 4: the CLI test below
    assert output(r).output_hash() != output(ordered[False]).output_hash()
    # The stale bytes come from the slot's earlier use, ordered by its events: the checker cannot see it, only the hash.
    assert r.checker.hazard_count == 0
    wl = r.result.point.workload
    cells = sum(g.deliveries for g in r.result.graphs) * N * (wl.k_row_bytes + wl.v_row_bytes)  # K and V: one cell per stream
    assert sum(g.early_bytes for g in r.result.graphs) == cells


def test_one_cell_range_leaves_a_unified_cache_exact(ordered: dict[bool, Checked]) -> None:
    r = run(fpoint(True, 1, "one-cell-range"))  # one stream, one range: nothing is sized per stream
    assert r.checker.hazard_count == 0 and output(r).output_hash() == output(ordered[True]).output_hash()


@pytest.mark.parametrize(("mutation", "writer"), [("no-boundary-wait", "host_cache_update"), ("stale-prefix", "cpu_rows_l3")])
def test_the_events_still_catch_their_mutations_with_8_sequences(mutation: str, writer: str, ordered: dict[bool, Checked]) -> None:
    r = run(fpoint(False, 1, mutation))
    assert r.checker.hazard_count > 0 and any("host_kv_cache" in line and writer in line for line in r.checker.report())
    assert output(r).output_hash() != output(ordered[False]).output_hash()


def test_cli_runs_8_functional_sequences_and_names_the_mutation(capsys: pytest.CaptureFixture[str], ordered: dict[bool, Checked]) -> None:
    args = ["simulate", "--functional", "--parallel", "8", "--no-kv-unified", "--context", str(CONTEXT), "--depth", "0,4",
            "--tokens", str(fn.MIN_GRAPHS)]
    assert main([*args, "--mutate", "one-cell-range", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["parallel"], r["unified"], r["hazards"]) for r in rows] == [(8, False, 0), (8, False, 0)]
    assert rows[0]["output_hash"] == output(ordered[False]).output_hash() != rows[1]["output_hash"]


# ---------------------------------------------------------------- the schedule and the prompts


def test_the_reset_writes_one_sequence_low_while_the_others_keep_their_prefix() -> None:
    p = fpoint(False, 1)
    assert [e for e, _ in fn.events(p)][:5] == ["decode", "decode", "ubatch", "shift", "reset"]
    reset = list(fn.functional_graphs(p))[4]
    wl, lay, r = p.workload, layout_of(p.workload), fn.RESET_ROWS
    rows = reset.positions
    assert rows[fn.RESET_SEQ] == r and all(x > 3 * r for s, x in enumerate(rows) if s != fn.RESET_SEQ)
    for inp in reset.staged_splits[0].staged:
        row_b = inp.pieces[0].cell_bytes
        assert [piece.prefix_bytes for piece in inp.pieces] == [x * row_b for x in rows]  # each stream its own prefix
    assert set(reset.host_writes_at_start) == {
        (off(j, fn.RESET_SEQ, 0), r * rb) for j in range(wl.model.n_attn)
        for off, rb in ((lay.k_offset, wl.k_row_bytes), (lay.v_offset, wl.v_row_bytes))
    }  # the new prompt: rows 0..8 of that stream, in every layer


class SwappedPrompts(DecodeProgram):
    """The decode program with the prompts of sequences 0 and 1 traded after setup."""

    def setup(self, backend: Backend, host_cache: Buffer) -> None:
        super().setup(backend, host_cache)
        cache, wl, lay, seqs = host_cache.array, self.wl, self.layout, self.seqs
        assert wl.contexts[0] == wl.contexts[1]
        for j in range(wl.model.n_attn):
            for offset, rb in ((lay.k_offset, wl.k_row_bytes), (lay.v_offset, wl.v_row_bytes)):
                for row in range(wl.contexts[0]):
                    a, b = offset(j, *seqs.cell(0, row)), offset(j, *seqs.cell(1, row))
                    cache[a : a + rb], cache[b : b + rb] = cache[b : b + rb].copy(), cache[a : a + rb].copy()


@LAYOUTS
def test_each_sequence_reads_its_own_prompt_and_the_prompts_differ(unified: bool) -> None:
    p = fpoint(unified, 1)
    p = replace(p, workload=replace(p.workload, tokens=2))
    plain = output(run(p, events=False))  # plain decode steps: no host rewrite (its content is keyed by cell)
    swapped = output(run(p, SwappedPrompts(p.workload), events=False))
    assert plain.step_hashes(0) != plain.step_hashes(1)
    assert swapped.step_hashes(0) == plain.step_hashes(1) and swapped.step_hashes(1) == plain.step_hashes(0)
    assert all(swapped.step_hashes(s) == plain.step_hashes(s) for s in range(2, N))  # nobody else reads those cells
    assert swapped.output_hash() != plain.output_hash()


@LAYOUTS
def test_every_row_of_every_sequence_has_its_own_cell_and_writes_follow_it(unified: bool) -> None:
    wl = fpoint(unified, 0).workload
    seqs = wl.sequence_cells
    cells = {(s, r): seqs.cell(s, r) for s in range(N) for r in range(seqs.capacity(s))}
    assert len(set(cells.values())) == len(cells) == wl.cells
    assert all(seqs.owner(*c) == sr for sr, c in cells.items())
    for s in range(N):
        listed = [(sl.stream, c) for sl in seqs.cells_of(s, 70) for c in range(sl.start, sl.stop, sl.step)]
        assert listed == [cells[(s, r)] for r in range(70)]  # the KQ mask of row 69, in row order
    assert wl.writes(2) == tuple(cells[(s, c + 2)] for s, c in enumerate(wl.contexts))


def test_unified_cells_lay_the_prompts_end_to_end_then_interleave() -> None:
    seqs = SequenceCells((3, 2), unified=True, cells_per_stream=10)
    assert [seqs.cell(0, r)[1] for r in range(5)] == [0, 1, 2, 5, 7]
    assert [seqs.cell(1, r)[1] for r in range(4)] == [3, 4, 6, 8]
    assert seqs.runs([(0, 1, 4), (1, 2, 3)]) == [(0, 1, 3), (0, 5, 7)]
