"""lab.infer.complete and encode_prompts: strings in, strings out, one compiled shape per
batch, the same completions however the prompts are batched."""

import numpy as np
import pytest
from flax import nnx

from lab import infer
from lab.data import ByteTokenizer
from lab.nn import Transformer, TransformerConfig

TOK = ByteTokenizer()
PROMPTS = ["ab", "hello", "x", "12+3="]


@pytest.fixture(scope="module")
def model():
    cfg = TransformerConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=1, n_heads=2,
                            n_kv_heads=1, head_dim=16, d_ff=64, max_len=32, init_std=0.5)
    return Transformer(cfg, rngs=nnx.Rngs(0))


def test_encode_prompts_pads_right_and_names_the_width():
    ids, lens = infer.encode_prompts(TOK, ["ab", "abcd"], None)
    assert ids.shape == (2, 5) and lens.tolist() == [3, 5]  # BOS + bytes
    assert (ids[0, 3:] == TOK.pad_id).all()
    with pytest.raises(ValueError, match=r"prompt 1 has 5 tokens > max_len=4; raise max_len"):
        infer.encode_prompts(TOK, ["ab", "abcd"], 4, name="max_len")


def test_complete_is_greedy_generate_decoded_and_independent_of_batching(model):
    want = []
    for p in PROMPTS:  # one prompt at a time, at the same padded width
        ids, lens = infer.encode_prompts(TOK, [p], 6)
        out = infer.generate(model, ids, lengths=lens, max_new_tokens=5,
                             stop_tokens=(TOK.eos_id,), pad_id=TOK.pad_id)
        want.append(TOK.decode(np.asarray(out.tokens)[0, :int(out.lengths[0])]))
    assert infer.complete(model, TOK, PROMPTS, max_new_tokens=5, width=6, batch=3) == want
    assert infer.complete(model, TOK, PROMPTS, max_new_tokens=5, width=6, batch=8) == want
    assert infer.complete(model, TOK, [], max_new_tokens=5) == []
    sampled = infer.complete(model, TOK, PROMPTS, max_new_tokens=5, width=6, batch=8,
                             temperature=1.0, seed=3)
    assert len(sampled) == len(PROMPTS) and sampled != want  # init_std 0.5: peaked, not one-hot
