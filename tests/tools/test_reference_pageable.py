"""The reference preset's pageable link: fitted from the one published pageable ordered row, and nothing else moves.

Issue 30 (with issue 28's reference part): the pageable H2D curve of ``rtx4070-gen4x16`` was the H200 probe's; it is now
the staging rate the published ``host_memory_13128`` pageable row determines (tools/reference_pageable.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from backends.profile import PRESET_DIR
from tests.conftest import tool

derivation = tool("reference_derivation")
pageable = tool("reference_pageable")


def _without_pageable(preset: dict[str, Any]) -> dict[str, Any]:
    d = json.loads(json.dumps(preset))
    for dev in d["devices"]:
        dev["links"].pop("h2d_pageable")
    d["derivation"].pop("pageable")
    return d


def test_the_fitted_pageable_rate_takes_the_published_pageable_row_and_says_what_it_cannot_tell() -> None:
    preset = derivation.derive()
    rec = preset["derivation"]["pageable"]
    assert rec["sim_pageable_tps"] == pytest.approx(pageable.HOST_MEMORY_13128["pageable_ordered_tps"], rel=1e-3)
    # the pinned row of the same pair is a check the preset was not fitted to: within the preset's ordered band (3%)
    assert rec["sim_pinned_tps_check"] == pytest.approx(pageable.HOST_MEMORY_13128["pinned_ordered_tps"], rel=0.03)
    link = preset["devices"][0]["links"]["h2d_pageable"]
    assert link["points"] == [[1.0, rec["GBps"]]] and link["latency_us"] == preset["devices"][0]["links"]["h2d_pinned"]["latency_us"]
    # faster than the pinned link could never be; slower than it, as a host's staging memcpy is
    assert 0 < rec["GBps"] < preset["devices"][0]["links"]["h2d_pinned"]["points"][0][1]
    text = preset["provenance"]["devices.links.h2d_pageable"]
    assert text.startswith("fitted from published numbers") and "not determined" in text and "fixed cost" in text
    assert "borrowed" in preset["provenance"]["devices.links.d2h_pageable"]
    assert json.loads((PRESET_DIR / "rtx4070-gen4x16.json").read_text()) == preset


def test_the_published_pageable_row_moves_the_pageable_link_only(monkeypatch: pytest.MonkeyPatch) -> None:
    base = derivation.derive()
    monkeypatch.setitem(pageable.HOST_MEMORY_13128, "pageable_ordered_tps", 12.0)
    slower = derivation.derive()
    assert slower["devices"][0]["links"]["h2d_pageable"]["points"][0][1] < base["devices"][0]["links"]["h2d_pageable"]["points"][0][1]
    assert slower["derivation"]["pageable"]["sim_pageable_tps"] == pytest.approx(12.0, rel=1e-3)
    assert _without_pageable(slower) == _without_pageable(base)  # the pinned, one-sequence preset does not move
