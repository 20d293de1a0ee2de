"""tools/llamacpp/staging_curve_study.sh (issue 28, docs/validation.md "Run 13"): bad arguments are one line on
stderr, exit 2, and leave no folder behind (the study itself runs minutes of simulation: not run here)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "llamacpp" / "staging_curve_study.sh"


@pytest.mark.parametrize("args,named", [
    (["9", "sizes"], "2 arguments"),  # OUT missing: the count given is named
    (["9", "sizes", "OUT"], "RUN 9"),
    (["13", "knee", "OUT"], "CURVE knee"),
    (["13", "sizes", "OUT"], "GGUF /nonexistent.gguf"),
])
def test_a_bad_argument_is_one_line_exit_2_and_nothing_written(tmp_path: Path, args: list[str], named: str) -> None:
    out = tmp_path / "study"
    argv = [str(out) if a == "OUT" else a for a in args]
    got = subprocess.run(["bash", str(SCRIPT), *argv], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "GGUF": "/nonexistent.gguf"})
    assert got.returncode == 2 and got.stdout == ""
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("staging_curve_study: ") and "allowed" in lines[0]
    assert named in lines[0]
    assert not out.exists()
