"""Qwen3-VL checkpoints (``Qwen3VLForConditionalGeneration``) as :class:`lab.nn.VLM`.

A Qwen3-VL directory is ``config.json`` (``model_type="qwen3_vl"`` with a
``text_config`` and a ``vision_config``) and safetensors under
``model.visual.*`` (the ViT, its merger and DeepStack mergers),
``model.language_model.*`` (a Qwen3 decoder with M-RoPE) and ``lm_head.weight``.
The decoder's tensors go through the same map as a Qwen3 checkpoint
(:func:`lab.hf.checkpoint.tensor_map` under another prefix); the vision tower's are
mapped here: the patch ``Conv3d`` (stride = kernel) becomes a linear kernel, the
fused ``qkv [3D, D]`` becomes Lab's ``[D, H, 3, hd]`` layout, linear weights are
transposed. No torch is needed. The MoE variant (``qwen3_vl_moe``) is refused: Lab's
decoder is dense.

Field map of ``vision_config`` (Hugging Face -> :class:`lab.nn.VisionConfig`):
``hidden_size`` -> ``d_model``, ``depth`` -> ``n_layers``, ``num_heads`` -> ``n_heads``,
``intermediate_size`` -> ``d_ff``, ``out_hidden_size`` -> ``out_dim``,
``deepstack_visual_indexes`` -> ``deepstack_layers``, ``hidden_act``
(``gelu_pytorch_tanh`` | ``gelu``) -> ``act``, ``rope_parameters.rope_theta`` ->
``rope_theta``; the others keep their names. ``text_config`` is read as a Qwen3
config (:func:`lab.hf.config.config_from_hf`) plus ``rope_parameters.mrope_section``
and ``attention_bias`` (q/k/v and o biases).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lab.hf import checkpoint as ckpt
from lab.hf.config import config_from_hf as text_config_from_hf
from lab.nn import VLM, TransformerConfig, VisionConfig, VLMConfig

MODEL_TYPE = "qwen3_vl"
TEXT = "model.language_model."
VISUAL = "model.visual."
ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
TOKEN_FIELDS = ("image_token_id", "video_token_id", "vision_start_token_id",
                "vision_end_token_id")


def _positive(d: dict, field: str, where: str) -> int:
    value = d.get(field)
    if isinstance(value, (list, tuple)) and len(set(value)) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config.json {where}.{field}={value!r}; expected a positive int")
    return value


def config_from_hf(hf: dict, *, dtype: Any = None) -> VLMConfig:
    """The :class:`lab.nn.VLMConfig` of a Qwen3-VL ``config.json`` dict; ValueError for the
    MoE variant or anything the VLM cannot represent (named with its value)."""
    mt = hf.get("model_type")
    tc = dict(hf.get("text_config") or {})
    if mt == "qwen3_vl_moe" or tc.get("model_type") == "qwen3_vl_moe_text" \
            or tc.get("num_experts"):
        raise ValueError(f"config.json model_type={mt!r} is Qwen3-VL's mixture-of-experts "
                         "variant, which lab.nn.VLM does not support: its decoder is dense "
                         "(model_type='qwen3_vl' only)")
    if mt != MODEL_TYPE:
        raise ValueError(f"config.json model_type={mt!r}; expected {MODEL_TYPE!r}")
    vc = dict(hf.get("vision_config") or {})
    if not tc or not vc:
        raise ValueError("config.json of a qwen3_vl model needs text_config and vision_config")
    rope = dict(tc.get("rope_parameters") or {})
    section = tuple(rope.pop("mrope_section", (24, 20, 20)))
    rope.pop("mrope_interleaved", None)  # Qwen3-VL's M-RoPE is always interleaved
    if dtype is None or dtype == "auto":
        dtype = hf.get("dtype") or hf.get("torch_dtype") or tc.get("dtype") or "float32"
    tie = bool(hf.get("tie_word_embeddings", tc.get("tie_word_embeddings", False)))
    text = text_config_from_hf({**tc, "model_type": "qwen3", "rope_parameters": rope,
                           "tie_word_embeddings": tie}, dtype=dtype)
    text = text.replace(o_bias=bool(tc.get("attention_bias", False)), mrope_section=section)
    act = vc.get("hidden_act", "gelu_pytorch_tanh")
    if act not in ACTS:
        raise ValueError(f"config.json vision_config.hidden_act={act!r}; expected one of "
                         f"{sorted(ACTS)}")
    vrope = vc.get("rope_parameters") or {}
    if vrope.get("rope_type", "axial") != "axial":
        raise ValueError(f"config.json vision_config.rope_parameters.rope_type="
                         f"{vrope.get('rope_type')!r}; Qwen3-VL's vision rope is 'axial'")
    vision = VisionConfig(
        d_model=_positive(vc, "hidden_size", "vision_config"),
        n_layers=_positive(vc, "depth", "vision_config"),
        n_heads=_positive(vc, "num_heads", "vision_config"),
        d_ff=_positive(vc, "intermediate_size", "vision_config"),
        in_channels=_positive(vc, "in_channels", "vision_config"),
        patch_size=_positive(vc, "patch_size", "vision_config"),
        temporal_patch_size=_positive(vc, "temporal_patch_size", "vision_config"),
        spatial_merge_size=_positive(vc, "spatial_merge_size", "vision_config"),
        out_dim=_positive(vc, "out_hidden_size", "vision_config"),
        num_position_embeddings=_positive(vc, "num_position_embeddings", "vision_config"),
        rope=True, rope_theta=float(vrope.get("rope_theta", 10_000.0)),
        deepstack_layers=tuple(vc.get("deepstack_visual_indexes") or ()),
        act=ACTS[act], norm_eps=1e-6, dtype=text.dtype)
    tokens = {k: hf[k] for k in TOKEN_FIELDS if k in hf}
    return VLMConfig(text=text, vision=vision, **tokens)


def config_to_hf(config: VLMConfig) -> dict:
    """A Qwen3-VL ``config.json`` dict that ``transformers`` loads as the same model;
    ValueError for what Qwen3-VL cannot hold (named with its value)."""
    t, v = config.text, config.vision
    checks = [(t.qk_norm, "text.qk_norm must be True (Qwen3-VL's decoder has q/k norm)"),
              (t.qkv_bias == t.o_bias, f"text.qkv_bias={t.qkv_bias} and o_bias={t.o_bias} must "
               "be equal (Qwen3-VL's attention_bias covers q, k, v and o)"),
              (t.norm == "rmsnorm" and t.mlp == "swiglu", "text.norm/mlp must be "
               f"rmsnorm/swiglu, got {t.norm}/{t.mlp}"),
              (v.rope, "vision.rope=False; Qwen3-VL's ViT always has the 2-D rope"),
              (v.num_position_embeddings > 0, "vision.num_position_embeddings=0; Qwen3-VL's "
               "ViT always has a learned position table"),
              (v.norm_eps == 1e-6, f"vision.norm_eps={v.norm_eps}; Qwen3-VL fixes 1e-6")]
    for ok, why in checks:
        if not ok:
            raise ValueError(f"VLMConfig cannot be saved as qwen3_vl: {why}")
    text = {
        "model_type": "qwen3_vl_text", "vocab_size": t.vocab_size, "hidden_size": t.d_model,
        "intermediate_size": t.d_ff, "num_hidden_layers": t.n_layers,
        "num_attention_heads": t.n_heads, "num_key_value_heads": t.n_kv_heads,
        "head_dim": t.head_dim, "hidden_act": "silu", "max_position_embeddings": t.max_len,
        "rms_norm_eps": t.norm_eps, "attention_bias": t.qkv_bias, "attention_dropout": 0.0,
        "initializer_range": t.init_std, "use_cache": True, "dtype": t.dtype,
        "rope_parameters": {"rope_type": "default", "rope_theta": t.rope_theta,
                            "mrope_section": list(t.mrope_section), "mrope_interleaved": True},
    }
    act = {a: h for h, a in ACTS.items()}[v.act]
    vision = {
        "model_type": "qwen3_vl_vision", "depth": v.n_layers, "hidden_size": v.d_model,
        "hidden_act": act, "intermediate_size": v.d_ff, "num_heads": v.n_heads,
        "in_channels": v.in_channels, "patch_size": v.patch_size,
        "temporal_patch_size": v.temporal_patch_size,
        "spatial_merge_size": v.spatial_merge_size, "out_hidden_size": v.out_dim,
        "num_position_embeddings": v.num_position_embeddings,
        "deepstack_visual_indexes": list(v.deepstack_layers),
        "initializer_range": v.init_std, "dtype": v.dtype,
        "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
    }
    return {"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": MODEL_TYPE,
            "text_config": text, "vision_config": vision,
            **{k: getattr(config, k) for k in TOKEN_FIELDS},
            "tie_word_embeddings": t.tie_embeddings, "dtype": t.dtype}


def _linear(hf: str, lab: tuple, bias: bool = True) -> list:
    out = [(f"{hf}.weight", (*lab, "kernel"), lambda a: a.T, lambda a: a.T)]
    if bias:
        out.append((f"{hf}.bias", (*lab, "bias"), _same, _same))
    return out


def _same(a):
    return a


def _norm(hf: str, lab: tuple) -> list:
    return [(f"{hf}.weight", (*lab, "weight"), _same, _same),
            (f"{hf}.bias", (*lab, "bias"), _same, _same)]


def vision_map(config: VisionConfig) -> list[tuple]:
    """``(hf_name, lab_path, to_lab, to_hf)`` for every vision-tower tensor."""
    c = config
    d, h, hd = c.d_model, c.n_heads, c.head_dim
    root = ("visual",)
    out = [(f"{VISUAL}patch_embed.proj.weight", (*root, "patch_embed", "kernel"),
            lambda a: a.reshape(d, -1).T,
            lambda a: a.T.reshape(d, c.in_channels, c.temporal_patch_size, c.patch_size,
                                  c.patch_size)),
           (f"{VISUAL}patch_embed.proj.bias", (*root, "patch_embed", "bias"), _same, _same),
           (f"{VISUAL}pos_embed.weight", (*root, "pos_embed", "embedding"), _same, _same)]
    for i in range(c.n_layers):
        hf, lab = f"{VISUAL}blocks.{i}.", (*root, "blocks", i)
        out += _norm(f"{hf}norm1", (*lab, "attn_norm"))
        # HF's qkv rows are (q|k|v, head, channel); Lab's fused kernel is [D, head, q|k|v, hd].
        out.append((f"{hf}attn.qkv.weight", (*lab, "attn", "qkv", "kernel"),
                    lambda a: a.T.reshape(d, 3, h, hd).transpose(0, 2, 1, 3),
                    lambda a: a.transpose(0, 2, 1, 3).reshape(d, 3 * d).T))
        out.append((f"{hf}attn.qkv.bias", (*lab, "attn", "qkv", "bias"),
                    lambda a: a.reshape(3, h, hd).transpose(1, 0, 2),
                    lambda a: a.transpose(1, 0, 2).reshape(-1)))
        out += _linear(f"{hf}attn.proj", (*lab, "attn", "o"))
        out += _norm(f"{hf}norm2", (*lab, "mlp_norm"))
        out += _linear(f"{hf}mlp.linear_fc1", (*lab, "mlp", "fc1"))
        out += _linear(f"{hf}mlp.linear_fc2", (*lab, "mlp", "fc2"))
    mergers = [("merger", ("merger",))] + [(f"deepstack_merger_list.{k}", ("deepstack_mergers", k))
                                           for k in range(len(c.deepstack_layers))]
    for hf, lab in mergers:
        out += _norm(f"{VISUAL}{hf}.norm", (*root, *lab, "norm"))
        out += _linear(f"{VISUAL}{hf}.linear_fc1", (*root, *lab, "fc1"))
        out += _linear(f"{VISUAL}{hf}.linear_fc2", (*root, *lab, "fc2"))
    return out


def text_map(config: TransformerConfig) -> list:
    """The decoder's :class:`lab.hf.checkpoint.Entry` list inside a Qwen3-VL checkpoint."""
    return ckpt.tensor_map(config, prefix=TEXT, root=("language_model",))


def load_pretrained(path: str | os.PathLike, *, dtype: Any = None) -> VLM:
    """The :class:`lab.nn.VLM` of a Qwen3-VL checkpoint directory.

    Raises ValueError for the MoE variant, unsupported config values, missing or
    unexpected tensors (listed) and shapes that differ from ``config.json``'s.
    """
    path = os.fspath(path)
    hf = ckpt.read_config(path)
    config = config_from_hf(hf, dtype=dtype)
    files = ckpt.weight_files(path)
    entries, vis = text_map(config.text), vision_map(config.vision)
    expected = {e.hf_name for e in entries} | {v[0] for v in vis}
    missing = sorted(expected - set(files))
    if missing:
        raise ValueError(f"checkpoint {path!r} lacks {len(missing)} tensor(s) that its "
                         f"config.json implies: {', '.join(missing[:20])}")
    allowed = expected | ({"lm_head.weight"} if config.text.tie_embeddings else set())
    unexpected = sorted(n for n in files if n not in allowed and not ckpt.IGNORED.match(n))
    if unexpected:
        raise ValueError(f"checkpoint {path!r} has {len(unexpected)} tensor(s) that lab.nn.VLM "
                         f"has no parameter for: {', '.join(unexpected[:20])}")
    graphdef, state = nnx.split(nnx.eval_shape(lambda: VLM(config, rngs=nnx.Rngs(0))))
    values = nnx.to_pure_dict(state)
    dt = config.text.jnp_dtype
    with ExitStack() as stack:
        handles = {f: stack.enter_context(ckpt.open_safetensors(f))
                   for f in sorted(set(files.values()))}

        def tensor(name):
            return handles[files[name]].get_tensor(name)

        ckpt.fill(values, entries, config.text, tensor)
        for name, lab, to_lab, to_hf in vis:
            target = ckpt.get_path(values, lab)
            array = tensor(name)
            want = to_hf(np.zeros(target.shape, np.int8)).shape
            if tuple(array.shape) != tuple(want):
                raise ValueError(f"tensor {name!r}: expected shape {tuple(want)} from "
                                 f"config.json, found {tuple(array.shape)} in the checkpoint")
            ckpt.set_path(values, lab, jnp.asarray(np.asarray(to_lab(array), dtype=dt)))
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def save_pretrained(model: VLM, path: str | os.PathLike, *,
                    max_shard_size: int | str | None = None) -> str:
    """Writes ``model`` as a Qwen3-VL checkpoint directory that
    ``transformers.Qwen3VLForConditionalGeneration.from_pretrained`` loads; returns ``path``.
    Raises ValueError when the config has no Qwen3-VL counterpart (see :func:`config_to_hf`).
    """
    hf = config_to_hf(model.config)
    values = ckpt.params_of(model)
    tensors = ckpt.collect(values, text_map(model.config.text), model.config.text)
    for name, lab, _, to_hf in vision_map(model.config.vision):
        tensors[name] = np.ascontiguousarray(to_hf(np.asarray(ckpt.get_path(values, lab))))
    return ckpt.write_checkpoint(os.fspath(path), tensors, hf, max_shard_size)


__all__ = ["config_from_hf", "config_to_hf", "load_pretrained", "save_pretrained",
           "text_map", "vision_map"]
