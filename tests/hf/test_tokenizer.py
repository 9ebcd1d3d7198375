"""lab.hf.load_tokenizer: ByteTokenizer's contract over tokenizer.json, ids as in transformers."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lab.hf import HFTokenizer, load_tokenizer

CORPUS = ["the cat sat on the mat", "a dog ate the cat food", "numbers: 12 + 30 = 42",
          "Lab loads Qwen3 and Llama checkpoints"] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture()
def tok_dir(tmp_path):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    json.dump({"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"},
               "bos_token": None}, open(tmp_path / "tokenizer_config.json", "w"))
    return tmp_path


def test_contract_and_special_ids(tok_dir):
    tok = load_tokenizer(tok_dir)
    assert isinstance(tok, HFTokenizer) and isinstance(tok.tokenizer, Tokenizer)
    assert tok.vocab_size == tok.tokenizer.get_vocab_size(with_added_tokens=True) == 300
    assert tok.eos_id == tok.tokenizer.token_to_id("<|im_end|>") == 2
    assert tok.pad_id == 0 and tok.bos_id is None and tok.sep_id is None
    text = "the cat ate 42 mats"
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert len(ids) < len(text)  # merges were learned
    assert tok.decode(ids) == text
    assert tok.decode([*ids, tok.eos_id]) == text + "<|im_end|>"
    assert tok.decode([*ids, tok.eos_id], skip_special_tokens=True) == text


def test_ids_equal_transformers(tok_dir):
    transformers = pytest.importorskip("transformers")
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    tok = load_tokenizer(tok_dir / "tokenizer.json")
    for text in ["numbers: 12 + 30 = 42", "unseen wörds ✓ <|im_end|>"]:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False)
        assert tok.decode(tok.encode(text)) == ref.decode(ref.encode(text))


def test_eos_falls_back_to_generation_config(tok_dir):
    (tok_dir / "tokenizer_config.json").unlink()
    json.dump({"eos_token_id": [2, 0], "bos_token_id": 1},
              open(tok_dir / "generation_config.json", "w"))
    tok = load_tokenizer(tok_dir)
    assert (tok.eos_id, tok.bos_id, tok.pad_id) == (2, 1, None)


def test_errors_name_the_problem(tok_dir, tmp_path_factory):
    json.dump({"eos_token": "</s>"}, open(tok_dir / "tokenizer_config.json", "w"))
    with pytest.raises(ValueError, match=r"eos_token='</s>' is not in the vocabulary"):
        load_tokenizer(tok_dir)
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path_factory.mktemp("empty"))
