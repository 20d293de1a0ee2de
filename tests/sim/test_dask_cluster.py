"""kvpipe sweep on a real dask.distributed LocalCluster: two worker processes, and one of them killed mid-sweep."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvpipe.cli import main

GRID = ["--context", "1024..12288/1024", "--depth", "0,1", "--budget", "0,128", "--tokens", "2", "--quiet"]


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = json.loads((path / "rows.json").read_text())
    return sorted(rows, key=lambda r: (r["context"], r["depth"], r["budget_mib"]))


def _cluster(distributed: Any) -> Any:
    return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol="tcp",
                                    dashboard_address=None, silence_logs=50)


def test_two_worker_processes_give_the_rows_of_one_local_process(tmp_path: Path) -> None:
    distributed = pytest.importorskip("dask.distributed", reason="the 'cluster' extra is part of dev: CI installs it")
    with _cluster(distributed) as cluster:
        assert main(["sweep", *GRID, "--dask", cluster.scheduler_address, "--out", str(tmp_path / "dask")]) == 0
        with distributed.Client(cluster.scheduler_address) as client:
            pids = set(client.run(os.getpid).values())
    assert main(["sweep", *GRID, "--jobs", "1", "--out", str(tmp_path / "local")]) == 0
    assert _rows(tmp_path / "dask") == _rows(tmp_path / "local")
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes, neither of them this one


def test_a_worker_killed_mid_sweep_costs_nothing_but_time(tmp_path: Path) -> None:
    distributed = pytest.importorskip("dask.distributed", reason="the 'cluster' extra is part of dev: CI installs it")
    codes: list[int] = []
    with _cluster(distributed) as cluster:
        sweep = threading.Thread(target=lambda: codes.append(
            main(["sweep", *GRID, "--dask", cluster.scheduler_address, "--out", str(tmp_path / "dask")])))
        with distributed.Client(cluster.scheduler_address) as client:
            sweep.start()
            deadline = time.monotonic() + 60
            while not client.processing() or not any(client.processing().values()):  # wait until work is running
                assert time.monotonic() < deadline, "the sweep never started on the cluster"
                time.sleep(0.05)
            victim = next(addr for addr, tasks in client.processing().items() if tasks)
            pid = client.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)  # the nanny restarts it; the scheduler reruns what it held
            sweep.join(timeout=300)
    assert codes == [0]
    assert main(["sweep", *GRID, "--jobs", "1", "--out", str(tmp_path / "local")]) == 0
    assert _rows(tmp_path / "dask") == _rows(tmp_path / "local")
