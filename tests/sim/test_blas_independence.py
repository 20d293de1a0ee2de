"""The functional output hash does not depend on the BLAS library's threads or CPU kernel choice.

The reference executor (``sim.program.numpy_exec``) contracts with ``einsum`` without BLAS, so the reduction
order is NumPy's own. The default functional run is repeated in fresh processes under OpenBLAS settings that
change BLAS's kernels and thread count; every run must print the same hashes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SETTINGS = [{}, {"OPENBLAS_NUM_THREADS": "1"}, {"OPENBLAS_NUM_THREADS": "2"}, {"OPENBLAS_CORETYPE": "Haswell"},
            {"OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}]


def _hashes(extra: dict[str, str]) -> list[tuple[int, int, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_", "MKL_"))}
    env.update(extra)
    out = subprocess.run([sys.executable, "-m", "kvpipe.cli", "simulate", "--functional", "--context", "8192,16384",
                          "--depth", "0,2", "--json"], check=True, capture_output=True, text=True, env=env).stdout
    return sorted((r["context"], r["depth"], r["output_hash"]) for r in json.loads(out))


@pytest.fixture(scope="module")
def base() -> list[tuple[int, int, str]]:
    """The hashes under the environment's own BLAS settings, run once for every setting below."""
    hashes = _hashes(SETTINGS[0])
    assert len({h for _, _, h in hashes}) == 2  # one hash per context, the same at both depths
    return hashes


@pytest.mark.parametrize("extra", SETTINGS[1:], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_the_functional_hash_is_the_same_under_every_blas_setting(base: list[tuple[int, int, str]], extra: dict[str, str]) -> None:
    assert _hashes(extra) == base
