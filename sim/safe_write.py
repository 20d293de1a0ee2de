"""Writing an output without damaging what is at its path.

Every file kvpipe writes (rows, journals, traces, plots, profiles, reports)
goes through :func:`write_output`:

* ``-`` is standard output;
* a symlink is followed: its target is what gets written;
* a regular file (or a new one) is replaced atomically: the bytes go to a
  temporary file in the same folder, which then takes the old file's mode (a
  new file: 0666 less the umask) and is renamed over the path -- a reader never
  sees half a file, and a failed write leaves the old one;
* anything else that exists -- a device, a FIFO, a socket -- is written
  *into*, never replaced;
* a folder is refused.

Every failure a user can cause (a folder, a read-only place, a path under a
file, a full device) is one :class:`sim.errors.InputError` line naming the
path and the reason. Blocks on the write.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from sim.errors import InputError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fail(path: str | Path, exc: OSError) -> InputError:
    return InputError(f"cannot write {str(path)!r}: {exc.strerror or exc}")


def write_output(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` (text is UTF-8) to ``path`` as the module text says. Raises InputError. Blocks on the write."""
    raw = data.encode() if isinstance(data, str) else data
    if str(path) == "-":
        sys.stdout.buffer.write(raw)
        sys.stdout.buffer.flush()
        return
    real = Path(os.path.realpath(path))
    try:
        st: os.stat_result | None = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _fail(path, exc) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError(f"cannot write {str(path)!r}: it is a folder; give a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        try:
            with open(real, "wb") as f:
                f.write(raw)
        except OSError as exc:
            raise _fail(path, exc) from None
        return
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", dir=real.parent)
    except OSError as exc:
        raise _fail(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, real)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _fail(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
