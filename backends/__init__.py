"""Machines the scheduler can run on, imported lazily by name.

``get_backend("simpy", profile=...)`` builds the SimPy machine;
``get_backend("cupy")`` builds the CUDA machine and is the only path that
imports CuPy, so ``import sim`` and ``kvpipe simulate`` work without it.
"""

from __future__ import annotations

import importlib
from typing import Any

BACKENDS = {"simpy": ("backends.simpy_machine", "SimMachine"), "cupy": ("backends.cupy_gpu", "CupyGPU")}


def get_backend(name: str, **kwargs: Any) -> Any:
    """Construct backend ``name`` with ``kwargs``. Raises ValueError for an unknown name, BackendUnavailable where it cannot run."""
    try:
        module, cls = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; allowed: {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module), cls)(**kwargs)
