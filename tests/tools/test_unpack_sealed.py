"""tools/llamacpp/unpack_sealed.py: a device call's tarball unpacked, held-out calls' files sealed outside the repository."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "llamacpp"))
import unpack_sealed  # noqa: E402


def _tarball(path: Path, names: list[str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for n in names:
            data = f"content of {n}".encode()
            info = tarfile.TarInfo(f"out-run11-1/{n}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_held_out_calls_go_to_the_seal_the_rest_to_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = ["r11-batched-split-pp512-r1.jsonl", "r11-batched-split-pp576-r1.jsonl", "r11-batched-unified-pp1120-r1.err",
             "r11-batched-unified-pp11200-r1.jsonl", "commands.txt", "machine.txt"]
    tb = _tarball(tmp_path / "run11.tar.gz", names)
    dest, seal = tmp_path / "dest", tmp_path / "seal"
    assert unpack_sealed.main(["--held", "576,1120", "--dest", str(dest), "--seal", str(seal), str(tb)]) == 0
    assert sorted(p.name for p in seal.iterdir()) == ["r11-batched-split-pp576-r1.jsonl", "r11-batched-unified-pp1120-r1.err"]
    assert sorted(p.name for p in dest.iterdir()) == ["commands.txt", "machine.txt", "r11-batched-split-pp512-r1.jsonl",
                                                      "r11-batched-unified-pp11200-r1.jsonl"]  # 11200 is not 1120
    assert (seal / "r11-batched-split-pp576-r1.jsonl").read_text() == "content of r11-batched-split-pp576-r1.jsonl"
    assert "4 files to" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["held", "tarball", "seal-inside"])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    tb = _tarball(tmp_path / "run11.tar.gz", ["commands.txt"])
    seal = tmp_path / "seal"
    argv = {"held": ["--held", "576,x"], "tarball": ["--held", "576"], "seal-inside": ["--held", "576"]}[case]
    if case == "tarball":
        tb = tmp_path / "not.tar.gz"
        tb.write_text("no")
    if case == "seal-inside":
        seal = unpack_sealed.ROOT / "validate" / "sealed-test"
    assert unpack_sealed.main([*argv, "--dest", str(tmp_path / "d"), "--seal", str(seal), str(tb)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("unpack_sealed: ") and "allowed" in err
    assert not (unpack_sealed.ROOT / "validate" / "sealed-test").exists()
