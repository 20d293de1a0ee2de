"""Workload shapes: cache byte sizes, windows, presets, GGUF and config.json loading."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.workload import CACHE_TYPES, Workload, cache_type, load_model, model_preset_names, pad_rows


@pytest.mark.parametrize(
    ("name", "bytes_per_32"),
    [("f32", 128), ("f16", 64), ("bf16", 64), ("q8_0", 34), ("q4_0", 18), ("q4_1", 20), ("q5_0", 22), ("q5_1", 24)],
)
def test_cache_type_exact_bytes(name, bytes_per_32):  # type: ignore[no-untyped-def]
    assert cache_type(name).row_bytes(32) == bytes_per_32
    assert cache_type(name).row_bytes(1024) == bytes_per_32 * 32


def test_quantized_rows_need_whole_blocks():  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="whole 32-element blocks"):
        cache_type("q8_0").row_bytes(48)


def test_reference_model_row_bytes_and_window(qwen):  # type: ignore[no-untyped-def]
    q = cache_type("q8_0")
    wl = Workload(qwen, q, q, (4096,))
    assert qwen.attn_layers == tuple(range(3, 64, 4)) and qwen.n_attn == 16
    assert wl.k_row_bytes == 1088 and wl.row_bytes == 2176
    assert wl.window_rows(4096) == 4352  # context 4,096 reads 4,352 rows
    assert wl.window_rows(4095) == 4096
    assert pad_rows(16385) == 16640


def test_presets_load_and_unknown_names_are_refused():  # type: ignore[no-untyped-def]
    assert {"qwen3.8-27b", "llama-3.1-8b", "llama-3.1-70b"} <= set(model_preset_names())
    assert load_model("llama-3.1-8b").attn_layers == tuple(range(32))
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        load_model("nope")
    with pytest.raises(ValueError, match="unknown cache type 'q9'"):
        cache_type("q9")
    assert set(CACHE_TYPES) == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"}


def test_hf_config_json_with_layer_types(tmp_path):  # type: ignore[no-untyped-def]
    cfg = {
        "model_type": "qwen3_next",
        "num_hidden_layers": 8,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "intermediate_size": 4096,
        "vocab_size": 5000,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        "torch_dtype": "bfloat16",
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = load_model(str(p))
    assert m.attn_layers == (3, 7) and m.n_head_kv == 2 and m.head_dim_k == 128
    assert m.weight_bytes > 2 * 8 * 3 * 1024 * 4096  # at least the FFN weights in bf16


def test_bad_config_json_is_one_clear_error(tmp_path):  # type: ignore[no-untyped-def]
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(str(p))
    p.write_text(json.dumps({"num_hidden_layers": 4}))
    with pytest.raises(ValueError, match="missing field 'hidden_size'"):  # the key as the file names it
        load_model(str(p))


@pytest.mark.parametrize("value", [True, 32.7, 0, -3, 10**7, "32"])
def test_a_count_must_be_a_whole_number_in_range(tmp_path, value):  # type: ignore[no-untyped-def]
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"num_hidden_layers": value, "hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 14336}))
    with pytest.raises(ValueError, match=r"num_hidden_layers = .*; allowed: a whole number 1..4,096"):
        load_model(str(p))


def test_gguf_header_is_read_with_the_gguf_package(tmp_path):  # type: ignore[no-untyped-def]
    gguf = pytest.importorskip("gguf", reason="the gguf package is a declared dependency")
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(4)
    w.add_head_count(8)
    w.add_head_count_kv(2)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_vocab_size(100)
    w.add_name("tiny-llama")
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((512, 256), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = load_model(str(path))
    assert (m.n_layers, m.n_head, m.n_head_kv, m.head_dim_k, m.hidden, m.ffn) == (4, 8, 2, 32, 256, 512)
    assert m.attn_layers == (0, 1, 2, 3)
    assert m.weight_bytes == 512 * 256 * 2
    assert m.name == "tiny-llama"


def test_a_gguf_with_no_tensors_is_refused(tmp_path):  # type: ignore[no-untyped-def]
    gguf = pytest.importorskip("gguf", reason="the gguf package is a declared dependency")
    path = tmp_path / "header-only.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in ((w.add_block_count, 4), (w.add_head_count, 8), (w.add_head_count_kv, 2), (w.add_embedding_length, 256),
                   (w.add_feed_forward_length, 512)):
        add(v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="holds no tensors"):  # counted as 0 bytes of weights it ran at 67 t/s, not 19
        load_model(str(path))


def test_workload_validates_its_inputs(qwen):  # type: ignore[no-untyped-def]
    q = cache_type("q8_0")
    with pytest.raises(ValueError, match="context 0 out of range"):
        Workload(qwen, q, q, (0,))
    with pytest.raises(ValueError, match="ctx-size 100 cannot hold"):
        Workload(qwen, q, q, (4096,), ctx_size=100)


def test_gpu_layers_follow_llama_cpp_and_kv_gpu_layers_are_bounded_by_the_attention_layers() -> None:
    from sim.workload import Workload, cache_type, load_model

    m, q8 = load_model("llama-3.1-8b"), cache_type("q8_0")
    assert Workload(m, q8, q8).gpu_layer_start == 0
    assert Workload(m, q8, q8, n_gpu_layers=99).gpu_layer_start == 0
    assert Workload(m, q8, q8, n_gpu_layers=20).gpu_layer_start == m.n_layers - 20  # the last 20 layers on the GPU
    assert Workload(m, q8, q8, n_gpu_layers=0).gpu_layer_start == m.n_layers
    with pytest.raises(ValueError, match=r"n-gpu-layers -1 out of range"):
        Workload(m, q8, q8, n_gpu_layers=-1)
    with pytest.raises(ValueError, match=rf"kv-gpu-layers {m.n_attn + 1} out of range; allowed: 0..{m.n_attn}"):
        Workload(m, q8, q8, kv_gpu_layers=m.n_attn + 1)
