"""lab.hf config mapping and checkpoint files, without torch: field map, errors, atomic saves."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lab import hf
from lab.hf.checkpoint import parse_size
from lab.nn import Transformer, TransformerConfig

QWEN3 = {"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 768,
         "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
         "head_dim": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
         "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default",
                                                              "rope_theta": 1e6},
         "dtype": "bfloat16", "hidden_act": "silu"}


def test_field_map_qwen3():
    c = hf.config_from_hf(QWEN3)
    assert (c.vocab_size, c.d_model, c.d_ff, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) \
        == (1000, 256, 768, 3, 8, 2, 64)
    assert (c.rope_theta, c.norm_eps, c.max_len, c.dtype) == (1e6, 1e-5, 4096, "bfloat16")
    assert c.qk_norm and not c.qkv_bias and c.tie_embeddings
    assert hf.config_from_hf(QWEN3, dtype=jnp.float32).dtype == "float32"
    assert hf.config_from_hf(QWEN3, dtype="auto").dtype == "bfloat16"


def test_llama_and_qwen2_defaults_and_legacy_fields():
    legacy = {k: v for k, v in QWEN3.items() if k not in ("head_dim", "rope_parameters", "dtype",
                                                          "num_key_value_heads")}
    llama = hf.config_from_hf({**legacy, "model_type": "llama", "rope_theta": 5e5,
                               "torch_dtype": "float16", "tie_word_embeddings": False})
    assert llama.head_dim == 256 // 8 and llama.n_kv_heads == 8  # hidden/heads, MHA
    assert llama.rope_theta == 5e5 and llama.dtype == "float16"  # transformers 4 layout
    assert not llama.qk_norm and not llama.qkv_bias and not llama.tie_embeddings
    qwen2 = hf.config_from_hf({**legacy, "model_type": "qwen2"})
    assert qwen2.qkv_bias and not qwen2.qk_norm and qwen2.rope_theta == 10_000.0
    assert hf.config_from_hf({**legacy, "model_type": "llama", "attention_bias": True}).qkv_bias


@pytest.mark.parametrize("change, pattern", [
    ({"model_type": "mistral"}, r"model_type='mistral'.*\('llama', 'qwen2', 'qwen3'\)"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, r"rope_type='llama3'"),
    ({"hidden_act": "gelu_pytorch_tanh"}, r"hidden_act='gelu_pytorch_tanh'"),
    ({"mlp_bias": True}, r"mlp_bias=True"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, r"\['sliding_attention'\]"),
    ({"dtype": "int8"}, r"dtype='int8'"),
    ({"hidden_size": None}, r"config.json hidden_size=None; expected a positive int"),
    ({"num_key_value_heads": 3}, r"n_heads=8 is not a multiple of n_kv_heads=3"),
])
def test_config_errors_name_the_field(change, pattern):
    with pytest.raises(ValueError, match=pattern):
        hf.config_from_hf({**QWEN3, **change})


@pytest.mark.parametrize("config, model_type", [
    (hf.config_from_hf(QWEN3), "qwen3"),
    (TransformerConfig(qk_norm=False, qkv_bias=True, tie_embeddings=False), "qwen2"),
    (TransformerConfig(qk_norm=False, head_dim=48, rope_theta=2e4), "llama"),
])
def test_config_to_hf_inverts_config_from_hf(config, model_type):
    out = json.loads(json.dumps(hf.config_to_hf(config)))
    assert out["model_type"] == model_type
    assert out["rope_parameters"]["rope_theta"] == out["rope_theta"] == config.rope_theta
    assert hf.config_from_hf(out) == config


@pytest.mark.parametrize("config, model_type, pattern", [
    (TransformerConfig(qk_norm=False), "qwen3", r"qwen3.*qk_norm=True"),
    (TransformerConfig(qk_norm=True), "llama", r"'llama' has no q/k norm"),
    (TransformerConfig(qk_norm=False, qkv_bias=False), "qwen2", r"qkv_bias=False"),
    (TransformerConfig(causal=False), None, r"causal=False"),
    (TransformerConfig(), "gemma", r"model_type='gemma'"),
])
def test_config_to_hf_refuses_what_the_family_cannot_hold(config, model_type, pattern):
    with pytest.raises(ValueError, match=pattern):
        hf.config_to_hf(config, model_type)


def test_parse_size():
    assert parse_size(123) == 123
    assert parse_size("40KB") == 40_000 and parse_size("1GiB") == 2**30
    with pytest.raises(ValueError, match="max_shard_size='lots'"):
        parse_size("lots")


def test_save_keeps_other_files_and_removes_stale_shards(tmp_path):
    config = TransformerConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                               head_dim=8, d_ff=64)
    model = Transformer(config, rngs=nnx.Rngs(0))
    (tmp_path / "tokenizer.json").write_text("{}")
    hf.save_pretrained(model, tmp_path, max_shard_size="8KB")
    shards = [f for f in os.listdir(tmp_path) if f.startswith("model-")]
    assert len(shards) >= 2 and (tmp_path / "model.safetensors.index.json").exists()
    hf.save_pretrained(model, tmp_path)  # now a single file: the old shards must go
    files = sorted(os.listdir(tmp_path))
    assert files == ["config.json", "model.safetensors", "tokenizer.json"], files
    x = jnp.arange(10, dtype=jnp.int32)[None]
    np.testing.assert_array_equal(np.asarray(hf.load_pretrained(tmp_path)(x)),
                                  np.asarray(model(x)))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:100])  # a truncated download
    with pytest.raises(ValueError, match=r"model.safetensors' is not a readable safetensors"):
        hf.load_pretrained(tmp_path)
    os.remove(tmp_path / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        hf.load_pretrained(tmp_path)
