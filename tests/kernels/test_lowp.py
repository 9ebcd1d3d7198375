"""Quantisers against the numpy/ml_dtypes references, bit for bit; documented edge values."""

import ml_dtypes
import numpy as np
import pytest

from kernels_pallas import lowp

FORMATS = sorted(lowp.FORMATS)


def _bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _edge_values():
    rs = np.random.RandomState(1)
    x = np.zeros((6, 64), np.float32)          # row 0: all zeros
    x[1] = 1e-40                                # row 1: subnormals (flushed)
    x[1, 3] = -1e-39
    x[2] = rs.randn(64)
    x[2, 5] = 4.0                               # amax exactly a power of two
    x[2, 40] = -np.inf                          # inf in the second MX block
    x[3] = rs.randn(64)
    x[3, 7] = np.nan                            # NaN in the first block
    x[4] = np.array([0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 6.0, 7.0] * 8) * 2.0**-3  # RNE ties
    x[5] = rs.randn(64) * 2.0**-120             # tiny but normal
    return x


CASES = {
    "random": (np.random.RandomState(0).randn(5, 70)
               * np.array([[1e-3], [1.0], [50.0], [1e4], [3e-30]])).astype(np.float32),
    "edge": _edge_values(),
}


@pytest.mark.parametrize("fmt,scaling", [(f, "tensor") for f in FORMATS]
                         + [("fp8_e4m3", "row"), ("fp8_e5m2", "row")])
@pytest.mark.parametrize("case", sorted(CASES))
def test_quantize_matches_numpy_reference_bit_for_bit(case, fmt, scaling):
    x = CASES[case]
    q = lowp.quantize(x, fmt, scaling=scaling)  # jitted
    ref = lowp.quantize_reference(x, fmt, scaling=scaling)
    for field in ("data", "scales", "tensor_scale"):
        got, want = getattr(q, field), ref[field]
        assert (got is None) == (want is None), field
        if want is not None:
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{fmt} {field}")
    deq = np.asarray(q.dequantize())
    np.testing.assert_array_equal(deq, lowp.dequantize_reference(ref, fmt, x.shape))
    assert deq.shape == x.shape


@pytest.mark.parametrize("fmt,bound", [("bf16", 2**-8), ("fp8_e4m3", 2**-3), ("fp8_e5m2", 2**-2),
                                       ("mxfp4", 0.5), ("nvfp4", 0.5)])
def test_dequantize_error_is_within_the_format_step(fmt, bound):
    x = np.random.RandomState(2).randn(8, 64).astype(np.float32)
    err = np.abs(np.asarray(lowp.quantize(x, fmt).dequantize()) - x)
    # half an ulp of the element format, relative to the block/tensor amax
    assert err.max() <= bound * np.abs(x).max(), (fmt, err.max())


def test_mxfp4_scale_rule_and_packing():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [4.0, -3.0, 0.5, 0.1]           # amax = 4 = 2^2 -> X = 2^(2 - 2) = 1
    q = lowp.quantize(x, "mxfp4")
    assert np.asarray(q.scales).view(np.uint8)[0, 0] == 127
    codes = np.array([4.0, -3.0, 0.5, 0.0], np.float32).astype(ml_dtypes.float4_e2m1fn)
    codes = codes.view(np.uint8)
    assert np.asarray(q.data)[0, 0] == codes[0] | (codes[1] << 4)   # element 0 low nibble
    assert np.asarray(q.data)[0, 1] == codes[2] | (codes[3] << 4)
    big = np.full((1, 32), 7.9, np.float32)    # floor(log2 7.9) = 2 -> X = 1, 7.9 saturates to 6
    np.testing.assert_array_equal(np.asarray(lowp.quantize(big, "mxfp4").dequantize()), 6.0)


def test_nan_and_inf_handling():
    x = _edge_values()
    mx = np.asarray(lowp.quantize(x, "mxfp4").dequantize())
    assert np.isnan(mx[3, :32]).all() and np.isfinite(mx[3, 32:]).all()   # NaN block -> NaN
    assert np.isnan(mx[2, 32:]).all() and np.isfinite(mx[2, :32]).all()   # inf block -> NaN
    f8 = np.asarray(lowp.quantize(x, "fp8_e4m3", scaling="row").dequantize())
    assert np.isnan(f8[3, 7]) and np.isfinite(np.delete(f8[3], 7)).all()
    assert f8[2, 40] == -448.0 * float(np.asarray(lowp.quantize(x, "fp8_e4m3",
                                                                scaling="row").scales)[2, 0])
    assert (mx[0] == 0).all() and (mx[1] == 0).all()                       # zeros, subnormals


def test_padding_and_rejection_of_ragged_lengths():
    x = np.random.RandomState(3).randn(3, 40).astype(np.float32)
    q = lowp.quantize(x, "nvfp4", axis=-1)
    assert q.data.shape == (3, 24) and q.scales.shape == (3, 3)          # padded 40 -> 48
    assert np.asarray(q.dequantize()).shape == (3, 40)
    with pytest.raises(ValueError, match="not a multiple of the mxfp4 block size 32"):
        lowp.quantize(x, "mxfp4", pad=False)


def test_quantize_along_axis_zero():
    x = np.random.RandomState(4).randn(64, 5).astype(np.float32)
    q = lowp.quantize(x, "mxfp4", axis=0)
    assert q.data.shape == (5, 32) and q.scales.shape == (5, 2)
    ref = lowp.quantize_reference(x, "mxfp4", axis=0)
    np.testing.assert_array_equal(np.asarray(q.data), ref["data"])
    np.testing.assert_array_equal(np.asarray(q.dequantize()),
                                  lowp.dequantize_reference(ref, "mxfp4", x.shape, axis=0))


def test_bad_format_and_scaling_names():
    with pytest.raises(ValueError, match=r"fmt='int3'.*known formats: \['bf16', 'fp8_e4m3'"):
        lowp.quantize(np.ones(4), "int3")
    with pytest.raises(ValueError, match="scaling='col'"):
        lowp.quantize(np.ones(4), "fp8_e4m3", scaling="col")
