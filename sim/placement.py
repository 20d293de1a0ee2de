"""Where llama.cpp puts a layer and its KV: ``-ngl`` (the layers on the CPU) and ``--kv-gpu-layers`` (KV on the device).

Two llama.cpp settings move work off the transport's default graph (every layer on the GPU, every attention
layer's K/V window in host memory and delivered):

* ``-ngl N`` runs the *last* N layers on the GPU (``Workload.gpu_layer_start`` is the first of them). The layers
  before it run on the CPU, first in the token, as one CPU split: each streams its weights from host memory
  (``ComputeModel.host_layer_seconds``) and each of their attention layers attends over the host cache on the CPU
  (``ComputeModel.host_attention_seconds``); the activation then goes up to the first GPU split. A profile whose
  ``host_weight_GBps`` is 0 does not know this host's rate: :func:`cpu_layers_seconds` then prices the weights at
  :func:`host_weight_rate`'s estimate (the profile's host attention rate, which streams host memory the same way,
  else ``ESTIMATE_HOST_WEIGHT_GBPS``), never at 0, and the row says ``cpu_layers_cost: "estimate"``.
* ``--kv-gpu-layers N`` (the fork GenerelSchwerz/llama.cpp) keeps the first N attention layers' K and V on the
  device under ``-nkvo``. In the host cache's layout (``sim.graph.CacheLayout``: per attention layer, K of all
  cells then V of all cells) they are the first bytes, so the device keeps one buffer of exactly that prefix,
  placed once (``sim.graph.DecodeGraph.device_kv_bytes``); those layers have no CPU split and nothing to deliver.

Pure functions of a compute model; seconds and bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.profile import ComputeModel

#: The host's weight-streaming rate when the profile gives none and no host attention rate either: about half the
#: sustained read bandwidth of a dual-channel DDR5 desktop (~50 GB/s), as a CPU matrix-vector product of quantized
#: weights reaches it. An estimate, and every row priced with it says so.
ESTIMATE_HOST_WEIGHT_GBPS = 25.0


def host_weight_rate(compute: ComputeModel) -> tuple[float, str]:
    """(bytes/s a CPU layer streams its weights at, ``"profile"`` or ``"estimate"``). Pure; does not block."""
    if compute.host_weight_bytes_per_s > 0:
        return compute.host_weight_bytes_per_s, "profile"
    if compute.host_attn_bytes_per_s > 0:
        return compute.host_attn_bytes_per_s, "estimate"
    return ESTIMATE_HOST_WEIGHT_GBPS * 1e9, "estimate"


def cpu_layers_seconds(compute: ComputeModel, layer_weight_bytes: float, n_layers: int, attn_window_bytes: Sequence[int],
                       n_seq: int) -> float:
    """Host seconds of the CPU split that runs the first ``n_layers`` layers (llama.cpp's layers past ``-ngl``).

    The split's fixed cost (``cpu_split_s``, and ``cpu_row_s`` per sequence past the first), each layer's
    weights at :func:`host_weight_rate` plus ``host_layer_s``, and each of its attention layers over its window
    (``attn_window_bytes``: one entry per attention layer, K + V bytes) at ``host_attention_seconds``. Pure.
    """
    rate, _ = host_weight_rate(compute)
    layer_s = compute.host_layer_s + layer_weight_bytes / rate
    attn_s = sum(compute.host_attention_seconds(w) for w in attn_window_bytes)
    return compute.cpu_split_s + max(0, n_seq - 1) * compute.cpu_row_s + n_layers * layer_s + attn_s


def cpu_layers_cost(compute: ComputeModel) -> str:
    """How a row's CPU layers were priced: ``profile`` (the profile's host weight rate) or ``estimate``. Pure."""
    return host_weight_rate(compute)[1]
