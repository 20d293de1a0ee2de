"""Outputs never damage what is at their path: devices and FIFOs are written into, symlinks followed, folders refused."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from kvpipe.cli import main as kvpipe
from sim.errors import InputError
from sim.safe_write import write_output


def test_a_new_file_takes_the_umask_and_an_old_one_keeps_its_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_output(tmp_path / "new.json", "{}")
        assert stat.S_IMODE(os.stat(tmp_path / "new.json").st_mode) == 0o644
        (tmp_path / "kept.csv").write_text("x")
        os.chmod(tmp_path / "kept.csv", 0o640)
        write_output(tmp_path / "kept.csv", "y")
        assert stat.S_IMODE(os.stat(tmp_path / "kept.csv").st_mode) == 0o640 and (tmp_path / "kept.csv").read_text() == "y"
    finally:
        os.umask(old)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_a_symlink_is_followed_to_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target.csv"
    target.write_text("old")
    (tmp_path / "link.csv").symlink_to(target)
    write_output(tmp_path / "link.csv", "new")
    assert (tmp_path / "link.csv").is_symlink() and target.read_text() == "new"


def test_a_fifo_is_written_into_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_output(fifo, "a,b\n")
    reader.join(timeout=10)
    assert got == [b"a,b\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_dev_full_stays_a_device_and_the_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvpipe(["simulate", "--context", "4096", "--depth", "0", "--tokens", "1", "--trace", "/dev/full"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/dev/full" in err and "Traceback" not in err
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_folder_a_path_under_a_file_and_a_read_only_folder_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="it is a folder"):
        write_output(tmp_path, "x")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="cannot write .*file/out.json"):
        write_output(tmp_path / "file" / "out.json", "x")
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who may write into a read-only folder (root)")
        with pytest.raises(InputError, match="Permission denied"):
            write_output(ro / "out.json", "x")
    finally:
        os.chmod(ro, 0o755)
