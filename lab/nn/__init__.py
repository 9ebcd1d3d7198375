"""Flax NNX modules shared by Lab's methods."""

from lab.nn.cache import KVCache, LayerKV
from lab.nn.config import TransformerConfig
from lab.nn.flops import VitDims, transformer_flops, vit_flops, vlm_flops
from lab.nn.layers import Fused, RMSNorm, SwiGLU, apply_rope, rope_frequencies
from lab.nn.transformer import (
                                CAPTURES,
                                Attention,
                                Block,
                                Intermediates,
                                Transformer,
                                check_tokens,
                                fuse_qkv,
                                split_qkv,
)

__all__ = [
    "CAPTURES", "Attention", "Block", "Fused", "Intermediates", "KVCache", "LayerKV", "RMSNorm",
    "SwiGLU", "Transformer", "TransformerConfig", "apply_rope", "check_tokens", "fuse_qkv",
    "rope_frequencies", "split_qkv",
]
__all__ += ["VitDims", "transformer_flops", "vit_flops", "vlm_flops"]
