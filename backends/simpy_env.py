"""The SimPy environment the machine runs on: SimPy's own, with a wait that needs no event advanced in place.

A process that waits a fixed time (a host call's issue cost, a kernel on its stream) yields a ``Timeout``: SimPy
pushes it on the event queue, pops it when it is the earliest, sets the clock to its time and resumes the process
through every generator layer between it and the ``yield``. When nothing else is queued before that time, and the
event being processed resumes no one else, that round trip changes nothing but the clock: no other event can be
processed in between, and the process would be the next to run. :meth:`FastEnvironment.advance` then moves the
clock to the same time (``now + seconds``, the same float SimPy would compute) and lets the process go on without
yielding. An event queued at that very time, or earlier, keeps the ``Timeout`` (SimPy processes ties in the order
they were queued, which a later timeout would follow), so every event is processed at the time and in the relative
order SimPy gives it, and every figure is the same bit for bit.

:meth:`FastEnvironment.run_until` is ``Environment.run(until=event)`` with SimPy's ``step`` inlined; it knows
whether the event being processed has one callback (``alone``), which ``advance`` requires: an event with two
waiters resumes the second at the old time, after the first. ``advanced`` counts the waits taken in place (each
one a ``Timeout`` SimPy would have processed).

Units: seconds.
"""

from __future__ import annotations

from heapq import heappop
from typing import Any

import simpy
from simpy.core import BoundClass, EmptySchedule, StopSimulation


class FastEnvironment(simpy.Environment):
    """A ``simpy.Environment`` whose processes may advance the clock in place (:meth:`advance`)."""

    def __init__(self) -> None:
        super().__init__()
        # SimPy binds its event constructors to the instance for its own class only; without this a subclass pays
        # a descriptor call (a new bound method) on every env.timeout, which a plain Environment does not.
        for name, attr in vars(simpy.Environment).items():
            if type(attr) is BoundClass:
                setattr(self, name, getattr(self, name))
        self.alone = False  # the event being processed by run_until has one callback
        self.advanced = 0  # waits taken in place by advance

    def advance(self, seconds: float) -> bool:
        """Move the clock ``seconds`` on in place, for the process now running, where a ``Timeout(seconds)`` would be
        the next event processed and would resume only it: True if done (the process goes on at once); False where
        it must yield the timeout. Only inside :meth:`run_until`. Does not block."""
        if not self.alone:
            return False
        t = self._now + seconds
        queue = self._queue
        if queue and queue[0][0] <= t:
            return False
        self._now = t
        self.advanced += 1
        return True

    def run_until(self, until: simpy.Event) -> Any:
        """``run(until=until)``: process events until ``until`` has been; returns its value. Raises what
        ``Environment.run`` raises (a failed event's exception; RuntimeError if the queue empties first)."""
        if until.callbacks is None:
            return until.value
        until.callbacks.append(StopSimulation.callback)
        queue = self._queue
        try:
            while True:
                try:
                    self._now, _, _, event = heappop(queue)
                except IndexError:
                    raise EmptySchedule from None
                callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
                if len(callbacks) == 1:
                    self.alone = True
                    try:
                        callbacks[0](event)
                    finally:
                        self.alone = False
                else:
                    for callback in callbacks:
                        callback(event)
                if not event._ok and not hasattr(event, "_defused"):
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    raise exc
        except StopSimulation as exc:
            return exc.args[0]
        except EmptySchedule:
            raise RuntimeError(f'No scheduled events left but "until" event was not triggered: {until}') from None
