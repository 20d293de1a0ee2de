"""The one exception type library code raises for bad input a user gave (defined in ``backends.errors``).

:class:`InputError` is a ``ValueError`` whose message is one line naming the
bad value and what is allowed, in the user's units. The command line
(``kvpipe.cli``) prints it and exits 2; a library caller catches it like any
``ValueError``. A bug raises anything else and keeps its traceback.
"""

from __future__ import annotations

from backends.errors import InputError

__all__ = ["InputError"]
