"""The exceptions of the lowest floor: bad input a user gave, and a machine refusing an operation.

:class:`InputError` is a ``ValueError`` whose message is one line naming the
bad value and what is allowed, in the user's units. The command line
(``kvpipe.cli``) prints it and exits 2; a library caller catches it like any
``ValueError``. A bug raises anything else and keeps its traceback. It lives
on the lowest floor so that every reader of a user's file, the machines'
profiles included, raises it; ``sim.errors`` re-exports it.

:class:`BackendError` (and its two kinds) is a machine refusing an operation: bad arguments, no room, no device.
``backends.base`` re-exports them beside the Protocol they belong to.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user (a flag, a file, a value): one line, exit code 2 at the command line."""


class BackendError(RuntimeError):
    """A backend refused an operation (bad arguments, no device, ...)."""


class OutOfDeviceMemory(BackendError):
    """A device allocation did not fit the device's free memory."""


class BackendUnavailable(BackendError):
    """The backend cannot run here (no CUDA device, CuPy missing, ...)."""
