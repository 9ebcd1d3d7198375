"""lab.hf.load_tokenizer: ByteTokenizer's contract over tokenizer.json, ids as in transformers."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lab.data.tokenizer import HFTokenizer
from lab.hf import load_tokenizer

CORPUS = ["the cat sat on the mat", "a dog ate the cat food", "numbers: 12 + 30 = 42",
          "Lab loads Qwen3 and Llama checkpoints"] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]


@pytest.fixture()
def tok_dir(tmp_path):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    # Non-default choices, so that a name-based guess would give other ids.
    json.dump({"eos_token": "<|im_end|>", "pad_token": {"content": "<|im_start|>"},
               "bos_token": "<|endoftext|>"}, open(tmp_path / "tokenizer_config.json", "w"))
    return tmp_path


def test_contract_and_special_ids(tok_dir):
    tok = load_tokenizer(tok_dir)
    assert isinstance(tok, HFTokenizer) and isinstance(tok.tokenizer, Tokenizer)
    assert tok.vocab_size == tok.tokenizer.get_vocab_size(with_added_tokens=True) == 300
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (2, 1, 0)  # from tokenizer_config.json
    text = "the cat ate 42 mats"
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert len(ids) < len(text)  # merges were learned
    assert tok.decode(ids) == text
    assert tok.encode(text, add_bos=True, add_eos=True) == [0, *ids, 2]
    assert tok.decode([*ids, tok.eos_id]) == text  # specials skipped, as ByteTokenizer does


def test_ids_equal_transformers(tok_dir):
    transformers = pytest.importorskip("transformers")
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_dir / "tokenizer.json"))
    tok = load_tokenizer(tok_dir / "tokenizer.json")
    for text in ["numbers: 12 + 30 = 42", "unseen wörds ✓ <|im_end|>"]:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False)
        assert tok.decode(tok.encode(text)) == ref.decode(ref.encode(text),
                                                          skip_special_tokens=True)


def test_ids_fall_back_to_generation_config(tok_dir):
    (tok_dir / "tokenizer_config.json").unlink()
    json.dump({"eos_token_id": [3, 2], "bos_token_id": 1},
              open(tok_dir / "generation_config.json", "w"))
    tok = load_tokenizer(tok_dir)
    assert (tok.eos_id, tok.bos_id) == (3, 1)
    assert tok.pad_id == 3  # no PAD named anywhere: EOS, as transformers does


def test_errors_name_the_problem(tok_dir, tmp_path_factory):
    json.dump({"eos_token": "</s>"}, open(tok_dir / "tokenizer_config.json", "w"))
    with pytest.raises(ValueError, match=r"tokenizer_config.json: eos='</s>' is not in the "
                                         r"tokenizer vocabulary"):
        load_tokenizer(tok_dir)
    (tok_dir / "tokenizer_config.json").unlink()
    json.dump({"eos_token_id": 999}, open(tok_dir / "generation_config.json", "w"))
    with pytest.raises(ValueError, match=r"generation_config.json eos_token_id=999 is outside"):
        load_tokenizer(tok_dir)
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path_factory.mktemp("empty"))
