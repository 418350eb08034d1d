"""Tensor factories (npu.empty/zeros/ones/full/arange and the *_like forms),
checked against numpy on the CPU backend."""

from __future__ import annotations

import numpy as np
import pytest

import npu
from npu import _abi
from npu.hal import CpuBackend

DTYPES = [npu.float32, npu.float16, npu.bfloat16, npu.int8, npu.int32, npu.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zeros_and_ones_give_numpys_values_in_every_dtype(
    default_device: npu.Device, dtype: object
) -> None:
    for make, value in ((npu.zeros, 0), (npu.ones, 1)):
        t = make(3, 5, dtype=dtype)
        assert t.shape == (3, 5) and t.dtype == dtype
        np.testing.assert_array_equal(t.numpy().astype(np.float32), np.full((3, 5), value))


def test_a_size_is_ints_or_one_sequence_as_in_pytorch(default_device: npu.Device) -> None:
    assert npu.zeros(2, 3).shape == npu.zeros((2, 3)).shape == npu.zeros([2, 3]).shape == (2, 3)
    assert npu.ones(()).shape == ()
    assert npu.full((), 4.0).item() == 4.0


def test_the_default_dtype_is_float32(default_device: npu.Device) -> None:
    assert npu.zeros(2).dtype == npu.ones(2).dtype == npu.empty(2).dtype == npu.float32


def test_zeros_is_one_fill_on_the_device_not_an_upload(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    t = npu.zeros(1000)
    t.numpy()
    assert driver.submitted[-1].opcode == _abi.NPU_OP_FILL


def test_a_fill_of_an_odd_byte_count_writes_only_the_tensor(default_device: npu.Device) -> None:
    t = npu.ones(7, dtype=npu.int8)  # 7 bytes: the FILL rounds up inside its block
    np.testing.assert_array_equal(t.numpy(), np.ones(7, np.int8))


def test_full_takes_the_dtype_of_its_value(default_device: npu.Device) -> None:
    assert npu.full((2,), 3).dtype == npu.int32
    assert npu.full((2,), 3.5).dtype == npu.float32
    assert npu.full((2,), True).dtype == npu.bool
    np.testing.assert_array_equal(npu.full((2, 2), -7).numpy(), np.full((2, 2), -7, np.int32))


def test_full_of_a_value_beyond_an_integer_dtype_raises_overflow_error(
    default_device: npu.Device,
) -> None:
    with pytest.raises(OverflowError, match="int8"):
        npu.full((2,), 300, dtype=npu.int8)


def test_full_rounds_a_bfloat16_value_as_the_device_stores_it(default_device: npu.Device) -> None:
    t = npu.full((4,), 1.0 / 3.0, dtype=npu.bfloat16)
    assert t.numpy().astype(np.float32)[0] == np.float32(0.333984375)


def test_like_forms_keep_shape_dtype_and_device_unless_given(default_device: npu.Device) -> None:
    base = npu.ones(2, 3, dtype=npu.int8)
    for t in (npu.zeros_like(base), npu.ones_like(base), npu.empty_like(base),
              npu.full_like(base, 5)):  # fmt: skip
        assert (t.shape, t.dtype, t.device) == ((2, 3), npu.int8, base.device)
    assert npu.zeros_like(base, dtype=npu.float16).dtype == npu.float16
    np.testing.assert_array_equal(npu.full_like(base, 5).numpy(), np.full((2, 3), 5, np.int8))


def test_arange_follows_numpys_count_and_pytorchs_dtypes(default_device: npu.Device) -> None:
    np.testing.assert_array_equal(npu.arange(5).numpy(), np.arange(5, dtype=np.int32))
    assert npu.arange(5).dtype == npu.int32
    np.testing.assert_array_equal(npu.arange(1, 2, 0.25).numpy(), np.arange(1, 2, 0.25))
    np.testing.assert_array_equal(npu.arange(10, 0, -3).numpy(), [10, 7, 4, 1])
    assert npu.arange(3, dtype=npu.float16).dtype == npu.float16


def test_arange_with_a_zero_step_raises_value_error(default_device: npu.Device) -> None:
    with pytest.raises(ValueError, match="step"):
        npu.arange(0, 4, 0)


def test_a_negative_dimension_raises_value_error(default_device: npu.Device) -> None:
    with pytest.raises(ValueError, match="negative"):
        npu.zeros(2, -1)


def test_a_size_that_is_not_ints_raises_type_error(default_device: npu.Device) -> None:
    with pytest.raises(TypeError, match="size"):
        npu.ones(2.5)


def test_an_empty_size_gives_an_empty_tensor_without_a_fill(
    default_device: npu.Device, driver: CpuBackend
) -> None:
    before = len(driver.submitted)
    t = npu.zeros(0, 4)
    assert t.shape == (0, 4) and t.numpy().shape == (0, 4)
    assert len(driver.submitted) == before


def test_zeros_inside_a_graph_capture_is_replayed(default_device: npu.Device) -> None:
    g = npu.Graph()
    x = npu.ones(8)
    with g.capture():
        y = npu.zeros(8) + x
    g.replay()
    g.synchronize()
    np.testing.assert_array_equal(y.numpy(), np.ones(8, np.float32))
