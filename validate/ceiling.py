"""The ceiling a transport arm is held to, measured on its own, and the regime a point sits in.

Two reference arms run beside every group's transport arms (``validate.driver``):

* ``resident``: the same windows already in device memory, no transport --
  compute alone, and what a user compares ``-nkvo`` against;
* ``copy-only``: the same deliveries (the deepest depth of the group) with no
  kernels and no CPU splits -- the transport alone, idle gaps included.

ceiling t/s = sequences / max(t_resident, t_copy_only), with each t the median
over the repetitions of an arm's mean token seconds. A transport arm cannot
beat both of its parts at once, so a share of the ceiling over 100% is a
measurement defect (the report flags it and leaves it out of every result).

The regime comes from the same two arms: copy/compute = t_copy_only /
t_resident under ``COMPUTE_BOUND`` is compute-bound, over ``COPY_BOUND``
copy-bound, between them copy ≈ compute; a point whose resident token is at
least ``HOST_BOUND_SHARE`` host time (the host's launch spans per token) is
host-bound whatever its ratio. Units: seconds and bytes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from backends.base import Span
from validate.gpu_run import GroupResult, Run

COMPUTE_BOUND, COPY_BOUND, HOST_BOUND_SHARE = 0.5, 2.0, 0.8
REGIMES = ("host-bound", "compute-bound", "copy ≈ compute", "copy-bound")


@dataclass(frozen=True)
class Reference:
    """Per-token seconds of the two reference arms (0: not run) and the host's share of the resident token."""

    resident_s: float
    copy_only_s: float
    host_share: float = 0.0

    @property
    def ceiling_s(self) -> float:
        return max(self.resident_s, self.copy_only_s)

    @property
    def copy_over_compute(self) -> float:
        return self.copy_only_s / self.resident_s if self.resident_s > 0 else 0.0

    @property
    def regime(self) -> str:
        if not self.resident_s or not self.copy_only_s:
            return ""
        if self.host_share >= HOST_BOUND_SHARE:
            return "host-bound"
        r = self.copy_over_compute
        return "compute-bound" if r < COMPUTE_BOUND else "copy-bound" if r > COPY_BOUND else "copy ≈ compute"


def median_token_s(runs: Sequence[Run]) -> float:
    """Median over the repetitions of each run's mean seconds per graph (0 for none)."""
    return statistics.median(r.token_s for r in runs) if runs else 0.0


def host_share(runs: Sequence[Run], graphs: int) -> float:
    """Host seconds per graph inside launches and CPU splits (traced run) over the arm's seconds per graph."""
    traced = next((r for r in runs if r.spans), None)
    if traced is None or not graphs:
        return 0.0
    busy = sum(s.end_s - s.start_s for s in traced.spans if s.track == "host" and not s.name.startswith(("sync", "wait")))
    return busy / graphs / median_token_s(runs)


def measured(group: GroupResult) -> Reference:
    """The group's measured reference arms."""
    res = group.reference("resident")
    graphs = group.workload.tokens + group.warmup
    return Reference(median_token_s(res), median_token_s(group.reference("copy-only")), host_share(res, graphs))


def delivery_rate(spans: Sequence[Span]) -> tuple[float, float]:
    """(bytes per second, bytes) of the early deliveries on the H2D engine track, idle gaps included.

    The rate is the bytes over the time from the first delivery's start to the
    last one's end, so the host's gaps between deliveries count against it.
    """
    ds = [s for s in spans if s.track.startswith("h2d") and s.name.startswith("delivery")]
    if not ds:
        return 0.0, 0.0
    nbytes = sum(s.args.get("bytes", 0) for s in ds)
    secs = max(s.end_s for s in ds) - min(s.start_s for s in ds)
    return (nbytes / secs if secs > 0 else 0.0), float(nbytes)
