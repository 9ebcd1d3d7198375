"""Flax NNX modules shared by Lab's methods."""

from lab.nn.cache import KVCache
from lab.nn.config import TransformerConfig
from lab.nn.layers import RMSNorm, SwiGLU, apply_rope, rope_frequencies
from lab.nn.transformer import CAPTURES, Attention, Block, Intermediates, Transformer, check_tokens

__all__ = [
    "CAPTURES", "Attention", "Block", "Intermediates", "KVCache", "RMSNorm", "SwiGLU",
    "Transformer", "TransformerConfig", "apply_rope", "check_tokens", "rope_frequencies",
]
