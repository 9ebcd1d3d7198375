"""Parity of lab.hf with `transformers` (torch CPU) on tiny random Qwen3, Qwen2 and Llama models.

Each family is built by `transformers`, its weights randomised (norm weights
and biases too, so a mis-mapped tensor cannot hide behind an init of ones or
zeros), saved with `save_pretrained` (safetensors) and loaded by
`lab.hf.load_pretrained`. Tolerances: float32 logits within 1e-4 absolute,
32 greedy tokens identical.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from lab import hf  # noqa: E402
from lab.nn import Transformer, TransformerConfig  # noqa: E402

ATOL = 1e-4
NEW_TOKENS = 32
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)
FAMILIES = {
    # GQA 4/2, explicit head_dim != hidden/heads, tied embeddings, q/k norm, theta 1e6.
    "qwen3": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                  tie_word_embeddings=True, rope_theta=1e6)),
    # GQA 4/2, qkv biases, untied, theta 5e5.
    "qwen2": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2,
                                  tie_word_embeddings=False, rope_theta=5e5)),
    # MQA 4/1, untied, theta 2e4.
    "llama": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=1,
                                  tie_word_embeddings=False, rope_theta=2e4)),
}


def build_hf(family: str, seed: int = 0, **overrides):
    cls_name, kw = FAMILIES[family]
    cfg = getattr(transformers, cls_name)(**{**COMMON, **kw, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def random_lab_model(config: TransformerConfig, seed: int) -> Transformer:
    """A Transformer with numpy-random weights (norms ~1 +- 0.2, the rest ~0.15 N(0, 1)).

    Filling an abstract model skips the eager random init (seconds of op compilation).
    """
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    rng = np.random.RandomState(seed)

    def fill(tree, name=""):
        if isinstance(tree, dict):
            return {k: fill(v, str(k)) for k, v in tree.items()}
        noise = rng.standard_normal(tree.shape).astype(np.float32)
        return jnp.asarray(1.0 + 0.2 * noise if name == "weight" else 0.15 * noise, tree.dtype)

    nnx.replace_by_pure_dict(state, fill(nnx.to_pure_dict(state)))
    return nnx.merge(graphdef, state)


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.float().numpy()


# One compiled program per config (eager op-by-op dispatch costs several CPU seconds).
_forward = nnx.jit(lambda model, tokens: model(tokens))


def lab_logits(model: Transformer, tokens: np.ndarray) -> np.ndarray:
    return np.asarray(_forward(model, jnp.asarray(tokens)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> (transformers model, checkpoint directory written by transformers)."""
    out = {}
    for family in FAMILIES:
        model = build_hf(family)
        path = str(tmp_path_factory.mktemp(family))
        model.save_pretrained(path, safe_serialization=True)
        out[family] = (model, path)
    return out


PROMPT_LEN = 8
# The greedy loop's buffer has the same shape, so it reuses the logits test's compilation.
TOKENS = np.random.RandomState(0).randint(0, 128, size=(2, PROMPT_LEN + NEW_TOKENS))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers(saved, family):
    ref_model, path = saved[family]
    model = hf.load_pretrained(path)
    assert model.config.dtype == "float32"
    assert model.config.qk_norm == (family == "qwen3")
    assert model.config.qkv_bias == (family == "qwen2")
    ref, out = hf_logits(ref_model, TOKENS), lab_logits(model, TOKENS)
    diff = float(np.abs(ref - out).max())
    print(f"{family}: max |logit diff| = {diff:.2e} (max |logit| {np.abs(ref).max():.2f})")
    assert diff < ATOL


def lab_greedy(model: Transformer, prompt: np.ndarray, n: int) -> np.ndarray:
    """Greedy decoding by re-running the full forward each step on a fixed-size buffer.

    Causality makes the logits at position t independent of the padding after
    it, so one jitted program serves every step.
    """
    b, t = prompt.shape
    buf = jnp.zeros((b, t + n), jnp.int32).at[:, :t].set(prompt)
    for i in range(n):
        nxt = jnp.argmax(_forward(model, buf)[:, t + i - 1], axis=-1)
        buf = buf.at[:, t + i].set(nxt)
    return np.asarray(buf[:, t:])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_tokens_match_transformers(saved, family):
    ref_model, path = saved[family]
    model = hf.load_pretrained(path)
    prompt = TOKENS[:, :PROMPT_LEN]
    with torch.no_grad():
        ref = ref_model.generate(torch.tensor(prompt), attention_mask=torch.ones_like(
            torch.tensor(prompt)), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
            do_sample=False, pad_token_id=0)[:, PROMPT_LEN:].numpy()
    ours = lab_greedy(model, prompt, NEW_TOKENS)
    assert ref.shape == (2, NEW_TOKENS)
    np.testing.assert_array_equal(ours, ref)
    if family != "qwen3":  # one family suffices for the cached engine (~4 s of compilation)
        return
    # The cached engine of lab.infer agrees with the full-forward loop.
    infer = pytest.importorskip("lab.infer")
    gen = infer.generate(model, prompt, max_new_tokens=NEW_TOKENS)
    np.testing.assert_array_equal(np.asarray(gen.tokens), ref)


@pytest.mark.parametrize("variant", [
    dict(qk_norm=True, qkv_bias=False, tie_embeddings=True),                       # -> qwen3
    dict(qk_norm=False, qkv_bias=True, tie_embeddings=False),                      # -> qwen2
    dict(qk_norm=False, qkv_bias=False, tie_embeddings=False, head_dim=32),        # -> llama
    dict(qk_norm=False, qkv_bias=True, tie_embeddings=True, model_type="llama"),   # attention_bias
])
def test_save_pretrained_round_trips_through_transformers(tmp_path, variant):
    variant = dict(variant)
    model_type = variant.pop("model_type", None)
    config = TransformerConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                               head_dim=variant.pop("head_dim", 16), d_ff=96, rope_theta=3e4,
                               max_len=128, **variant)
    model = random_lab_model(config, seed=1)
    hf.save_pretrained(model, tmp_path, model_type=model_type)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    expected_type = model_type or hf.config.default_model_type(config)
    assert ref_model.config.model_type == expected_type
    diff = float(np.abs(hf_logits(ref_model, TOKENS) - lab_logits(model, TOKENS)).max())
    print(f"save -> transformers ({expected_type}): max |logit diff| = {diff:.2e}")
    assert diff < ATOL, diff
    again = hf.load_pretrained(tmp_path)
    assert again.config == config
    np.testing.assert_array_equal(lab_logits(again, TOKENS), lab_logits(model, TOKENS))


def test_sharded_checkpoint_loads(saved, tmp_path):
    ref_model, _ = saved["qwen2"]
    ref_model.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    index = json.load(open(tmp_path / "hf" / "model.safetensors.index.json"))
    shards = set(index["weight_map"].values())
    assert len(shards) >= 2
    model = hf.load_pretrained(tmp_path / "hf")
    assert float(np.abs(hf_logits(ref_model, TOKENS) - lab_logits(model, TOKENS)).max()) < ATOL
    # Lab's own sharded writer is read by transformers.
    hf.save_pretrained(model, tmp_path / "lab", max_shard_size="40KB")
    files = sorted(os.listdir(tmp_path / "lab"))
    assert "model.safetensors.index.json" in files and "model.safetensors" not in files
    assert sum(f.startswith("model-") for f in files) >= 2
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lab", dtype=torch.float32)
    assert float(np.abs(hf_logits(back, TOKENS) - lab_logits(model, TOKENS)).max()) < ATOL


def test_bfloat16_load_and_save(saved, tmp_path):
    ref_model, path = saved["qwen3"]
    model = hf.load_pretrained(path, dtype=jnp.bfloat16)
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    ref = hf_logits(ref_model, TOKENS)
    diff = float(np.abs(lab_logits(model, TOKENS) - ref).max())
    print(f"bfloat16 load: max |logit diff| vs float32 transformers = {diff:.3f} "
          f"(max |logit| {np.abs(ref).max():.2f})")
    # bfloat16 keeps 8 mantissa bits: logits of magnitude ~5 move by a few 1e-2.
    assert diff < 0.15 * np.abs(ref).max(), diff
    hf.save_pretrained(model, tmp_path)
    stored = load_file(str(tmp_path / "model.safetensors"))
    assert str(stored["model.norm.weight"].dtype) == "bfloat16"
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)  # dtype from config
    assert back.dtype == torch.bfloat16
    with torch.no_grad():
        theirs = back(torch.tensor(TOKENS)).logits.float().numpy()
    assert float(np.abs(theirs - lab_logits(model, TOKENS)).max()) < 0.15 * np.abs(ref).max()


def copy_checkpoint(saved, family, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(saved[family][1], dst)
    return dst


def edit_config(path, **changes):
    cfg = json.load(open(path / "config.json"))
    cfg.update(changes)
    json.dump(cfg, open(path / "config.json", "w"))


def test_unsupported_model_type_is_named(saved, tmp_path):
    path = copy_checkpoint(saved, "qwen3", tmp_path)
    edit_config(path, model_type="gpt2")
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*\('llama', 'qwen2', 'qwen3'\)"):
        hf.load_pretrained(path)


def test_missing_tensor_is_listed(saved, tmp_path):
    path = copy_checkpoint(saved, "llama", tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    del tensors["lm_head.weight"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks 2 tensor.*model\.layers\.1\.mlp\.down_proj\."
                                         r"weight, lm_head\.weight"):
        hf.load_pretrained(path)


def test_shape_mismatch_names_tensor_and_shapes(saved, tmp_path):
    path = copy_checkpoint(saved, "qwen2", tmp_path)
    edit_config(path, intermediate_size=80)  # the tensors are of the 96-wide model
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight.*expected "
                                         r"shape \(80, 64\).*found \(96, 64\)"):
        hf.load_pretrained(path)


def test_unexpected_and_nonzero_output_bias_are_refused(saved, tmp_path):
    ref_model, _ = saved["llama"]
    path = copy_checkpoint(saved, "llama", tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.full(64, 0.5, np.float32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"no parameter for: model\.layers\.0\.self_attn\.o_proj"):
        hf.load_pretrained(path)
    # Llama's attention_bias=True biases q, k, v and o; Lab has no o-projection bias.
    edit_config(path, attention_bias=True)
    for i in range(2):
        for name, width in (("q", 64), ("k", 16), ("v", 16), ("o", 64)):
            key = f"model.layers.{i}.self_attn.{name}_proj.bias"
            tensors.setdefault(key, np.zeros(width, np.float32))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.self_attn\.o_proj\.bias' is "
                                         r"nonzero \(max \|b\| = 0\.5\)"):
        hf.load_pretrained(path)
    tensors["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    model = hf.load_pretrained(path)  # zero biases: the same function as the reference
    assert model.config.qkv_bias
    assert float(np.abs(hf_logits(ref_model, TOKENS) - lab_logits(model, TOKENS)).max()) < ATOL


@pytest.mark.parametrize("change, pattern", [
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}),
     r"rope_parameters\.rope_type='yarn'"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), r"rope_scaling\.rope_type='linear'"),
    (dict(hidden_act="gelu"), r"hidden_act='gelu'.*silu"),
    (dict(use_sliding_window=True), r"use_sliding_window"),
])
def test_unsupported_config_fields_are_named(saved, tmp_path, change, pattern):
    path = copy_checkpoint(saved, "qwen3", tmp_path)
    edit_config(path, **change)
    with pytest.raises(ValueError, match=pattern):
        hf.load_pretrained(path)
