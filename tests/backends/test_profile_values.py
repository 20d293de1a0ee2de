"""A hardware profile's values are checked at the door: finite, in range, strict JSON, every section present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.profile import PRESET_DIR, load_profile

BASE = json.loads((PRESET_DIR / "h200-gen5x16.json").read_text())


def _write(tmp_path: Path, edit, raw: str | None = None) -> str:  # type: ignore[no-untyped-def]
    d = json.loads(json.dumps(BASE))
    edit(d)
    p = tmp_path / "profile.json"
    p.write_text(raw if raw is not None else json.dumps(d))
    return str(p)


def _set(path: tuple, value):  # type: ignore[no-untyped-def,type-arg]
    def edit(d):  # type: ignore[no-untyped-def]
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


@pytest.mark.parametrize("path,value,message", [
    (("host", "launch_us"), -5, r"host.launch_us -5; allowed: a finite number >= 0"),
    (("host", "event_us"), 1e400, r"is not valid JSON: Infinity"),  # json writes it as Infinity
    (("devices", 0, "links", "h2d_pinned", "points", 1, 1), 0.0, r"h2d_pinned: bad link curve .*finite numbers > 0"),
    (("devices", 0, "links", "d2h_pinned", "points", 0, 1), -1.0, r"d2h_pinned: bad link curve .*finite numbers > 0"),
    (("devices", 0, "dram_GBps"), -1.0, r"dram_GBps must be >= 0"),
])
def test_a_bad_value_is_one_line_naming_the_file_and_the_key(tmp_path: Path, path, value, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message) as exc:
        load_profile(_write(tmp_path, _set(path, value)))
    assert "profile.json" in str(exc.value) and "\n" not in str(exc.value)


def test_nan_and_infinity_are_not_json_and_a_missing_host_is_missing(tmp_path: Path) -> None:
    text = json.dumps(BASE).replace('"launch_us": ' + json.dumps(BASE["host"]["launch_us"]), '"launch_us": NaN')
    with pytest.raises(ValueError, match="is not valid JSON: NaN"):
        load_profile(_write(tmp_path, lambda d: None, text))
    with pytest.raises(ValueError, match="missing field 'host'"):
        load_profile(_write(tmp_path, lambda d: d.pop("host")))
