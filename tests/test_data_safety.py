"""Nothing a user gives kvpipe loses their data: issue 29's part A.

* an output that is an input of the same run (same path, a hard link, a symlink) is refused before anything runs;
* a sweep folder is one sweep's at a time (flock), and rows kvpipe did not record there are never rewritten;
* a read-only file is not replaced through the atomic rename;
* a sweep's workers die with their parent, SIGKILL included;
* several files of one command are written all or none; a study that fails names what earlier tables kept.

docs/reliability.md counts these beside the bad-input corpus.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvpipe.cli import main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "validate" / "fixtures" / "reference-ordered.llama-bench.json"
GRID = ["--context", "2048", "--depth", "0,1", "--budget", "0", "--tokens", "1"]


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


# ------------------------------------------------------- outputs onto inputs


@pytest.mark.parametrize("how", ["same", "hardlink", "symlink", "relative"])
def test_calibrate_never_writes_over_the_measurements_it_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "in.json"
    shutil.copy(BENCH, src)
    before = src.read_bytes()
    out = {"same": src, "hardlink": tmp_path / "link.json", "symlink": tmp_path / "sym.json", "relative": Path("./in.json")}[how]
    if how == "hardlink":
        os.link(src, out)
    elif how == "symlink":
        out.symlink_to(src)
    monkeypatch.chdir(tmp_path)
    _refused(capsys, ["calibrate", "--from-llama-bench", str(src), "-m", "qwen3.8-27b", "--out", str(out)],
             "input of this command", "in.json")
    assert src.read_bytes() == before


@pytest.mark.parametrize("flag", ["--csv", "--trace"])
def test_simulate_never_writes_over_its_hardware_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str) -> None:
    profile = tmp_path / "p.json"
    shutil.copy(ROOT / "backends" / "presets" / "h200-gen5x16.json", profile)
    before = profile.read_bytes()
    _refused(capsys, ["simulate", *GRID, "--hardware", str(profile), flag, str(profile)], "p.json", "input")
    assert profile.read_bytes() == before


def test_report_never_writes_over_its_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *GRID, "--json"]) == 0
    rows = tmp_path / "rows.json"
    rows.write_text(capsys.readouterr().out)
    before = rows.read_bytes()
    _refused(capsys, ["report", str(rows), "--out", str(rows)], "input")
    assert main(["sweep", *GRID, "--jobs", "1", "--quiet", "--out", str(tmp_path / "sw")]) == 0
    _refused(capsys, ["report", str(tmp_path / "sw"), "--out", str(tmp_path / "sw" / "rows.json")], "input")
    assert rows.read_bytes() == before


def test_a_study_never_writes_over_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study.toml"
    study.write_text('contexts = [2048]\ndepths = [0]\ntokens = 1\n[simulate]\nout = "study.toml"\n')
    before = study.read_bytes()
    _refused(capsys, ["run", str(study)], "study.toml", "input")
    study.write_text('contexts = [2048]\ndepths = [0]\ntokens = 1\n[simulate]\ncsv = "study.toml"\n')
    _refused(capsys, ["run", str(study)], "study.toml", "input")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.toml"]
    assert b"csv" in study.read_bytes() and before != b""


# ------------------------------------------------------------ sweep folders


def test_a_second_sweep_into_a_held_folder_stops_naming_the_holder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sw"
    out.mkdir()
    fd = os.open(out / ".kvpipe-sweep.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"424242\n")
        _refused(capsys, ["sweep", *GRID, "--jobs", "1", "--quiet", "--out", str(out)], "in use", "424242", "sw")
    finally:
        os.close(fd)
    assert sorted(p.name for p in out.iterdir()) == [".kvpipe-sweep.lock"]
    assert main(["sweep", *GRID, "--jobs", "1", "--quiet", "--out", str(out)]) == 0  # the holder gone: it runs


def test_two_sweeps_at_once_into_one_folder_lose_no_row(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    cmd = [sys.executable, "-m", "kvpipe.cli", "sweep", "--context", "1024..8192/1024", "--depth", "0..2", "--budget", "0,64",
           "--tokens", "2", "--jobs", "1", "--quiet", "--out", str(out)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    errs = [e for _, e in results]
    if codes == [0, 0]:  # the first finished before the second started: the second resumed every point
        assert any("48 already done" in o for o, _ in results), results
    else:
        assert codes == [0, 2], errs
        loser = errs[[p.returncode for p in procs].index(2)]
        assert "in use by another kvpipe sweep (pid" in loser and loser.count("\n") == 1, loser
    rows = json.loads((out / "rows.json").read_text())
    assert len(rows) == 48 and len((out / "rows.jsonl").read_text().splitlines()) == 48


@pytest.mark.parametrize("kind", ["no-manifest", "csv-only", "other-grid"])
def test_a_folder_of_someone_elses_rows_is_not_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    out = tmp_path / "sw"
    if kind == "other-grid":
        assert main(["sweep", "--context", "4096", "--depth", "0", "--tokens", "1", "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    else:
        out.mkdir()
        (out / ("rows.jsonl" if kind == "no-manifest" else "rows.csv")).write_text('{"theirs": 1}\n')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    err = _refused(capsys, ["sweep", *GRID, "--jobs", "1", "--quiet", "--out", str(out)], "sw")
    assert ("another grid" in err) if kind == "other-grid" else ("no sweep.json" in err)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # not even a lock file left in someone else's folder
    if kind == "other-grid":  # --resume adds this grid to it, keeping the old rows
        assert main(["sweep", *GRID, "--jobs", "1", "--quiet", "--out", str(out), "--resume"]) == 0
        assert len(json.loads((out / "rows.json").read_text())) == 3
    else:
        _refused(capsys, ["sweep", *GRID, "--jobs", "1", "--quiet", "--out", str(out), "--resume"], "no sweep.json")


@pytest.mark.parametrize("case", ["manifest-list", "manifest-string", "journal-folder", "deep-rows", "rows-not-dicts"])
def test_a_damaged_sweep_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    out = tmp_path / "sw"
    assert main(["sweep", *GRID, "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    if case == "manifest-list":
        (out / "sweep.json").write_text("[1, 2]")
    elif case == "manifest-string":
        (out / "sweep.json").write_text('"a sweep"')
    elif case == "journal-folder":
        (out / "rows.jsonl").unlink()
        (out / "rows.jsonl").mkdir()
    elif case == "deep-rows":
        (out / "rows.json").write_text("[" * 100_000 + "]" * 100_000)
    else:
        (out / "rows.json").write_text("[1, 2]")
    _refused(capsys, ["sweep", *GRID, "--jobs", "1", "--quiet", "--out", str(out)], "sw")


# --------------------------------------------------------- read-only targets


def test_a_read_only_file_is_not_replaced_through_the_rename(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "theirs.csv"
    target.write_text("their data\n")
    target.chmod(0o444)  # as root os.access allows anything: the mode with no write bit is what refuses it
    _refused(capsys, ["simulate", *GRID, "--csv", str(target)], "theirs.csv", "read-only")
    assert target.read_text() == "their data\n" and oct(target.stat().st_mode & 0o777) == "0o444"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.csv"]


@pytest.mark.parametrize("where", ["under-a-file", "proc", "read-only-folder"])
def test_validate_refuses_an_unwritable_report_folder_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                      where: str) -> None:
    (tmp_path / "file").write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if where == "read-only-folder" and os.access(ro, os.W_OK):
        pytest.skip("root writes into a read-only folder")
    out = {"under-a-file": tmp_path / "file" / "report", "proc": Path("/proc/kvpipe-report"), "read-only-folder": ro / "report"}[where]
    _refused(capsys, ["validate", "--machine", "simpy", "--hardware", "h200-gen5x16", "--model", "llama-3.1-8b", "--context", "2048",
                      "--depth", "0", "--out", str(out)], "report")
    assert not out.exists()


# ------------------------------------------------------------ process death


def _alive(pid: int) -> bool:
    try:
        import psutil

        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except ImportError:
        status = Path(f"/proc/{pid}/status")
        return status.exists() and "zombie" not in status.read_text()
    except Exception:  # it ended while we asked
        return False


def _children(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except ImportError:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]


def test_sigkill_of_a_sweep_leaves_no_worker_running(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "kvpipe.cli", "sweep", "--context", "1024..65536/1024", "--depth", "0..4",
                             "--budget", "0,64", "--jobs", "2", "--quiet", "--out", str(tmp_path / "out")],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    workers: list[int] = []
    while time.time() < deadline and len(workers) < 2:
        workers = _children(proc.pid)
        time.sleep(0.1)
    assert len(workers) >= 2, "the sweep never started its workers"
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)  # no cleanup runs in the parent
    proc.wait(timeout=10)
    deadline = time.time() + 5
    while time.time() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.1)
    left = [w for w in workers if _alive(w)]
    for w in left:  # do not leave them to the next test
        os.kill(w, signal.SIGKILL)
    assert left == [], f"workers left running after SIGKILL of their parent: {left}"


# ------------------------------------------------------------ all or nothing


def test_a_trace_is_not_left_when_the_csv_after_it_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not Path("/proc").is_dir():
        pytest.skip("needs /proc (a folder no file can be made in)")
    trace = tmp_path / "trace.json"
    _refused(capsys, ["simulate", *GRID, "--trace", str(trace), "--csv", "/proc/kvpipe-rows.csv"], "kvpipe-rows.csv")
    assert list(tmp_path.iterdir()) == []


def test_a_plot_writes_every_file_or_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "out-gain-vs-depth.svg").mkdir()  # the second kind's file cannot be written
    assert main(["simulate", *GRID, "--json"]) == 0
    rows = tmp_path / "rows.json"
    rows.write_text(capsys.readouterr().out)
    code = main(["plot", "all", "--rows", str(rows), "--out", str(tmp_path / "out"), "--format", "svg"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out-gain-vs-depth.svg", "rows.json"]


def test_a_study_that_fails_late_names_what_it_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study.toml"
    study.write_text('contexts = [2048]\ndepths = [0, 1]\nbudgets_mib = [0]\ntokens = 1\n'
                     '[simulate]\nout = "rows.json"\nformat = "json"\n'
                     '[sweep]\nout = "sw"\njobs = 1\nquiet = true\n'
                     '[plot]\nkinds = ["gain-vs-depth"]\nrows = "missing.json"\nformat = ["svg"]\n')
    assert main(["run", str(study)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the finished tables' progress lines
    assert err.startswith("kvpipe: error:") and "[plot]" in err and "missing.json" in err, err
    assert "kept from the tables before it" in err and "rows.json" in err and "sw'" in err
    assert not (tmp_path / "out").exists()


def test_two_outputs_of_one_run_are_never_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = tmp_path / "x.json"
    _refused(capsys, ["simulate", *GRID, "--trace", str(same), "--csv", str(tmp_path / "." / "x.json")], "--trace", "--csv",
             "same file")
    study = tmp_path / "study.toml"
    study.write_text('contexts = [2048]\ndepths = [0]\ntokens = 1\n[plan]\nout = "o.txt"\n[simulate]\nout = "o.txt"\n')
    _refused(capsys, ["run", str(study)], "[plan]", "[simulate]", "same file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.toml"]


def test_a_study_reruns_its_sweep_with_another_grid_only_with_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study.toml"
    table = '[sweep]\nout = "sw"\njobs = 1\nquiet = true\n'
    study.write_text('contexts = [2048]\ndepths = [0]\ntokens = 1\n' + table)
    assert main(["run", str(study)]) == 0
    study.write_text('contexts = [2048, 4096]\ndepths = [0]\ntokens = 1\n' + table)
    assert main(["run", str(study)]) == 2
    assert "another grid" in capsys.readouterr().err
    study.write_text('contexts = [2048, 4096]\ndepths = [0]\ntokens = 1\n' + table + "resume = true\n")
    assert main(["run", str(study)]) == 0
    assert len(json.loads((tmp_path / "sw" / "rows.json").read_text())) == 2
