"""The reference preset's per-sequence term, from the published ordered rows at 1, 2, 4 and 8 sequences.

The reference work also measured several sequences decoding together on the
RTX 4070 (``-c 32768``, a 2,048-token prompt each, t/s over all sequences,
over a unified cache and a cache split into a stream per sequence). Its
ordered (depth 0) rows are calibration inputs, typed in below from
``/work/shared/reference/seed-ordered-rows.json`` (``parallel_sequences``);
the pipelined rows of the same table are not, and are not read anywhere.

``validate.batch_fit`` fits what each sequence past the first adds to a step
on the preset's one-sequence calibration, by the token fit
``kvpipe calibrate --from-batched-bench`` runs on a user's file: the
per-sequence cost goes to ``layer_seq_us`` (every layer's matrix products
gain a column), each (layout) point keeps its own constant for what the
one-sequence preset misses at 2,048 (reported, not written), and
``cpu_row_us`` keeps the derivation's rule. ``tools/reference_derivation.py``
calls :func:`with_batch_terms` last, so ``tools/calibrate_reference.py``
writes and ``--check`` verifies the term with the rest of the preset.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.workload import cache_type, load_model
from validate.batch_fit import fit_per_sequence, record, with_term
from validate.token_fit import TokenRun

#: Published ordered rows: (sequences, unified t/s, split t/s), t/s over all sequences, depth 0, -c 32768, 2,048-token
#: prompt each (seed-ordered-rows.json, parallel_sequences; "streams" there is the split cache here).
PARALLEL_ORDERED = ((1, 32.62, 32.66), (2, 51.59, 51.48), (4, 71.89, 71.45), (8, 83.44, 84.16))
PROMPT_TOKENS = 2048
SOURCE = ("the reference's published ordered rows at 1, 2, 4 and 8 sequences (-c 32768, 2,048-token prompt each, unified "
          "and split cache), typed in at tools/reference_batch.py")


def runs() -> list[TokenRun]:
    """The published rows as fit points: one step of all sequences, its seconds = sequences / total t/s."""
    out = []
    for n, unified_tps, split_tps in PARALLEL_ORDERED:
        for unified, tps in ((True, unified_tps), (False, split_tps)):
            label = f"published ordered {'unified' if unified else 'split'} x{n}"
            out.append(TokenRun(PROMPT_TOKENS, n / tps, "ordered", label, sequences=n, unified=unified))
    return out


def with_batch_terms(preset: dict[str, Any], term: str = "layer", model: str = "qwen3.8-27b",
                     cache: str = "q8_0") -> dict[str, Any]:
    """A copy of the derived preset with the per-sequence ``term`` (``layer``: ``layer_seq_us``; ``attention``, ``cpu``:
    the sensitivity variants) fitted to the published rows, the GPU's other per-sequence term 0, and the fit recorded
    under ``derivation.batch``. Blocks (about 50 ordered simulations of the reference model)."""
    m, q = load_model(model), cache_type(cache)
    base = {k: v for k, v in preset.items() if k != "derivation"}
    base = with_term(with_term(base, "layer_seq_us", 0.0), "attn_seq_us", 0.0)
    fit = fit_per_sequence(base, m, q, q, runs(), term)
    out = copy.deepcopy(preset)
    for dev in out["devices"]:
        dev["compute"].update({"layer_seq_us": 0.0, "attn_seq_us": 0.0} if term != "layer" else {})
        dev["compute"][fit.term] = round(fit.value_us, 3)
    out.setdefault("derivation", {})["batch"] = record(fit, SOURCE)
    return out
