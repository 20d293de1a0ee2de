"""Machines the scheduler can run on, imported lazily by name.

``get_backend("simpy", profile=...)`` builds the SimPy machine;
``get_backend("cupy")`` builds the CUDA machine and is the only path that
imports CuPy, so ``import sim`` and ``kvpipe simulate`` work without it.

The modules: ``base`` (the Protocol the scheduler imports, its plain data,
and the one copy check and 2D rule), ``machine`` (the concrete base class both
machines derive from: ``copy`` and ``alloc`` keep the invariants, a machine
implements ``_copy`` and ``_alloc``), ``simpy_machine`` with ``simpy_copy``
(its copy engines and copy times), ``cupy_gpu``, ``checked`` with ``hazards``
(the race checker, a wrapper around any of them), ``profile_types`` (what a
machine is, as numbers) and ``profile`` (hardware profiles as files, and the
calibrated entry of a workload).
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
