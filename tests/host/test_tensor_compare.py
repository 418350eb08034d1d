"""Comparisons give bool tensors (ELTWISE EQ..GE, out NPU_DTYPE_BOOL), checked against numpy.

Also the bool dtype around them: how masks promote, reduce and convert,
what is refused, and that a tensor stays hashable by identity.
"""

from __future__ import annotations

import ctypes
import errno
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import npu
from npu import _abi, ops
from npu.hal import CpuBackend

OPS: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("eq", operator.eq),
    ("ne", operator.ne),
    ("lt", operator.lt),
    ("le", operator.le),
    ("gt", operator.gt),
    ("ge", operator.ge),
]
DTYPES = [np.float32, np.float16, np.int8, np.int32]


@pytest.fixture(autouse=True)
def _default(default_device: npu.Device) -> None:
    del default_device


@pytest.mark.parametrize("name,fn", OPS, ids=[n for n, _ in OPS])
@pytest.mark.parametrize("dtype", DTYPES, ids=[np.dtype(d).name for d in DTYPES])
def test_each_comparison_matches_numpy_with_broadcasting(
    name: str, fn: Callable[[Any, Any], Any], dtype: Any
) -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(-3, 4, (3, 4)).astype(dtype)
    b = rng.integers(-3, 4, (4,)).astype(dtype)
    got = fn(npu.tensor(a), npu.tensor(b))
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got.numpy(), fn(a, b))


@pytest.mark.parametrize("name,fn", OPS, ids=[n for n, _ in OPS])
def test_nan_compares_as_ieee_754(name: str, fn: Callable[[Any, Any], Any]) -> None:
    a = np.array([np.nan, 1.0, np.nan, -np.inf], np.float32)
    b = np.array([np.nan, np.nan, 2.0, -np.inf], np.float32)
    np.testing.assert_array_equal(fn(npu.tensor(a), npu.tensor(b)).numpy(), fn(a, b))


def test_bfloat16_comparisons_use_the_rounded_values() -> None:
    x = np.array([1.0, 1.00390625, 2.5, -0.0], np.float32)  # 1 + 2^-8 rounds to 1 in bf16
    t = npu.tensor(x, dtype=npu.bfloat16)
    np.testing.assert_array_equal((t == 1.0).numpy(), [True, True, False, False])
    np.testing.assert_array_equal((t == 0).numpy(), [False, False, False, True])


def test_a_scalar_operand_is_weak_as_in_numpy() -> None:
    t = npu.tensor(np.array([-2, 0, 5], np.int8))
    np.testing.assert_array_equal((t > 0).numpy(), [False, False, True])
    np.testing.assert_array_equal((t > 1).numpy(), [False, False, True])
    np.testing.assert_array_equal((t <= 0.5).numpy(), [True, True, False])


def test_mixed_dtypes_compare_after_promotion() -> None:
    i = np.array([1, 2, 3], np.int32)
    f = np.array([1.5, 2.0, 2.5], np.float32)
    np.testing.assert_array_equal((npu.tensor(i) >= npu.tensor(f)).numpy(), i >= f)


def test_named_functions_are_the_operators() -> None:
    a, b = npu.tensor(np.arange(4, dtype=np.float32)), npu.tensor(np.full(4, 2, np.float32))
    for fn, want in (
        (npu.equal, [False, False, True, False]),
        (npu.not_equal, [True, True, False, True]),
        (npu.less, [True, True, False, False]),
        (npu.less_equal, [True, True, True, False]),
        (npu.greater, [False, False, False, True]),
        (npu.greater_equal, [False, False, True, True]),
    ):
        np.testing.assert_array_equal(fn(a, b).numpy(), want)


# -- the bool dtype ---------------------------------------------------------------


def test_a_mask_promotes_to_the_other_operand_in_arithmetic() -> None:
    x = np.array([-1.5, 0.5, 2.0], np.float32)
    t = npu.tensor(x)
    got = t * (t > 0)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.numpy(), x * (x > 0))


def test_sum_of_a_mask_counts_and_max_min_are_any_and_all() -> None:
    x = np.array([[1, -1, 2], [-3, 4, 5]], np.float32)
    m = npu.tensor(x) > 0
    assert m.sum().item() == 4
    np.testing.assert_array_equal(m.sum(axis=1).numpy(), [2, 2])
    assert m.max().dtype == np.bool_ and bool(m.max()) is True
    np.testing.assert_array_equal(m.min(axis=0).numpy(), [False, False, True])


def test_astype_bool_is_nonzero_and_bool_converts_to_one_and_zero() -> None:
    x = np.array([0.0, 2.0, np.nan, -1.0, -0.0], np.float32)
    got = npu.tensor(x).astype(npu.bool)
    np.testing.assert_array_equal(got.numpy(), x.astype(np.bool_))
    np.testing.assert_array_equal(got.astype(np.int32).numpy(), [0, 1, 1, 1, 0])
    np.testing.assert_array_equal(got.astype(np.float16).numpy(), [0, 1, 1, 1, 0])


def test_a_bool_array_makes_a_bool_tensor() -> None:
    t = npu.tensor(np.array([True, False, True]))
    assert t.dtype == npu.bool_ and t.dtype == npu.bool
    np.testing.assert_array_equal(
        (t == npu.tensor([True, True, False])).numpy(), [True, False, False]
    )


def test_arithmetic_on_two_bool_tensors_is_a_type_error() -> None:
    m = npu.tensor(np.array([True, False]))
    with pytest.raises(TypeError, match="bool"):
        m + m
    with pytest.raises(TypeError, match="bool"):
        npu.relu(m)


def test_equality_with_a_non_array_falls_back_to_identity() -> None:
    t = npu.tensor(np.ones(2, np.float32))
    assert (t == None) is False  # noqa: E711
    assert (t != "x") is True


def test_a_tensor_is_hashable_by_identity() -> None:
    a, b = npu.tensor(np.ones(2, np.float32)), npu.tensor(np.ones(2, np.float32))
    assert len({a, b, a}) == 2
    assert {a: 1}[a] == 1


# -- descriptor rules -----------------------------------------------------------


def ref(dtype: _abi.DType) -> ops.TensorRef:
    return ops.TensorRef(1, dtype, 0, (4,), (1,))


def test_a_comparison_must_write_bool() -> None:
    f = ref(_abi.DType.FP32)
    with pytest.raises(ValueError, match="BOOL"):
        ops.eltwise(_abi.EltwiseKind.LT, f, f, f)
    ops.eltwise(_abi.EltwiseKind.LT, f, f, ref(_abi.DType.BOOL))


@pytest.mark.parametrize(
    "make",
    [
        lambda b: ops.eltwise(_abi.EltwiseKind.ADD, b, b, b),
        lambda b: ops.unary(_abi.UnaryKind.ABS, b, b),
        lambda b: ops.reduce(_abi.ReduceKind.MAX, b, b, [0]),
    ],
    ids=["add", "abs", "reduce"],
)
def test_bool_operands_outside_comparisons_and_convert_are_refused(
    make: Callable[[ops.TensorRef], ops.TensorOp],
) -> None:
    with pytest.raises(ValueError, match="BOOL"):
        make(ref(_abi.DType.BOOL))


def test_the_cpu_backend_refuses_a_comparison_into_a_float_as_the_driver(
    device: npu.Device, driver: CpuBackend
) -> None:
    buf = device.alloc(64)
    raw = (_abi.NpuTensorOp * 1)()
    raw[0].opcode = _abi.NPU_OP_ELTWISE
    raw[0].kind = _abi.NPU_ELTWISE_GT
    for i in range(3):
        t = raw[0].t[i]
        t.handle, t.dtype, t.ndim, t.shape[0], t.strides[0] = buf.handle, 0, 1, 4, 1
    with pytest.raises(OSError) as info:
        driver.submit(raw, ctypes.sizeof(_abi.NpuTensorOp), 0)
    assert info.value.errno == errno.EINVAL
