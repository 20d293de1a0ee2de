"""Numbers for what the point planner's and the evaluator's caches are keyed by: equal values, equal numbers.

A workload, a machine or a device is a frozen dataclass whose hash walks every field at every call (a few us each);
the caches of a line's shapes, numbers and envelope verdict would hash the same objects again and again. Here each
value gets a number once (:func:`interned`), each object its number once (:func:`number`, kept per object), and the
keys the caches use -- a workload at any context (:func:`context_free`), a machine's compute models, a config but its
depth and budget -- are numbers kept per object too (:func:`free_number`, :func:`compute_number`, :func:`config_class`).
Pure but for the tables kept.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from typing import Any, get_type_hints

from sim.transport.config import TransportConfig
from sim.workload import Workload


@functools.lru_cache(maxsize=1 << 14)
def context_free(wl: Workload, cells: bool) -> Any:
    """What a one-sequence workload's graph at a given window depends on, whatever its context: the workload at a
    context of 1, one token, and (``cells``) a cache of its own size. The graphs of two such workloads with equal keys
    differ only in the row each step writes (its window's stable prefix): the point planner's shapes and the
    evaluator's numbers of a window are kept under this key (several sequences: the workload itself). Pure."""
    if wl.n_parallel != 1:
        return wl
    return replace(wl, context=(1,), tokens=1, ctx_size=wl.cells if cells else 0)


def interned(key: Any) -> int:
    """A number for ``key`` (equal keys, equal numbers; a number is never given to another key, even after the table
    is emptied): what a cache keyed by it hashes instead of a workload, once per line rather than once per token."""
    got = _INTERNED.get(key)
    if got is None:
        if len(_INTERNED) > 1 << 16:
            _INTERNED.clear()
            _DERIVED.clear()  # the objects' numbers with it: after a clear, equal values still get one number
        got = _INTERNED[key] = next(_NUMBERS)
    return got


_INTERNED: dict[Any, int] = {}
_NUMBERS = itertools.count()


def derived(obj: Any, tag: str, make: Callable[[Any], Any]) -> int:
    """:func:`interned` of ``make(obj)``, kept per object (its id; the entry keeps it alive, so the id is not reused)
    and ``tag`` (what ``make`` derives): ``obj`` and ``make(obj)`` hashed once, not at every cache keyed by them."""
    key = (id(obj), tag)
    got = _DERIVED.get(key)
    if got is None or got[0] is not obj:
        if len(_DERIVED) > 1 << 16:
            _DERIVED.clear()
        got = _DERIVED[key] = (obj, interned(make(obj)))
    return got[1]


def number(obj: Any) -> int:
    """:func:`interned` of ``obj`` itself, kept per object."""
    return derived(obj, "", _same)


def free_number(wl: Workload, cells: bool) -> int:
    """A number for :func:`context_free` of ``wl`` (equal numbers iff equal), kept per workload object: read off the
    workload's fields but context, tokens and the cache's size (their objects as numbers) and the size
    :func:`context_free` gives the cache, without making the context-free workload."""
    return derived(wl, "free+cells" if cells else "free", _FREE_KEY[cells])


def _free_key(wl: Workload, cells: bool) -> tuple[Any, ...]:
    """What :func:`context_free` of ``wl`` is equal by: a workload of several sequences is its own; else every field but
    those it sets (``Workload.__post_init__`` only validates: no field is derived from another), and the size it sets."""
    if wl.n_parallel != 1:
        return ("self", number(wl))
    return ("free", wl.cells if cells else 0, *map(number, _objects_of(wl)), *_values_of(wl))


def compute_number(hw: Any) -> int:
    """:func:`interned` of a machine's devices' compute models, kept per machine object."""
    return derived(hw, "compute", _compute)


def clear_numbers() -> None:
    """Forget the numbers kept per object (a timing that must build them)."""
    _DERIVED.clear()


def _same(obj: Any) -> Any:
    return obj


def _compute(hw: Any) -> tuple[Any, ...]:
    return tuple(d.compute for d in hw.devices)


_FREE_KEY = {c: functools.partial(_free_key, cells=c) for c in (False, True)}
_REST = [f.name for f in fields(Workload) if f.name not in ("context", "tokens", "ctx_size")]
_HINTS = get_type_hints(Workload)
#: The fields left in a context-free key, split by their declared type: a dataclass (model, cache types) as its
#: :func:`number`, any other value as itself. Either way equal values give equal entries and different ones different
#: entries (a number is its value's alone), whatever a field holds at run time: the key is exact by position.
_OBJECT_FIELDS = [f for f in _REST if isinstance(_HINTS[f], type) and is_dataclass(_HINTS[f])]
_values_of = operator.attrgetter(*(f for f in _REST if f not in _OBJECT_FIELDS))
_objects_of = (operator.attrgetter(*_OBJECT_FIELDS) if len(_OBJECT_FIELDS) > 1  # a tuple (one name: its value alone)
               else lambda wl: tuple(getattr(wl, f) for f in _OBJECT_FIELDS))
_DERIVED: dict[tuple[int, str], tuple[Any, int]] = {}


#: A config's fields but depth and budget, as a tuple.
_rest = operator.attrgetter(*(f.name for f in fields(TransportConfig) if f.name not in ("depth", "budget_mib")))


def config_but_depth_budget(cfg: TransportConfig) -> tuple[Any, ...]:
    """``cfg``'s fields but depth and budget (what a line of ``sim.replay`` shares), kept per config object."""
    return _kept_rest(cfg)[1]


def config_class(cfg: TransportConfig) -> int:
    """A number for ``cfg``'s fields but depth and budget: equal numbers, equal :func:`config_but_depth_budget` (a key
    that hashes as one int where millions of points are told apart). Kept per config object."""
    return _kept_rest(cfg)[2]


def _kept_rest(cfg: TransportConfig) -> tuple[TransportConfig, tuple[Any, ...], int]:
    got = _RESTS.get(id(cfg))
    if got is None or got[0] is not cfg:
        if len(_RESTS) > 4096:
            _RESTS.clear()
        rest = _rest(cfg)
        got = _RESTS[id(cfg)] = (cfg, rest, _CLASSES.setdefault(rest, len(_CLASSES)))
    return got


_RESTS: dict[int, tuple[TransportConfig, tuple[Any, ...], int]] = {}
_CLASSES: dict[tuple[Any, ...], int] = {}  # never cleared (the numbers must stay): one entry per distinct config but depth/budget
