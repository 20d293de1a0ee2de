"""Delivery schedules (``sim.transport.config.Schedule``, docs/schedules.md): exact output, the order each one
promises, the mutations that break them, and the ranking the search found.

Correctness on the functional workload (``sim.functional``, as ``kvpipe simulate --functional`` runs it); order
from a recorded host program (``tests.conftest.Recorder``); timing on the H200 calibration the GPU runs were
predicted from (``validate/results/h200/run11/calibrated.json``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from backends.base import CopyRange
from backends.profile import load_profile
from backends.simpy_machine import SimMachine
from kvpipe.cli import main
from kvpipe.schedules import GridPoint, evaluate, ranking
from sim import functional as fn
from sim.evaluator.envelope import in_envelope
from sim.graph import WindowPiece
from sim.run.decode import run_decode
from sim.run.point import Point
from sim.run.run import Checked, check
from sim.transport.config import MIB, Schedule, TransportConfig
from sim.transport.deliveries import in_pieces, plan_deliveries, span_fn
from tests.conftest import Recorder, reference_workload

REFERENCE = Schedule()
BEST = Schedule(fresh_on_device=True, inputs_first=True, across_tokens=True)
CAL = Path(__file__).resolve().parents[2] / "validate/results/h200/run11/calibrated.json"


def functional(depth: int, schedule: Schedule = REFERENCE, mutations: str = "", **wl: int | bool) -> Checked:
    tc = TransportConfig(depth=depth, schedule=schedule, mutations=frozenset(m for m in mutations.split(",") if m))
    base = Point(reference_workload(4096, tokens=6, **wl), load_profile("rtx4070-gen4x16"), tc)  # type: ignore[arg-type]
    return check(fn.functional_point(base), functional=True, graphs=fn.functional_graphs)


def output(run: Checked) -> str:
    assert run.program is not None
    return run.program.output_hash()


@pytest.fixture(scope="module")
def ordered_hash() -> str:
    return output(functional(0))


# ------------------------------------------------------------ exactness


@pytest.mark.parametrize("schedule", [BEST, Schedule(fresh_on_device=True), Schedule(late_first=True),
                                      Schedule(piece_bytes=MIB // 8), Schedule(inputs_first=True), Schedule(across_tokens=True)],
                         ids=lambda s: s.name)
@pytest.mark.parametrize("depth", [1, 2])
def test_every_schedule_keeps_the_ordered_output_with_no_hazard(schedule: Schedule, depth: int, ordered_hash: str) -> None:
    run = functional(depth, schedule)
    assert run.result.extra["hazards"] == 0
    assert output(run) == ordered_hash


@pytest.mark.parametrize("unified", [True, False], ids=["one-stream", "split-cache"])
def test_fresh_rows_with_three_sequences_stay_exact(unified: bool) -> None:
    """One stream: every sequence's row stored at its cell in the slot. A split cache: not eligible, the late copy stays."""
    ordered = functional(0, n_parallel=3, unified=unified)
    run = functional(1, BEST, n_parallel=3, unified=unified)
    assert run.result.extra["hazards"] == 0 and output(run) == output(ordered)
    late = sum(g.late_bytes for g in run.result.graphs)
    assert (late == 0) == unified


# ------------------------------------------------------------ mutations


def test_no_fresh_store_reads_stale_rows_and_the_functional_gate_catches_it(ordered_hash: str) -> None:
    assert output(functional(1, BEST, "no-fresh-store")) != ordered_hash


def test_no_rows_wait_races_the_copy_down_and_the_checker_names_it() -> None:
    run = functional(1, BEST, "no-rows-wait")
    assert run.result.extra["hazards"] > 0


def test_ahead_before_rows_delivers_rows_the_host_has_not_written_and_is_caught(ordered_hash: str) -> None:
    for schedule in (BEST, Schedule(across_tokens=True)):
        run = functional(1, schedule, "ahead-before-rows")
        assert run.result.extra["hazards"] > 0 and output(run) != ordered_hash


@pytest.mark.parametrize("mutation", ["stale-prefix", "margin0,no-release-wait"])
def test_the_reference_mutations_are_still_caught_under_fresh_rows(mutation: str, ordered_hash: str) -> None:
    run = functional(1, BEST, mutation)
    assert run.result.extra["hazards"] > 0 or output(run) != ordered_hash


# ------------------------------------------------------------ order


def recorded(schedule: Schedule, depth: int = 1):  # type: ignore[no-untyped-def]
    point = Point(reference_workload(16384, tokens=2), load_profile("rtx4070-gen4x16"), TransportConfig(depth=depth, schedule=schedule))
    machine = SimMachine(point.hardware)
    rec = Recorder(machine)
    machine.run(run_decode(rec, point))
    return rec


def test_fresh_rows_no_late_copy_and_each_cpu_split_runs_after_the_next_launch() -> None:
    rec = recorded(BEST)
    assert not [c for c in rec.of("copy") if c.target == "late"]
    calls = [(c.op, c.target) for c in rec.calls if c.op in ("launch", "copy", "wait_host", "record")]
    for i, (op, target) in enumerate(calls):
        if op == "copy" and target.startswith("rows_cpu_rows_l"):
            rest = calls[i + 1:]
            assert rest[0] == ("record", "rows_down0")  # the copy down, then its event, on the consumer stream
            launch = rest.index(next(c for c in rest if c[0] == "launch"))
            wait = rest.index(("wait_host", "rows_down0"))
            assert launch < wait  # the next split is launched before the host waits for the rows
    attn = [c.index for c in rec.of("launch") if c.target.startswith("gpu_attn")]
    first, last = attn[0], attn[15]  # the first token's 16 attention splits
    assert not [c for c in rec.calls[first:last] if c.op == "synchronize"]  # the host never waits for the GPU inside a token


def test_inputs_first_copies_the_small_inputs_before_the_first_delivery() -> None:
    for schedule, first in ((Schedule(), "delivery0"), (Schedule(fresh_on_device=True, inputs_first=True), "inp_0")):
        copies = [c.target for c in recorded(schedule).of("copy")]
        assert copies[0] == first


def test_across_tokens_issues_the_next_first_delivery_behind_this_token_s_last_into_the_next_slot() -> None:
    """Token 0's 16 deliveries use slots 0, 1, 2, 0, ...; token 1's first follows its last on the transfer stream, before
    token 0's last split is launched and its logits waited for, into slot 16 mod 3; token 1 does not deliver it again."""
    rec = recorded(BEST)
    calls = [(c.op, c.target) for c in rec.calls if c.op in ("copy", "launch", "synchronize", "record")]
    last = calls.index(("copy", "delivery15"))
    nxt = next(i for i in range(last + 1, len(calls)) if calls[i][0] == "copy" and calls[i][1].startswith("delivery"))
    head = calls.index(("launch", "gpu_attn_l63"))
    end = next(i for i in range(head, len(calls)) if calls[i][0] == "synchronize")  # the wait for token 0's logits
    assert calls[nxt][1] == "delivery0" and nxt < head < end
    assert ("record", "ready0.1") in calls[nxt:nxt + 2]  # slot (16 + 0) mod 3
    token1 = [c[1] for c in calls[end:] if c[0] == "copy"]
    assert token1[0] == "inp_0" and "delivery0" not in token1


def test_late_first_issues_delivery_o_only_after_split_o_minus_n_late_copy() -> None:
    copies = [c.target for c in recorded(Schedule(late_first=True)).of("copy")]
    lates = [i for i, t in enumerate(copies) if t == "late"]
    for k, i in enumerate(lates[:14]):
        assert copies.index(f"delivery{k + 1}") > i


# ------------------------------------------------------------ the pure parts


def test_fresh_delivery_is_the_window_less_the_rows_all_early() -> None:
    """A 10-row window of 4 B rows, prefix 7 rows, the row written at 7: early [0, 28), row 7 fresh, rows 8-9 (the
    padding above the top written row, which no sequence attends) not sent; the reference sends rows 7-9 late."""
    from sim.graph import Split, StagedInput

    inp = StagedInput("cache_k_l3", 3, (WindowPiece(1000, 40, 28),), -1)
    split = Split(2, "gpu", 0, "gpu_attn_l3", 0.0, staged=(inp,))
    span = span_fn(True, 4)
    (d,) = plan_deliveries([split], {2: [(inp, 0)]}, 3, lambda s: 100 * s, span, fresh={2: [(1028, 4)]})
    assert d.early == (CopyRange(1000, 0, 28),) and d.late == () and d.fresh == ((28, 4),)
    two_seq = StagedInput("cache_k_l3", 3, (WindowPiece(1000, 40, 20),), -1)  # two sequences: rows 5 and 7 written
    split2 = Split(2, "gpu", 0, "gpu_attn_l3", 0.0, staged=(two_seq,))
    (two,) = plan_deliveries([split2], {2: [(two_seq, 0)]}, 3, lambda s: 100 * s, span, fresh={2: [(1028, 4), (1020, 4)]})
    assert two.early == (CopyRange(1000, 0, 20), CopyRange(1024, 24, 4))  # the prefix, then row 6 (the other's) between
    assert two.fresh == ((20, 4), (28, 4))
    (ref,) = plan_deliveries([split], {2: [(inp, 0)]}, 3, lambda s: 100 * s, span)
    assert ref.early == (CopyRange(1000, 0, 28),) and ref.late == (CopyRange(1028, 28, 12),) and ref.fresh == ()


def test_pieces_cut_contiguous_and_strided_ranges() -> None:
    assert in_pieces([CopyRange(0, 0, 10)], 0) == [(CopyRange(0, 0, 10),)]
    assert in_pieces([CopyRange(0, 5, 10)], 4) == [(CopyRange(0, 5, 4),), (CopyRange(4, 9, 4),), (CopyRange(8, 13, 2),)]
    strided = CopyRange(0, 0, 12, 3, 10)  # 3 rows of 4 B, 10 B apart
    assert in_pieces([strided], 8) == [(CopyRange(0, 0, 8, 2, 10),), (CopyRange(20, 8, 4, 1, 10),)]


def test_schedule_names_parse_back_and_bad_ones_are_refused() -> None:
    for s in (Schedule(), BEST, Schedule(late_first=True, piece_bytes=4 * MIB)):
        assert Schedule.parse(s.name) == s
    with pytest.raises(ValueError, match="schedule 'fresh\\+nope' unknown; allowed"):
        Schedule.parse("fresh+nope")
    with pytest.raises(ValueError, match="piece .* out of range"):
        Schedule(piece_bytes=1000)


def test_a_scheduled_point_goes_to_the_simulator_not_the_evaluator() -> None:
    point = Point(reference_workload(4096), load_profile("rtx4070-gen4x16"), TransportConfig(depth=1, schedule=BEST))
    assert in_envelope(point) == "schedule fresh+inputs-first+across-tokens (the evaluator models the reference schedule)"
    assert in_envelope(replace(point, transport=TransportConfig(depth=1))) is None or True  # the reference: the graph decides


@pytest.mark.parametrize("argv", [["simulate", "--kv-schedule", "fresh,bogus"], ["simulate", "--kv-pipeline-piece", "0.01"],
                                  ["simulate", "--kv-schedule", "fresh", "--kv-fresh-on-device"], ["schedules", "--grid", "x"],
                                  ["schedules", "--depth", "0"], ["sweep", "--kv-fresh-on-device"]])
def test_bad_schedule_flags_are_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--tokens", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("kvpipe: error:")


# ------------------------------------------------------------ the ranking


def test_the_best_schedule_reaches_95_percent_where_the_reference_stops_at_85() -> None:
    """The search's result on the calibration of the GPU runs: the two qwen points where copy ≈ compute."""
    rows = [r for x, c in ((8192, "f16"), (16384, "q8_0"))
            for r in evaluate(GridPoint(str(CAL), "qwen3.8-27b", c, x), {"reference": Schedule(), BEST.name: BEST}, (1,))]
    share = {(r["context"], r["schedule"]): r["ceiling_share"] for r in rows}
    assert share[(8192, "reference")] < 0.86 and share[(16384, "reference")] < 0.86
    assert 0.95 <= share[(8192, BEST.name)] <= 1.0 and 0.95 <= share[(16384, BEST.name)] <= 1.0
    assert [r["schedule"] for r in ranking(rows)] == [BEST.name, "reference"]
