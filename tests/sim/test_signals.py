"""SIGTERM and SIGINT end a sweep's worker processes with their parent, at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_sweep_ends_its_workers(tmp_path: Path, sig: int, code: int) -> None:
    # --exact: the simulator in the workers for long enough to be signalled (the evaluator answers this grid in ~1 s)
    proc = subprocess.Popen([sys.executable, "-m", "kvpipe.cli", "sweep", "--context", "1024..65536/1024", "--depth", "0..4",
                             "--budget", "0,64", "--jobs", "2", "--quiet", "--exact", "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    workers: list[int] = []
    while time.time() < deadline and len(workers) < 2:  # the pool's two workers (and its manager thread's helpers)
        workers = _children(proc.pid)
        time.sleep(0.1)
    assert len(workers) >= 2, "the sweep never started its workers"
    time.sleep(1.0)  # let them take chunks
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == code, err
    time.sleep(0.5)
    alive = [w for w in workers if Path(f"/proc/{w}").exists() and "zombie" not in Path(f"/proc/{w}/status").read_text()]
    assert alive == [], f"workers left running: {alive}"
    assert "Traceback" not in err and err.strip().splitlines()[-1] in ("kvpipe: terminated", "kvpipe: interrupted")
