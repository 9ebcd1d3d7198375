"""A tiny Hugging Face checkpoint directory for launcher tests of ``--config.model=<hf dir>``."""

import json

from flax import nnx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lab.hf import save_pretrained
from lab.nn import Transformer, TransformerConfig


def tiny_qwen3(path, corpus: str) -> None:
    """Writes to ``path`` a random one-layer Qwen3 (d=32, GQA 2/1, q/k norm) with a byte-level
    BPE tokenizer trained on ``corpus`` (vocabulary 320, ``<|endoftext|>`` as BOS and
    padding, ``<|im_end|>`` as EOS): what ``lab.zoo.load_model(path)`` reads."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus] * 10, trainer)
    tok.save(str(path / "tokenizer.json"))
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "bos_token": "<|endoftext|>"}, open(path / "tokenizer_config.json", "w"))
    cfg = TransformerConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_layers=1, n_heads=2,
                            n_kv_heads=1, head_dim=16, d_ff=64, max_len=256, qk_norm=True)
    save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), path, model_type="qwen3")
