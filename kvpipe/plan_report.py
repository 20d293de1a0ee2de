"""The gain analysis as text (``kvpipe plan``'s table): one line per context -- its best depth, the gain it buys
uncapped and at the default budget, the budget that keeps it, where the default declines, copy and compute -- then
the peak lines (closed form, simulated, best of the contexts asked) and the note between them. Does not block."""

from __future__ import annotations

from typing import Any


def render(plans: list[Any]) -> str:
    """The plan as a fixed-width table, the peak lines and the note. Does not block."""
    frac = plans[0].budget_for_gain
    head = ["context", "window", "best depth", "uncapped gain", "budget MiB (full gain)", f"gain @{plans[0].default_budget_mib:g} MiB",
            "default declines past", "gain %/MiB", "copy ms", "compute ms"]
    if frac is not None:
        head += [f"budget MiB ({frac:.0%} of gain)", "at depth"]
    budgets = list(plans[0].best_by_budget)
    head += [f"@{b:g} MiB: depth gain" if b else "no cap: depth gain" for b in budgets]
    lines = [head]
    for p in plans:
        line = [f"{p.context:,}", f"{p.window_rows:,}", str(p.best_depth), f"{p.uncapped_gain:+.1%}",
                f"{p.budget_mib_for_full_gain:g}" if p.best_depth else "-",
                f"{p.gain_at_default_budget:+.1%}" + (" (declined)" if p.default_declines else ""),
                f"{p.default_decline_rows:,} rows" if p.default_decline_rows else "never",
                f"{p.gain_per_mib * 100:.3f}" if p.gain_per_mib else "-", f"{p.copy_ms:.2f}", f"{p.compute_ms:.2f}"]
        if frac is not None:
            line += [f"{p.budget_mib_for_gain:g}" if p.budget_mib_for_gain is not None else "-",
                     str(p.depth_for_gain) if p.depth_for_gain is not None else "-"]
        line += [f"{p.best_by_budget[b][0]} {p.best_by_budget[b][1]:+.1%}" for b in budgets]
        lines.append(line)
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    text = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    p = plans[0]
    cf_ring = p.peak_ring_mib_closed_form
    pad = " " * len(f"peak (depth {p.peak_depth}, {p.peak_slots} slots): ")
    text += [
        "",
        f"peak (depth {p.peak_depth}, {p.peak_slots} slots): closed form rows* = compute x BW / (n_attn x b) = "
        f"{p.extra['peak_compute_ms_closed_form']:.2f} ms x {p.extra['peak_bw_gbps_closed_form']:.2f} GB/s / (n_attn x b) = "
        f"{p.peak_rows_closed_form:,.0f} rows, ring (n_slots / n_attn) x compute x BW = {cf_ring:.1f} MiB",
        f"{pad}simulated: {p.peak_rows_simulated:,} rows (context {p.peak_context_simulated:,}), "
        f"gain {p.peak_gain_simulated:+.1%}, ring {p.peak_ring_mib_simulated:.1f} MiB",
        f"{pad}best of the contexts asked: {_asked_line(plans)}",
        "",
        "note: " + p.peak_note,
    ]
    return "\n".join(text)


def _asked_line(plans: list[Any]) -> str:
    d = plans[0].peak_depth
    best = max(plans, key=lambda p: p.gain_by_depth.get(d, 0.0))
    return (f"context {best.context:,} (window {best.window_rows:,} rows), gain {best.gain_by_depth.get(d, 0.0):+.1%}, "
            f"ring {best.ring_mib_by_depth.get(d, 0.0):.1f} MiB")
