"""The one exception type library code raises for bad input a user gave.

:class:`InputError` is a ``ValueError`` whose message is one line naming the
bad value and what is allowed, in the user's units. The command line
(``kvpipe.cli``) prints it and exits 2; a library caller catches it like any
``ValueError``. A bug raises anything else and keeps its traceback. It lives
on the lowest floor so that every reader of a user's file, the machines'
profiles included, raises it; ``sim.errors`` re-exports it.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user (a flag, a file, a value): one line, exit code 2 at the command line."""
