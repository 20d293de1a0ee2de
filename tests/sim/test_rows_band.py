"""A row's interval (``sim.rows.interval_fields``) is ``prediction_band``'s, whichever profile object asks: the band is
kept per profile object, and a new profile that takes a freed object's id gets its own band."""

from __future__ import annotations

import gc
import random
from dataclasses import replace
from pathlib import Path

import pytest

from backends.profile import load_profile, prediction_band, preset_names
from sim.points import GridSpec, points
from sim.rows import interval_fields

ROOT = Path(__file__).resolve().parents[2]
PROFILES = [*preset_names(), *(str(p) for p in sorted(ROOT.glob("validate/results/h200-llamacpp/prediction-*/profile.json"))[:3])]


def _old(point, tokens_per_s):  # type: ignore[no-untyped-def]  # interval_fields as it was at 7c32073: the oracle
    band = prediction_band(point.hardware, point.workload.model.name, point.workload.cache_k.name,
                           point.workload.cache_v.name)
    if band is None:
        return {"tokens_per_s_interval": None, "interval": "uncalibrated: the profile has no calibration residuals for this "
                f"model and cache type ({point.workload.model.name}, {point.workload.cache_k.name})"}
    return {"tokens_per_s_interval": [tokens_per_s * (1 - band.relative), tokens_per_s * (1 + band.relative)],
            "interval": f"+-{band.relative:.1%}: {band.source}"}


@pytest.mark.parametrize("seed", [0, 1])
def test_interval_is_the_bands_of_every_profile_model_and_cache(seed: int) -> None:
    """Every (profile, model, K, V) asked in a shuffled order, twice, of the same profile objects: each one's band."""
    rng = random.Random(seed)
    combos = [(hw, m, k, v) for hw in PROFILES for m in ("qwen3.8-27b", "llama-3.1-8b", "llama-3.1-70b")
              for k in ("q8_0", "f16", "q4_0") for v in ("q8_0", "f16")]
    shared = {hw: load_profile(hw) for hw in PROFILES}  # one object per profile, whatever is asked of it: the keys must tell
    pts = {}
    for hw, m, k, v in combos:
        spec = GridSpec(models=(m,), hardware=(hw,), cache_types=(k,), cache_types_v=(v,), contexts=((4096,),))
        pts[hw, m, k, v] = replace(points(spec)[0], hardware=shared[hw])
    bands = set()
    for combo in rng.sample(combos, len(combos)) * 2:
        p, tps = pts[combo], rng.uniform(0.1, 200.0)
        got, want = interval_fields(p, tps), _old(p, tps)
        assert got == want and repr(got) == repr(want)
        bands.add(want["interval"])
    assert len(bands) >= 4  # calibrated, reference and uncalibrated bands all met


def test_a_new_profile_in_a_freed_objects_place_gets_its_own_band() -> None:
    base = points(GridSpec(hardware=("rtx4070-gen4x16",), contexts=((4096,),)))[0]
    for k in range(200):
        band = 0.01 + k / 1000
        meta = {**base.hardware.meta, "calibration": {**base.hardware.meta["calibration"], "band": band,
                                                        "band_source": f"test {k}"}}
        p = replace(base, hardware=replace(base.hardware, meta=meta))
        assert interval_fields(p, 10.0) == _old(p, 10.0)
        assert interval_fields(p, 10.0)["interval"] == f"+-{band:.1%}: test {k}"
        del p
        gc.collect()
    assert load_profile("rtx4070-gen4x16") is not None
