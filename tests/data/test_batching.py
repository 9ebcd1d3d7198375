"""SFT batches: loss mask exactly on the completion, step-determinism, epoch coverage."""

import numpy as np
import pytest

from lab.data import ByteTokenizer, arithmetic, mixture, sft_batches, step_indices


def test_mask_covers_completion_and_eos_only():
    tok = ByteTokenizer()
    ds = arithmetic(16, seed=0, steps=(1, 3))
    fn = sft_batches(ds, tok, batch_size=16, seq_len=96, seed=0)
    arrays = fn.arrays
    for i, row in enumerate(ds):
        m = arrays["mask"][i].astype(bool)
        target_ids = arrays["targets"][i][m]
        assert target_ids[-1] == tok.eos_id
        assert tok.decode(target_ids) == row["completion"]
        # inputs are BOS + prompt + completion, targets the same shifted by one
        n = len(tok.encode(row["prompt"] + row["completion"])) + 1
        np.testing.assert_array_equal(arrays["inputs"][i][1:n], arrays["targets"][i][:n - 1])
        assert arrays["inputs"][i][0] == tok.bos_id
    assert arrays["inputs"].dtype == np.int32 and arrays["mask"].dtype == np.float32


def test_batches_are_a_function_of_step_and_cover_each_epoch():
    tok = ByteTokenizer()
    ds = arithmetic(10, seed=0)
    a = sft_batches(ds, tok, batch_size=4, seq_len=96, seed=7)
    b = sft_batches(ds, tok, batch_size=4, seq_len=96, seed=7)
    for step in (0, 3, 11, 2):
        for k in ("inputs", "targets", "mask"):
            np.testing.assert_array_equal(a(step)[k], b(step)[k])
    # 5 batches of 4 = 2 epochs of 10: each row exactly twice, once per epoch
    idx = np.concatenate([step_indices(10, 4, s, seed=7) for s in range(5)])
    assert sorted(idx[:10]) == list(range(10)) and sorted(idx[10:]) == list(range(10))
    assert not np.array_equal(idx[:10], idx[10:])  # re-shuffled each epoch


def test_too_long_rows_are_an_error():
    ds = arithmetic(4, seed=0, steps=6, digits=3)
    with pytest.raises(ValueError, match="row 0 has .* tokens > seq_len"):
        sft_batches(ds, ByteTokenizer(), batch_size=2, seq_len=16)


def test_mixture_counts_schema_and_determinism():
    tasks = {"arithmetic": {"weight": 2}, "needle": {"context_len": 192},
             "icl_classification": {"weight": 1, "n_shots": 4}}
    a = mixture(100, 0, tasks)
    assert a.to_list() == mixture(100, 0, tasks).to_list()
    counts = {t: a["task"].count(t) for t in set(a["task"])}
    assert counts == {"arithmetic": 50, "needle": 25, "icl_classification": 25}
    assert a.column_names == ["prompt", "completion", "answer", "difficulty", "task", "meta"]
    assert a["task"][:10] != sorted(a["task"][:10]) or len(set(a["task"][:10])) == 1
    with pytest.raises(ValueError, match="task='nope' is unknown"):
        mixture(10, 0, {"nope": {}})
    with pytest.raises(ValueError, match="bad arguments for task 'needle'"):
        mixture(10, 0, {"needle": {"hops": 3}})


def test_packed_rows_see_each_example_alone():
    from flax import nnx

    from lab.data.batching import packed_sft_batches
    from lab.nn import Transformer, TransformerConfig

    tok = ByteTokenizer()
    ds = arithmetic(40, seed=0, steps=(1, 3))
    fn = packed_sft_batches(ds, tok, batch_size=2, seq_len=96, seed=0)
    b = fn(0)
    assert b["attention_mask"].shape == (2, 1, 96, 96)
    assert (b["inputs"] != tok.pad_id).mean() > 0.8  # rows are mostly full
    completions = set(ds["completion"])
    row = 0
    starts = np.flatnonzero(b["positions"][row] == 0)
    segs = [s for s in starts if b["inputs"][row, s] == tok.bos_id]
    assert len(segs) >= 2  # several examples share the row
    cfg = TransformerConfig(vocab_size=264, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                            head_dim=16, d_ff=64, max_len=96)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    packed = np.asarray(model(b["inputs"], mask=b["attention_mask"], positions=b["positions"]))
    for s, e in list(zip(segs, segs[1:] + [None], strict=True))[:2]:  # two suffice
        n = int(b["mask"][row, s:e].astype(bool).nonzero()[0].max()) + 1
        m = b["mask"][row, s:s + n].astype(bool)
        assert tok.decode(b["targets"][row, s:s + n][m]) in completions
        alone = np.asarray(model(b["inputs"][row:row + 1, s:s + n]))[0]
        np.testing.assert_allclose(packed[row, s:s + n], alone, atol=1e-5)
    np.testing.assert_array_equal(fn(3)["inputs"], packed_sft_batches(
        ds, tok, batch_size=2, seq_len=96, seed=0)(3)["inputs"])


def test_prompt_weight_trains_the_prompt_lightly():
    from lab.data import encode_sft

    tok = ByteTokenizer()
    ds = arithmetic(6, seed=0)
    plain = encode_sft(ds, tok, 96)
    weighted = encode_sft(ds, tok, 96, prompt_weight=0.1)
    assert "weights" not in plain
    real = weighted["inputs"] != tok.pad_id
    np.testing.assert_array_equal(weighted["mask"], real.astype(np.float32))
    completion = plain["mask"].astype(bool)
    np.testing.assert_allclose(weighted["weights"][completion], 1.0)
    np.testing.assert_allclose(weighted["weights"][real & ~completion], 0.1)
    # every prompt byte is a weighted target (BOS predicts the first)
    assert (real & ~completion).sum() == sum(len(tok.encode(p)) for p in ds["prompt"])
    with pytest.raises(ValueError, match="prompt_weight=-1"):
        encode_sft(ds, tok, 96, prompt_weight=-1)


def test_encode_sft_takes_rows_as_well_as_a_dataset():
    from lab.data import encode_sft

    tok = ByteTokenizer()
    ds = arithmetic(4, seed=0)
    rows = [{"prompt": p, "completion": c, "extra": 1}
            for p, c in zip(ds["prompt"], ds["completion"], strict=True)]
    want, got = encode_sft(ds, tok, 96), encode_sft(rows, tok, 96)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    with pytest.raises(ValueError, match=r"row 1 has keys \['prompt'\]"):
        encode_sft([rows[0], {"prompt": "x"}], tok, 96)
    with pytest.raises(ValueError, match="dataset is empty"):
        encode_sft([], tok, 96)
