"""High-level numpy functions, run against the CPU backend."""

from __future__ import annotations

import numpy as np
import pytest

import npu
from npu import _abi
from npu.hal import CpuBackend


def test_matmul_matches_numpy(device: npu.Device) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    np.testing.assert_allclose(npu.matmul(a, b, device=device), a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_returns_float32(device: npu.Device) -> None:
    assert npu.matmul([[1, 2]], [[3], [4]], device=device).dtype == np.float32


def test_matmul_accepts_non_contiguous_inputs(device: npu.Device) -> None:
    a = np.arange(12, dtype=np.float64).reshape(3, 4).T  # 4 x 3, Fortran order
    b = np.ones((3, 2), dtype=np.float32)
    np.testing.assert_array_equal(npu.matmul(a, b, device=device), (a @ b).astype(np.float32))


def test_matmul_frees_its_buffers(device: npu.Device, driver: CpuBackend) -> None:
    npu.matmul(np.ones((2, 2)), np.ones((2, 2)), device=device)
    assert driver.handles == set()


def test_matmul_rejects_misaligned_shapes(device: npu.Device) -> None:
    with pytest.raises(ValueError, match=r"shapes \(2, 3\) and \(4, 5\) are not aligned"):
        npu.matmul(np.ones((2, 3)), np.ones((4, 5)), device=device)


def test_matmul_rejects_non_2d_operands(device: npu.Device) -> None:
    with pytest.raises(ValueError, match="2-D"):
        npu.matmul(np.ones(3), np.ones((3, 1)), device=device)


def test_matmul_with_an_empty_inner_dimension_returns_zeros(device: npu.Device) -> None:
    np.testing.assert_array_equal(
        npu.matmul(np.ones((2, 0)), np.ones((0, 3)), device=device), np.zeros((2, 3))
    )


def test_matmul_frees_its_buffers_when_the_device_fails(
    device: npu.Device, driver: CpuBackend
) -> None:
    driver.fail_opcode[_abi.NPU_OP_GEMM] = _abi.NPU_ST_DMA_ERROR
    with pytest.raises(npu.NpuDeviceError, match="NPU_ST_DMA_ERROR"):
        npu.matmul(np.ones((2, 2)), np.ones((2, 2)), device=device)
    assert driver.handles == set()


@pytest.mark.parametrize(
    ("trans_a", "trans_b"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_gemm_op_semantics_with_strides_and_transposes(
    device: npu.Device, trans_a: bool, trans_b: bool
) -> None:
    rng = np.random.default_rng(1)
    m, n, k, pad = 3, 4, 5, 2
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    sa, sb = (a.T if trans_a else a), (b.T if trans_b else b)
    with device.alloc(4096) as ba, device.alloc(4096) as bb, device.alloc(4096) as bc:
        lda, ldb, ldc = sa.shape[1] + pad, sb.shape[1] + pad, n + pad
        ba.numpy(np.float32, (sa.shape[0], lda))[:, : sa.shape[1]] = sa
        bb.numpy(np.float32, (sb.shape[0], ldb))[:, : sb.shape[1]] = sb
        op = npu.ops.gemm(ba, bb, bc, m, n, k, lda, ldb, ldc, trans_a, trans_b)
        device.run([op])
        c = bc.numpy(np.float32, (m, ldc))[:, :n]
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_copy_array_round_trips_dtype_shape_and_bytes(device: npu.Device) -> None:
    x = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    y = npu.copy_array(x, device=device)
    assert (y.dtype, y.shape) == (x.dtype, x.shape)
    np.testing.assert_array_equal(y, x)


def test_copy_array_of_an_empty_array_needs_no_device() -> None:
    assert npu.copy_array(np.zeros((0, 3))).shape == (0, 3)


def test_copy_array_rejects_object_arrays(device: npu.Device) -> None:
    with pytest.raises(TypeError, match="objects"):
        npu.copy_array(np.array([object()]), device=device)


def test_fill_float32_fills_with_the_value(device: npu.Device) -> None:
    np.testing.assert_array_equal(npu.fill((2, 3), 1.5, device=device), np.full((2, 3), 1.5))


def test_fill_uint8_replicates_the_byte_into_the_pattern(
    device: npu.Device, driver: CpuBackend
) -> None:
    out = npu.fill(5, 0xAB, np.uint8, device=device)
    np.testing.assert_array_equal(out, np.full(5, 0xAB, dtype=np.uint8))
    assert driver.submitted[-1].params[0] == 0xABABABAB
    assert driver.submitted[-1].bufs[0].size == 8


def test_fill_rejects_8_byte_elements(device: npu.Device) -> None:
    with pytest.raises(ValueError, match="dtype float64"):
        npu.fill(2, 1.0, np.float64, device=device)


def test_high_level_functions_use_the_default_device(driver: CpuBackend) -> None:
    npu.set_default_device(npu.Device(driver))
    try:
        np.testing.assert_array_equal(npu.copy_array(np.arange(3)), np.arange(3))
    finally:
        npu.close_default_device()
