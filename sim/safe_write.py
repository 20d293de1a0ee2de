"""Writing an output without damaging what is at its path.

Every file kvpipe writes (rows, journals, traces, plots, profiles, reports)
goes through :func:`write_output` (one file) or :func:`write_outputs` (several
that stand or fall together):

* ``-`` is standard output;
* a symlink is followed: its target is what gets written;
* a regular file (or a new one) is replaced atomically: the bytes go to a
  temporary file in the same folder, which then takes the old file's mode (a
  new file: 0666 less the umask) and is renamed over the path -- a reader never
  sees half a file, and a failed write leaves the old one;
* anything else that exists -- a device, a FIFO, a socket -- is written
  *into*, never replaced;
* a folder is refused.

Before anything is written, :func:`distinct_outputs` refuses two outputs that
are one file, and :func:`check_output` refuses a path that is an
input of the same run (``backends.files.input_named``: the same resolved path
or the same inode -- ``calibrate --from-llama-bench in.json --out in.json``
would replace the measurements it reads) and an existing file the user could
not have written (the rename would replace it all the same, since only the
folder's permission counts for a rename; as root, whom ``os.access`` always
allows, a file with no write bit for anyone). :func:`write_outputs` writes
every file to its temporary first and renames them only once all are written,
so a failure leaves none of them (and removes the temporaries).

Every failure a user can cause (a folder, a read-only place, a path under a
file, a full device, an input) is one :class:`sim.errors.InputError` line naming
the path and the reason. Blocks on the write.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from backends.files import input_named, shown
from sim.errors import InputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fail(path: str | Path, exc: OSError) -> InputError:
    return InputError(f"cannot write {shown(path)}: {exc.strerror or exc}")


def _stat(path: str | Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise InputError(f"cannot write {shown(path)}: a folder on its path is a file") from None
    except OSError as exc:
        raise _fail(path, exc) from None


def check_output(path: str | Path) -> None:
    """Refuse (InputError) an output path that is an input of this run, a folder, or an existing file the user could
    not write. Writes nothing; ``write_output`` calls it too. Does not block beyond a stat."""
    if str(path) == "-":
        return
    same = input_named(path)
    if same is not None:
        also = "" if same == str(path) else f" (the same file as {shown(same)})"
        raise InputError(f"cannot write {shown(path)}: it is an input of this command{also}; allowed: an output path "
                         "that no input of the run names")
    st = _stat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"cannot write {shown(path)}: it is a folder; give a file path")
    if stat.S_ISREG(st.st_mode):
        no_bits = os.geteuid() == 0 and not st.st_mode & 0o222
        if no_bits or not os.access(path, os.W_OK):
            raise InputError(f"cannot write {shown(path)}: the file is read-only for you (mode "
                             f"{stat.filemode(st.st_mode)}, owner uid {st.st_uid}); allowed: a file you may write, or a new path")


def check_folder(path: str | Path) -> None:
    """Refuse (InputError) an output folder that cannot be made or written: a file, a path under a file, a read-only
    place, ``/proc``. Probes with a temporary file in the folder, or in its nearest existing parent if it does not
    exist yet, and leaves nothing behind (the folder is not made). Blocks on the probe."""
    where = Path(os.path.realpath(path))
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        what = "it is a file" if probe == where else f"{shown(probe)} on its path is a file"
        raise InputError(f"cannot write the folder {shown(path)}: {what}; allowed: a folder, or a new path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvpipe-probe.", dir=probe)
    except OSError as exc:
        raise InputError(f"cannot write the folder {shown(path)}: {exc.strerror or exc}") from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)


def distinct_outputs(paths: Sequence[str | Path], names: Sequence[str] = ()) -> None:
    """Refuse (InputError) two outputs of one run that are the same file (the last would silently replace the
    first); ``names`` says which flag or table each path came from. Does not block beyond stats."""
    seen: dict[str, int] = {}
    for i, path in enumerate(paths):
        if str(path) == "-":
            continue
        real = os.path.realpath(path)
        if real in seen:
            j = seen[real]
            a, b = (f"{names[j]} {shown(paths[j])}", f"{names[i]} {shown(path)}") if names else (shown(paths[j]), shown(path))
            raise InputError(f"{a} and {b} are the same file; allowed: a different path for each output")
        seen[real] = i


def write_output(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` (text is UTF-8) to ``path`` as the module text says. Raises InputError. Blocks on the write."""
    write_outputs([(path, data)])


def write_outputs(files: Sequence[tuple[str | Path, bytes | str]]) -> None:
    """Write several outputs all or nothing: each regular file to a temporary beside it, then every rename. A
    failure before the renames removes every temporary and leaves every path as it was. Raises InputError."""
    distinct_outputs([path for path, _ in files])
    for path, _ in files:
        check_output(path)
    staged: list[tuple[str, Path]] = []  # (temporary, final path)
    into: list[tuple[str | Path, Path, bytes]] = []  # devices, FIFOs: written into at the end
    try:
        for path, data in files:
            raw = data.encode() if isinstance(data, str) else data
            if str(path) == "-":
                into.append((path, Path("-"), raw))
                continue
            real = Path(os.path.realpath(path))
            st = _stat(real)
            if st is not None and not stat.S_ISREG(st.st_mode):
                into.append((path, real, raw))
                continue
            staged.append((_stage(path, real, raw, st), real))
        for tmp, real in staged:
            os.replace(tmp, real)
        staged = []
    except OSError as exc:
        raise _fail(files[0][0] if len(files) == 1 else ", ".join(str(p) for p, _ in files), exc) from None
    finally:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
    for path, real, raw in into:
        _write_into(path, real, raw)


def _stage(path: str | Path, real: Path, raw: bytes, st: os.stat_result | None) -> str:
    """``raw`` in a temporary file beside ``real``, with the mode the final file gets; its name. Raises InputError."""
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", dir=real.parent)
    except OSError as exc:
        raise _fail(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _fail(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _write_into(path: str | Path, real: Path, raw: bytes) -> None:
    if str(path) == "-":
        sys.stdout.buffer.write(raw)
        sys.stdout.buffer.flush()
        return
    try:
        with open(real, "wb") as f:
            f.write(raw)
    except OSError as exc:
        raise _fail(path, exc) from None
