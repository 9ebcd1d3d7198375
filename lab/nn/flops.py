"""Analytic forward FLOPs of Lab's Transformer, a ViT encoder and a VLM built from the two.

Only matrix products are counted, each ``[m, k] @ [k, n]`` as ``2 m n k``
(multiply and add; Kaplan et al. 2020, "Scaling Laws for Neural Language
Models", Sec. 2.1, and the PaLM paper's appendix B count the same way).
Norms, activations, RoPE, softmax, masks and the embedding lookup are not
counted: they are O(tokens x width) against the O(tokens x width^2) of the
products and O(tokens^2 x width) of attention, a few percent at the sizes
where FLOPs matter (``tests/nn/test_flops.py`` measures the gap to XLA's
count, which includes them).

:func:`vlm_config_flops` counts a :class:`lab.nn.VLM` from its config and the frame
count and resolution (the ViT's dimensions from :func:`vision_dims`).

Attention's two products, ``Q K^T`` and ``P V``, cost ``2 * H * hd`` FLOPs per
(query, key) pair each. Which pairs are computed depends on the kernel:

- ``"dense"``: every query against every key, ``T * (context + T)`` pairs;
- ``"causal"``: only the unmasked pairs, ``T * context + T (T + 1) / 2``
  (an ideal causal kernel);
- ``"lab"`` (default): what :func:`kernels_pallas.attention.reference`
  computes: without a cache and with ``config.causal``, query blocks of
  :func:`~kernels_pallas.attention.causal_block` rows that each read their key
  prefix; otherwise dense (a decode step reads its cache's whole capacity, so
  pass ``context = capacity - tokens``).
"""

from __future__ import annotations

import dataclasses

from flax import nnx

from kernels_pallas.attention import causal_block
from lab.nn.config import TransformerConfig, VisionConfig, VLMConfig

ATTENTION_COUNTS = ("lab", "dense", "causal")


def _check_count(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}; expected an int >= {low}")
    return value


def attention_pairs(tokens: int, context: int = 0, *, causal: bool = True,
                    attention: str = "lab") -> int:
    """(query, key) pairs one head's ``Q K^T`` computes for ``tokens`` queries after
    ``context`` cached keys (see the module docstring for ``attention``)."""
    if attention not in ATTENTION_COUNTS:
        raise ValueError(f"attention={attention!r}; expected one of {ATTENTION_COUNTS}")
    t, c = tokens, context
    if attention == "dense" or not causal:
        return t * (c + t)
    if attention == "causal":
        return t * c + t * (t + 1) // 2
    block = causal_block(t)
    if c or not block:
        return t * (c + t)
    return sum((min(s + block, t) - s) * min(s + block, t) for s in range(0, t, block))


def transformer_flops(config: TransformerConfig, batch: int, tokens: int, *, context: int = 0,
                      attention: str = "lab", logits: bool = True) -> dict[str, int]:
    """Forward FLOPs of :class:`lab.nn.Transformer` on ``batch`` rows of ``tokens`` new tokens.

    ``context`` cached tokens are attended to as keys (a decode step: ``tokens=1``).
    ``logits=False`` leaves out the LM head (a forward that stops at the residual
    stream). Returns ``{"qkv", "attn_scores", "attn_values", "attn_out", "mlp",
    "lm_head", "total"}``, summed over layers and rows.
    """
    c = config
    b = _check_count("batch", batch)
    t = _check_count("tokens", tokens)
    ctx = _check_count("context", context, 0)
    n = b * t                                            # token rows through every matmul
    pairs = b * attention_pairs(t, ctx, causal=c.causal, attention=attention)
    per_layer = {
        "qkv": 2 * n * c.d_model * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim,
        "attn_scores": 2 * pairs * c.n_heads * c.head_dim,
        "attn_values": 2 * pairs * c.n_heads * c.head_dim,
        "attn_out": 2 * n * c.n_heads * c.head_dim * c.d_model,
        "mlp": 2 * n * c.d_model * 2 * c.d_ff + 2 * n * c.d_ff * c.d_model,   # gate_up, down
    }
    out = {k: v * c.n_layers for k, v in per_layer.items()}
    out["lm_head"] = 2 * n * c.d_model * c.vocab_size if logits else 0
    out["total"] = sum(out.values())
    return out


@dataclasses.dataclass(frozen=True)
class VitDims:
    """The dimensions of a ViT encoder and its projector into a language model.

    ``patches``: tokens per image before merging (e.g. ``(64 // 8) ** 2``);
    ``patch_size``, ``channels``, ``temporal_patch`` (frames per patch, 2 in
    Qwen2-VL): the patch embedding reads ``channels * temporal_patch *
    patch_size**2`` values per patch. ``mlp_gated``: a SwiGLU MLP (three
    ``d_model x mlp_dim`` matrices) instead of two. ``merge``: the projector
    concatenates ``merge x merge`` neighbouring patches (Qwen2-VL's
    ``spatial_merge_size``) and maps the ``d_model * merge**2`` vector through
    a hidden layer of ``projector_hidden`` (0 = the same width) to ``out_dim``
    (the LM's ``d_model``; 0 = no projector).
    """

    patches: int
    patch_size: int
    d_model: int
    n_layers: int
    n_heads: int
    head_dim: int
    mlp_dim: int
    channels: int = 3
    temporal_patch: int = 1
    mlp_gated: bool = False
    merge: int = 1
    out_dim: int = 0
    projector_hidden: int = 0

    def __post_init__(self):
        for name in ("patches", "patch_size", "d_model", "n_layers", "n_heads", "head_dim",
                     "mlp_dim", "channels", "temporal_patch", "merge"):
            _check_count(f"VitDims.{name}", getattr(self, name))
        for name in ("out_dim", "projector_hidden"):
            _check_count(f"VitDims.{name}", getattr(self, name), 0)
        if self.patches % (self.merge ** 2):
            raise ValueError(f"VitDims.patches={self.patches} is not a multiple of "
                             f"merge**2={self.merge ** 2}")

    @property
    def tokens_out(self) -> int:
        """Tokens per image handed to the language model."""
        return self.patches // self.merge ** 2


def vit_flops(dims: VitDims, images: int) -> dict[str, int]:
    """Forward FLOPs of a pre-norm ViT (bidirectional attention within each image) on
    ``images`` images (or temporal patches) and of its projector.

    Returns ``{"patch_embed", "qkv", "attn_scores", "attn_values", "attn_out", "mlp",
    "projector", "total"}``.
    """
    d = dims
    m = _check_count("images", images)
    n = m * d.patches
    width = d.n_heads * d.head_dim
    per_layer = {
        "qkv": 2 * n * d.d_model * 3 * width,
        "attn_scores": 2 * m * d.patches ** 2 * width,
        "attn_values": 2 * m * d.patches ** 2 * width,
        "attn_out": 2 * n * width * d.d_model,
        "mlp": 2 * n * d.d_model * d.mlp_dim * (3 if d.mlp_gated else 2),
    }
    out = {"patch_embed": 2 * n * d.channels * d.temporal_patch * d.patch_size ** 2 * d.d_model}
    out.update({k: v * d.n_layers for k, v in per_layer.items()})
    merged, wide = m * d.tokens_out, d.d_model * d.merge ** 2
    hidden = d.projector_hidden or wide
    out["projector"] = 2 * merged * (wide * hidden + hidden * d.out_dim) if d.out_dim else 0
    out["total"] = sum(out.values())
    return out


def vlm_flops(dims: VitDims, config: TransformerConfig, batch: int, images: int,
              text_tokens: int, *, attention: str = "lab") -> dict[str, int]:
    """Forward FLOPs of a VLM: ``images`` images (frames) per row through the ViT, their
    ``images * dims.tokens_out`` tokens plus ``text_tokens`` through the language model.

    Returns ``{"vision", "lm", "total", "lm_tokens"}``.
    """
    if dims.out_dim and dims.out_dim != config.d_model:
        raise ValueError(f"VitDims.out_dim={dims.out_dim} differs from the language model's "
                         f"d_model={config.d_model}")
    b = _check_count("batch", batch)
    seq = _check_count("images", images) * dims.tokens_out + _check_count(
        "text_tokens", text_tokens, 0)
    vision = vit_flops(dims, b * images)["total"]
    lm = transformer_flops(config, b, seq, attention=attention)["total"]
    return {"vision": vision, "lm": lm, "total": vision + lm, "lm_tokens": seq}


def vision_dims(vision: VisionConfig, height: int, width: int) -> VitDims:
    """The :class:`VitDims` of :class:`lab.nn.VisionEncoder` with ``vision``'s config on
    ``height x width`` pixel frames (multiples of ``patch_size * spatial_merge_size``):
    ``(height / P) (width / P)`` patches of ``C x Tp x P x P`` pixels, a GELU MLP of
    ``d_ff``, the ``m^2 D -> m^2 D -> out_dim`` merger."""
    step = vision.patch_size * vision.spatial_merge_size
    for name, value in (("height", height), ("width", width)):
        _check_count(name, value)
        if value % step:
            raise ValueError(f"{name}={value} is not a multiple of patch_size * "
                             f"spatial_merge_size = {step}")
    return VitDims(patches=(height // vision.patch_size) * (width // vision.patch_size),
                   patch_size=vision.patch_size, d_model=vision.d_model,
                   n_layers=vision.n_layers, n_heads=vision.n_heads, head_dim=vision.head_dim,
                   mlp_dim=vision.d_ff, channels=vision.in_channels,
                   temporal_patch=vision.temporal_patch_size, merge=vision.spatial_merge_size,
                   out_dim=vision.out_dim)


def vlm_config_flops(model: VLMConfig | nnx.Module, batch: int, frames: int, height: int,
                     width: int, text_tokens: int, *, attention: str = "lab") -> dict[str, int]:
    """Forward FLOPs of :class:`lab.nn.VLM` (or its :class:`VLMConfig`) on ``batch`` rows,
    each ``frames`` frames (or images) of ``height x width`` pixels and ``text_tokens``
    other tokens (question, vision start / end markers, timestamps).

    ``frames / temporal_patch_size`` temporal patches per row go through the ViT
    (:func:`vit_flops` of :func:`vision_dims`; each DeepStack merger costs one more
    projector), their ``(h / m) (w / m)`` merged tokens each plus ``text_tokens`` through
    the decoder (:func:`transformer_flops`, LM head included). Returns ``{"vision", "lm",
    "total", "lm_tokens", "visual_tokens"}`` (``visual_tokens`` per row), so a method's
    compute budget (frames x resolution) needs no hand-built :class:`VitDims`.
    """
    config = getattr(model, "config", model)
    if not isinstance(config, VLMConfig):
        raise ValueError(f"model={type(model).__name__}; expected a lab.nn.VLM or VLMConfig")
    tp = config.vision.temporal_patch_size
    _check_count("frames", frames)
    if frames % tp:
        raise ValueError(f"frames={frames} is not a multiple of temporal_patch_size={tp}")
    dims = vision_dims(config.vision, height, width)
    out = vlm_flops(dims, config.text, batch, frames // tp, text_tokens, attention=attention)
    vit = vit_flops(dims, batch * (frames // tp))
    deep = len(config.vision.deepstack_layers) * vit["projector"]
    out["vision"] += deep
    out["total"] += deep
    out["visual_tokens"] = (frames // tp) * dims.tokens_out
    return out
