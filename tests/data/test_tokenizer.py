"""Byte tokenizer round trips, specials and padding; the HF wrapper on a tiny tokenizer."""

import numpy as np
import pytest

from lab.data import ByteTokenizer, HFTokenizer, tokenizer_from_dict


def test_byte_round_trip_with_specials():
    tok = ByteTokenizer()
    text = "23+7=30; héllo ✓\n"
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id == 257 and ids[-1] == tok.eos_id == 258
    assert len(ids) == len(text.encode("utf-8")) + 2
    assert tok.decode(ids) == text
    # every special and reserved id is skipped on decode
    assert tok.decode([tok.pad_id, 104, tok.sep_id, 105, 262, tok.eos_id]) == "hi"
    assert tok.vocab_size == 264 and tok.vocab_size % 8 == 0
    assert max(ids) < tok.vocab_size
    assert tok.token_to_id("<sep>") == tok.sep_id == 259


def test_byte_batch_encode_pads_and_truncates():
    tok = ByteTokenizer()
    ids, lengths = tok.batch_encode(["abc", "a"], max_len=4, add_bos=True)
    assert ids.dtype == np.int32 and ids.shape == (2, 4)
    np.testing.assert_array_equal(lengths, [4, 2])
    np.testing.assert_array_equal(ids[1], [tok.bos_id, 97, tok.pad_id, tok.pad_id])
    cut, n = tok.batch_encode(["abcdef"], max_len=3, truncate="left")
    assert tok.decode(cut[0]) == "def" and n[0] == 3
    with pytest.raises(ValueError, match="max_len=3"):
        tok.batch_encode(["abcdef"], max_len=3, truncate="error")
    with pytest.raises(ValueError, match="expects a str"):
        tok.encode(123)


def test_hf_wrapper_matches_interface():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "[UNK]": 3, "hello": 4, "world": 5}
    t = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.add_special_tokens(["<pad>", "<s>", "</s>"])
    tok = HFTokenizer(t)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    ids = tok.encode("hello world", add_bos=True, add_eos=True)
    assert ids == [1, 4, 5, 2]
    assert tok.decode(ids) == "hello world"
    batch, lengths = tok.batch_encode(["hello", "hello world"])
    np.testing.assert_array_equal(batch, [[4, 0], [4, 5]])
    np.testing.assert_array_equal(lengths, [1, 2])
    again = tokenizer_from_dict(tok.to_dict())
    assert again.encode("world hello") == [5, 4]
    with pytest.raises(ValueError, match="not in the tokenizer vocabulary"):
        HFTokenizer(t, eos="<|nope|>")
    assert isinstance(tokenizer_from_dict(ByteTokenizer().to_dict()), ByteTokenizer)
