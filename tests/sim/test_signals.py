"""SIGTERM and SIGINT end a sweep's worker processes with their parent, at once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _cpu_ticks(pid: int) -> int:
    """User + system CPU clock ticks the process has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))


def _gone(pid: int) -> bool:
    p = Path(f"/proc/{pid}/status")
    try:
        return "zombie" in p.read_text()
    except OSError:
        return True


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_sweep_ends_its_workers(tmp_path: Path, sig: int, code: int) -> None:
    # --exact: the simulator in the workers, on a grid far longer than the test waits (~30 min of simulation on two
    # cores), so the signal always lands mid-sweep however loaded the machine is; the evaluator would answer it in
    # seconds
    proc = subprocess.Popen([sys.executable, "-m", "kvpipe.cli", "sweep", "--context", "1024..262144/1024", "--depth", "0..8",
                             "--budget", "0,64,128", "--jobs", "2", "--quiet", "--exact", "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        deadline = time.time() + 60
        while time.time() < deadline and len(workers) < 2:  # the pool's two workers (and its manager thread's helpers)
            workers = _children(proc.pid)
            time.sleep(0.1)
        assert len(workers) >= 2, "the sweep never started its workers"
        while time.time() < deadline and min(_cpu_ticks(w) for w in workers) < 10:  # each has simulated for ~0.1 s CPU
            time.sleep(0.05)
        assert min(_cpu_ticks(w) for w in workers) >= 10, "the workers never started simulating"
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == code, err
        gone_by = time.time() + 2  # the parent has returned; its workers must be ended, not left to finish their chunks
        while time.time() < gone_by and not all(_gone(w) for w in workers):
            time.sleep(0.05)
        alive = [w for w in workers if not _gone(w)]
        assert alive == [], f"workers left running: {alive}"
        assert "Traceback" not in err and err.strip().splitlines()[-1] in ("kvpipe: terminated", "kvpipe: interrupted")
    finally:  # a failed check must not leave a ~30 min --exact sweep loading the machine for the tests after it
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for w in workers:
            if not _gone(w):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w, signal.SIGKILL)
