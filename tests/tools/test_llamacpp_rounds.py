"""Runs 10-14 of issue 28 (tools/llamacpp/README-run10.md to README-run14.md): rounds of llama-batched-bench over
calibration and held-out -npp, odd rounds ascending and even rounds reversed, held-out calls hidden, a warm follow-up
call repeating nothing, and held-out -npp and -c that no earlier run used."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import alternating_rounds, assert_held_out_hidden, bench_dry_run

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "validate" / "results" / "h200-llamacpp"
EARLIER = ("run1", "run2", "run3", "run4", "run5", "run6", "run7", "run8", "run9", "span")


@dataclass(frozen=True)
class Run:
    n: int  # the run's number: phase run{n}, files r{n}-batched-*, knobs LCP_R{n}_*
    pps: tuple[int, ...]  # every -npp, ascending
    held: tuple[int, ...]  # the held-out ones
    ctx: dict[int, int]  # each -npp's -c
    rounds: int
    earlier: tuple[str, ...]  # the runs before it, whose -npp and -c the held-out ones must avoid

    @property
    def script(self) -> str:
        return (ROOT / "tools" / "llamacpp" / "rounds.sh").read_text()  # every run's settings, one table


RUNS = [Run(10, (512, 704, 960, 1280), (704, 960), {512: 4864, 704: 6400, 960: 16384, 1280: 11008}, 6, EARLIER),
        Run(11, (512, 576, 1120, 1280), (576, 1120), {512: 4864, 576: 14336, 1120: 9728, 1280: 11008}, 12, EARLIER + ("run10",)),
        Run(12, (512, 800, 1000, 1280), (800, 1000), {512: 4864, 800: 7168, 1000: 8768, 1280: 11008}, 12,
            EARLIER + ("run10", "run11")),
        Run(13, (512, 672, 1056, 1280), (672, 1056), {512: 4864, 672: 6144, 1056: 9216, 1280: 11008}, 12,
            EARLIER + ("run10", "run11", "run12")),
        Run(14, (512, 928, 1200, 1280), (928, 1200), {512: 4864, 928: 8192, 1200: 10368, 1280: 11008}, 12,
            EARLIER + ("run10", "run11", "run12", "run13"))]


def _dry_run(tmp_path: Path, run: Run, phase: str, env_extra: dict[str, str] | None = None) -> tuple[list[str], str, str]:
    summary, commands = bench_dry_run(tmp_path, phase, env_extra)
    return re.findall(rf"\] (r{run.n}-batched-\S+): rc=", summary), summary, commands


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"run{r.n}")
def test_rounds_odd_ascending_even_reversed_held_out_hidden(tmp_path: Path, run: Run) -> None:
    names, summary, commands = _dry_run(tmp_path, run, f"run{run.n}")
    calls = 8 * run.rounds
    assert names == alternating_rounds(f"r{run.n}", run.pps, rounds=run.rounds) and len(names) == calls
    assert_held_out_hidden(names, summary, run.held)
    assert {int(pp): int(c) for c, pp in re.findall(r" -c (\d+) .* -npp (\d+) ", commands)} == run.ctx
    assert commands.count(" -kvu") == calls // 2 and commands.count(" -npl 1,2,4,8 ") == calls and " -ntg 64 " in commands


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"run{r.n}")
def test_a_warm_follow_up_call_repeats_no_finished_call(tmp_path: Path, run: Run) -> None:
    first, _, _ = _dry_run(tmp_path, run, f"run{run.n}", {f"LCP_R{run.n}_ROUNDS": "2"})
    again, summary, _ = _dry_run(tmp_path, run, f"run{run.n}b", {f"LCP_R{run.n}_ROUNDS": "3"})
    assert len(first) == 16 and len(again) == 8 and all(n.endswith("-r3") for n in again)
    assert summary.count("done in an earlier call") == 16


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"run{r.n}")
def test_no_held_out_prompt_or_context_was_used_by_an_earlier_run(run: Run) -> None:
    prompts: set[int] = set()
    contexts: set[int] = set()
    for earlier in run.earlier:
        for f in (RESULTS / earlier).rglob("commands.txt"):
            text = f.read_text()
            prompts |= {int(x) for x in re.findall(r" -npp (\d+)", text)}
            contexts |= {int(x) for x in re.findall(r"batched-bench .* -c (\d+) ", text)}
    assert {512, 1280, 832, 1216} <= prompts and {10496, 12288} <= contexts  # the earlier runs were read
    held = re.search(rf'LCP_R{run.n}_PP_HELD:-([\d ]+)\}}', run.script)
    every = re.search(rf'LCP_R{run.n}_PP:-([\d ]+)\}}', run.script)
    assert held is not None and every is not None
    assert tuple(map(int, held.group(1).split())) == run.held and not set(run.held) & prompts
    assert tuple(map(int, every.group(1).split())) == run.pps  # every held-out -npp between the calibration ones
    assert not {run.ctx[pp] for pp in run.held} & contexts
    assert re.search(rf'LCP_R{run.n}_ROUNDS:-{run.rounds}\}}', run.script)
