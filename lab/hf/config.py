"""Hugging Face ``config.json`` <-> :class:`lab.nn.TransformerConfig` for Qwen3, Qwen2 and Llama.

Field map (Hugging Face name -> Lab name):

================================  ==========================================
``vocab_size``                    ``vocab_size``
``hidden_size``                   ``d_model``
``intermediate_size``             ``d_ff``
``num_hidden_layers``             ``n_layers``
``num_attention_heads``           ``n_heads``
``num_key_value_heads``           ``n_kv_heads`` (default: ``n_heads``)
``head_dim``                      ``head_dim`` (default: hidden / heads)
``rope_theta`` or                 ``rope_theta`` (transformers 5 moved it
``rope_parameters.rope_theta``    into ``rope_parameters``; both are read)
``rms_norm_eps``                  ``norm_eps``
``tie_word_embeddings``           ``tie_embeddings``
``max_position_embeddings``       ``max_len``
``model_type == "qwen3"``         ``qk_norm=True``
``model_type == "qwen2"``         ``qkv_bias=True``
``attention_bias`` (llama/qwen3)  ``qkv_bias`` (the o-projection bias it
                                  also adds must be zero, see checkpoint.py)
``dtype`` / ``torch_dtype``       ``dtype`` unless the caller overrides it
================================  ==========================================

Everything Lab's decoder cannot represent (scaled RoPE, another activation,
sliding-window layers, MLP biases) is refused with a ValueError naming the
field, the value and what is supported, rather than loaded into a model that
would silently compute something else.
"""

from __future__ import annotations

from typing import Any

from lab.nn import TransformerConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16",
                "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _dtype_name(dtype: Any) -> str:
    """Canonical Lab dtype string for ``dtype`` (a string, numpy/jax dtype or scalar type)."""
    if dtype is None:
        return "float32"
    name = str(getattr(dtype, "__name__", None) or getattr(dtype, "name", None) or dtype)
    name = name.replace("torch.", "").replace("jnp.", "")
    if name not in _DTYPE_NAMES:
        raise ValueError(f"dtype={dtype!r} is not supported; expected one of "
                         f"{sorted(set(_DTYPE_NAMES.values()))}")
    return _DTYPE_NAMES[name]


def rope_theta_of(hf: dict) -> float:
    """RoPE base from ``rope_parameters`` (transformers >= 5) or ``rope_theta`` (older).

    Raises ValueError when the RoPE is scaled (``rope_type`` other than
    ``"default"``): Lab's rotary embedding is the unscaled one.
    """
    params = hf.get("rope_parameters") or {}
    legacy = hf.get("rope_scaling") or {}
    for field, spec in (("rope_parameters", params), ("rope_scaling", legacy)):
        if not isinstance(spec, dict):
            raise ValueError(f"config.json {field}={spec!r}; expected a dict or null")
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind not in (None, "default"):
            raise ValueError(f"config.json {field}.rope_type={kind!r} (scaled RoPE) is not "
                             "supported; lab.nn.Transformer implements rope_type='default' only")
    theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
    return float(theta)


def _int(hf: dict, field: str, default: Any = None) -> int:
    value = hf.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config.json {field}={value!r}; expected a positive int")
    return value


def config_from_hf(hf: dict, *, dtype: Any = None) -> TransformerConfig:
    """Returns the :class:`TransformerConfig` of a Hugging Face ``config.json`` dict.

    Args:
      hf: the parsed ``config.json``.
      dtype: parameter dtype of the Lab model; ``None`` (or ``"auto"``) takes the checkpoint's
        (``dtype`` or ``torch_dtype``), as ``transformers``' ``dtype="auto"`` does,
        and float32 when the checkpoint names none.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"config.json model_type={model_type!r} is not supported; lab.hf "
                         f"supports {SUPPORTED_MODEL_TYPES}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json hidden_act={act!r} is not supported; lab.nn.Transformer "
                         "uses SwiGLU with 'silu'")
    if hf.get("mlp_bias"):
        raise ValueError("config.json mlp_bias=True is not supported; lab.nn.Transformer's MLP "
                         "has no biases")
    if hf.get("use_sliding_window"):
        raise ValueError("config.json use_sliding_window=True is not supported; lab.nn."
                         "Transformer attends over the full context in every layer")
    layer_types = hf.get("layer_types") or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise ValueError(f"config.json layer_types contains {other}; only 'full_attention' "
                         "layers are supported")
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads"):
        if field not in hf:
            raise ValueError(f"config.json has no {field!r}; it is required for "
                             f"model_type={model_type!r}")
    n_heads = _int(hf, "num_attention_heads")
    d_model = _int(hf, "hidden_size")
    head_dim = _int(hf, "head_dim") if hf.get("head_dim") is not None else d_model // n_heads
    n_kv_heads = _int(hf, "num_key_value_heads") if hf.get("num_key_value_heads") else n_heads
    if dtype is None or dtype == "auto":
        dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    return TransformerConfig(
        vocab_size=_int(hf, "vocab_size"),
        d_model=d_model,
        n_layers=_int(hf, "num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        d_ff=_int(hf, "intermediate_size"),
        rope_theta=rope_theta_of(hf),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qk_norm=model_type == "qwen3",
        qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_len=_int(hf, "max_position_embeddings", 2048),
        dtype=_dtype_name(dtype),
    )


def o_bias_expected(hf: dict) -> bool:
    """Whether the checkpoint carries ``o_proj.bias`` (``attention_bias`` in Llama/Qwen3)."""
    return hf.get("model_type") in ("llama", "qwen3") and bool(hf.get("attention_bias", False))


def default_model_type(config: TransformerConfig) -> str:
    """Family that holds ``config`` exactly: q/k norm -> qwen3, qkv bias -> qwen2, else llama."""
    if config.qk_norm:
        return "qwen3"
    return "qwen2" if config.qkv_bias else "llama"


def config_to_hf(config: TransformerConfig, model_type: str | None = None) -> dict:
    """Returns a ``config.json`` dict that ``transformers`` loads as the same model.

    ``model_type`` defaults to :func:`default_model_type`. Raises ValueError when
    the family cannot represent ``config`` (Qwen3 always has q/k norm, Qwen2
    always has qkv biases and never q/k norm, Llama has no q/k norm; every
    family is causal and none smears queries and keys).
    """
    mt = model_type or default_model_type(config)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type={mt!r} is not supported; expected one of "
                         f"{SUPPORTED_MODEL_TYPES}")
    if not config.causal:
        raise ValueError("TransformerConfig.causal=False has no Hugging Face counterpart in "
                         f"{SUPPORTED_MODEL_TYPES}; they are causal LMs")
    if config.qk_smear:
        raise ValueError(f"TransformerConfig.qk_smear={config.qk_smear} has no Hugging Face "
                         f"counterpart in {SUPPORTED_MODEL_TYPES}; only qk_smear=0 exports")
    later = {k: getattr(config, k) for k in ("norm", "mlp", "o_bias", "mrope_section")}
    if later != {"norm": "rmsnorm", "mlp": "swiglu", "o_bias": False, "mrope_section": None}:
        raise ValueError(f"TransformerConfig {later} (a vision block or an M-RoPE decoder) has "
                         f"no counterpart in {SUPPORTED_MODEL_TYPES}; a lab.nn.VLM saves as "
                         "qwen3_vl")
    if mt == "qwen3" and not config.qk_norm:
        raise ValueError("model_type='qwen3' needs TransformerConfig.qk_norm=True")
    if mt in ("qwen2", "llama") and config.qk_norm:
        raise ValueError(f"model_type={mt!r} has no q/k norm but TransformerConfig.qk_norm=True; "
                         "use model_type='qwen3'")
    if mt == "qwen2" and not config.qkv_bias:
        raise ValueError("model_type='qwen2' always has q/k/v biases but "
                         "TransformerConfig.qkv_bias=False; use model_type='llama'")
    hf = {
        "architectures": [ARCHITECTURES[mt]],
        "model_type": mt,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "tie_word_embeddings": config.tie_embeddings,
        "attention_dropout": 0.0,
        "initializer_range": config.init_std,
        "use_cache": True,
        "dtype": config.dtype,
        "torch_dtype": config.dtype,
    }
    if mt in ("llama", "qwen3"):
        hf["attention_bias"] = config.qkv_bias
    if mt == "llama":
        hf["mlp_bias"] = False
    if mt in ("qwen2", "qwen3"):
        hf["use_sliding_window"] = False
        hf["sliding_window"] = None
        hf["max_window_layers"] = config.n_layers
        hf["layer_types"] = ["full_attention"] * config.n_layers
    return hf
