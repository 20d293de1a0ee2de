"""The memory plan as text: one line per context (how it runs, t/s, the memory split), the largest contexts, the
sample check, and the llama.cpp flags of each context followed by the build that has them (``kvpipe.capacity``)."""

from __future__ import annotations

from kvpipe.capacity import Choice, FitPlan, flags
from sim.evaluator.check import ARM_N
from sim.memory import GIB


def _how(c: Choice, n_layers: int) -> str:
    ngl = f"-ngl {c.n_gpu_layers}, " if c.n_gpu_layers <= n_layers else ""
    if c.resident:
        return ngl + "cache on the device"
    how = ngl + f"host cache, depth {c.depth}" + (f", {c.budget_mib:g} MiB" if c.depth else "")
    return how + (" (ring declined)" if c.declined else "") + (f", {c.kv_gpu_layers} KV layers on GPU" if c.kv_gpu_layers else "")


def render_fit(fp: FitPlan, cache_type: str, head: str | None = None) -> str:
    """The plan under the memory cap as text: the table per context, the largest contexts, the flags and their build,
    the sample check (``head``: :func:`render_fit_head` of ``fp``, made already)."""
    head = render_fit_head(fp, cache_type) if head is None else head
    return "\n".join(part for part in (head, render_fit_tail(fp)) if part)


def render_fit_head(fp: FitPlan, cache_type: str) -> str:
    """:func:`render_fit` but its last lines (:func:`render_fit_tail`): what the plan says before its check is done."""
    lim = fp.limits
    lines = [f"{fp.model} ({cache_type} KV) on {fp.hardware}: {lim.vram_bytes / GIB:.2f} GiB from {lim.vram_from}; "
             f"host {lim.host_bytes / GIB:.1f} GiB from {lim.host_from}"]
    if fp.verdict:
        lines.append(fp.verdict)
    rows = [["context", "t/s", "+-", "how", "weights", "buffer~", "KV dev", "ring", "free GiB"]]
    for f in fp.fits:
        c = f.best
        if c is None:
            rows.append([f"{f.context:,}", "-", "", "does not fit", "", "", "", "", ""])
            continue
        g = c.memory.as_gib()
        band = f"{(c.interval[1] - c.interval[0]) / 2:.2f}" if c.interval else "uncal."
        rows.append([f"{f.context:,}", f"{c.tokens_per_s:.2f}", band, _how(c, fp.n_layers), f"{g['weights']:.2f}",
                     f"{g['compute_buffer']:.2f}", f"{g['kv']:.2f}", f"{g['ring']:.2f}", f"{g['free']:.2f}"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for k, r in enumerate(rows):
        lines.append("  ".join(v.ljust(w) if i == 3 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    for f in fp.fits:
        if f.best is None:
            lines.append(f"{f.context:,}: {f.reason}")
    at = f" at {fp.ngl} GPU layers" if fp.ngl < fp.n_layers else ""
    lines.append(f"largest context that fits{at}: {fp.largest_host_context:,} with the host cache, "
                 f"{fp.largest_resident_context:,} with the cache on the device")
    if fp.min_tps is not None:
        at = f"{fp.largest_at_min_tps:,}" if fp.largest_at_min_tps else "none"
        lines.append(f"largest context at >= {fp.min_tps:g} t/s: {at}")
    lines.append("flags (llama-cli / llama-server / llama-bench; the build each line needs):")
    for f in fp.fits:
        if f.best is not None:
            fl, build = flags(f.best, f.context, cache_type, cache_type)
            lines.append(f"  {f.context:>7,}  {fl}")
            lines.append(f"  {'':>7}  # {build}")
    lines.append("buffer~: llama.cpp's compute buffer, estimated (sim.memory); KV dev: KV cache on the device")
    return "\n".join(lines)


def render_fit_tail(fp: FitPlan) -> str:
    """:func:`render_fit`'s last lines: the sample check, and how CPU layers were priced ("" if neither applies)."""
    lines = []
    if fp.check[0] and not fp.check_n:
        lines.append(f"sample check: off (--check 0); {fp.check[0]:,} points from the evaluator, none re-simulated")
    elif fp.check[0]:
        lines.append(f"sample check: {fp.check[0]:,} points from the evaluator, {fp.checked:,} re-simulated on the simulator's "
                     f"default path ({fp.check_n} drawn, at least {min(fp.check_n, ARM_N)} of each arm, and every change of "
                     f"best depth or decline; {fp.checked_exact:,} again exact), largest disagreement {fp.check[1]:.2g} "
                     f"(relative; times relative to the token's; tolerance 1e-9)")
    if any(f.best is not None and f.best.cpu_layers_cost == "estimate" for f in fp.fits):
        lines.append("CPU layers (-ngl) priced at an estimated host rate: the profile has none (calibrate from llama-bench "
                     "runs at several -ngl)")
    return "\n".join(lines)
