"""``validate.batch_fit``: the per-sequence term from whole steps, each point with its own constant; the reference's term."""

from __future__ import annotations

import pytest

from backends.profile import read_profile_dict
from sim.errors import InputError
from sim.workload import cache_type, load_model
from tests.conftest import tool
from validate.batch_fit import TERMS, fit_per_sequence, with_staging, with_term
from validate.token_fit import TokenRun, simulated_s, workload_at

M, Q = load_model("qwen3.8-27b"), cache_type("q8_0")


def _rows(profile: dict, offsets: dict[tuple[int, bool], float], counts: tuple[int, ...] = (1, 2, 4, 8)) -> list[TokenRun]:  # type: ignore[type-arg]
    """Steps ``profile`` simulates at each (context, unified) point and sequence count, plus that point's constant."""
    return [TokenRun(ctx, simulated_s(profile, workload_at(M, Q, Q, ctx, sequences=b, unified=uni), "ordered") + off, "ordered",
                     f"{ctx} {uni} x{b}", sequences=b, unified=uni)
            for (ctx, uni), off in offsets.items() for b in counts]


@pytest.mark.parametrize("term", sorted(TERMS))
def test_the_term_and_each_points_constant_come_back_from_exact_rows(term: str) -> None:
    base, _ = read_profile_dict("rtx4070-gen4x16")
    base = with_term(with_term(base, "layer_seq_us", 0.0), "cpu_row_us", 0.0)
    offsets = {(2048, True): 2.0e-3, (2048, False): -1.0e-3, (8192, True): 0.5e-3}
    fit = fit_per_sequence(base, M, Q, Q, _rows(with_term(base, TERMS[term], 42.0), offsets), term)
    assert fit.term == TERMS[term] and fit.value_us == pytest.approx(42.0, rel=1e-6) and not fit.clamped
    assert {(o["context"], o["unified"]): o["offset_ms"] * 1e-3 for o in fit.offsets} == pytest.approx(offsets, abs=1e-9)
    assert all(r["error"] == pytest.approx(r["measured_s"] / r["fitted_s"] - 1) for r in fit.residuals)
    assert len(fit.held_out) == 9 and all(h["term_us"] == pytest.approx(42.0, rel=1e-6) for h in fit.held_out)


def test_rows_that_grow_slower_than_the_profile_without_the_term_give_zero() -> None:
    base = with_term(read_profile_dict("rtx4070-gen4x16")[0], "layer_seq_us", 0.0)
    runs = _rows(base, {(2048, True): 0.0})
    faster = [TokenRun(r.context, r.seconds_per_token * (1 - 0.02 * (r.sequences - 1)), "ordered", r.label,
                       sequences=r.sequences, unified=r.unified) for r in runs]
    fit = fit_per_sequence(base, M, Q, Q, faster)
    assert fit.clamped and fit.value_us == 0.0


def test_rows_at_one_sequence_count_per_point_are_refused() -> None:
    base, _ = read_profile_dict("rtx4070-gen4x16")
    runs = _rows(base, {(2048, True): 0.0}, counts=(4,)) + _rows(base, {(4096, True): 0.0}, counts=(8,))
    with pytest.raises(InputError, match="two sequence counts"):
        fit_per_sequence(base, M, Q, Q, runs)
    with pytest.raises(InputError, match="per-sequence term 'gpu'"):
        fit_per_sequence(base, M, Q, Q, runs, "gpu")


def test_the_reference_term_follows_its_published_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = tool("reference_batch")
    derived = tool("reference_derivation").derive()
    base = {k: v for k, v in derived.items() if k != "derivation"}
    got = batch.with_batch_terms(base)["devices"][0]["compute"]["layer_seq_us"]
    assert got == derived["devices"][0]["compute"]["layer_seq_us"] > 0
    slower = tuple((n, u * 0.9, s * 0.9) if n == 8 else (n, u, s) for n, u, s in batch.PARALLEL_ORDERED)
    monkeypatch.setattr(batch, "PARALLEL_ORDERED", slower)
    assert batch.with_batch_terms(base)["devices"][0]["compute"]["layer_seq_us"] > got  # slower 8-sequence rows: a dearer term


def test_a_call_whose_link_ran_slower_gives_the_term_back_when_the_staging_is_fitted_beside_it() -> None:
    base = with_term(read_profile_dict("rtx4070-gen4x16")[0], "layer_seq_us", 0.0)
    key = "h2d_pinned"  # the rows' link (pinned rows)
    truth = with_term(with_staging(base, key, 0.85), "layer_seq_us", 42.0)  # this call's host moved 15% slower
    runs = _rows(truth, {(2048, True): 1.0e-3, (8192, True): 0.0, (8192, False): -0.5e-3})
    kept = fit_per_sequence(base, M, Q, Q, runs)  # the one-sequence profile's rate kept: the copies take the term's place
    assert abs(kept.value_us - 42.0) > 10.0
    fit = fit_per_sequence(base, M, Q, Q, runs, staging="all")
    assert fit.staging == pytest.approx(0.85, rel=0.01) and fit.link_key == key
    assert fit.value_us == pytest.approx(42.0, rel=0.05) and not fit.clamped
    rate = base["devices"][0]["links"][key]["points"][0][1]
    assert fit.profile["devices"][0]["links"][key]["points"][0][1] == pytest.approx(rate * fit.staging)
    with pytest.raises(InputError, match="two -npp values"):  # one context cannot tell the copies from the term
        fit_per_sequence(base, M, Q, Q, [r for r in runs if r.context == 2048], staging="all")
