"""The exception classes keep errno, strerror and what failed."""

from __future__ import annotations

import errno
import os
import pickle

import npu


def test_npu_error_is_an_oserror_with_errno_and_strerror() -> None:
    err = npu.NpuError(errno.EINVAL, context="BO_CREATE(size=0)")
    assert isinstance(err, OSError)
    assert err.errno == errno.EINVAL
    assert err.strerror == os.strerror(errno.EINVAL)


def test_npu_error_message_starts_with_the_context() -> None:
    err = npu.NpuError(errno.EINVAL, context="BO_CREATE(size=0)")
    assert str(err) == f"BO_CREATE(size=0): [Errno {errno.EINVAL}] {os.strerror(errno.EINVAL)}"


def test_npu_error_from_oserror_keeps_errno_and_text() -> None:
    err = npu.NpuError.from_oserror(OSError(errno.ENOMEM, "no memory"), "BO_CREATE(size=1)")
    assert (err.errno, err.strerror, err.context) == (
        errno.ENOMEM,
        "no memory",
        "BO_CREATE(size=1)",
    )


def test_device_error_carries_status_name_fence_and_op() -> None:
    err = npu.NpuDeviceError(npu.Status.BAD_ARGS, fence=12, op="GEMM(...)", context="WAIT")
    assert err.errno == errno.EIO
    assert (err.status, err.status_name, err.fence, err.op) == (
        4,
        "NPU_ST_BAD_ARGS",
        12,
        "GEMM(...)",
    )


def test_device_error_message_names_the_status_and_fence() -> None:
    err = npu.NpuDeviceError(npu.Status.DMA_ERROR, fence=3, context="WAIT(fence=3)")
    assert "NPU_ST_DMA_ERROR (6) at fence 3" in str(err)
    assert str(err).startswith("WAIT(fence=3): ")


def test_device_error_names_an_unknown_status() -> None:
    assert npu.NpuDeviceError(99, fence=1).status_name == "NPU_ST_UNKNOWN(99)"


def test_device_error_is_an_npu_error() -> None:
    assert isinstance(npu.NpuDeviceError(1, fence=1), npu.NpuError)


def test_timeout_error_has_etimedout_and_is_a_builtin_timeout_error() -> None:
    err = npu.NpuTimeoutError(fence=5, timeout_s=0.5, context="WAIT(fence=5)")
    assert err.errno == errno.ETIMEDOUT
    assert isinstance(err, TimeoutError)
    assert isinstance(err, npu.NpuError)
    assert (err.fence, err.timeout_s) == (5, 0.5)


def test_device_not_found_defaults_to_enodev() -> None:
    err = npu.DeviceNotFoundError("open_device(0)")
    assert err.errno == errno.ENODEV
    assert isinstance(err, npu.NpuError)


def test_errors_survive_pickling_with_all_attributes() -> None:
    err = npu.NpuDeviceError(5, fence=9, op="COPY", context="WAIT(fence=9)")
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), copy.errno, copy.status, copy.fence, copy.op, copy.context) == (
        npu.NpuDeviceError,
        errno.EIO,
        5,
        9,
        "COPY",
        "WAIT(fence=9)",
    )


def test_status_name_uses_the_c_names() -> None:
    assert [npu.status_name(s) for s in npu.Status] == [
        "NPU_ST_OK",
        "NPU_ST_BAD_OPCODE",
        "NPU_ST_BAD_FLAGS",
        "NPU_ST_BAD_RESERVED",
        "NPU_ST_BAD_ARGS",
        "NPU_ST_BAD_ADDR",
        "NPU_ST_DMA_ERROR",
        "NPU_ST_ABORTED",
        "NPU_ST_NO_MEMORY",
        "NPU_ST_MMU_FAULT",
        "NPU_ST_BAD_QUANT",
        "NPU_ST_HW_ERROR",
        "NPU_ST_TIMEOUT",
    ]
