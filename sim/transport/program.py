"""What the scheduler asks of the real work behind the splits: the ``Program`` protocol and its bindings.

A program is optional (the timing simulation has none): the functional
simulation and the GPU give the scheduler one (``sim.program.decode.DecodeProgram``),
and the scheduler hands it, per split, the *bindings* its kernels read and
write -- names mapped to ``(buffer, byte offset, bytes)``. It never looks at
the values. Units: bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from backends.base import Backend, Buffer
from sim.bindings import Binding
from sim.graph import DecodeGraph, Split


class Program(Protocol):
    """Real work behind the splits (functional simulation, GPU). Optional.

    ``bindings`` map names to ``(buffer, offset, nbytes)``: ``window:<input>``
    for each staged input as the kernel will read it, ``small:<input>`` for
    ordered inputs, ``host_cache`` and ``io`` buffers.
    """

    def setup(self, backend: Backend, host_cache: Buffer) -> None: ...

    def gpu_run(self, split: Split, bindings: dict[str, Binding]) -> Callable[[Any], None] | None: ...

    def cpu_run(self, split: Split, bindings: dict[str, Binding]) -> Callable[[Any], None] | None: ...

    def graph_inputs(self, graph: DecodeGraph) -> dict[str, Any]:
        """Bytes (uint8 arrays) of named small inputs, written into the host io buffer before their copy."""
        ...

    def host_update_run(self, graph: DecodeGraph) -> Callable[[Any], None] | None: ...
