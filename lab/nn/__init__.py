"""Flax NNX modules shared by Lab's methods."""

from lab.nn.cache import KVCache, LayerKV
from lab.nn.config import TransformerConfig, VisionConfig, VLMConfig
from lab.nn.flops import VitDims, transformer_flops, vit_flops, vlm_flops
from lab.nn.hooks import check_neuron_scale, edit_residual, scale_neurons
from lab.nn.layers import (
                           Fused,
                           GeluMLP,
                           LayerNorm,
                           RMSNorm,
                           SwiGLU,
                           apply_rope,
                           axial_angles,
                           mrope_angles,
                           rope_frequencies,
)
from lab.nn.sae import FeatureScale, SparseAutoencoder, fit_sae, sae_stats
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
from lab.nn.vision import PatchMerger, VisionEncoder, patchify
from lab.nn.vlm import VLM, Embedded, choice_posterior, rope_index

__all__ = [
    "CAPTURES", "VLM", "Attention", "Block", "Embedded", "Fused", "GeluMLP", "Intermediates",
    "KVCache", "LayerKV", "LayerNorm", "PatchMerger", "RMSNorm", "SwiGLU", "Transformer",
    "TransformerConfig", "VLMConfig", "VisionConfig", "VisionEncoder", "apply_rope",
    "axial_angles", "check_tokens", "choice_posterior", "fuse_qkv", "mrope_angles",
    "rope_frequencies", "rope_index", "scale_neurons", "check_neuron_scale", "split_qkv",
    "VitDims", "transformer_flops", "vit_flops", "vlm_flops", "edit_residual", "FeatureScale",
    "SparseAutoencoder", "fit_sae", "sae_stats", "patchify",
]
