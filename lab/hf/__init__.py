"""Hugging Face interop: Qwen3 / Qwen2 / Llama / Qwen3-VL safetensors checkpoints and tokenizers.

``load_pretrained(dir)`` -> :class:`lab.nn.Transformer` (a Qwen3-VL directory ->
:class:`lab.nn.VLM`, see :mod:`lab.hf.qwen3_vl`); ``save_pretrained(model, dir)``
writes a directory ``transformers.AutoModelForCausalLM.from_pretrained`` (for a VLM,
``Qwen3VLForConditionalGeneration.from_pretrained``) loads with the same logits;
``load_tokenizer(dir)`` returns ``tokenizer.json`` as ``lab.data.tokenizer.HFTokenizer``
with the checkpoint's special tokens.
No torch is needed for any of them.
"""

from lab.hf.checkpoint import load_pretrained, save_pretrained, tensor_map
from lab.hf.config import SUPPORTED_MODEL_TYPES, config_from_hf, config_to_hf
from lab.hf.tokenizer import load_tokenizer

__all__ = [
    "SUPPORTED_MODEL_TYPES", "config_from_hf", "config_to_hf", "load_pretrained",
    "load_tokenizer", "save_pretrained", "tensor_map",
]
