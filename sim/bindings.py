"""The names a split's kernels find their bytes by: one type, built here only.

The transport binds every buffer range a split reads or writes to a name (:data:`BindingKey`), and the decode program
looks the ranges up by the same names; both sides build them with the functions below, so neither spells a prefix
or a separator of its own. A binding is ``(buffer, byte offset, bytes)``. The staged inputs' own names (the K and V
windows of attention layer ``a``: :func:`cache_input`) are the graph's (``sim.graph``), built here too. Pure.
"""

from __future__ import annotations

from typing import Any, NewType

#: (``backends.base.Buffer``, byte offset, bytes): a range of a buffer that a split reads or writes.
Binding = tuple[Any, int, int]
#: A binding's name. Built only by the functions of this module.
BindingKey = NewType("BindingKey", str)

#: The step's small-input staging buffer on the device (every split's activations and graph inputs).
IO = BindingKey("io")
#: The whole KV cache on the device (the resident arm).
RESIDENT_CACHE = BindingKey("resident:cache")


def cache_input(kv: str, layer: int, suffix: str = "") -> str:
    """The staged input name of attention layer ``layer``'s ``kv`` ("k" or "v") window (``suffix``: the graph's own
    device suffix, if any)."""
    return f"cache_{kv}_l{layer}{suffix}"


def window(input_name: str, part: int | None = None) -> BindingKey:
    """Where the kernels read staged input ``input_name``'s window (``part``: one sequence stream's part of it)."""
    return BindingKey(f"window:{input_name}" if part is None else f"window:{input_name}#{part}")


def cache_rows(input_name: str, stream: int | None = None) -> BindingKey:
    """Where a CPU split writes the new rows of ``input_name`` into the host cache (``stream``: one stream's rows)."""
    return BindingKey(f"cache:{input_name}" if stream is None else f"cache:{input_name}#{stream}")


def small(input_name: str) -> BindingKey:
    """Where a split finds its small ordered input ``input_name`` on the device."""
    return BindingKey(f"small:{input_name}")


def fresh(input_name: str) -> BindingKey:
    """Where the fresh-rows schedule has a split write ``input_name``'s new rows straight into the staged slot."""
    return BindingKey(f"fresh:{input_name}")


def host_input(input_name: str) -> BindingKey:
    """Where a CPU split reads a graph input ``input_name`` staged through the host (its own name)."""
    return BindingKey(input_name)
