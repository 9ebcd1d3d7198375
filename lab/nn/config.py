"""TransformerConfig: the one decoder family Lab runs (Qwen3 / Qwen2 / Llama)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ATTENTION_IMPLS = (None, "xla", "pallas")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of :class:`lab.nn.Transformer`.

    The fields follow Hugging Face's Qwen3/Llama names where one exists
    (``d_model`` = ``hidden_size``, ``d_ff`` = ``intermediate_size``,
    ``n_kv_heads`` = ``num_key_value_heads``). ``qk_norm`` is Qwen3's per-head
    RMSNorm on queries and keys; ``qkv_bias`` is Qwen2's projection bias.
    ``causal=False`` gives a bidirectional encoder/denoiser on the same code.
    ``attention_impl`` is ``None`` (the dispatcher decides: the compiled flash
    kernel on GPU/TPU, the jnp reference on CPU, ``LAB_KERNELS=xla|pallas``
    overrides), ``"xla"`` or ``"pallas"`` (``kernels_pallas.attention``).

    ``qk_smear = S > 0`` adds to each query and key a learned depthwise mix of
    the raw queries/keys of the ``S`` previous tokens of the same sequence
    (``q'_t = q_t + sum_i w_i * q_{t-i}``, weights per lag, head and channel,
    before q/k norm and RoPE): Olsson et al. (2022)'s smeared keys, a short
    causal convolution as in Primer and H3. It lets one attention layer match
    on a multi-token key, where a plain 2-layer model sits on the associative-
    recall plateau (``docs/zoo.md``). 0 = off, the Qwen/Llama
    architecture unchanged; no Hugging Face family holds ``S > 0``.
    """

    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 768
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    qk_norm: bool = True
    qkv_bias: bool = False
    tie_embeddings: bool = True
    max_len: int = 2048
    dtype: str = "float32"
    attention_impl: str | None = None
    causal: bool = True
    init_std: float = 0.02
    qk_smear: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                     "d_ff", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"TransformerConfig.{name}={value!r}; expected a positive int")
        if not isinstance(self.qk_smear, int) or self.qk_smear < 0:
            raise ValueError(f"TransformerConfig.qk_smear={self.qk_smear!r}; expected an int >= 0 "
                             "(previous tokens mixed into each query and key; 0 = off)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"TransformerConfig.n_heads={self.n_heads} is not a multiple of "
                             f"n_kv_heads={self.n_kv_heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise ValueError(f"TransformerConfig.head_dim={self.head_dim}; rotary embeddings "
                             "need an even head_dim")
        if self.dtype not in DTYPES:
            raise ValueError(f"TransformerConfig.dtype={self.dtype!r}; expected one of "
                             f"{tuple(DTYPES)}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"TransformerConfig.attention_impl={self.attention_impl!r}; expected "
                             f"one of {ATTENTION_IMPLS}")

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    def replace(self, **kwargs) -> TransformerConfig:
        return dataclasses.replace(self, **kwargs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        d, h, kv, hd, f, v = (self.d_model, self.n_heads, self.n_kv_heads, self.head_dim,
                              self.d_ff, self.vocab_size)
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.qkv_bias:
            attn += h * hd + 2 * kv * hd
        norms = 2 * d + (2 * hd if self.qk_norm else 0)
        smear = self.qk_smear * (h + kv) * hd
        layer = attn + 3 * d * f + norms + smear
        return v * d * (1 if self.tie_embeddings else 2) + self.n_layers * layer + d
