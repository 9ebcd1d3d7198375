"""lab.data.tfds: array_record TFDS datasets prepared and read back without TensorFlow."""

import sys

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from lab.data import tfds as ltfds  # noqa: E402


def _features():
    return {"question": tfds.features.Text(), "n": tfds.features.Scalar(np.int64),
            "value": tfds.features.Scalar(np.float64),
            "image": tfds.features.Image(shape=(None, None, 3), encoding_format="png"),
            "frames": tfds.features.Sequence(tfds.features.Image(shape=(4, 4, 3),
                                                                encoding_format="png"))}


def _gen(n, offset=0):
    def gen():
        for i in range(n):
            img = np.zeros((6, 7, 3), np.uint8)
            img[i % 6, :, 0] = 200 + i
            yield f"k{i + offset}", {"question": f"what is {i + offset}? ü", "n": i + offset,
                                      "value": 0.25 * i, "image": img,
                                      "frames": np.full((i + 1, 4, 4, 3), i, np.uint8)}
    return gen


def test_build_and_load_roundtrip_without_tensorflow(tmp_path):
    builder = ltfds.build("lab_toy", _features(), {"train": _gen(5), "bench": _gen(2, 100)},
                          tmp_path, shuffle=False, description="toy")
    splits = ltfds.load(builder.data_dir)
    assert set(splits) == {"train", "bench"}
    assert len(splits["train"]) == 5 and len(splits["bench"]) == 2
    for i, ex in enumerate(splits["train"]):  # generation order kept with shuffle=False
        assert ex["question"] == f"what is {i}? ü" and ex["n"] == i
        assert ex["value"] == pytest.approx(0.25 * i)
        assert ex["image"].shape == (6, 7, 3) and ex["image"].dtype == np.uint8
        assert ex["image"][i % 6, 3, 0] == 200 + i  # PNG is lossless
        assert len(ex["frames"]) == i + 1 and all((f == i).all() for f in ex["frames"])
    assert splits["bench"][-1]["n"] == 101
    with pytest.raises(IndexError, match="out of range"):
        splits["bench"][2]
    assert "tensorflow" not in sys.modules


def test_bad_input_named(tmp_path):
    with pytest.raises(ValueError, match="snake_case"):
        ltfds.make_builder_class("BadName", _features(), {"train": _gen(1)})
    with pytest.raises(ValueError, match="splits is empty"):
        ltfds.make_builder_class("ok_name", _features(), {})
    with pytest.raises(FileNotFoundError, match="dataset_info.json"):
        ltfds.load(tmp_path)
    with pytest.raises(ValueError, match="uint8"):
        ltfds.encode_png(np.zeros((2, 2), np.float32))
