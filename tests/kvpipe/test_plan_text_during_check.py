"""``kvpipe plan`` makes its text while the sample check's simulations run, and prints what it printed before: the
memory plan's lines, the check's, the gain table (``kvpipe.capacity.plan_fit``'s ``meanwhile``)."""

from __future__ import annotations

import pytest

from kvpipe.capacity import plan_fit
from kvpipe.capacity_report import render_fit, render_fit_head, render_fit_tail
from kvpipe.cli import main
from kvpipe.plan import PlanRequest, render

ARGS = ["--context", "4096,16384,32768", "--max-depth", "3", "--budget", "0,64"]


def _req(check_n: int = 32) -> PlanRequest:
    return PlanRequest(contexts=(4096, 16384, 32768), max_depth=3, budgets_mib=(0, 64), jobs=2, check_n=check_n)


def test_the_text_is_made_once_before_the_check_ends_and_is_the_whole_plans() -> None:
    seen = []

    def meanwhile(fp) -> None:  # type: ignore[no-untyped-def]
        seen.append((fp, fp.check, fp.checked, render_fit_head(fp, "q8_0"), render(fp.plans)))

    fp = plan_fit(_req(), meanwhile)
    assert len(seen) == 1
    got, check, checked, head, gains = seen[0]
    assert got is fp and check == (0, 0.0) and checked == 0  # the check's figures not in yet
    assert fp.check[0] > 0 and fp.checked >= 32  # ... and in once it ended
    assert head == render_fit_head(fp, "q8_0") and gains == render(fp.plans)  # the rest of the plan was whole
    assert "sample check:" in render_fit_tail(fp) and render_fit(fp, "q8_0") == f"{head}\n{render_fit_tail(fp)}"


def test_no_check_no_meanwhile() -> None:
    seen = []
    fp = plan_fit(_req(check_n=0), seen.append)
    assert seen == [] and fp.check[1] == 0.0


@pytest.mark.parametrize("check", ["32", "0"])
def test_the_command_prints_the_plan_as_rendered_whole(check: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *ARGS, "--check", check]) == 0
    out = capsys.readouterr().out
    fp = plan_fit(_req(check_n=int(check)))
    assert out == f"{render_fit(fp, 'q8_0')}\n\n{render(fp.plans)}\n"
    assert ("sample check: off" in out) == (check == "0")
