"""TransformerConfig: the one decoder family Lab runs (Qwen3 / Qwen2 / Llama), and the
vision-language configs built on it (:class:`VisionConfig`, :class:`VLMConfig`, Qwen3-VL)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ATTENTION_IMPLS = (None, "xla", "pallas")
NORMS = ("rmsnorm", "layernorm")
MLPS = ("swiglu", "gelu_tanh", "gelu")
# Fields added for the vision tower and M-RoPE: to_dict() leaves them out at their
# defaults, so the configs (and zoo digests) of models written before them are unchanged.
LATER_FIELDS = {"norm": "rmsnorm", "mlp": "swiglu", "o_bias": False, "mrope_section": None}


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

    The vision tower's blocks (:class:`lab.nn.VisionEncoder`, Qwen3-VL's ViT) are the
    same :class:`lab.nn.Block` with ``norm="layernorm"`` (LayerNorm with bias),
    ``mlp="gelu_tanh"`` or ``"gelu"`` (``fc2(gelu(fc1 x))`` with biases, tanh or erf
    GELU), ``o_bias=True`` and ``causal=False``. ``mrope_section = (t, h, w)`` makes the
    rotary embedding Qwen3-VL's interleaved multimodal RoPE (M-RoPE, Bai et al. 2025):
    frequency ``j`` of the ``head_dim / 2`` rotates by the height position when
    ``j % 3 == 1 and j < 3h``, by the width position when ``j % 3 == 2 and j < 3w``,
    else by the temporal one (``t + h + w = head_dim / 2``); with the three positions
    equal (text tokens) it is the plain RoPE.
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
    norm: str = "rmsnorm"
    mlp: str = "swiglu"
    o_bias: bool = False
    mrope_section: tuple[int, ...] | None = None

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
        if self.norm not in NORMS:
            raise ValueError(f"TransformerConfig.norm={self.norm!r}; expected one of {NORMS}")
        if self.mlp not in MLPS:
            raise ValueError(f"TransformerConfig.mlp={self.mlp!r}; expected one of {MLPS}")
        if self.mrope_section is not None:
            sec = tuple(self.mrope_section)
            object.__setattr__(self, "mrope_section", sec)
            if (len(sec) != 3 or any(not isinstance(v, int) or v < 0 for v in sec)
                    or sum(sec) != self.head_dim // 2):
                raise ValueError(f"TransformerConfig.mrope_section={self.mrope_section!r}; "
                                 "expected three ints >= 0 (temporal, height, width) summing "
                                 f"to head_dim / 2 = {self.head_dim // 2}")

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    def replace(self, **kwargs) -> TransformerConfig:
        return dataclasses.replace(self, **kwargs)

    def to_dict(self) -> dict:
        """The fields as a dict; those of :data:`LATER_FIELDS` only when not at their default
        (``TransformerConfig(**d)`` restores the same config)."""
        d = dataclasses.asdict(self)
        for name, default in LATER_FIELDS.items():
            if d[name] == default:
                del d[name]
        return d

    def num_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        d, h, kv, hd, f, v = (self.d_model, self.n_heads, self.n_kv_heads, self.head_dim,
                              self.d_ff, self.vocab_size)
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.qkv_bias:
            attn += h * hd + 2 * kv * hd
        if self.o_bias:
            attn += d
        per_norm = 2 * d if self.norm == "layernorm" else d
        norms = 2 * per_norm + (2 * hd if self.qk_norm else 0)
        smear = self.qk_smear * (h + kv) * hd
        mlp = 3 * d * f if self.mlp == "swiglu" else 2 * d * f + f + d
        layer = attn + mlp + norms + smear
        return v * d * (1 if self.tie_embeddings else 2) + self.n_layers * layer + per_norm


VISION_ACTS = ("gelu_tanh", "gelu")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """Hyper-parameters of :class:`lab.nn.VisionEncoder`, Qwen3-VL's ViT (Bai et al. 2025,
    ``Qwen3VLVisionModel``), named as Lab's decoder fields where one exists.

    ``d_model`` (``hidden_size``), ``n_layers`` (``depth``), ``n_heads``, ``d_ff``
    (``intermediate_size``): the bidirectional pre-LayerNorm blocks, ``head_dim =
    d_model / n_heads``. A patch is ``in_channels x temporal_patch_size x patch_size
    x patch_size`` pixels, embedded by one linear map (Hugging Face's stride = kernel
    Conv3d). ``num_position_embeddings``: a learned square ``sqrt(n) x sqrt(n)``
    position table, bilinearly resampled to each image's patch grid (0 = none);
    ``rope``: 2-D (axial) rotary embedding of the patch row and column in every
    block. ``spatial_merge_size = m``: the merger concatenates each ``m x m`` block
    of patches and maps it by LayerNorm + MLP to one token of width ``out_dim`` (the
    text model's ``d_model``). ``deepstack_layers``: blocks whose output, merged by
    its own merger, is added to the text model's residual stream at the visual
    tokens after its first ``len(deepstack_layers)`` blocks (DeepStack, Meng et al.
    2024). ``act``: the blocks' MLP GELU, ``"gelu_tanh"`` (Hugging Face's
    ``gelu_pytorch_tanh``) or ``"gelu"`` (erf).
    """

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 128
    in_channels: int = 3
    patch_size: int = 4
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_dim: int = 64
    num_position_embeddings: int = 64
    rope: bool = True
    rope_theta: float = 10_000.0
    deepstack_layers: tuple[int, ...] = ()
    act: str = "gelu_tanh"
    norm_eps: float = 1e-6
    dtype: str = "float32"
    init_std: float = 0.02

    def __post_init__(self):
        for name in ("d_model", "n_layers", "n_heads", "d_ff", "in_channels", "patch_size",
                     "temporal_patch_size", "spatial_merge_size", "out_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"VisionConfig.{name}={value!r}; expected a positive int")
        if self.d_model % self.n_heads:
            raise ValueError(f"VisionConfig.d_model={self.d_model} is not a multiple of "
                             f"n_heads={self.n_heads}")
        if self.rope and self.head_dim % 4:
            raise ValueError(f"VisionConfig head_dim={self.head_dim} (d_model / n_heads); the "
                             "2-D rotary embedding needs a multiple of 4 (rope=False to drop it)")
        n = self.num_position_embeddings
        if not isinstance(n, int) or n < 0 or int(round(n ** 0.5)) ** 2 != n:
            raise ValueError(f"VisionConfig.num_position_embeddings={n!r}; expected 0 or a "
                             "perfect square (a side x side table)")
        layers = tuple(self.deepstack_layers)
        object.__setattr__(self, "deepstack_layers", layers)
        if any(not isinstance(i, int) or not 0 <= i < self.n_layers for i in layers) \
                or len(set(layers)) != len(layers):
            raise ValueError(f"VisionConfig.deepstack_layers={layers!r}; expected distinct "
                             f"block indices in [0, {self.n_layers})")
        if self.act not in VISION_ACTS:
            raise ValueError(f"VisionConfig.act={self.act!r}; expected one of {VISION_ACTS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"VisionConfig.dtype={self.dtype!r}; expected one of "
                             f"{tuple(DTYPES)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def patch_dim(self) -> int:
        """Pixels per patch: the width of a row of ``pixel_values``."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    def block_config(self) -> TransformerConfig:
        """The :class:`TransformerConfig` of the vision blocks (:class:`lab.nn.Block`)."""
        return TransformerConfig(
            vocab_size=1, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
            n_kv_heads=self.n_heads, head_dim=self.head_dim, d_ff=self.d_ff,
            rope_theta=self.rope_theta, norm_eps=self.norm_eps, qk_norm=False, qkv_bias=True,
            o_bias=True, norm="layernorm", mlp=self.act, causal=False, max_len=1 << 30,
            dtype=self.dtype, init_std=self.init_std)

    def replace(self, **kwargs) -> VisionConfig:
        return dataclasses.replace(self, **kwargs)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class VLMConfig:
    """:class:`lab.nn.VLM` = a :class:`VisionConfig` tower + a :class:`TransformerConfig`
    decoder with M-RoPE (``text.mrope_section`` set), Qwen3-VL's layout.

    ``image_token_id`` / ``video_token_id``: the image / video token ids whose embeddings the
    image / video-frame tokens replace (one per merged ``m x m`` patch block);
    ``vision_start_token_id`` / ``vision_end_token_id``: the ids that bracket them in
    Qwen3-VL's chat format (the model treats them as text).
    """

    text: TransformerConfig = dataclasses.field(default_factory=lambda: TransformerConfig(
        vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
        max_len=1024, tie_embeddings=False, mrope_section=(2, 3, 3)))
    vision: VisionConfig = dataclasses.field(default_factory=VisionConfig)
    image_token_id: int = 60
    video_token_id: int = 61
    vision_start_token_id: int = 62
    vision_end_token_id: int = 63

    def __post_init__(self):
        if isinstance(self.text, dict):
            object.__setattr__(self, "text", TransformerConfig(**self.text))
        if isinstance(self.vision, dict):
            object.__setattr__(self, "vision", VisionConfig(**self.vision))
        t, v = self.text, self.vision
        if t.mrope_section is None:
            raise ValueError("VLMConfig.text.mrope_section=None; a VLM's decoder needs M-RoPE "
                             "sections (t, h, w) summing to head_dim / 2")
        if not t.causal or t.qk_smear:
            raise ValueError("VLMConfig.text must be a causal decoder without qk_smear")
        if v.out_dim != t.d_model:
            raise ValueError(f"VLMConfig.vision.out_dim={v.out_dim} differs from "
                             f"text.d_model={t.d_model}; the merger maps into the decoder")
        if len(v.deepstack_layers) > t.n_layers:
            raise ValueError(f"VLMConfig.vision.deepstack_layers has {len(v.deepstack_layers)} "
                             f"entries; the decoder has only {t.n_layers} blocks to add them to")
        ids = {}
        for name in ("image_token_id", "video_token_id", "vision_start_token_id",
                     "vision_end_token_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) \
                    or not 0 <= value < t.vocab_size:
                raise ValueError(f"VLMConfig.{name}={value!r}; expected an id in "
                                 f"[0, text.vocab_size={t.vocab_size})")
            if value in ids:
                raise ValueError(f"VLMConfig.{name}={value} equals {ids[value]}; the special "
                                 "ids must be distinct")
            ids[value] = name

    def replace(self, **kwargs) -> VLMConfig:
        return dataclasses.replace(self, **kwargs)

    def to_dict(self) -> dict:
        return {"text": self.text.to_dict(), "vision": self.vision.to_dict(),
                **{k: getattr(self, k) for k in ("image_token_id", "video_token_id",
                                                 "vision_start_token_id",
                                                 "vision_end_token_id")}}
